"""Compressed update codecs for the wire: ``none`` (float32), ``fp16`` and ``int8`` (per block).

Pure NumPy, no torch. The engine calls :func:`encode` on a part before it sends it and
:func:`decode` on the bytes it receives; aggregators add decoded parts in float32 and encode the
sum again for the next hop or the broadcast (see "Aggregation" below).

Formats (all little-endian; ``n`` elements; :func:`encoded_size` is exact):

* ``none``: float32, ``4 n`` bytes. Bit-exact.
* ``fp16``: IEEE half, ``2 n`` bytes, round to nearest even.
* ``int8``: blocks of ``INT8_BLOCK`` = 256 elements (the last one may be short). Header first:
  per block a float32 ``lo`` (the block minimum) and a float32 ``step``; then one uint8 code
  per element, ``q = rint((x - lo) / step)`` clipped to 0..255; decoded ``lo + q * step``.
  ``step = (max - min) / 255``. Size ``n + 8 ceil(n / 256)`` bytes, 0.2578x of float32.

Why min/max per block of 256 (``python -m lab.studies.codecstudy``, the default MLP on digits
after 20 iterations of 8 local steps; relative L2 error of one encode of the 8-step
pseudo-gradient / of the model): min/max 256 7.2e-3 / 4.1e-3 at 1.031 bytes per element; min/max
64 5.5e-3 / 3.8e-3 at 1.125; min/max 1024 9.6e-3 / 4.4e-3 at 1.008; absmax/127 with 256 8.0e-3 /
4.3e-3 at 1.016; clipping at mu +- 3 sigma 7.5e-2 / 4.4e-3 and at mu +- 4 sigma 2.7e-2 / 4.1e-3.
The asymmetric min/max grid uses all 256 codes, has a hard error bound, and codes all-equal and
all-zero blocks exactly (``step = 0``). Clipping shrinks the step but turns the outliers, which
in pseudo-gradients are the largest updates, into large errors (10x worse above) that no bound
covers. Blocks of 256 keep the header at 3% (0.258x of float32, under the 0.27x target with
frame headers); blocks of 64 cut the error by a quarter for 9% more bytes.

Error feedback is not done here: these functions are stateless. The reduce engine's codec
(:class:`crew.train.partcodec.PartCodec`) keeps each node's residual and adds it to the node's
next encode; its docstring says why (models on the wire, small updates rounded away) and how it
stays exact under verification.

Error bounds (derived, for verification). One encode of a vector ``y`` changes element ``i`` by
at most ``A(y)_i + c``, where ``A`` is elementwise *sub-additive and positively homogeneous*,
``A(sum_m w_m v_m) <= sum_m w_m A(v_m)`` for ``w_m >= 0``:

* ``none``: ``A = 0, c = 0``.
* ``fp16``: ``A(y)_i = 2^-11 |y_i|`` (half a unit in the last place of an 11-bit significand),
  ``c = 2^-25`` (half the subnormal spacing 2^-24, for ``|y_i| < 2^-14``). ``|y_i| > 65504``
  (the largest half) is refused with :class:`CompressError`, never turned into inf.
* ``int8``: ``A(y)_i = (1 + 2^-12) R_b / 510 + 2^-23 M_b`` for ``i`` in block ``b``, with
  ``R_b = max - min`` and ``M_b = max |y|`` over the block (both sub-additive), and
  ``c = 2^-142``. Derivation, with ``s = R_b / 255`` the exact step and ``s32`` the stored one:
  float32 rounding gives ``|s32 - s| <= 2^-24 s + 2^-150`` (relative for a normal step, half the
  subnormal spacing 2^-149 for a subnormal one, which a block of range below about 3e-36
  has). An unclipped code is within ``s32 / 2`` of its value; a code clipped at 255 (when
  ``s32 < s``) within ``255 (s - s32)``; either way within ``s / 2 + 255 |s32 - s|
  <= (1 + 2^-12) s / 2 + 255 * 2^-150``. A step that underflows to 0 codes every element as
  ``lo``, off by at most ``R_b = 255 s < 255 * 2^-150``. The final cast of ``lo + q s32`` to
  float32 adds ``2^-24 (M_b + s32) <= 2^-23 M_b`` for a normal result, or ``2^-150`` for a
  subnormal one. So ``c = 256 * 2^-150 = 2^-142``. Encoding works in float64 so nothing else
  rounds. (Hypothesis found the subnormal case: ``[1e-45, 0]`` has a step that underflows.)

A reduce tree sums member vectors ``w_m v_m``; a member's values pass ``h_m`` encodes on the way
up (its own at the leaf and one per aggregator above it that is not the root; ``h_m = 0`` for
the root's own vector) and one at the root for the broadcast, which relays bytes unchanged.
Every encode adds at most ``A(partial sum) + c``, so the result differs from the float32 sum by
``e_i <= sum_m w_m (h_m + 1) A(v_m)_i + E c``, ``E`` the number of encodes (at most members + 1).
Verification compares projections ``r . v`` with ``r`` a standard normal vector drawn
independently of the data, so ``r . e`` is normal with standard deviation ``||e||_2``; with a
z-score ``Z = 6`` (a false alarm below 2e-9 per check),

    |r . result - sum_m w_m r . v_m| <= Z (sum_m w_m (h_m + 1) B_m + E c sqrt(n))

with ``B_m = ||A(v_m)||_2`` (:func:`error_norm`), which each member computes from its own
vector and reports beside its projection; :func:`reduce_tolerance` adds it up. A worst-case
``sum |r_i| e_i`` bound would be about sqrt(n) times looser.

That bound needs nothing from aggregators, but for int8 it is about as large as the projection
of a missing 1 MB part (half a step is the worst case, the typical error is 1/sqrt(3) of it,
and every encode on the path counts in full), so it cannot tell a lost part from rounding.
Exact accounting can: whoever encodes ``y`` knows its own error exactly, so
:func:`encode_with_error` returns ``r . (decode(encode(y)) - y)`` with the bytes. Every
encoding node adds these up and passes the sum on inside the payload
(:mod:`crew.train.partcodec`), so ``r . result = sum_m w_m r . v_m + sum_E delta_E`` up to float32
rounding; members report ``r . result - sum_E delta_E`` and the existing relative check
(``crew.control.verify``) applies unchanged.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "INT8_BLOCK",
    "VERIFY_Z",
    "Codec",
    "CompressError",
    "decode",
    "encode",
    "encode_bound",
    "encode_with_error",
    "encoded_size",
    "error_norm",
    "reduce_tolerance",
]

INT8_BLOCK = 256
INT8_LEVELS = 255  # codes 0..255
FP16_MAX = 65504.0
FP16_REL = 2.0**-11
FP16_ABS = 2.0**-25
INT8_STEP_SLACK = 1.0 + 2.0**-12
INT8_CAST_REL = 2.0**-23
INT8_ABS = 2.0**-142  # subnormal steps and results, see the docstring
VERIFY_Z = 6.0

_F32 = np.dtype("<f4")
_F16 = np.dtype("<f2")
_HEADER = np.dtype([("lo", "<f4"), ("step", "<f4")])


class Codec(enum.Enum):
    """How a part travels on the wire."""

    NONE = "none"
    FP16 = "fp16"
    INT8 = "int8"


class CompressError(ValueError):
    """A part cannot be encoded (NaN, inf, fp16 overflow) or bytes cannot be decoded."""


def _blocks(n: int) -> int:
    return -(-n // INT8_BLOCK)


def encoded_size(codec: Codec, n: int) -> int:
    """Exact byte size of ``n`` encoded elements."""
    if n < 0:
        raise CompressError(f"element count must be >= 0, got {n}")
    if codec is Codec.NONE:
        return 4 * n
    if codec is Codec.FP16:
        return 2 * n
    return n + _HEADER.itemsize * _blocks(n)


def _check_part(part: np.ndarray) -> np.ndarray:
    if not isinstance(part, np.ndarray) or part.ndim != 1:
        raise CompressError(f"a part must be a 1-D ndarray, got {type(part).__name__}")
    if part.dtype != np.float32:
        raise CompressError(f"a part must be float32, got {part.dtype}")
    finite = np.isfinite(part)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise CompressError(
            f"part has {bad.size} non-finite values (first at element {int(bad[0])}: "
            f"{part[bad[0]]}); refusing to encode"
        )
    return part


def encode(codec: Codec, part: np.ndarray) -> bytes:
    """Encode a float32 part. Raises CompressError on NaN, inf or (fp16) ``|x| > 65504``."""
    x = _check_part(part)
    if codec is Codec.NONE:
        return x.astype(_F32, copy=False).tobytes()
    if codec is Codec.FP16:
        big = np.abs(x) > FP16_MAX
        if big.any():
            i = int(np.flatnonzero(big)[0])
            raise CompressError(f"fp16 overflow: element {i} is {x[i]}, beyond +-{FP16_MAX}")
        return x.astype(_F16).tobytes()
    return _encode_int8(x)


def _encode_int8(x: np.ndarray) -> bytes:
    n = x.size
    nb = _blocks(n)
    padded = np.empty(nb * INT8_BLOCK, dtype=np.float64)
    padded[:n] = x
    if n:
        # The short last block is padded with its own first value: no effect on min and max.
        padded[n:] = x[(nb - 1) * INT8_BLOCK]
    blocks = padded.reshape(nb, INT8_BLOCK)
    lo = blocks.min(axis=1)
    step32 = ((blocks.max(axis=1) - lo) / INT8_LEVELS).astype(np.float32)
    step = step32.astype(np.float64)
    safe = np.where(step > 0, step, 1.0)  # step 0: all-equal block, every code is 0
    q = np.rint((blocks - lo[:, None]) / safe[:, None])
    q = np.clip(q, 0, INT8_LEVELS).astype(np.uint8)
    header = np.empty(nb, dtype=_HEADER)
    header["lo"] = lo  # exact: lo is one of the float32 inputs
    header["step"] = step32
    return header.tobytes() + q.reshape(-1)[:n].tobytes()


def decode(codec: Codec, data: bytes | bytearray | memoryview, n: int) -> np.ndarray:
    """Decode ``n`` elements to a new float32 array. Raises CompressError on a size mismatch
    or a header that is not finite."""
    buf = memoryview(data).cast("B")
    want = encoded_size(codec, n)
    if buf.nbytes != want:
        raise CompressError(f"{codec.value}: {n} elements need {want} bytes, got {buf.nbytes}")
    if codec is Codec.NONE:
        out = np.frombuffer(buf, dtype=_F32).copy()
    elif codec is Codec.FP16:
        out = np.frombuffer(buf, dtype=_F16).astype(np.float32)
    else:
        nb = _blocks(n)
        hsize = nb * _HEADER.itemsize
        header = np.frombuffer(buf[:hsize], dtype=_HEADER)
        q = np.frombuffer(buf[hsize:], dtype=np.uint8)
        lo = header["lo"].astype(np.float64)
        step = header["step"].astype(np.float64)
        if not (np.isfinite(lo).all() and np.isfinite(step).all() and (step >= 0).all()):
            raise CompressError("int8: a block header is not finite or has a negative step")
        idx = np.arange(n) // INT8_BLOCK
        out = (lo[idx] + q * step[idx]).astype(np.float32)
    if not np.isfinite(out).all():  # fp16 inf/NaN bit patterns, or an int8 sum that overflows
        raise CompressError(f"{codec.value}: decoded values are not all finite")
    return out


def encode_bound(codec: Codec, part: np.ndarray) -> np.ndarray:
    """Per-element bound ``A(part) + c`` on ``|decode(encode(part)) - part|`` (float64).

    ``A`` is sub-additive (see the module docstring), so it also bounds the encode of a sum.
    """
    x = np.asarray(_check_part(part), dtype=np.float64)
    if codec is Codec.NONE:
        return np.zeros_like(x)
    if codec is Codec.FP16:
        return FP16_REL * np.abs(x) + FP16_ABS
    n = x.size
    out = np.empty(n, dtype=np.float64)
    for start in range(0, n, INT8_BLOCK):
        b = x[start : start + INT8_BLOCK]
        rng = float(b.max() - b.min())
        out[start : start + INT8_BLOCK] = (
            INT8_STEP_SLACK * rng / (2 * INT8_LEVELS)
            + INT8_CAST_REL * float(np.abs(b).max())
            + INT8_ABS
        )
    return out


def _abs_term(codec: Codec) -> float:
    """``c``: the part of one encode's bound that does not scale with the values."""
    return {Codec.NONE: 0.0, Codec.FP16: FP16_ABS, Codec.INT8: INT8_ABS}[codec]


