"""Hostile input to the frame decoder (lab.fuzz): Hypothesis-driven mutations, the seeded
benchmark at a small size, checks that catch broken decoders, and the attacker over loopback."""

from __future__ import annotations

import struct
import threading
import tracemalloc
from collections.abc import Callable, Iterator

import pytest
from frame_strategies import frames
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crew.wire.frames as wf
from crew.wire.frames import HEADER, HEADER_SIZE, MAGIC, TAG_SIZE, Frame, FrameCodec, FrameKind
from crew.wire.transport import Transport
from lab import fuzz
from lab.fuzz import Case, Mutation
from lab.orchestrate import attacker

SECRET = b"k" * 32
RUN = 424242
LIMIT = 2048  # a small limit keeps payloads at and beyond it cheap to generate
CODEC = FrameCodec(SECRET, RUN, max_payload=LIMIT)
U32 = 0xFFFF_FFFF

FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

frames_st = frames(
    RUN, st.one_of(st.binary(max_size=64), st.binary(min_size=LIMIT - 8, max_size=LIMIT))
)


def _assert_clean(case: Case, codec: FrameCodec = CODEC) -> tuple[fuzz.Result, fuzz.Result]:
    """Both decode paths meet the case's expectation and the read bound."""
    stream, whole = fuzz.check_stream(codec, case), fuzz.check_whole(codec, case)
    assert stream.violation is None, stream.violation
    assert whole.violation is None, whole.violation
    assert stream.total_request <= HEADER_SIZE + codec.max_payload + TAG_SIZE
    return stream, whole


@FAST
@given(frame=frames_st, extra=st.binary(max_size=40))
def test_valid_frames_decode_exactly_with_or_without_trailing_bytes(frame: Frame, extra) -> None:
    wire = CODEC.encode_bytes(frame)
    stream, whole = _assert_clean(Case(Mutation.VALID, wire, frame, frame))
    assert stream.outcome == whole.outcome == fuzz.VALID
    if extra:
        stream, whole = _assert_clean(Case(Mutation.TRAILING, wire + extra, frame, wf.FrameError))
        assert stream.outcome == fuzz.VALID and whole.outcome == "TrailingData"


@FAST
@given(frame=frames_st, data=st.data())
def test_flipped_bits_are_never_accepted(frame: Frame, data: st.DataObject) -> None:
    wire = CODEC.encode_bytes(frame)
    bits = data.draw(st.sets(st.integers(0, len(wire) * 8 - 1), min_size=1, max_size=8))
    _assert_clean(
        Case(Mutation.BIT_FLIP, fuzz.flip_bits(wire, sorted(bits)), wf.FrameError, wf.FrameError)
    )


@FAST
@given(frame=frames_st, data=st.data())
def test_every_truncation_is_truncated(frame: Frame, data: st.DataObject) -> None:
    wire = CODEC.encode_bytes(frame)
    keep = data.draw(st.integers(0, len(wire) - 1))
    _assert_clean(Case(Mutation.TRUNCATE, fuzz.truncate(wire, keep), wf.Truncated, wf.Truncated))


@FAST
@given(frame=frames_st, data=st.data())
def test_length_lies_are_rejected(frame: Frame, data: st.DataObject) -> None:
    wire = CODEC.encode_bytes(frame)
    lie = data.draw(st.integers(0, LIMIT).filter(lambda n: n != frame.nbytes))
    _assert_clean(
        Case(Mutation.LENGTH_LIE, fuzz.with_length(wire, lie), wf.FrameError, wf.FrameError)
    )


@FAST
@given(frame=frames_st, length=st.integers(LIMIT + 1, U32))
def test_huge_declared_lengths_cost_one_header_read(frame: Frame, length: int) -> None:
    data = fuzz.with_length(CODEC.encode_bytes(frame), length)
    stream, _ = _assert_clean(Case(Mutation.HUGE_LENGTH, data, wf.Oversized, wf.Oversized))
    assert stream.total_request == HEADER_SIZE  # refused before any payload was asked for


