"""Checking every group's result without shipping models to the coordinator.

Averaging is linear, so for any fixed vector r, ``r · Σ w_m v_m = Σ w_m (r · v_m)``. Each
worker reports ``r · v`` of the vector it offers when ready, and ``r · result`` of what the
group gave it back; the coordinator compares the second with the weighted sum of the first.
A wrong, missing or doubly counted part shifts the projection far beyond float32 rounding, so
every completed group of every scheme is checked in every run, faults included.

r is drawn from the run number, so all workers and the coordinator agree on it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CHECK_TOLERANCE = 1e-3  # relative; float32 sums of ~1e6 terms stay well below 1e-5


def check_vector(run_num: int, size: int) -> np.ndarray:
    return np.random.default_rng(run_num).standard_normal(size).astype(np.float32)


def project(check: np.ndarray, vector: np.ndarray) -> float:
    return float(np.dot(check.astype(np.float64), vector.astype(np.float64)))


def relative_error(
    result_projs: Sequence[float], weights: Sequence[float], member_projs: Sequence[float]
) -> float:
    """Worst relative deviation of the members' result projections from the expected one."""
    expected = sum(w * p for w, p in zip(weights, member_projs, strict=True))
    scale = sum(abs(w * p) for w, p in zip(weights, member_projs, strict=True)) + 1e-9
    return max(abs(p - expected) for p in result_projs) / scale
