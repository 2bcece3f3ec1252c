"""The route LP's latency-level search: the best plan when a route's time is its links'
drain time plus the latency of the slowest route used. Pure, no I/O.

A plan's time is T = T_bw + max over used columns of L_c (:mod:`crew.plan.routelp`). Since a
column either is used or not, T is not linear in x; :func:`choose_level` minimises it exactly
over the master's pool by solving the LP at a few latency levels lambda (only columns with
L_c <= lambda allowed), best first, with dual bounds pruning the rest. Above a size threshold
the level LPs keep only the resource rows that bind (:class:`LevelLP`, row generation), which
returns the same optimum from a smaller LP.
"""

from __future__ import annotations

import heapq
import logging

import numpy as np
from scipy.sparse import csr_array

from crew.plan.highs import INF, OPTIMAL, status_text
from crew.plan.inputs import PlanError
from crew.plan.routelp.master import DUAL_SIMPLEX, MasterLP, new_lp
from crew.plan.routelp.settings import DEFAULT_SETTINGS, RouteLPSettings

log = logging.getLogger(__name__)


class LevelLP:
    """The master LP's columns over a subset of its resource rows, grown on demand (row
    generation), for the latency-level solves of :func:`choose_level` from the settings'
    ``level_rows_min_n`` workers on.

    A solve fixes the columns above the level at 0 and solves over the rows kept so far; then
    every omitted row is checked at the solution (its load ``x @ coef`` against t), the violated
    ones are added and the LP is solved again from its basis (dual simplex: added rows and fixed
    columns keep the basis dual feasible). When no omitted row is violated, the solution is
    feasible for the full LP and optimal for a relaxation of it, so it is the full LP's optimum
    (same t; exact, up to ``slack``), and its duals, 0 on the omitted rows, are dual
    feasible for the full LP, so ``choose_level``'s dual bounds stay valid. Rows stay once added:
    later levels start from every row an earlier one needed. Cost per pass: one sparse
    (columns x rows) product for the check, on top of the LP over the kept rows."""

    def __init__(
        self,
        coef: csr_array,
        rows: np.ndarray,
        slack: float = DEFAULT_SETTINGS.level_rows_slack,
    ) -> None:
        self.slack = slack  # relative excess of an omitted row over t that adds it
        self.coef = coef  # columns x master rows, row 0 (convexity) zeroed
        self.by_row = coef.T.tocsr()  # master rows x columns: the entries of a row to add
        self.k = coef.shape[0]
        self.kept = np.zeros(coef.shape[1], dtype=bool)
        self.kept[0] = True  # the convexity row is always there (as LP row 0)
        self.lp_rows: list[int] = [0]  # the master row of each LP row
        self.h = new_lp(DUAL_SIMPLEX)
        k = self.k
        self.h.addCols(
            k, np.zeros(k), np.zeros(k), np.full(k, INF), k,
            np.arange(k, dtype=np.int32), np.zeros(k, dtype=np.int32), np.ones(k),
        )  # fmt: skip
        self.idx = np.arange(1, k + 1, dtype=np.int32)
        self._add_rows(rows)

    def _add_rows(self, rows: np.ndarray) -> None:
        """Add these master rows: load - t <= 0 over the LP's columns (1..k) and t (0)."""
        rows = rows[~self.kept[rows]]
        if rows.size == 0:
            return
        sub = self.by_row[rows]
        starts = (sub.indptr[:-1] + np.arange(rows.size)).astype(np.int32)
        nnz = int(sub.indptr[-1]) + rows.size
        index = np.empty(nnz, dtype=np.int32)
        value = np.empty(nnz)
        at_t = starts  # each row's first entry is t's -1, then the columns' loads
        index[at_t] = 0
        value[at_t] = -1.0
        rest = np.ones(nnz, dtype=bool)
        rest[at_t] = False
        index[rest] = sub.indices + 1
        value[rest] = sub.data
        self.h.addRows(
            rows.size, np.full(rows.size, -INF), np.zeros(rows.size), nnz, starts, index, value
        )
        self.kept[rows] = True
        self.lp_rows.extend(int(r) for r in rows)

    def solve(self, allowed: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, float]:
        """As ``MasterLP.solve(allowed)``: (x, t, duals y >= 0 over the master's rows, mu)."""
        self.h.changeColsBounds(self.k, self.idx, np.zeros(self.k), np.where(allowed, INF, 0.0))
        for _ in range(self.coef.shape[1] + 1):  # each pass adds a row: bounded
            self.h.run()
            if self.h.getModelStatus() != OPTIMAL:
                raise PlanError("bw", f"route LP level: {status_text(self.h)}")
            sol = self.h.getSolution()
            values = np.asarray(sol.col_value)
            t = float(values[0])
            x = np.clip(values[1:], 0.0, None)
            load = self.by_row @ x
            bad = np.flatnonzero((load > t * (1 + self.slack)) & ~self.kept)
            if bad.size == 0:
                break
            self._add_rows(bad)
        duals = np.asarray(sol.row_dual)
        y = np.zeros(self.coef.shape[1])
        y[np.asarray(self.lp_rows[1:], dtype=np.int64)] = np.clip(-duals[1:], 0.0, None)
        return x, t, y, float(duals[0])