@FAST
@given(frame=frames_st, key=st.binary(min_size=16, max_size=48), run=st.integers(0, U32))
def test_foreign_key_is_bad_mac_and_foreign_run_is_wrong_run(frame, key: bytes, run) -> None:
    if key != SECRET:
        forged = FrameCodec(key, RUN, LIMIT).encode_bytes(frame)
        _assert_clean(Case(Mutation.WRONG_MAC, forged, wf.BadMac, wf.BadMac))
    if run != RUN:
        other = Frame(frame.kind, frame.sender, run, payload=frame.payload)
        replayed = FrameCodec(SECRET, run, LIMIT).encode_bytes(other)
        _assert_clean(Case(Mutation.WRONG_RUN, replayed, wf.WrongRun, wf.WrongRun))


@FAST
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.binary(max_size=300).map(lambda b: MAGIC + b"\x01" + b),
        st.tuples(st.integers(0, 255), st.integers(0, U32), st.binary(max_size=300)).map(
            lambda t: HEADER.pack(MAGIC, 1, t[0], 0, RUN, 0, 0, 0, 0, 0, t[1]) + t[2]
        ),
    )
)
def test_arbitrary_bytes_only_raise_frame_errors(data: bytes) -> None:
    _assert_clean(Case(Mutation.RANDOM, data, wf.FrameError, wf.FrameError))


@settings(max_examples=150, deadline=None)
@given(frame=frames_st, data=st.data())
def test_memory_peak_is_bounded_by_the_payload_limit(frame: Frame, data: st.DataObject) -> None:
    wire = CODEC.encode_bytes(frame)
    mutated = data.draw(
        st.sampled_from(
            [
                Case(Mutation.VALID, wire, frame, frame),
                Case(Mutation.HUGE_LENGTH, fuzz.with_length(wire, U32), wf.Oversized, wf.Oversized),
                Case(Mutation.TRUNCATE, wire[: len(wire) - 1], wf.Truncated, wf.Truncated),
            ]
        )
    )
    tracemalloc.start()
    try:
        stream = fuzz.check_stream(CODEC, mutated, trace=True)
        whole = fuzz.check_whole(CODEC, mutated, trace=True)
    finally:
        tracemalloc.stop()
    assert stream.violation is None and whole.violation is None
    assert stream.peak_bytes is not None and stream.peak_bytes <= fuzz.memory_bound(CODEC)
    assert whole.peak_bytes is not None and whole.peak_bytes <= fuzz.memory_bound(CODEC)


# -- the checks catch broken decoders ----------------------------------------------------------


class TrustingCodec(FrameCodec):
    """Reads the declared length before checking it: what the limit exists to prevent."""

    def read_frame(self, recv_exact: Callable[[int], bytes]) -> Frame:
        header = recv_exact(HEADER_SIZE)
        length = struct.unpack("!I", bytes(header[36:40]))[0]
        recv_exact(length)
        raise wf.Truncated("not reached in these tests")


class NoMacCodec(FrameCodec):
    """Skips the MAC: accepts anything well formed."""

    def read_frame(self, recv_exact: Callable[[int], bytes]) -> Frame:
        header = bytes(recv_exact(HEADER_SIZE))
        fields = HEADER.unpack(header)
        payload = bytes(recv_exact(fields[-1]))
        recv_exact(TAG_SIZE)
        return Frame(FrameKind(fields[2]), *fields[3:10], payload=payload)


def test_a_decoder_that_trusts_the_length_is_caught() -> None:
    broken = TrustingCodec(SECRET, RUN, LIMIT)
    frame = Frame(FrameKind.SCATTER, 1, RUN, payload=b"x")
    data = fuzz.with_length(CODEC.encode_bytes(frame), U32)
    res = fuzz.check_stream(broken, Case(Mutation.HUGE_LENGTH, data, wf.Oversized, wf.Oversized))
    assert res.outcome == "ReadBoundExceeded"
    assert res.violation is not None and "escaped the decoder" in res.violation


def test_a_decoder_that_skips_the_mac_is_caught() -> None:
    broken = NoMacCodec(SECRET, RUN, LIMIT)
    forged = FrameCodec(b"x" * 32, RUN, LIMIT).encode_bytes(Frame(FrameKind.HELLO, 0, RUN))
    res = fuzz.check_stream(broken, Case(Mutation.WRONG_MAC, forged, wf.BadMac, wf.BadMac))
    assert res.outcome == fuzz.VALID
    assert res.violation is not None and "accepted a hostile input" in res.violation


