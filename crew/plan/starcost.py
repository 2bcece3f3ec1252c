"""What a star split costs: phase times, per-link loads, the capacity groups in flight leave,
and capacities improved by one relay hop. Pure, no I/O.

A *star split* gives worker i the ``elems[i]`` elements it aggregates (S_i bytes): every member
sends its copy of them to i (scatter) and i sends the sum back to every member (broadcast).
Inputs follow :mod:`crew.plan.inputs`. Two cost models price it, both ignoring latency and
aggregation time and treating every directed link as an independent pipe of rate ``bw[j][k]``:

* phased (:func:`phased_cost`): scatter, then broadcast; X = max_i S_i / a_i and
  Y = max_i S_i / b_i with a_i, b_i the slowest link into i from the group and out of i to it
  (:func:`group_rates`); T = X + Y;
* pipelined (:func:`pipelined_cost`): parts stream, so T = max over links of load / rate
  (:func:`load_matrices`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from crew.plan.inputs import (
    BYTES_PER_S_PER_MBIT,
    ELEM_BYTES,
    PlanError,
    check_bw,
    check_group,
)
from crew.plan.plantypes import Plan

DEFAULT_FLOOR_MBIT = 1e-3
"""Residual capacity left on a live link that is fully committed (see residual_capacity)."""


def group_rates(w: np.ndarray, members: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """a_i = min_g bw[g][i] (slowest link in from the group), b_i = min_g bw[i][g] (out)."""
    rows = w[list(members), :]
    cols = w[:, list(members)]
    return rows.min(axis=0), cols.min(axis=1)


def member_mask(n: int, members: Sequence[int]) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    mask[list(members)] = True
    return mask


def phased_cost(
    bw: np.ndarray, group: Sequence[int], elems: Sequence[int], elem_bytes: int = ELEM_BYTES
) -> tuple[float, float]:
    """(X, Y) in seconds for a phased scatter-then-broadcast with this split on ``group``.

    Cost model: every member sends its copy of worker i's S_i bytes to i over its own link, all
    links in parallel and independent (one shaped point-to-point link per pair, no shared NIC),
    so i's scatter ends after ``S_i / a_i``; X is the slowest over aggregators. Broadcast
    likewise ends after ``Y = max_i S_i / b_i``. The phases are back to back: T = X + Y. Latency
    and aggregation time are ignored. An aggregator with a dead link to or from a member gives
    ``inf``. Useful to price a fixed split (e.g. the a2a one) on a group.
    """
    w = check_bw(bw)
    members = check_group(group, w.shape[0])
    e = np.asarray(elems, dtype=float)
    if e.shape != (w.shape[0],) or np.any(e < 0):
        raise PlanError("elems", f"need {w.shape[0]} non-negative counts")
    a, b = group_rates(w, members)
    return phase_times(e * elem_bytes, a, b)


def phase_times(nbytes: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    used = nbytes > 0
    if not used.any():
        return 0.0, 0.0
    with np.errstate(divide="ignore"):
        x = nbytes[used] / (a[used] * BYTES_PER_S_PER_MBIT)
        y = nbytes[used] / (b[used] * BYTES_PER_S_PER_MBIT)
    return float(x.max()), float(y.max())


def load_matrices(members_mask: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scatter, broadcast) bytes per directed link j -> k."""
    scatter = np.outer(members_mask, nbytes).astype(float)  # member j sends S_k to k
    broadcast = np.outer(nbytes, members_mask).astype(float)  # aggregator j sends S_j to member k
    np.fill_diagonal(scatter, 0.0)
    np.fill_diagonal(broadcast, 0.0)
    return scatter, broadcast


def link_time(load: np.ndarray, w: np.ndarray) -> float:
    used = load > 0
    if not used.any():
        return 0.0
    with np.errstate(divide="ignore"):
        return float((load[used] / (w[used] * BYTES_PER_S_PER_MBIT)).max())


