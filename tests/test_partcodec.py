"""Compressed payloads in the reduce engine: exact error accounting, bit-identical results,
the coordinator's check unchanged, and bad payloads refused without harm."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
import reduce_kit
from reduce_kit import MEMBERS, RUN, TOTAL, WEIGHTS, N, path_and_tree, vectors

from crew.control.verify import CHECK_TOLERANCE, check_vector, project, relative_error
from crew.train.compress import Codec, CompressError, decode, encode, encode_bound
from crew.train.partcodec import ERR_HEADER, PartCodec
from crew.wire.frames import Frame, FrameKind

COMPRESSED = [Codec.FP16, Codec.INT8]


class Net(reduce_kit.Net):
    """The kit's engines, each with its own PartCodec of ``codec`` (none for Codec.NONE)."""

    def __init__(self, codec: Codec, check: np.ndarray, tamper=None) -> None:
        super().__init__(
            codec_for=lambda i: None if codec is Codec.NONE else PartCodec(codec, check),
            tamper=tamper,
        )


_assign = path_and_tree
_vectors = vectors


def _reported(net: Net, check: np.ndarray, m: int, group: int = 5) -> float:
    """What Node._have_all reports for member m."""
    result = net.engines[m].result(group)
    assert result is not None
    return project(check, result) - net.engines[m].codec_error(group)


@pytest.mark.parametrize("codec", COMPRESSED)
@pytest.mark.parametrize("pipelined", [True, False])
def test_compressed_reduce_keeps_the_exact_check(codec: Codec, pipelined: bool) -> None:
    check = check_vector(RUN, TOTAL)
    v = _vectors()
    net = Net(codec, check)
    net.run(_assign(pipelined), v)
    assert net.done >= set(MEMBERS)
    results = [net.engines[m].result(5) for m in MEMBERS]
    for r in results[1:]:  # relays forward bytes: every member holds the same bits
        assert np.array_equal(r, results[0])
    exact = sum(np.float32(w) * v[m] for m, w in zip(MEMBERS, WEIGHTS, strict=True))
    # Each element passes at most 3 encodes (leaf, relay 4, root); the bound is sub-additive.
    bound = 3 * sum(w * encode_bound(codec, v[m]) for m, w in zip(MEMBERS, WEIGHTS, strict=True))
    assert (np.abs(results[0].astype(np.float64) - exact) <= bound + 1e-6).all()
    offered = [project(check, v[m]) for m in MEMBERS]
    reported = [_reported(net, check, m) for m in MEMBERS]
    assert relative_error(reported, WEIGHTS, offered) < 1e-5  # float32 rounding only
    raw = [project(check, r) for r in results]
    if codec is Codec.INT8:  # without the accounting the int8 error would fail the check
        assert relative_error(raw, WEIGHTS, offered) > CHECK_TOLERANCE
    assert all(net.engines[i].dropped_frames == 0 for i in range(N))


@pytest.mark.parametrize("codec", COMPRESSED)
def test_error_feedback_residuals_keep_the_exact_check(codec: Codec) -> None:
    """A second group on the same engines: every encoding node now adds its residual from the
    first, and the check still holds exactly, because ``err`` accounts for what was sent."""
    check = check_vector(RUN, TOTAL)
    net = Net(codec, check)
    net.run(_assign(True, group=5), _vectors(3))
    residuals = [e._codec.residual() for e in net.engines]  # noqa: SLF001
    assert sum(float(np.abs(r).sum()) for r in residuals if r is not None) > 0
    v = _vectors(4)
    net.run(_assign(False, group=6), v)
    offered = [project(check, v[m]) for m in MEMBERS]
    reported = [_reported(net, check, m, group=6) for m in MEMBERS]
    assert relative_error(reported, WEIGHTS, offered) < 1e-5
    results = [net.engines[m].result(6) for m in MEMBERS]
    assert all(np.array_equal(r, results[0]) for r in results[1:])


