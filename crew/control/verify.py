"""Checking every group's result without shipping models to the coordinator.

Averaging is linear, so for any fixed vector r, ``r · Σ w_m v_m = Σ w_m (r · v_m)``. Each
worker reports ``r · v`` of the vector it offers when ready, and ``r · result`` of what the
group gave it back; the coordinator compares the second with the weighted sum of the first.
A wrong, missing or doubly counted part shifts the projection far beyond float32 rounding, so
every completed group of every scheme is checked in every run, faults included.

r is drawn from the run number, so all workers and the coordinator agree on it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

CHECK_TOLERANCE = 1e-3  # relative; float32 sums of ~1e6 terms stay well below 1e-5


def check_vector(run_num: int, size: int) -> np.ndarray:
    return np.random.default_rng(run_num).standard_normal(size).astype(np.float32)


PROJECT_CHUNK = 1 << 14
"""Elements converted to float64 at a time by :func:`project`. Converting whole vectors made two
fresh float64 copies per call (16 MB each for an 8 MB model), whose page faults and memory
traffic cost 2x the dot product alone; two 128 KiB buffers stay in cache."""


def project(check: np.ndarray, vector: np.ndarray) -> float:
    """``check · vector`` summed in float64 (float32 sums of ~1e6 terms would not hold
    ``CHECK_TOLERANCE``). Cost: one pass over both, ``PROJECT_CHUNK`` elements at a time."""
    if check.shape != vector.shape:
        raise ValueError(f"check vector has shape {check.shape}, the vector {vector.shape}")
    size = vector.size
    chunk = max(1, min(PROJECT_CHUNK, size))
    c64 = np.empty(chunk, dtype=np.float64)
    v64 = np.empty(chunk, dtype=np.float64)
    total = 0.0
    for start in range(0, size, chunk):
        m = min(chunk, size - start)
        np.copyto(c64[:m], check[start : start + m])
        np.copyto(v64[:m], vector[start : start + m])
        total += float(np.dot(c64[:m], v64[:m]))
    return total


def relative_error(
    result_projs: Sequence[float], weights: Sequence[float], member_projs: Sequence[float]
) -> float:
    """Worst relative deviation of the members' result projections from the expected one."""
    expected = sum(w * p for w, p in zip(weights, member_projs, strict=True))
    scale = sum(abs(w * p) for w, p in zip(weights, member_projs, strict=True)) + 1e-9
    return max(abs(p - expected) for p in result_projs) / scale


def agreement_error(
    result_projs: Sequence[float], weights: Sequence[float], member_projs: Sequence[float]
) -> float:
    """Worst relative deviation of the members' result projections from each other, on the
    scale of :func:`relative_error`: a clipped result (``crew.control.clipping``) is no linear
    combination of the offered vectors, but every member must hold the same one."""
    scale = sum(abs(w * p) for w, p in zip(weights, member_projs, strict=True)) + 1e-9
    if not all(math.isfinite(p) for p in result_projs):
        return math.nan  # max and min would skip a NaN
    return (max(result_projs) - min(result_projs)) / scale


CHUNK = 1 << 16
"""Elements of a secret check vector ``r_g`` (``crew.control.secretcheck``) drawn at a time:
three float64 buffers of 512 KiB stay in cache, and the generator's per-call overhead is spread
over enough elements (64 Ki: 70 ms per 2 M elements on the lab's host, 16 Ki: 120 ms)."""


def check_chunks(run_num: int, nonce: int, size: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, r_g[start : start + len(chunk)])`` over ``size`` elements: ``r_g`` standard
    normal drawn from ``(run_num, nonce)``, :data:`CHUNK` elements at a time into one buffer,
    which the next chunk overwrites (use each before asking for the next)."""
    rng = np.random.default_rng([run_num, nonce])
    chunk = max(1, min(CHUNK, size))
    r = np.empty(chunk)
    for start in range(0, size, chunk):
        m = min(chunk, size - start)
        rng.standard_normal(out=r[:m])
        yield start, r[:m]
