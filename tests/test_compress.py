"""Wire codecs: round trips, derived error bounds, refusals, and aggregation of encoded parts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from crew.train.compress import (
    FP16_MAX,
    INT8_BLOCK,
    Codec,
    CompressError,
    add_encoded,
    decode,
    encode,
    encode_bound,
    encode_with_error,
    encoded_size,
    error_norm,
    reduce_tolerance,
)

FINITE = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)
PARTS = arrays(np.float32, st.integers(0, 3 * INT8_BLOCK + 7), elements=FINITE)


@pytest.mark.parametrize("codec", list(Codec))
@given(part=PARTS)
@example(part=np.array([1e-45, 0.0], dtype=np.float32))  # int8 step underflows to 0
@example(part=np.array([3e-38, -3e-38, 1e-40], dtype=np.float32))  # subnormal step
@settings(max_examples=60, deadline=None)
def test_round_trip_within_bound_and_exact_size(codec: Codec, part: np.ndarray) -> None:
    data = encode(codec, part)
    assert len(data) == encoded_size(codec, part.size)
    out = decode(codec, data, part.size)
    assert out.dtype == np.float32 and out.shape == part.shape
    err = np.abs(out.astype(np.float64) - part.astype(np.float64))
    assert (err <= encode_bound(codec, part)).all()
    if codec is Codec.NONE:
        assert np.array_equal(out, part)


def test_sizes() -> None:
    assert encoded_size(Codec.NONE, 1000) == 4000
    assert encoded_size(Codec.FP16, 1000) == 2000
    assert encoded_size(Codec.INT8, 256) == 256 + 8
    assert encoded_size(Codec.INT8, 257) == 257 + 16
    n = 868_490
    assert encoded_size(Codec.INT8, n) / encoded_size(Codec.NONE, n) < 0.26


def test_int8_uses_the_full_grid_on_a_ramp() -> None:
    x = np.random.default_rng(0).uniform(-1, 3, INT8_BLOCK).astype(np.float32)
    x[:2] = [-1, 3]
    err = np.abs(decode(Codec.INT8, encode(Codec.INT8, x), x.size) - x)
    assert err.max() <= 4 / 510 * 1.001
    assert err.max() > 4 / 510 * 0.5  # the bound is not vacuous: half a step is reached


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("value", [0.0, -0.0, 1.5, -3.25e-3, 1e-30])
def test_all_equal_and_zero_parts_are_exact(codec: Codec, value: float) -> None:
    x = np.full(INT8_BLOCK + 3, value, dtype=np.float32)
    out = decode(codec, encode(codec, x), x.size)
    if codec is Codec.FP16 and value == 1e-30:  # below the smallest half: rounds to 0
        assert (out == 0).all()
    elif codec is Codec.FP16 and value == -3.25e-3:
        assert np.abs(out - x).max() <= 2**-11 * abs(value)
    else:
        assert np.array_equal(out, x)


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_parts_are_refused(codec: Codec, bad: float) -> None:
    x = np.ones(10, dtype=np.float32)
    x[7] = bad
    before = x.copy()
    with pytest.raises(CompressError, match="non-finite.*element 7"):
        encode(codec, x)
    assert np.array_equal(x, before, equal_nan=True)  # the caller's part is untouched


def test_fp16_overflow_is_refused_not_inf() -> None:
    x = np.array([1.0, FP16_MAX * 1.01], dtype=np.float32)
    with pytest.raises(CompressError, match="fp16 overflow: element 1"):
        encode(Codec.FP16, x)
    assert decode(Codec.FP16, encode(Codec.FP16, np.float32([FP16_MAX])), 1)[0] == FP16_MAX


def test_wrong_sizes_dtype_and_bad_headers_are_refused() -> None:
    x = np.arange(300, dtype=np.float32)
    with pytest.raises(CompressError, match="need"):
        decode(Codec.INT8, encode(Codec.INT8, x), 299)
    with pytest.raises(CompressError, match="float32"):
        encode(Codec.INT8, x.astype(np.float64))
    with pytest.raises(CompressError, match="not all finite"):
        decode(Codec.FP16, np.float16([np.inf]).tobytes(), 1)
    data = bytearray(encode(Codec.INT8, x))
    data[0:4] = np.float32(np.nan).tobytes()  # first block's lo
    with pytest.raises(CompressError, match="header"):
        decode(Codec.INT8, bytes(data), 300)


@pytest.mark.parametrize("codec", [Codec.FP16, Codec.INT8])
@given(
    parts=st.lists(arrays(np.float32, 2 * INT8_BLOCK, elements=FINITE), min_size=2, max_size=4),
    data=st.data(),
)
@settings(max_examples=40, deadline=None)
def test_aggregated_encoded_parts_within_tree_bound(codec: Codec, parts, data) -> None:
    """Two-level tree: leaves encode, an aggregator adds and re-encodes, the root re-encodes
    for the broadcast. The error stays within sum_m w_m (h_m + 1) A(v_m) + E c per element."""
    raw = data.draw(st.lists(st.floats(0.05, 1), min_size=len(parts), max_size=len(parts)))
    w = [x / sum(raw) for x in raw]
    n = parts[0].size
    exact = sum(np.float64(wi) * p.astype(np.float64) for wi, p in zip(w, parts, strict=True))
    # parts[0] is the root's own vector (h = 0); parts[1:] go through one inner aggregator
    # (leaf encode + aggregator encode: h = 2); the root adds them and encodes the broadcast.
    weighted = [np.float32(wi) * p for wi, p in zip(w, parts, strict=True)]
    inner = add_encoded(codec, [encode(codec, p) for p in weighted[1:]], [1.0] * len(parts[1:]), n)
    root_sum = weighted[0] + decode(codec, inner, n)
    result = decode(codec, encode(codec, root_sum), n)
    hops = [0] + [2] * (len(parts) - 1)
    c = 2.0**-25 if codec is Codec.FP16 else 0.0
    a = [encode_bound(codec, p) - c for p in parts]
    bound = sum(wi * (h + 1) * ai for wi, h, ai in zip(w, hops, a, strict=True))
    bound = bound + (len(parts) + 1) * c + 1e-6 * np.abs(exact) + 1e-30  # + float32 adds
    assert (np.abs(result - exact) <= bound).all()


@pytest.mark.parametrize("codec", [Codec.FP16, Codec.INT8])
def test_projection_tolerance_holds_and_catches_a_missing_part(codec: Codec) -> None:
    """The member-only statistical bound holds; for fp16 it is far below the projection's
    standard deviation of a lost 1/8 of a member's vector, so a loss is caught (int8: see
    the exact-accounting test)."""
    rng = np.random.default_rng(3)
    n, members = 64 * INT8_BLOCK, 4
    vs = [(rng.standard_normal(n) * 0.02).astype(np.float32) for _ in range(members)]
    w = [1 / members] * members
    r = np.random.default_rng(99).standard_normal(n).astype(np.float32)
    # A star: members 1..3 are leaves (h=1), member 0 is the root (h=0).
    weighted = [np.float32(wi) * v for wi, v in zip(w, vs, strict=True)]
    total = weighted[0] + decode(
        codec, add_encoded(codec, [encode(codec, x) for x in weighted[1:]], [1, 1, 1], n), n
    )
    result = decode(codec, encode(codec, total), n)
    expected = sum(wi * float(r.astype(np.float64) @ v) for wi, v in zip(w, vs, strict=True))
    tol = reduce_tolerance(codec, [error_norm(codec, v) for v in vs], w, [0, 1, 1, 1], n)
    assert abs(float(r.astype(np.float64) @ result) - expected) <= tol
    if codec is Codec.FP16:
        assert tol < 0.1 * float(np.linalg.norm(weighted[3][: n // 8]))


@pytest.mark.parametrize("codec", list(Codec))
def test_exact_accounting_of_encode_errors_restores_the_exact_check(codec: Codec) -> None:
    """Every encoder reports r . (its decode - its input); with those added, the projection of
    the result matches to float32 rounding, and a lost 1/8 of a member's vector is caught."""
    rng = np.random.default_rng(4)
    n, members = 64 * INT8_BLOCK, 4
    vs = [(rng.standard_normal(n) * 0.02).astype(np.float32) for _ in range(members)]
    w = [np.float32(1 / members)] * members
    r = np.random.default_rng(7).standard_normal(n).astype(np.float32)
    r64 = r.astype(np.float64)

    def reduce(drop: bool) -> tuple[np.ndarray, float]:
        deltas = 0.0
        total = w[0] * vs[0]
        for m in range(1, members):
            y = w[m] * vs[m]
            data, d = encode_with_error(codec, r, y)
            deltas += d
            part = decode(codec, data, n)
            if drop and m == 3:
                part[: n // 8] = 0  # the aggregator loses member 3's first eighth
            total = total + part
        data, d = encode_with_error(codec, r, total)
        return decode(codec, data, n), deltas + d

    expected = sum(float(wi) * float(r64 @ v) for wi, v in zip(w, vs, strict=True))
    scale = sum(abs(float(wi) * float(r64 @ v)) for wi, v in zip(w, vs, strict=True))
    result, deltas = reduce(drop=False)
    assert abs(float(r64 @ result) - expected - deltas) <= 1e-5 * scale
    result, deltas = reduce(drop=True)
    lost = abs(float(r64[: n // 8] @ (w[3] * vs[3][: n // 8])))
    assert abs(float(r64 @ result) - expected - deltas) == pytest.approx(lost, rel=0.05)
    assert lost > 100 * 1e-5 * scale  # and so far outside the float32 tolerance


def test_reduce_tolerance_is_zero_for_none_and_checks_lengths() -> None:
    assert reduce_tolerance(Codec.NONE, [1.0], [1.0], [0], 10) == 0.0
    with pytest.raises(CompressError, match="one entry per member"):
        reduce_tolerance(Codec.INT8, [1.0, 2.0], [1.0], [0], 10)
