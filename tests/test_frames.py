"""Frame codec: round trips, every rejection path, control payloads, and fuzzing."""

from __future__ import annotations

import hashlib
import hmac
import struct

import blake3
import numpy as np
import pytest
from frame_strategies import frames
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crew.wire.frames as wf
from crew.wire.frames import (
    COORDINATOR,
    HEADER,
    HEADER_SIZE,
    MAC_CONTEXT,
    MAGIC,
    TAG_SIZE,
    VERSION,
    Frame,
    FrameCodec,
    FrameError,
    FrameKind,
    control_body,
    control_frame,
    decode_control,
    encode_control,
    wire_size,
)

SECRET = bytes(range(32))
RUN = 42


@pytest.fixture
def codec() -> FrameCodec:
    return FrameCodec(SECRET, RUN, max_payload=1 << 16)


def _raw(
    codec_secret: bytes,
    *,
    magic: bytes = MAGIC,
    version: int = VERSION,
    kind: int = FrameKind.SCATTER,
    run: int = RUN,
    length: int | None = None,
    payload: bytes = b"abc",
) -> bytes:
    """A frame assembled by hand, with a correct tag over whatever header we built."""
    header = HEADER.pack(
        magic, version, kind, 3, run, 1, 2, 3, 4, 5, len(payload) if length is None else length
    )
    return header + payload + documented_tag(codec_secret, header, payload)


def documented_tag(secret: bytes, header: bytes, payload: bytes) -> bytes:
    """The tag as the module doc defines it, computed apart from the codec: keyed BLAKE3 over
    payload || header, the key derived from the run secret."""
    key = blake3.blake3(secret, derive_key_context=MAC_CONTEXT).digest()
    return blake3.blake3(payload + header, key=key).digest()


