"""The ring all-reduce's order: the directed cycle through the members whose slowest link is
fastest. Pure, no I/O.

Exact by brute force over (p - 1)! orders for p <= ``RING_EXACT_MAX``; above, a heuristic:
binary search on the bottleneck threshold, each threshold tried with a depth-first search for a
Hamiltonian cycle of links at least that fast (fewest-options-first, ``RING_SEARCH_BUDGET``
expansions per threshold). Used by the ring baseline (:func:`crew.plan.baselines.plan_ring`)
and to seed the route LP with the ring's routes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from crew.plan.inputs import PlanError

RING_EXACT_MAX = 8
"""Largest group whose ring order is found by brute force ((p - 1)! orders)."""

RING_SEARCH_BUDGET = 20_000
"""Depth-first expansions per bottleneck threshold in the ring heuristic (p > RING_EXACT_MAX)."""


def _member_rates(w: np.ndarray, members: Sequence[int]) -> list[list[float]]:
    return [[float(w[a, b]) for b in members] for a in members]


def ring_order(w: np.ndarray, members: tuple[int, ...]) -> tuple[tuple[int, ...], float]:
    """(the cycle's members in order, its slowest link's rate), ties broken as
    :func:`crew.plan.baselines.plan_ring` states; PlanError when no cycle of live links is
    found."""
    ms = sorted(members)
    p = len(ms)
    rate = _member_rates(w, ms)
    if p <= RING_EXACT_MAX:
        best_key: list[float] | None = None
        best: tuple[int, ...] = ()
        for perm in itertools.permutations(range(1, p)):  # member ms[0] fixed first
            cyc = (0, *perm)
            rates = [rate[cyc[k]][cyc[(k + 1) % p]] for k in range(p)]
            if min(rates) <= 0:
                continue
            key = sorted(rates)
            if best_key is None or key > best_key:
                best_key, best = key, cyc
        if best_key is None:
            raise PlanError("bw", f"ring: no cycle of live links through all of {members}")
        return tuple(ms[k] for k in best), best_key[0]
    return _ring_heuristic(rate, ms)


def _ring_heuristic(rate: list[list[float]], ms: list[int]) -> tuple[tuple[int, ...], float]:
    p = len(ms)
    levels = sorted({rate[a][b] for a in range(p) for b in range(p) if a != b and rate[a][b] > 0})
    lo, hi = 0, len(levels) - 1
    found: tuple[tuple[int, ...], float] | None = None
    while lo <= hi:  # binary search: a cycle found at a threshold works for all lower ones
        mid = (lo + hi) // 2
        cyc = _hamiltonian_cycle(rate, levels[mid])
        if cyc is None:
            hi = mid - 1
        else:
            neck = min(rate[cyc[k]][cyc[(k + 1) % p]] for k in range(p))
            found = (tuple(ms[k] for k in cyc), neck)
            lo = max(mid, levels.index(neck)) + 1
    if found is None:
        raise PlanError(
            "bw",
            f"ring: no cycle of live links through all of {tuple(ms)} found"
            f" within {RING_SEARCH_BUDGET} search steps per threshold",
        )
    return found


def _hamiltonian_cycle(rate: list[list[float]], floor: float) -> tuple[int, ...] | None:
    """A cycle through all nodes on links of rate >= floor, from node 0; None if not found."""
    p = len(rate)
    out = [[b for b in range(p) if b != a and rate[a][b] >= floor] for a in range(p)]
    if any(not o for o in out) or any(not any(b in out[a] for a in range(p)) for b in range(p)):
        return None
    budget = [RING_SEARCH_BUDGET]

    def dfs(path: list[int], seen: set[int]) -> bool:
        if len(path) == p:
            return 0 in out[path[-1]]
        if budget[0] <= 0:
            return False
        budget[0] -= 1
        nxt = [b for b in out[path[-1]] if b not in seen]
        # fewest onward options first (Warnsdorff), then the faster link
        nxt.sort(key=lambda b: (sum(c not in seen for c in out[b]), -rate[path[-1]][b], b))
        for b in nxt:
            path.append(b)
            seen.add(b)
            if dfs(path, seen):
                return True
            path.pop()
            seen.discard(b)
        return False

    path = [0]
    return tuple(path) if dfs(path, {0}) else None