def choose_level(
    master: MasterLP,
    seconds_per_unit: float,
    settings: RouteLPSettings = DEFAULT_SETTINGS,
) -> tuple[np.ndarray, float, float]:
    """Best fractions under T = T_bw + max latency of used columns (module docstring).

    Returns (x, T_bw in seconds, latency in seconds) of the fractional optimum.

    With latency levels l_0 < ... < l_K (the columns' distinct latencies) and T_bw(l) the LP
    optimum over the columns with latency <= l, the optimum is min over l of T_bw(l) + l
    (at l = the worst used latency of the best plan the two coincide; elsewhere T_bw(l) + l
    only over-counts). T_bw never grows with l, so a branch and bound over intervals of
    levels finds it exactly: one solve at level l_m with worst used latency w settles every
    level in [w, l_m] (the same plan is allowed there, and nothing better is), and an interval
    of levels is dropped when a lower bound on T_bw(l) + l at each of its levels is no better
    than the best found. Each solve settles at least one level, so at most K + 1 solves.

    The lower bounds cost no solve. T_bw(l) >= T_bw(l') for l <= l', so an interval inherits
    the value of the solve above it. And every solve's duals bound every level (weak duality
    of the LP: for resource prices y >= 0 with sum y <= 1, T_bw(l) >= the cheapest column of
    latency <= l priced at y, a prefix minimum over the columns sorted by latency), which
    prunes the low levels whose few columns all load some link the top plan needs. Cost: one
    (columns x resources) product per solve. It is weak where the optimum mixes columns of
    several latencies (the other used columns keep the bound at the solve's own T_bw).

    Best first: the open intervals wait in a heap by their lower bound (re-ranked when later
    duals raised it); the one with the lowest is solved at the middle of its levels that can
    still beat the best found, so the solves go where the optimum can still be, the best found
    drops early and prunes the rest sooner. (Splitting at the level of lowest bound instead
    would solve the levels nearly one by one: the bound grows with the level where no dual has
    reached it yet.)

    From the settings' ``level_rows_min_n`` workers on, the level solves below the top one use
    :class:`LevelLP`, started from the rows that bind in the top (master) solve; each
    returns the full LP's optimum. Only the chosen level's solve gets the link-time tie-break,
    on the master.

    A ``level_tolerance`` > 0 in ``settings`` also drops an interval that could improve the best
    found by at most that share of it: the result is then within 1 / (1 - tolerance) of the
    optimum."""
    lat = np.asarray(master.lat)
    if master.hop is None:
        sol = master.solve(tie_break=True)
        assert sol is not None
        return sol[0], sol[1] * seconds_per_unit, 0.0

    def worst(x: np.ndarray) -> float:
        used = x > 1e-9
        return float(lat[used].max()) if used.any() else 0.0

    levels = np.unique(lat)
    by_lat = np.argsort(lat, kind="stable")
    ends = np.searchsorted(lat[by_lat], levels, side="right") - 1
    coef = master.coef_sparse()  # columns x resource rows (row 0 zeroed)
    coef_by_lat = coef[by_lat]
    bound = np.zeros(levels.size)  # dual lower bound on T_bw(level), seconds

    def tighten(y: np.ndarray) -> None:
        y = y / max(1.0, float(y.sum()))  # weak duality needs sum y <= 1
        cheapest = np.minimum.accumulate(coef_by_lat @ y)[ends] * seconds_per_unit
        np.maximum(bound, cheapest, out=bound)

    top = master.solve()
    assert top is not None
    tighten(top[2])
    t_top, w_top = top[1] * seconds_per_unit, worst(top[0])
    tolerance = settings.level_tolerance
    level_lp: LevelLP | None = None
    if master.w.shape[0] >= settings.level_rows_min_n and levels.size > 1:
        # start from the rows that bind at the top: most levels' optima load the same links
        load = top[0] @ coef
        binding = (top[2] > 0) | (load >= top[1] * (1 - settings.level_rows_slack))
        binding[0] = False
        level_lp = LevelLP(coef, np.flatnonzero(binding), settings.level_rows_slack)

    def at(i: int) -> tuple[float, float]:
        """(T_bw in seconds, worst used latency) of the LP over columns up to level i; its
        duals tighten every level's bound."""
        allowed = lat <= levels[i]
        sol = master.solve(allowed=allowed) if level_lp is None else level_lp.solve(allowed)
        assert sol is not None  # every level has at least the column that defines it
        tighten(sol[2])
        return sol[1] * seconds_per_unit, worst(sol[0])

    def low(lo: int, hi: int, t_known: float) -> tuple[float, np.ndarray]:
        """Lower bound of T_bw + level over levels lo..hi, and each level's."""
        below = np.maximum(bound[lo : hi + 1], t_known) + levels[lo : hi + 1]
        return float(below.min()), below

    best_t, best_level = t_top + w_top, w_top
    heap: list[tuple[float, int, int, float]] = []

    def push(lo: int, hi: int, t_known: float) -> None:
        if lo <= hi:
            heapq.heappush(heap, (low(lo, hi, t_known)[0], lo, hi, t_known))

    push(0, int(np.searchsorted(levels, w_top)) - 1, t_top)
    solves = 1
    while heap:
        key, lo, hi, t_known = heapq.heappop(heap)
        if key >= best_t * (1.0 - tolerance):
            break  # the lowest bound left cannot beat the best found (by the tolerance)
        now, below = low(lo, hi, t_known)
        if now > key:  # later solves raised this interval's bound: re-rank it
            heapq.heappush(heap, (now, lo, hi, t_known))
            continue
        if solves >= settings.max_latency_levels:
            log.warning("route LP: stopped after %d latency-level solves", solves)
            break
        # split in the middle of the levels that can still beat the best found (a binary
        # search: splitting at the lowest bound instead solved the levels one by one)
        open_ = np.flatnonzero(below < best_t * (1.0 - tolerance))
        m = lo + int(open_[0] + open_[-1]) // 2
        t_m, w_m = at(m)
        solves += 1
        if t_m + w_m < best_t:
            best_t, best_level = t_m + w_m, w_m
        push(m + 1, hi, t_known)
        push(lo, int(np.searchsorted(levels, w_m)) - 1, t_m)
    sol = master.solve(allowed=lat <= best_level, tie_break=True)
    assert sol is not None
    x, t = sol[0], sol[1]
    return x, t * seconds_per_unit, worst(x)