# -- the seeded benchmark ----------------------------------------------------------------------


def test_benchmark_small_run_is_clean_and_covers_every_mutation() -> None:
    report = fuzz.run_fuzz(1500, seed=3, max_payload=4096, traced_inputs=300)
    assert report.ok, report.examples
    assert set(report.by_mutation) == {m.value for m in Mutation}
    assert sum(report.outcomes.values()) == 2 * report.inputs
    # Both accepted frames and every kind of rejection occur.
    for outcome in (
        "valid",
        "BadMac",
        "BadMagic",
        "BadVersion",
        "UnknownKind",
        "Oversized",
        "Truncated",
        "WrongRun",
    ):
        assert report.outcomes[f"read_frame:{outcome}"] > 0, outcome
    assert report.outcomes["decode:TrailingData"] > 0
    assert report.max_total_request <= report.read_bound
    assert 0 < report.peak_bytes <= report.memory_bound


def test_benchmark_is_reproducible() -> None:
    a = fuzz.run_fuzz(300, seed=11, max_payload=1024, traced_inputs=0)
    b = fuzz.run_fuzz(300, seed=11, max_payload=1024, traced_inputs=0)
    assert a.outcomes == b.outcomes and a.by_mutation == b.by_mutation


def test_cli_prints_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert fuzz.main(["--frames", "200", "--seed", "1", "--max-payload", "1024"]) == 0
    out = capsys.readouterr().out
    assert "inputs/s" in out and "violations: 0" in out and "read_frame:valid" in out


# -- the attacker, against a real transport on loopback ----------------------------------------


@pytest.fixture
def victim() -> Iterator[tuple[Transport, list[wf.FrameError], list[Frame]]]:
    rejects: list[wf.FrameError] = []
    frames: list[Frame] = []
    lock = threading.Lock()

    def on_reject(_addr: object, err: wf.FrameError) -> None:
        with lock:
            rejects.append(err)

    t = Transport(
        1,
        ("127.0.0.1", 0),
        {0: ("127.0.0.1", 9)},
        CODEC,
        on_frame=frames.append,
        on_reject=on_reject,
        stall_timeout=5.0,
    )
    t.start()
    try:
        yield t, rejects, frames
    finally:
        t.close()


def test_attacker_connections_are_all_rejected(victim) -> None:
    t, rejects, frames = victim
    report = fuzz.attack(
        "127.0.0.1", t.port, 12, fuzz.AttackMode.MIXED, seed=5, max_payload=LIMIT, wait_s=5.0
    )
    assert report.sent == {"wrong-mac": 4, "garbage": 4, "oversized": 4}
    assert report.dropped == 12, report.to_dict()
    stats = t.stats()
    assert stats.rejected == 12
    # Before the HELLO only a HELLO's bytes are read: a forged frame of another size is
    # refused for its size (HandshakeError), without its MAC computed; a forged HELLO for its
    # MAC; an oversized header from its length alone.
    by = stats.rejected_by_reason
    assert by.get("BadMac", 0) + by.get("HandshakeError", 0) == 4 and by["Oversized"] == 4
    assert stats.frames_received == 0 and frames == []
    assert len(rejects) == 12


def test_hostile_message_shapes() -> None:
    import random

    rng = random.Random(0)
    forged = attacker.hostile_message(attacker.AttackMode.WRONG_MAC, rng, LIMIT)
    with pytest.raises(wf.BadMac):
        CODEC.decode(forged)
    huge = attacker.hostile_message(attacker.AttackMode.OVERSIZED, rng, LIMIT)
    assert struct.unpack("!I", huge[36:40])[0] > LIMIT
    with pytest.raises(wf.Oversized):
        CODEC.read_frame(fuzz.GuardedReader(huge, HEADER_SIZE))  # one header read, no more
    with pytest.raises(ValueError):
        attacker.hostile_message(attacker.AttackMode.MIXED, rng, LIMIT)