def _sub_additive_part(codec: Codec, part: np.ndarray) -> np.ndarray:
    """``A(part)``: the bound without the constant ``c``."""
    return encode_bound(codec, part) - _abs_term(codec)


def error_norm(codec: Codec, vector: np.ndarray) -> float:
    """``B = ||A(vector)||_2``: what a member reports beside its projection (see the docstring).

    Blocks follow the vector's own element offsets, so the engine's parts (multiples of 256
    elements long, as the lab's are) see the same blocks. A weight ``w`` scales it by ``w``.
    """
    return float(np.linalg.norm(_sub_additive_part(codec, vector)))


def reduce_tolerance(
    codec: Codec,
    error_norms: Sequence[float],
    weights: Sequence[float],
    hops: Sequence[int],
    n: int,
    z: float = VERIFY_Z,
) -> float:
    """Absolute tolerance on ``|r . result - sum_m w_m r . v_m|`` for one group's result.

    ``error_norms``: each member's :func:`error_norm`; ``hops``: encodes its vector passes
    before the root's sum (0 for the root's own vector, 1 for a leaf of a star, the depth in a
    tree). ``n``: elements. Add this to the float32 tolerance verification already uses.
    """
    if codec is Codec.NONE:
        return 0.0
    if not len(error_norms) == len(weights) == len(hops):
        raise CompressError("error_norms, weights and hops must have one entry per member")
    if any(h < 0 for h in hops) or any(w < 0 for w in weights):
        raise CompressError("hops and weights must be >= 0")
    encodes = len(error_norms) + 1
    c = _abs_term(codec)
    body = math.fsum(w * (h + 1) * b for b, w, h in zip(error_norms, weights, hops, strict=True))
    return z * (body + encodes * c * math.sqrt(n))


def encode_with_error(codec: Codec, check: np.ndarray, part: np.ndarray) -> tuple[bytes, float]:
    """``(encode(part), r . (decode(encode(part)) - part))`` with ``r = check`` (the check
    vector's slice for this part): the projection of this encode's error, for exact accounting.
    """
    data = encode(codec, part)
    if codec is Codec.NONE:
        return data, 0.0
    err = decode(codec, data, part.size).astype(np.float64) - part.astype(np.float64)
    return data, float(np.dot(np.asarray(check, dtype=np.float64), err))


def add_encoded(codec: Codec, parts: Sequence[bytes], weights: Sequence[float], n: int) -> bytes:
    """What an aggregator does: decode each part, add ``w * part`` in float32, encode the sum."""
    total = np.zeros(n, dtype=np.float32)
    for data, w in zip(parts, weights, strict=True):
        total += np.float32(w) * decode(codec, data, n)
    return encode(codec, total)