class Recorder:
    """recv_exact over a byte string that records each requested size."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.calls: list[int] = []

    def __call__(self, n: int) -> bytes:
        self.calls.append(n)
        chunk = self.data[self.pos : self.pos + n]
        self.pos += len(chunk)
        return chunk


# -- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(FrameKind))
def test_round_trip_every_kind_and_field(codec: FrameCodec, kind: FrameKind) -> None:
    frame = Frame(
        kind,
        sender=COORDINATOR,
        run=RUN,
        group=0xFFFF_FFFF,
        rev=7,
        block=123,
        part=0xFFFF_FFFE,
        offset=(1 << 64) - 1,
        payload=bytes(range(256)) * 3,
    )
    data = codec.encode_bytes(frame)
    assert len(data) == wire_size(frame) == HEADER_SIZE + 768 + TAG_SIZE
    out = codec.decode(data)
    assert out == frame
    assert (out.kind, out.sender, out.group, out.rev, out.block, out.part, out.offset) == (
        kind,
        0xFFFF,
        0xFFFF_FFFF,
        7,
        123,
        0xFFFF_FFFE,
        (1 << 64) - 1,
    )


def test_header_layout_is_network_order(codec: FrameCodec) -> None:
    frame = Frame(FrameKind.RESULT, sender=0x0102, run=RUN, group=5, offset=1 << 40, payload=b"x")
    header = bytes(codec.encode(frame)[0])
    assert HEADER_SIZE == 40
    assert header[:4] == b"CRW1"
    assert header[4] == VERSION == 3 and header[5] == FrameKind.RESULT
    assert header[6:8] == b"\x01\x02"
    assert struct.unpack("!Q", header[28:36])[0] == 1 << 40
    assert struct.unpack("!I", header[36:40])[0] == 1


def test_empty_payload_round_trip(codec: FrameCodec) -> None:
    frame = Frame(FrameKind.HELLO, sender=3, run=RUN)
    assert codec.decode(codec.encode_bytes(frame)) == frame


def test_numpy_payload_is_not_copied_and_round_trips(codec: FrameCodec) -> None:
    arr = np.arange(1000, dtype=np.float32)
    frame = Frame(FrameKind.SCATTER, sender=1, run=RUN, payload=memoryview(arr))
    assert frame.nbytes == arr.nbytes
    parts = codec.encode(frame)
    assert len(parts) == 3
    assert isinstance(parts[1], memoryview) and parts[1].obj is arr  # a view, not a copy
    out = codec.decode(codec.encode_bytes(frame))
    np.testing.assert_array_equal(np.frombuffer(out.payload, dtype=np.float32), arr)


def test_read_frame_hands_out_read_only_views(codec: FrameCodec) -> None:
    data = codec.encode_bytes(Frame(FrameKind.SCATTER, sender=1, run=RUN, payload=b"hello"))
    pos = 0

    def recv_exact(n: int) -> bytearray:
        nonlocal pos
        pos += n
        return bytearray(data[pos - n : pos])

    out = codec.read_frame(recv_exact)
    assert isinstance(out.payload, memoryview) and out.payload.readonly
    assert bytes(out.payload) == b"hello"


def test_non_contiguous_payload_is_refused() -> None:
    arr = np.arange(10, dtype=np.float32)[::2]
    with pytest.raises(wf.BadField, match="payload"):
        Frame(FrameKind.SCATTER, sender=1, run=RUN, payload=memoryview(arr))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sender", 0x10000),
        ("sender", -1),
        ("run", 1 << 32),
        ("group", -1),
        ("rev", 1 << 32),
        ("block", 1.5),
        ("part", True),
        ("offset", 1 << 64),
    ],
)
def test_out_of_range_fields_name_the_field(field: str, value: object) -> None:
    kwargs: dict[str, object] = {"kind": FrameKind.SCATTER, "sender": 1, "run": RUN, field: value}
    with pytest.raises(wf.BadField, match=field):
        Frame(**kwargs)  # type: ignore[arg-type]


def test_unknown_kind_in_constructor() -> None:
    with pytest.raises(wf.BadField, match="kind"):
        Frame(99, sender=1, run=RUN)  # type: ignore[arg-type]


def test_codec_rejects_weak_secret_and_bad_limits() -> None:
    with pytest.raises(ValueError, match="secret"):
        FrameCodec(b"short", RUN)
    with pytest.raises(ValueError, match="max_payload"):
        FrameCodec(SECRET, RUN, max_payload=0)
    with pytest.raises(wf.BadField, match="run"):
        FrameCodec(SECRET, -1)


# -- rejections -------------------------------------------------------------------------------


def test_bad_magic(codec: FrameCodec) -> None:
    with pytest.raises(wf.BadMagic, match="magic"):
        codec.decode(_raw(SECRET, magic=b"HTTP"))


def test_bad_version(codec: FrameCodec) -> None:
    with pytest.raises(wf.BadVersion, match="version 4"):
        codec.decode(_raw(SECRET, version=4))
    with pytest.raises(wf.BadVersion, match="version 2"):  # before connections had sessions
        codec.decode(_raw(SECRET, version=2))


def test_a_version_1_frame_with_its_hmac_sha256_tag_is_refused_by_version(
    codec: FrameCodec,
) -> None:
    header = HEADER.pack(MAGIC, 1, FrameKind.SCATTER, 3, RUN, 1, 2, 3, 4, 5, 3)
    old = header + b"abc" + hmac.new(SECRET, header + b"abc", hashlib.sha256).digest()
    with pytest.raises(wf.BadVersion, match="version 1 is not 3"):
        codec.decode(old)


def test_the_tag_is_the_documented_keyed_blake3(codec: FrameCodec) -> None:
    """Pins the wire format: another implementation can compute the tag from the module doc."""
    frame = Frame(FrameKind.SCATTER, sender=2, run=RUN, group=9, offset=128, payload=b"x" * 5000)
    header, payload, tag = codec.encode(frame)
    assert len(tag) == TAG_SIZE == 32
    assert tag == documented_tag(SECRET, bytes(header), bytes(payload))


def test_unknown_kind(codec: FrameCodec) -> None:
    with pytest.raises(wf.UnknownKind, match="kind 200"):
        codec.decode(_raw(SECRET, kind=200))


def test_oversized_is_refused_before_reading_the_payload(codec: FrameCodec) -> None:
    data = _raw(SECRET, length=9_000_000)
    rec = Recorder(data)
    with pytest.raises(wf.Oversized, match="frame length 9000000 exceeds the maximum 65536"):
        codec.read_frame(rec)
    assert rec.calls == [HEADER_SIZE]  # neither payload nor tag was requested


def test_oversized_on_encode(codec: FrameCodec) -> None:
    frame = Frame(FrameKind.SCATTER, sender=1, run=RUN, payload=bytes(codec.max_payload + 1))
    with pytest.raises(wf.Oversized, match="exceeds the maximum"):
        codec.encode(frame)


def test_payload_at_the_limit_is_accepted(codec: FrameCodec) -> None:
    frame = Frame(FrameKind.SCATTER, sender=1, run=RUN, payload=bytes(codec.max_payload))
    assert codec.decode(codec.encode_bytes(frame)) == frame


@pytest.mark.parametrize("where", [0, 10, 20, 39, 40, 42, -1])
def test_any_flipped_bit_fails_the_mac_or_an_earlier_check(codec: FrameCodec, where: int) -> None:
    data = bytearray(
        codec.encode_bytes(Frame(FrameKind.SCATTER, sender=1, run=RUN, payload=b"abc"))
    )
    data[where] ^= 0x01
    with pytest.raises(FrameError) as info:
        codec.decode(bytes(data))
    if 8 <= where % len(data) < 36 or where % len(data) >= 40:
        assert isinstance(info.value, wf.BadMac)  # fields and payload are covered by the tag


def test_wrong_secret_is_bad_mac(codec: FrameCodec) -> None:
    other = FrameCodec(b"x" * 32, RUN)
    data = other.encode_bytes(Frame(FrameKind.SCATTER, sender=1, run=RUN, payload=b"abc"))
    with pytest.raises(wf.BadMac, match="tag"):
        codec.decode(data)


def test_wrong_run(codec: FrameCodec) -> None:
    other = FrameCodec(SECRET, RUN + 1)
    data = other.encode_bytes(Frame(FrameKind.SCATTER, sender=1, run=RUN + 1, payload=b"abc"))
    with pytest.raises(wf.WrongRun, match=f"run {RUN + 1} is not this run {RUN}"):
        codec.decode(data)


def test_every_truncation_is_truncated(codec: FrameCodec) -> None:
    data = codec.encode_bytes(Frame(FrameKind.SCATTER, sender=1, run=RUN, payload=b"abcdef"))
    for cut in range(len(data)):
        with pytest.raises(wf.Truncated):
            codec.decode(data[:cut])


def test_trailing_bytes(codec: FrameCodec) -> None:
    data = codec.encode_bytes(Frame(FrameKind.SCATTER, sender=1, run=RUN, payload=b"abc"))
    with pytest.raises(wf.TrailingData, match="1 bytes"):
        codec.decode(data + b"\x00")


# -- control payloads -------------------------------------------------------------------------


def test_control_round_trip(codec: FrameCodec) -> None:
    msg = {"type": "assign", "group": 3, "members": [1, 2, 5], "name": "ß→", "loss": 0.25}
    frame = control_frame(COORDINATOR, RUN, msg, group=3, rev=1)
    out = codec.decode(codec.encode_bytes(frame))
    assert out.kind is FrameKind.CONTROL and out.group == 3 and out.rev == 1
    assert control_body(out) == msg


@pytest.mark.parametrize(
    "payload",
    [b"\xff\xfe", b"{", b"[1, 2]", b"42", b'"text"', b"null", b"", b"[" * 100_000],
)
def test_decode_control_rejects_garbage(payload: bytes) -> None:
    with pytest.raises(wf.BadPayload):
        decode_control(payload)


@pytest.mark.parametrize("obj", [[1, 2], "text", {"a": {1, 2}}, {"a": object()}])
def test_encode_control_rejects_non_json_objects(obj: object) -> None:
    with pytest.raises(wf.BadPayload):
        encode_control(obj)  # type: ignore[arg-type]


def test_control_body_rejects_other_kinds() -> None:
    with pytest.raises(wf.BadPayload, match="SCATTER"):
        control_body(Frame(FrameKind.SCATTER, sender=1, run=RUN, payload=b"{}"))


# -- fuzzing ----------------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

frames_st = frames(RUN, st.binary(max_size=300))


@FUZZ
@given(frame=frames_st)
def test_fuzz_round_trip(frame: Frame) -> None:
    codec = FrameCodec(SECRET, RUN, max_payload=1 << 16)
    assert codec.decode(codec.encode_bytes(frame)) == frame


@FUZZ
@given(data=st.one_of(st.binary(max_size=400), st.binary(max_size=60).map(lambda b: MAGIC + b)))
def test_fuzz_random_bytes_only_raise_frame_errors(data: bytes) -> None:
    codec = FrameCodec(SECRET, RUN, max_payload=1 << 16)
    try:
        codec.decode(data)
    except FrameError:
        return
    pytest.fail("random bytes decoded as a valid frame")


@FUZZ
@given(
    frame=frames_st,
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 10_000)),
    extra=st.binary(max_size=8),
)
def test_fuzz_mutated_frames(
    frame: Frame, flips: list[tuple[int, int]], cut: int | None, extra: bytes
) -> None:
    codec = FrameCodec(SECRET, RUN, max_payload=1 << 16)
    original = codec.encode_bytes(frame)
    data = bytearray(original)
    for pos, mask in flips:
        data[pos % len(data)] ^= mask
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    data += extra
    try:
        out = codec.decode(bytes(data))
    except FrameError:
        return
    # The tag admits nothing but the original bytes.
    assert bytes(data) == original and out == frame
