"""Whole elements from real shares: no element lost or duplicated. Pure, no I/O."""

from __future__ import annotations

import numpy as np

from crew.plan.inputs import PlanError, is_int


def largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
    """Round non-negative ``shares`` (any scale) to ints summing exactly to ``total``.

    Each worker gets the floor of its proportional quota; the elements left over go one each to
    the largest fractional parts (ties to the lower index). So no element is lost or duplicated,
    and a zero share stays zero.
    """
    q = np.asarray(shares, dtype=float)
    if q.ndim != 1 or not np.all(np.isfinite(q)) or np.any(q < 0):
        raise PlanError("shares", "must be a 1-D array of finite non-negative numbers")
    if not is_int(total) or total < 0:
        raise PlanError("total", f"must be a non-negative int, got {total!r}")
    out = np.zeros(q.shape, dtype=np.int64)
    if total == 0:
        return out
    positive = q > 0
    if not positive.any():
        raise PlanError("shares", "are all zero but total > 0")
    quota = q / q.sum() * total
    out[:] = np.floor(quota)
    frac = quota - out
    short = int(total - out.sum())
    order = np.argsort(-frac, kind="stable")
    order = order[positive[order]]
    if short > 0:
        # Float error can leave more elements than positive shares; spread them round-robin.
        for k in range(short):
            out[order[k % len(order)]] += 1
    elif short < 0:
        for k in order[::-1][:-short]:
            out[k] -= 1  # quota sums were a hair above total
    if out.sum() != total or np.any(out < 0):
        raise AssertionError(f"largest_remainder lost elements: {out} vs {total}")
    return out