def test_error_feedback_sends_what_rounding_took_over_later_encodes() -> None:
    """A weight on the int8 grid, moved by far less than half a step per round and re-encoded
    each round (the every-step case): plain rounding never moves it; with the residual, the
    sum of what was sent equals the sum asked for, less one residual of at most half a step."""
    check = check_vector(RUN, 512)
    base = np.linspace(-1.0, 1.0, 512, dtype=np.float32)  # int8 step about 1/255 = 3.9e-3
    nudge = np.full(512, 1e-4, np.float32)
    nudge[0::256] = nudge[255::256] = 0  # each block's min and max stay: its grid stays
    for feedback in (False, True):
        pc = PartCodec(Codec.INT8, check, error_feedback=feedback)
        model = decode(Codec.INT8, encode(Codec.INT8, base), 512)
        asked = np.zeros(512)
        sent = np.zeros(512)
        for _ in range(200):
            y = model + nudge  # one local step
            model = pc.encode(y, 0, 0.0)[1]  # what every member loads
            asked += y.astype(np.float64)
            sent += model.astype(np.float64)
        moved = float(np.median(model - base))
        if feedback:
            step = 2.0 / 255
            assert np.abs(sent - asked).max() <= step / 2 * (1 + 1e-3)
            assert moved == pytest.approx(200 * 1e-4, rel=0.3)
        else:
            assert moved < 0.1 * 200 * 1e-4  # the updates were rounded away


def test_error_feedback_refuses_non_finite_and_keeps_its_residual() -> None:
    check = check_vector(RUN, 300)
    pc = PartCodec(Codec.INT8, check)
    pc.encode(np.linspace(0, 1, 300, dtype=np.float32), 0, 0.0)
    before = pc.residual()
    bad = np.linspace(0, 1, 300, dtype=np.float32)
    bad[7] = np.inf
    with pytest.raises(CompressError, match="non-finite"):
        pc.encode(bad, 0, 0.0)
    assert np.array_equal(pc.residual(), before) and np.isfinite(before).all()
    assert PartCodec(Codec.INT8, check, error_feedback=False).residual() is None


def test_uncompressed_reduce_has_no_codec_error() -> None:
    check = check_vector(RUN, TOTAL)
    v = _vectors()
    net = Net(Codec.NONE, check)
    net.run(_assign(True), v)
    assert all(net.engines[m].codec_error(5) == 0.0 for m in MEMBERS)
    exact = sum(np.float32(w) * v[m] for m, w in zip(MEMBERS, WEIGHTS, strict=True))
    np.testing.assert_allclose(net.engines[0].result(5), exact, rtol=1e-5, atol=1e-6)


def _corrupt_values(frame: Frame) -> Frame:
    """A sender that encodes other values than it summed (a wrong part, honest err header)."""
    if frame.kind is FrameKind.SCATTER and frame.sender == 1 and frame.offset == 1000:
        err = frame.payload[: ERR_HEADER.size]
        n = 256
        body = encode(Codec.INT8, np.full(n, 3.0, dtype=np.float32))
        return dataclasses.replace(frame, payload=bytes(err) + body)
    return frame