def pipelined_cost(
    bw: np.ndarray, group: Sequence[int], elems: Sequence[int], elem_bytes: int = ELEM_BYTES
) -> tuple[float, float, float]:
    """(scatter-only, broadcast-only, T) link times in seconds for a streamed split.

    See :func:`solve_pipelined` for the model: T = max over links of load / rate.
    """
    w = check_bw(bw)
    members = check_group(group, w.shape[0])
    e = np.asarray(elems, dtype=float)
    if e.shape != (w.shape[0],) or np.any(e < 0):
        raise PlanError("elems", f"need {w.shape[0]} non-negative counts")
    scatter, broadcast = load_matrices(member_mask(w.shape[0], members), e * elem_bytes)
    return link_time(scatter, w), link_time(broadcast, w), link_time(scatter + broadcast, w)


def link_load(plan: Plan, group: Sequence[int] | None = None) -> np.ndarray:
    """n x n bytes each directed link carries under ``plan`` (scatter + broadcast).

    Link j -> k carries S_k if j is a member (scatter) plus S_j if k is a member (broadcast),
    j != k. ``group`` defaults to ``plan.group``. For a non-blocking plan this is the whole
    transfer, including the bytes already sent under a2a.
    """
    members = plan.group if group is None else check_group(group, plan.n)
    nbytes = np.asarray(plan.elems, dtype=float) * plan.elem_bytes
    scatter, broadcast = load_matrices(member_mask(plan.n, members), nbytes)
    return scatter + broadcast


def residual_capacity(
    bw: np.ndarray,
    committed: np.ndarray,
    horizon_s: float,
    floor_mbit: float = DEFAULT_FLOOR_MBIT,
) -> np.ndarray:
    """Capacity (Mbit/s) left for a new group after the groups already in flight.

    ``committed[j][k]`` is the bytes link j -> k still has to carry for groups in flight (e.g. the
    sum of :func:`link_load` minus what has been delivered). Spreading them evenly over the next
    ``horizon_s`` seconds uses ``committed * 8 / 1e6 / horizon_s`` Mbit/s, which is subtracted.
    A live link is never planned as dead: with FCFS sending, a saturated link still serves the
    new group after the backlog, so it keeps ``min(bw, floor_mbit)`` and the LP steers load away
    from it instead of failing. Dead links stay 0; the diagonal stays ``inf``. This is a planning
    heuristic, not a bound.
    """
    w = check_bw(bw)
    used = np.array(committed, dtype=float)
    if used.shape != w.shape:
        raise PlanError("committed", f"must have shape {w.shape}, got {used.shape}")
    if not np.all(np.isfinite(used)) or np.any(used < 0):
        raise PlanError("committed", "must be finite and non-negative")
    if not isinstance(horizon_s, int | float) or not math.isfinite(horizon_s) or horizon_s <= 0:
        raise PlanError("horizon_s", f"must be a positive number of seconds, got {horizon_s!r}")
    if not isinstance(floor_mbit, int | float) or not floor_mbit > 0:
        raise PlanError("floor_mbit", f"must be positive, got {floor_mbit!r}")
    off = ~np.eye(w.shape[0], dtype=bool)
    live = off & (w > 0)
    out = np.zeros_like(w)
    rest = w - used / BYTES_PER_S_PER_MBIT / horizon_s
    out[live] = np.maximum(rest[live], np.minimum(w[live], floor_mbit))
    np.fill_diagonal(out, np.inf)
    return out


def two_hop(bw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Capacities improved by one relay hop, and which relay achieves each.

    ``out[i][j] = max(bw[i][j], max_r min(bw[i][r], bw[r][j]))``; ``relay[i][j]`` is that r, or
    -1 where the direct link is at least as fast. Dead links (0) are never relays.

    Cost model and its limit: a relayed transfer i -> r -> j streams, so it runs at the slower
    of its two hops. The LP that plans on ``out`` does not know the hops are shared with r's own
    traffic, so it is optimistic wherever it relays; that is why ``crew-relay`` is a scheme to
    measure against ``crew``, not the default.
    """
    w = check_bw(bw)
    n = w.shape[0]
    out = w.copy()
    relay = np.full((n, n), -1, dtype=np.int64)
    for r in range(n):
        via = np.minimum(w[:, r][:, None], w[r, :][None, :])  # i -> r -> j
        via[r, :] = 0.0
        via[:, r] = 0.0
        better = via > out
        np.fill_diagonal(better, False)
        out = np.where(better, via, out)
        relay = np.where(better, r, relay)
    return out, relay