def test_a_wrong_part_still_fails_the_check() -> None:
    check = check_vector(RUN, TOTAL)
    v = _vectors()
    net = Net(Codec.INT8, check, tamper=_corrupt_values)
    net.run(_assign(True), v)
    offered = [project(check, v[m]) for m in MEMBERS]
    reported = [_reported(net, check, m) for m in MEMBERS]
    assert relative_error(reported, WEIGHTS, offered) > CHECK_TOLERANCE


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00" * 7,  # shorter than the header
        ERR_HEADER.pack(0.0) + encode(Codec.INT8, np.zeros(255, np.float32)),  # one short
        ERR_HEADER.pack(float("nan")) + encode(Codec.INT8, np.zeros(256, np.float32)),
        ERR_HEADER.pack(0.0) + struct.pack("<ff", float("inf"), 1.0) + bytes(256),
        ERR_HEADER.pack(0.0) + struct.pack("<ff", 0.0, float("nan")) + bytes(256),
    ],
)
def test_bad_compressed_payloads_are_dropped_not_summed(payload: bytes) -> None:
    check = check_vector(RUN, TOTAL)
    net = Net(Codec.INT8, check)
    root = net.engines[3]
    root.assign(_assign(True), None)
    frame = Frame(
        kind=FrameKind.SCATTER,
        sender=1,
        run=RUN,
        group=5,
        rev=0,
        block=1,
        part=0,
        offset=1000,
        payload=payload,
    )
    root.on_frame(frame)
    assert root.dropped_frames == 1
    # The honest part from 1 is still taken afterwards (nothing was counted for it).
    good = PartCodec(Codec.INT8, check).encode(np.ones(256, np.float32), 1000, 0.0)[0]
    root.on_frame(dataclasses.replace(frame, payload=good))
    assert root.dropped_frames == 1


@pytest.mark.parametrize("codec", COMPRESSED)
def test_part_codec_carries_its_exact_error(codec: Codec) -> None:
    check = check_vector(RUN, TOTAL)
    pc = PartCodec(codec, check)
    x = np.random.default_rng(0).standard_normal(700).astype(np.float32)
    payload, decoded, err = pc.encode(x, 1200, 0.5)
    assert np.array_equal(decoded, decode(codec, payload[ERR_HEADER.size :], 700))
    expected = 0.5 + float(
        np.dot(check[1200:1900].astype(np.float64), decoded - x.astype(np.float64))
    )
    assert err == pytest.approx(expected, rel=1e-12)
    back, carried = pc.decode(payload, 1200, 700)
    assert np.array_equal(back, decoded) and carried == err
    # The next encode adds the residual; err is still against the values asked for.
    _, decoded2, err2 = pc.encode(x, 1200, 0.0)
    assert not np.array_equal(decoded2, decoded)
    expected2 = float(np.dot(check[1200:1900].astype(np.float64), decoded2 - x.astype(np.float64)))
    assert err2 == pytest.approx(expected2, rel=1e-12)
    with pytest.raises(CompressError, match="outside the vector"):
        pc.decode(payload, TOTAL - 10, 700)
    with pytest.raises(CompressError, match="non-finite"):
        pc.encode(np.array([np.nan] * 4, np.float32), 0, 0.0)
    with pytest.raises(CompressError):
        PartCodec(Codec.NONE, check)


def test_config_names_match_the_training_enums() -> None:
    from crew.config import COMPRESS, SYNC_MODES, WORKLOADS
    from crew.train.outer import SyncMode
    from crew.train.workloads import Workload

    assert tuple(c.value for c in Codec) == COMPRESS
    assert tuple(m.value for m in SyncMode) == SYNC_MODES
    assert tuple(w.value for w in Workload) == WORKLOADS


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"compress": "int4"}, "compress"),
        ({"compress": "int8", "nonblocking": True}, "compress"),
        ({"compress": "fp16", "scheme": "gloo"}, "compress"),
        ({"sync": "fedavg"}, "sync"),
        ({"workload": "cnn"}, "workload"),
        ({"local_steps": 8}, "local_steps"),  # every-step with H = 8
        ({"local_steps": 0, "sync": "local-sgd"}, "local_steps"),
        ({"sync": "diloco", "local_steps": 8, "outer_lr": 0.0}, "outer_lr"),
        ({"sync": "diloco", "local_steps": 8, "outer_momentum": 1.0}, "outer_momentum"),
    ],
)
def test_bad_training_settings_name_the_field(kw: dict, field: str) -> None:
    from crew.config import ConfigError
    from tests.lifecycle_kit import make_cfg

    with pytest.raises(ConfigError, match=f"^{field}:"):
        make_cfg(**kw)
    make_cfg(sync="diloco", local_steps=8, compress="int8", workload="lm")  # a good one
