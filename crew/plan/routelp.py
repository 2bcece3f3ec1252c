"""CREW's route planner: one LP over every route a group's vector can take. Pure, no I/O.

Conventions are :mod:`crew.plan.inputs`': ``bw`` is n x n Mbit/s (``bw[i][j]`` the rate of i -> j,
0 = dead link, diagonal ignored), ``members`` the group, ``active`` who may relay or aggregate,
``size`` the bytes of the vector (4-byte elements), times in seconds.

**Routes.** A route (:mod:`crew.plan.routes`) carries one element range up a reduce in-tree to its
root and back down a broadcast out-tree. A *column* of the LP is a route shape without its range
(or a bundle of shapes that together deliver a range to every member once, like all-to-all);
the LP gives each column a fraction x_c of the vector. Every tree edge a -> b of a column puts
x_c * M bytes on link a -> b, in both phases (an edge used by the reduce and the broadcast tree
counts twice).

**Resources.** Each directed pair is a resource of capacity ``bw[a][b]``; a
:class:`SharedLink` is one more resource: a set of directed pairs whose *sum* is capped (a
cloud's WAN uplink shared by the cloud's workers). The cost model is the lab's: every resource
drains its load at its rate, all at once (fluid, cut-through forwarding of parts, free adds),
so the bandwidth time is ``T_bw = max over resources of load / rate``.

**Latency.** With a one-way delay matrix, a route also needs the delay of its longest reduce
path plus its longest broadcast path before its last part lands (pipeline fill); with
``part_bytes`` each hop also adds ``part_bytes`` at the hop's rate. The coordinator passes a
part's own bytes plus the unsent bytes a busy connection holds ahead of it
(``crew.control.assignment.hop_bytes``): a part leaves a hop only after both, and a frame trace
of bench-hetero measured a median 13.6 ms per hop beyond the part itself, 64 KiB at the mean
rate. Counting it, the LP weighs a relay's extra hops at what they cost the engine. The plan's
time is ``T = T_bw + max over used columns of L_c``: the links drain while the slowest route's
first part is still on its way, and the slowest route ends at most L_c after its links drained
(exact for one route on idle links in the fluid limit; a model, not a bound). Since a column
either is used or not, T is not linear in x; it is minimised exactly over the column pool by
solving the LP once per latency level lambda (only columns with L_c <= lambda allowed) in
decreasing lambda, stopping as soon as T_bw(lambda) alone is no better than the best T found
(T_bw only grows as lambda falls).

**LP** (HiGHS through ``highspy``, one model kept warm while columns and rows are added)::

    minimise t  s.t.  sum_c x_c = 1,  x >= 0,
                      sum_c x_c * uses_c(k) * M / rate_k <= t     for every resource k

then a second LP keeps t within 1e-7 of its optimum and minimises the total link time
``sum_c x_c sum_{e in c} M / rate_e``: among equally fast plans, the one moving fewest bytes
over slow links (no relay where a direct link does as well).

**Column generation.** The pool starts with today's CREW stars (one per usable aggregator, which
is also every PS plan), BLINK's packed trees, the all-to-all bundle, per root the trees of least
total link time and, when the pricing below is heuristic, the ring's routes. With the LP duals
y_k >= 0 of the resources and mu of ``sum x = 1``, a new column's reduced cost is ``sum_{e in c}
w_e - mu`` where the link weight ``w_e = sum_{k contains e} y_k / rate_k``. The cheapest column
is, for each root v, a min-cost Steiner in-tree from the members to v plus a min-cost Steiner
out-tree from v to the members, over dual-weighted links among active workers. The LP duals are
very degenerate (most links price at 0 until they bind), so pricing first tries Wentges-smoothed
duals (a mix with those of the best Lagrangian bound so far) and falls back to the plain duals.
For small groups (3^p * n small) the cheapest column is found *exactly* by Dreyfus-Wagner
dynamic programming for all roots at once; then the loop stops when no column has negative
reduced cost (Lagrangian gap <= 1e-7), and the plan is optimal over all routes, so no
route-based scheme (PS, ring, all-to-all, BLINK, TopoAdopt, today's CREW) has a lower pipelined
cost, hence none beats it on its own (never lower) cost model. For larger groups the pricing is
heuristic (shortest-path trees per root) and the seeded columns keep the guarantee for every
seeded baseline. The loop is bounded (``MAX_ROUNDS``, ``time_budget_s``); if it stops early the
ring's routes are added before the final solve, so the plan stays at least as good as every
seeded baseline, and ``RoutePlanResult.optimal`` says the optimum over all routes was not
proved.

This is the path (column) form of the tree-packing LPs of ForestColl (Zhao et al., 2024:
aggregation and broadcast trees, throughput-optimal via spanning-tree packing) and of TE-CCL's
flow formulation, restricted to what the lab's engine runs: per range one reduce tree and one
broadcast tree through the same root, cut-through, with shared capacities and latency added.

**Whole elements.** Each used column gets the floor of its share; the few elements left over
go one by one where they raise the busiest resource least; the predicted time is recomputed
from the whole-element routes (``bandwidth_time`` + ``route_latency``).

Not modelled: TCP's and HTB's sharing of one connection among several flows (the fluid model
assumes each link drains its load at its rate whatever the mix), aggregation CPU, and that
each route is a separate stream in the engine (a plan may have ten or more routes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import heapq
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import shortest_path

from crew.plan import bound
from crew.plan.bound import lower_bound
from crew.plan.highs import INF, OPTIMAL, Solver, new_solver
from crew.plan.inputs import (
    BYTES_PER_S_PER_MBIT,
    ELEM_BYTES,
    PlanError,
    SharedLink,
    check_active,
    check_bw,
    check_delays,
    check_group,
    check_shared,
    check_size,
    is_int,
)
from crew.plan.memo import Memo
from crew.plan.ringorder import ring_order
from crew.plan.rounding import largest_remainder
from crew.plan.routes import Route
from crew.plan.trees import eccentric_root, pack_trees, tree_routes

log = logging.getLogger(__name__)

Edge = tuple[int, int]

MAX_ROUNDS = 60
"""Column-generation rounds at most (each: one LP, one pricing)."""
DEFAULT_TIME_BUDGET_S = 2.0
"""Wall time after which column generation stops (the plan stays >= every seeded baseline)."""
COLUMNS_PER_ROUND = 4
"""New columns added per round at most (the best roots by reduced cost)."""
EXACT_PRICING_WORK = 3_000_000
"""Dreyfus-Wagner is used while 3^p * n and 2^p * n^2 stay below this."""
MAX_LATENCY_LEVELS = 48
"""LP solves over latency levels at most (branch and bound, ``_choose``; a handful usually)."""
GAP = 1e-7
"""Relative Lagrangian gap at which column generation counts as converged."""
SMOOTHING = 0.7
"""Weight of the best-bound duals in the pricing duals (Wentges smoothing)."""
CACHE_RESULTS = 256
"""Plans kept for repeated identical inputs."""
CACHE_GROUPS = 512
"""Groups (members, active set) whose recently used columns are kept for warm starts."""
POOL_SHAPES = 160
"""Warm columns kept per group: the chosen plan's, the bandwidth optimum's, then the rest of the
pool. Keeping only the chosen plan's columns did not warm-start plans with a latency term: the
chosen latency level often skips the bandwidth optimum's columns, and re-planning on bench-hetero
(p = 4 of 8, 64 KiB parts, rates x 1.01) then took 5-26 rounds; with the whole pool, 1."""
_RESULTS = Memo(CACHE_RESULTS)
_POOL: OrderedDict[tuple, list[Shape]] = OrderedDict()
_LIMITS: dict[str, float] = {}  # set by limits()
_POOL_LOCK = threading.Lock()
"""Guards ``_POOL`` (``_RESULTS`` is a thread-safe ``Memo``): the coordinator may plan ahead on
a second thread (``crew.runtime.planahead``); plans themselves share nothing else."""
TREE_SEEDS = 16
"""Roots whose least-link-time trees seed the pool at most (the cheapest; at n = 60 seeding
every root's trees cost more LP time than the rounds it saved)."""
RELAY_SEEDS = True
CROSS_PAIRS = True
"""Add crossed pairs of reduce and broadcast trees after each pricing (``_crossed``): measured
with ``lab.studies.planbench`` matrices (p = 4, 64 KiB parts) it halves the rounds (n = 8: 11 -> 7,
n = 16: 15.5 -> 8) at about the same time, and plans 3-4% faster under the latency model."""
CROSS_LIMIT = 2
"""Used routes at the same root that each new shape is crossed with."""
CROSS_MAX_N = 16
"""Crossed pairs only up to this many workers: at n = 60 (p = 5, 5 rounds) they made plans 20%
slower for 1% more rounds per worker in ``crew.sim`` (planner 232 -> 279 ms median)."""
PRIMAL_SIMPLEX = 4
"""HiGHS's ``simplex_strategy`` value for the primal simplex."""
DUAL_SIMPLEX = 1
"""HiGHS's ``simplex_strategy`` value for the dual simplex."""
DUAL_FOR_LEVELS = True
"""Solve the latency levels of ``_choose`` with the dual simplex: fixing columns at 0 keeps the
basis dual feasible, not primal (planbench matrices: n = 8 -10%, n = 60 -8% per plan)."""
LEVEL_ROWS_MIN_N = 32
"""From this many workers on, ``_choose`` solves the latency levels on a row-generated LP
(``_LevelLP``: the master's columns, but only the resource rows that bind) instead of the
master, which has a row for every link any column uses (in ``crew.sim`` at n = 60, p = 5: a
median of 891 rows, 126 binding at the top level, 169 kept by the last level). A level solve is
then a smaller LP plus a check of the omitted rows, and the result is the full LP's optimum.
Below, the master has few enough rows that building and checking the second LP did not pay
(planbench timing, n = 8 / 16: 16.3 / 34.9 ms cold with it at every n, 14.3 / 33.2 without)."""
LEVEL_ROWS_SLACK = 1e-9
"""Relative excess of an omitted row's load over t at which ``_LevelLP`` adds the row (the
solver's own feasibility tolerance is 1e-7 in LP units of about 1)."""
CUT_CHECK_MIN_N = 12
"""From this many workers on, the max-flow cut bound (``bound.lower_bound``, a few ms) is
computed first and column generation stops once the LP reaches it: the plan is then proved
optimal over every scheme, not only over routes. Below, the few rounds left do not pay for it."""
_INF = INF
_OPTIMAL = OPTIMAL
_TIE = 1e-9  # relative weight of link time in pricing: ties go to routes over fewer/faster links


@dataclass(frozen=True)
class Shape:
    """A route without its range: reduce in-tree to ``root``, broadcast out-tree from it."""

    root: int
    up: tuple[Edge, ...]
    down: tuple[Edge, ...]


@dataclass(frozen=True)
class Column:
    """Shapes that together deliver one range to every member exactly once."""

    shapes: tuple[Shape, ...]
    origin: str  # "star", "blink", "ring", "a2a", "priced": where the column came from

    def edge_uses(self) -> dict[Edge, int]:
        out: dict[Edge, int] = {}
        for s in self.shapes:
            for e in (*s.up, *s.down):
                out[e] = out.get(e, 0) + 1
        return out


@dataclass(frozen=True)
class RoutePlanResult:
    """The chosen routes (whole elements) and their time under the model above."""

    routes: tuple[Route, ...]
    predicted_s: float  # bandwidth time + latency, from the integer split
    bandwidth_s: float
    latency_s: float
    lp_s: float  # the LP optimum (fractional), same model
    rounds: int
    columns: int
    optimal: bool  # column generation proved optimality over all routes (exact pricing)
    origins: tuple[str, ...]  # origin of each route's column
    gap: float = 0.0
    """Proved bound on how far the fractional plan's bandwidth time is above the LP optimum over
    all routes: (t - lower) / lower, with lower the best of the Lagrangian bound and the max-flow
    cut bound. 0 when optimal; ``inf`` when no bound was found (heuristic pricing, early stop)."""


# --------------------------------------------------------------------------- the master LP


def _new_lp(simplex_strategy: int) -> Solver:
    """A HiGHS LP "minimise t" with the variable t (column 0) and the convexity row (row 0,
    sum of the route fractions = 1, no fractions yet): what the master and the level LPs start
    from. No presolve: the models are re-solved from their last basis."""
    h = new_solver(presolve="off", simplex_strategy=simplex_strategy)
    h.addVar(0.0, _INF)
    h.changeColCost(0, 1.0)
    h.addRow(1.0, 1.0, 0, np.zeros(0, dtype=np.int32), np.zeros(0))
    return h


class _Master:
    """The restricted master LP over a growing column pool, kept in one HiGHS instance so that
    every re-solve after adding columns (or rows, as new links appear) warm-starts from the
    previous basis. Column 0 is t; row 0 is ``sum x = 1``; every other row is a resource."""

    def __init__(
        self, w: np.ndarray, shared: tuple[SharedLink, ...], hop: np.ndarray | None
    ) -> None:
        finite = w[np.isfinite(w) & (w > 0)]
        self.r_ref = float(finite.max()) if finite.size else 1.0
        self.w = w
        self.shared = shared
        self.hop = hop
        self.row_of: dict[tuple[str, int, int], int] = {}
        self.link_row: dict[Edge, int] = {}  # row_of's "link" rows by pair, for add()
        self.links: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # see _links()
        self.row_rate: list[float] = [0.0]  # row 0: convexity
        self.shared_of: dict[Edge, list[int]] = {}
        for k, s in enumerate(shared):
            for e in s.pairs:
                self.shared_of.setdefault(e, []).append(k)
        self.cols: list[Column] = []
        self.keys: set[tuple[Shape, ...]] = set()
        # Per column its sparse coefficients (rows incl. row 0, values), made once in add():
        # every solve of _choose, the level LPs and _round read them, and rebuilding them from
        # the column's edges each time cost more than the small LPs at n = 60.
        self.col_rows: list[np.ndarray] = []
        self.col_vals: list[np.ndarray] = []
        self.tie: list[float] = []
        self.lat: list[float] = []
        # add() runs for a few hundred columns per plan, in Python: plain lists index faster
        # than numpy scalars, and the crossed pairs (``_crossed``) reuse the same trees, whose
        # depths are kept per (direction, root, edges).
        self.rates: list[list[float]] = w.tolist()
        self.hops: list[list[float]] | None = None if hop is None else hop.tolist()
        self.depths: dict[tuple[bool, int, tuple[Edge, ...]], float] = {}
        # Primal simplex: after columns are added the old basis stays primal feasible, so
        # primal re-solves from it (measured at n = 60: 1.5x faster than HiGHS's default dual).
        self.h = _new_lp(PRIMAL_SIMPLEX)

    def _row(self, key: tuple[str, int, int], rate: float) -> int:
        row = self.row_of.get(key)
        if row is None:
            row = self.row_of[key] = len(self.row_rate)
            self.row_rate.append(rate)
            self.h.addRow(-_INF, 0.0, 1, np.zeros(1, dtype=np.int32), np.array([-1.0]))
        return row

    def add(self, col: Column) -> bool:
        key = col.shapes
        if key in self.keys:
            return False
        coef: dict[int, float] = {0: 1.0}
        tie = 0.0
        r_ref, rates, link_row, shared_of = self.r_ref, self.rates, self.link_row, self.shared_of
        for e, uses in col.edge_uses().items():
            a, b = e
            rate = rates[a][b]
            if not rate > 0:
                raise AssertionError(f"column {col.origin} uses dead link {a}->{b}")
            r = link_row.get(e)
            if r is None:
                r = link_row[e] = self._row(("link", a, b), rate)
            load = uses * r_ref / rate
            coef[r] = load  # edge_uses has each pair once: its link row is set once
            tie += load
            if not shared_of:
                continue
            for k in shared_of.get(e, ()):
                r = self._row(("shared", k, 0), self.shared[k].mbit)
                coef[r] = coef.get(r, 0.0) + uses * r_ref / self.shared[k].mbit
        rows = np.fromiter(coef.keys(), dtype=np.int32, count=len(coef))
        vals = np.fromiter(coef.values(), dtype=float, count=len(coef))
        self.h.addCol(0.0, 0.0, _INF, rows.size, rows, vals)
        self.keys.add(key)
        self.cols.append(col)
        self.col_rows.append(rows)
        self.col_vals.append(vals)
        self.tie.append(tie)
        self.lat.append(0.0 if self.hops is None else self._latency(col, self.hops))
        return True

    def _latency(self, col: Column, hops: list[list[float]]) -> float:
        """A column's latency: the longest reduce path plus the longest broadcast path of its
        slowest shape (seconds), each tree's depth computed once per master."""
        worst = 0.0
        depths = self.depths
        for s in col.shapes:
            up = depths.get((False, s.root, s.up))
            if up is None:
                up = depths[False, s.root, s.up] = _tree_depth(s.root, s.up, hops, False)
            down = depths.get((True, s.root, s.down))
            if down is None:
                down = depths[True, s.root, s.down] = _tree_depth(s.root, s.down, hops, True)
            worst = max(worst, up + down)
        return worst

    def _run(self) -> None:
        self.h.run()
        status = self.h.getModelStatus()
        if status != _OPTIMAL:
            raise PlanError("bw", f"route LP: {self.h.modelStatusToString(status)}")

    def solve(
        self, allowed: np.ndarray | None = None, tie_break: bool = False
    ) -> tuple[np.ndarray, float, np.ndarray, float] | None:
        """(x over all columns, t, resource duals y >= 0, mu); None if no allowed column.

        ``allowed``: only these columns may be used (the others are fixed at 0 for this solve).
        ``tie_break``: then keep t within GAP of its optimum and minimise the link time."""
        k = len(self.cols)
        if k == 0 or (allowed is not None and not allowed.any()):
            return None
        idx = np.arange(1, k + 1, dtype=np.int32)
        if allowed is not None:
            upper = np.where(allowed, _INF, 0.0)
            self.h.changeColsBounds(k, idx, np.zeros(k), upper)
            if DUAL_FOR_LEVELS:
                self.h.setOptionValue("simplex_strategy", DUAL_SIMPLEX)
        try:
            self._run()
            sol = self.h.getSolution()
            values = np.asarray(sol.col_value)
            duals = np.asarray(sol.row_dual)
            t = float(values[0])
            x = values[1:].copy()
            if tie_break:
                tie = np.asarray(self.tie) / max(max(self.tie), 1e-300)
                self.h.changeColCost(0, 0.0)
                self.h.changeColsCost(k, idx, tie)
                self.h.changeColBounds(0, 0.0, t * (1 + GAP) + 1e-12)
                try:
                    self._run()
                    x = np.asarray(self.h.getSolution().col_value)[1:].copy()
                except PlanError:
                    pass  # keep the first optimum
                finally:
                    self.h.changeColCost(0, 1.0)
                    self.h.changeColsCost(k, idx, np.zeros(k))
                    self.h.changeColBounds(0, 0.0, _INF)
        finally:
            if allowed is not None:
                self.h.changeColsBounds(k, idx, np.zeros(k), np.full(k, _INF))
                if DUAL_FOR_LEVELS:
                    self.h.setOptionValue("simplex_strategy", PRIMAL_SIMPLEX)
        y = np.clip(-duals[1:], 0.0, None)
        return np.clip(x, 0.0, None), t, np.concatenate([[0.0], y]), float(duals[0])

    def coef_matrix(self, cols: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """These columns' (default: every column's) load per row (columns x rows, row 0 the
        convexity row, zeroed: it is no resource)."""
        return self.coef_sparse(cols).toarray()

    def coef_sparse(self, cols: Sequence[int] | np.ndarray | None = None) -> csr_array:
        """``coef_matrix`` as a sparse matrix (a column touches a few dozen of the rows)."""
        which = range(len(self.cols)) if cols is None else [int(c) for c in cols]
        rows = [self.col_rows[c] for c in which]
        vals = [self.col_vals[c] for c in which]
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([r.size for r in rows], out=indptr[1:])
        idx = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int32)
        data = np.concatenate(vals) if vals else np.zeros(0)
        data = np.where(idx == 0, 0.0, data)  # row 0 is the convexity row, no resource
        out = csr_array((data, idx, indptr), shape=(len(rows), len(self.row_rate)))
        out.eliminate_zeros()
        return out

    def _links(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every link row's pair (a, b) and row r as arrays, remade only when rows came."""
        k = len(self.link_row)
        if self.links is None or self.links[2].size != k:
            pairs = np.fromiter((x for e in self.link_row for x in e), dtype=np.int64, count=2 * k)
            rows = np.fromiter(self.link_row.values(), dtype=np.int64, count=k)
            self.links = (pairs[0::2], pairs[1::2], rows)
        return self.links

    def link_weights(self, y: np.ndarray) -> np.ndarray:
        """Dual weight of every directed pair in LP units (0 where no resource is binding)."""
        n = self.w.shape[0]
        y = np.concatenate([y, np.zeros(len(self.row_rate) - y.size)])  # rows added since
        wt = np.zeros((n, n))
        if self.link_row:
            a, b, r = self._links()
            wt[a, b] = y[r] * self.r_ref / np.asarray(self.row_rate)[r]
        for k, s in enumerate(self.shared):
            row = self.row_of.get(("shared", k, 0))
            if row is not None and y[row] > 0:
                for a, b in s.pairs:
                    wt[a, b] += y[row] * self.r_ref / s.mbit
        return wt


class _LevelLP:
    """The master LP's columns over a subset of its resource rows, grown on demand (row
    generation), for the latency-level solves of ``_choose`` at n >= ``LEVEL_ROWS_MIN_N``.

    A solve fixes the columns above the level at 0 and solves over the rows kept so far; then
    every omitted row is checked at the solution (its load ``x @ coef`` against t), the violated
    ones are added and the LP is solved again from its basis (dual simplex: added rows and fixed
    columns keep the basis dual feasible). When no omitted row is violated, the solution is
    feasible for the full LP and optimal for a relaxation of it, so it is the full LP's optimum
    (same t; exact, up to ``LEVEL_ROWS_SLACK``), and its duals, 0 on the omitted rows, are dual
    feasible for the full LP, so ``_choose``'s dual bounds stay valid. Rows stay once added:
    later levels start from every row an earlier one needed. Cost per pass: one sparse
    (columns x rows) product for the check, on top of the LP over the kept rows."""

    def __init__(self, coef: csr_array, rows: np.ndarray) -> None:
        self.coef = coef  # columns x master rows, row 0 (convexity) zeroed
        self.by_row = coef.T.tocsr()  # master rows x columns: the entries of a row to add
        self.k = coef.shape[0]
        self.kept = np.zeros(coef.shape[1], dtype=bool)
        self.kept[0] = True  # the convexity row is always there (as LP row 0)
        self.lp_rows: list[int] = [0]  # the master row of each LP row
        self.h = _new_lp(DUAL_SIMPLEX)
        k = self.k
        self.h.addCols(
            k, np.zeros(k), np.zeros(k), np.full(k, _INF), k,
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
            rows.size, np.full(rows.size, -_INF), np.zeros(rows.size), nnz, starts, index, value
        )
        self.kept[rows] = True
        self.lp_rows.extend(int(r) for r in rows)

    def solve(self, allowed: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, float]:
        """As ``_Master.solve(allowed)``: (x, t, duals y >= 0 over the master's rows, mu)."""
        self.h.changeColsBounds(self.k, self.idx, np.zeros(self.k), np.where(allowed, _INF, 0.0))
        for _ in range(self.coef.shape[1] + 1):  # each pass adds a row: bounded
            self.h.run()
            status = self.h.getModelStatus()
            if status != _OPTIMAL:
                raise PlanError("bw", f"route LP level: {self.h.modelStatusToString(status)}")
            sol = self.h.getSolution()
            values = np.asarray(sol.col_value)
            t = float(values[0])
            x = np.clip(values[1:], 0.0, None)
            load = self.by_row @ x
            bad = np.flatnonzero((load > t * (1 + LEVEL_ROWS_SLACK)) & ~self.kept)
            if bad.size == 0:
                break
            self._add_rows(bad)
        duals = np.asarray(sol.row_dual)
        y = np.zeros(self.coef.shape[1])
        y[np.asarray(self.lp_rows[1:], dtype=np.int64)] = np.clip(-duals[1:], 0.0, None)
        return x, t, y, float(duals[0])


def _tree_depth(root: int, edges: tuple[Edge, ...], hops: list[list[float]], down: bool) -> float:
    """Longest path of a shape's in-tree (``edges`` as (child, parent), ``down`` False) into
    ``root``, or of its out-tree ((parent, child), ``down`` True) from it, in seconds. Each
    node's depth is its parent's plus its hop, summed from the root outwards."""
    parent = {c: p for p, c in edges} if down else dict(edges)
    depth: dict[int, float] = {root: 0.0}
    worst = 0.0
    for x in parent:
        chain = []
        while x not in depth:  # bounded: a valid tree reaches the root
            chain.append(x)
            x = parent[x]
        d = depth[x]
        for y in reversed(chain):
            d += hops[parent[y]][y] if down else hops[y][parent[y]]
            depth[y] = d
        worst = max(worst, d)
    return worst


# --------------------------------------------------------------------------- pricing


@functools.lru_cache(maxsize=16)
def _splits(q: int) -> tuple[list[tuple[np.ndarray, ...]], int]:
    """Per subset size k >= 2: (subsets S, reduceat starts, S1, S2, the row of S for each
    split, the splits' indices as a column) with S1 holding S's lowest bit, S1 and S2 = S
    minus S1 non-empty: every way to merge two sub-trees at a node."""
    by_size: dict[int, list[int]] = {}
    for s in range(1, 1 << q):
        by_size.setdefault(s.bit_count(), []).append(s)
    levels = []
    for k in range(2, q + 1):
        subsets, starts, s1s, s2s = [], [], [], []
        for s in by_size[k]:
            low = s & -s
            rest = s ^ low
            starts.append(len(s1s))
            subsets.append(s)
            sub = rest
            while True:  # subsets of rest, each with low added; S2 must be non-empty
                a = sub | low
                if a != s:
                    s1s.append(a)
                    s2s.append(s ^ a)
                if sub == 0:
                    break
                sub = (sub - 1) & rest
        seg = np.repeat(np.arange(len(subsets)), np.diff([*starts, len(s1s)]))
        idx = np.arange(len(s1s))[:, None]
        levels.append((np.array(subsets), np.array(starts), np.array(s1s), np.array(s2s), seg, idx))
    return levels, (1 << q) - 1


def _dreyfus_wagner(
    dist: np.ndarray, terms: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dp[S][v]: cheapest in-tree to v spanning terminals S (dist[u][v]: path u -> v), for all
    roots at once, and the choices that rebuild the trees: via[S][x] is the node u where the
    two sub-trees of S join on the way to x (dp[S][x] = merge[S][u] + dist[u][x]), and
    half[S][u] the sub-set S1 of the cheapest split S = S1 + S2 joined at u. Both are first
    minima (as numpy's argmin), so the trees are those an argmin search would rebuild.

    ``dist`` may be a stack of graphs (b x n x n; then every result gets the same leading
    axis): pricing solves the graph and its reverse in one pass, half the numpy calls, each
    element computed as alone."""
    if dist.ndim == 2:
        dp, via, half = _dreyfus_wagner(dist[None], terms)
        return dp[0], via[0], half[0]
    q = len(terms)
    b, n = dist.shape[0], dist.shape[-1]
    dp = np.full((b, 1 << q, n), np.inf)
    via = np.zeros((b, 1 << q, n), dtype=np.int64)
    half = np.zeros((b, 1 << q, n), dtype=np.int64)
    for i, t in enumerate(terms):
        dp[:, 1 << i] = dist[:, t]
    levels, _ = _splits(q)
    for subsets, starts, s1, s2, seg, idx in levels:
        vals = dp[:, s1] + dp[:, s2]
        m = np.minimum.reduceat(vals, starts, axis=1)
        first = np.where(vals == m[:, seg], idx, len(s1))  # the first split reaching the minimum
        half[:, subsets] = s1[np.minimum.reduceat(first, starts, axis=1)]
        joined = m[:, :, :, None] + dist[:, None, :, :]
        via[:, subsets] = joined.argmin(axis=2)
        dp[:, subsets] = joined.min(axis=2)
    return dp, via, half


def _dw_tree(
    v: int,
    via: list[list[int]],
    half: list[list[int]],
    pred: list[list[int]],
    terms: Sequence[int],
) -> set[Edge]:
    """Edges (towards v) of the Dreyfus-Wagner tree of all terminals rooted at v (``via`` and
    ``half`` from ``_dreyfus_wagner``, as lists: plain indexing is what this loop does; the
    shortest paths are walked inline, a call per path cost more than the walk at n = 8)."""
    q = len(terms)
    n = len(pred)
    edges: set[Edge] = set()
    stack = [((1 << q) - 1, v)]
    for _ in range(4 * (1 << q)):  # each entry splits a set: at most 2^(q+1) entries
        if not stack:
            break
        s, x = stack.pop()
        if s & (s - 1) == 0:
            u = terms[s.bit_length() - 1]
        else:
            u = via[s][x]
            a = half[s][u]
            stack.append((a, u))
            stack.append((s ^ a, u))
        row, y = pred[u], x  # the shortest path u -> x, backwards from x
        for _ in range(n):
            if y == u:
                break
            p = row[y]
            if p < 0:
                raise AssertionError(f"no path {u}->{x} in the pricing graph")
            edges.add((p, y))
            y = p
        else:
            if y != u:
                raise AssertionError("shortest-path predecessors loop")
    return edges


def _as_in_tree(root: int, edges: set[Edge], members: Collection[int]) -> tuple[Edge, ...]:
    """One parent per node: BFS from the root over reversed edges, then prune idle leaves."""
    into: dict[int, list[int]] = {}
    for a, b in edges:
        into.setdefault(b, []).append(a)
    parent: dict[int, int] = {}
    order = [root]
    for x in order:
        for a in sorted(into.get(x, ())):
            if a != root and a not in parent:
                parent[a] = x
                order.append(a)
    mset = set(members)
    for _ in range(len(parent) + 1):  # prune leaves that are not members
        has_child = set(parent.values())
        idle = [c for c in parent if c not in has_child and c not in mset]
        if not idle:
            break
        for c in idle:
            del parent[c]
    return tuple(sorted(parent.items()))


def _all_pairs(wt: np.ndarray, usable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shortest paths (dist[u][v] of u -> v) and predecessors (pred[u][x]: the node before x
    on the path from u; -9999 for none), by Floyd-Warshall in numpy for small n. ``wt`` and
    ``usable`` may be stacks of graphs (b x n x n), as in ``_dreyfus_wagner``."""
    n = wt.shape[-1]
    if wt.ndim == 3 and n > 48:
        pairs = [_all_pairs(w, u) for w, u in zip(wt, usable, strict=True)]
        return np.stack([d for d, _ in pairs]), np.stack([p for _, p in pairs])
    if n > 48:
        return shortest_path(
            _pricing_graph(wt, usable), method="D", directed=True, return_predecessors=True
        )
    dist = np.where(usable, wt, np.inf)
    diag = np.arange(n)
    dist[..., diag, diag] = 0.0
    pred = np.where(usable, np.arange(n)[:, None], -9999)
    for k in range(n):
        alt = dist[..., :, k, None] + dist[..., None, k, :]
        better = alt < dist
        dist = np.where(better, alt, dist)
        pred = np.where(better, pred[..., k, None, :], pred)
    return dist, pred


def _pricing_graph(wt: np.ndarray, usable: np.ndarray) -> csr_array:
    """Sparse weights for csgraph on the usable links (a dense matrix would drop weights
    below 1e-8: scipy masks values close to its null value)."""
    r, c = np.nonzero(usable)
    return csr_array((wt[r, c], (r, c)), shape=wt.shape)


def _price_exact(
    wt: np.ndarray,
    usable: np.ndarray,
    members: Sequence[int],
    roots: np.ndarray,
    cut: float,
    limit: int | None = None,
) -> tuple[float, list[tuple[float, Shape]]]:
    """Cheapest (in-tree + out-tree) over all roots, exactly (Dreyfus-Wagner), and the trees
    of the roots whose cost is below ``cut`` (at most COLUMNS_PER_ROUND, cheapest first)."""
    # in-trees on the graph, out-trees as in-trees of the reversed graph: both in one pass
    dist, pred = _all_pairs(np.stack([wt, wt.T]), np.stack([usable, usable.T]))
    dp, via, half = _dreyfus_wagner(dist, members)
    tables_in = via[0].tolist(), half[0].tolist(), pred[0].tolist()
    tables_out = via[1].tolist(), half[1].tolist(), pred[1].tolist()
    full = (1 << len(members)) - 1
    cost = dp[0, full] + dp[1, full]
    out = []
    order = roots[np.argsort(cost[roots], kind="stable")]
    for v in order[: COLUMNS_PER_ROUND if limit is None else limit]:
        v = int(v)
        if not cost[v] < cut:
            break
        up = _as_in_tree(v, _dw_tree(v, *tables_in, members), members)
        rev = _dw_tree(v, *tables_out, members)
        down_in = _as_in_tree(v, rev, members)  # in the reversed graph
        down = tuple(sorted((p, c) for c, p in down_in))
        out.append((float(cost[v]), Shape(v, up, down)))
    return float(cost[order[0]]), out


def _price_spt(
    wt: np.ndarray,
    usable: np.ndarray,
    members: Sequence[int],
    roots: np.ndarray,
    cut: float,
    limit: int | None = None,
) -> tuple[float, list[tuple[float, Shape]]]:
    """Heuristic: shortest-path in-tree + out-tree per root (for groups too big for DW)."""
    g = _pricing_graph(wt, usable)
    n = g.shape[0]
    dense = np.where(usable, wt, np.inf)
    _, pred_to = shortest_path(g.T, method="D", directed=True, return_predecessors=True)
    _, pred_from = shortest_path(g, method="D", directed=True, return_predecessors=True)
    mem = np.zeros(n, dtype=bool)
    mem[list(members)] = True
    # pred_to[v][u]: next hop from u towards v; pred_from[v][u]: parent of u from v
    cost = np.zeros(n)
    trees = {}
    for which, pred in (("up", pred_to), ("down", pred_from)):
        marked = np.zeros((n, n), dtype=bool)
        marked[:, mem] = True
        marked[np.arange(n), np.arange(n)] = False
        bad = (pred < 0) & marked
        dead = bad.any(axis=1)
        for _ in range(n):
            r, c = np.nonzero(marked & (pred >= 0))
            nxt = pred[r, c]
            newly = ~marked[r, nxt] & (nxt != r)
            if not newly.any():
                break
            marked[r[newly], nxt[newly]] = True
        r, c = np.nonzero(marked & (pred >= 0))
        p = pred[r, c]
        wts = dense[c, p] if which == "up" else dense[p, c]
        part = np.zeros(n)
        np.add.at(part, r, wts)
        part[dead] = np.inf
        cost += part
        trees[which] = (marked, pred)
    out = []
    order = roots[np.argsort(cost[roots], kind="stable")]
    for v in order[: COLUMNS_PER_ROUND if limit is None else limit]:
        v = int(v)
        if not cost[v] < cut:
            break
        m_up, p_up = trees["up"]
        m_dn, p_dn = trees["down"]
        up = tuple(sorted((int(u), int(p_up[v, u])) for u in np.flatnonzero(m_up[v])))
        down = tuple(sorted((int(p_dn[v, u]), int(u)) for u in np.flatnonzero(m_dn[v])))
        out.append((float(cost[v]), Shape(v, up, down)))
    return float(cost[order[0]]), out


# --------------------------------------------------------------------------- seeds


def _cost(s: Shape, wt: list[list[float]]) -> float:
    """The shape's total link weight (``wt`` as nested lists: numpy scalars index slowly)."""
    return float(sum(wt[a][b] for a, b in (*s.up, *s.down)))


def _star(root: int, members: Sequence[int]) -> Shape:
    others = [m for m in members if m != root]
    return Shape(root, tuple((m, root) for m in others), tuple((root, m) for m in others))


def _route_shape(r: Route) -> Shape:
    return Shape(r.root, tuple(sorted(r.up)), tuple(sorted(r.down)))


def _seed_columns(
    w: np.ndarray, members: tuple[int, ...], act: np.ndarray, with_ring: bool
) -> list[Column]:
    out: list[Column] = []
    rows = w[list(members), :]
    cols = w[:, list(members)]
    usable = act & (rows.min(axis=0) > 0) & (cols.min(axis=1) > 0)
    for v in np.flatnonzero(usable):  # today's CREW stars, and every PS server
        out.append(Column((_star(int(v), members),), "star"))
    trees = pack_trees(w, members, 4)
    if trees:
        roots = [eccentric_root(t.edges, members) for t in trees]
        routes = tree_routes([t.edges for t in trees], roots, [1] * len(trees))
        out.extend(Column((_route_shape(r),), "blink") for r in routes)
    ms = list(members)
    sub = w[np.ix_(ms, ms)]
    if np.all(sub[~np.eye(len(ms), dtype=bool)] > 0):
        out.append(
            Column(
                tuple(Shape(m, tuple(sorted((g, m) for g in ms if g != m)), ()) for m in ms),
                "a2a",
            )
        )
        if with_ring:
            out.extend(_ring_columns(w, members))
    return out


def _relay_star_columns(w: np.ndarray, members: tuple[int, ...], act: np.ndarray) -> list[Column]:
    """Per root, the star whose every leg takes the widest of the direct link and the two-hop
    paths through one active non-member (as ``starcost.two_hop``, but only for the legs of
    members, O(p n^2)): the first step from a star towards the relayed trees that large
    groups of workers need."""
    live = np.where(act[:, None] & act[None, :], w, 0.0)
    live[~np.isfinite(live)] = 0.0  # the diagonal
    ms = list(members)
    relays = np.flatnonzero(act & ~np.isin(np.arange(w.shape[0]), ms))
    legs = {}
    for name, into, out_of in (("up", live[ms][:, relays], live[relays]),
                               ("down", live[:, relays], live[relays][:, ms])):  # fmt: skip
        if name == "up":  # via[m, k, v] = min(m -> relays[k], relays[k] -> v)
            via = np.minimum(into[:, :, None], out_of[None, :, :])
            direct = live[ms]
        else:  # via[v, k, m] = min(v -> relays[k], relays[k] -> m)
            via = np.minimum(into[:, :, None], out_of[None, :, :])
            direct = live[:, ms]
        if relays.size:
            k = via.argmax(axis=1)
            best = np.take_along_axis(via, k[:, None, :], axis=1)[:, 0, :]
        else:
            k = np.zeros(direct.shape, dtype=np.int64)
            best = np.zeros(direct.shape)
        legs[name] = (np.where(best > direct, relays[k] if relays.size else -1, -1), direct)
    out = []
    (r_up, d_up), (r_dn, d_dn) = legs["up"], legs["down"]
    for v in np.flatnonzero(act).tolist():
        up: set[Edge] = set()
        down: set[Edge] = set()
        ok = True
        for i, m in enumerate(ms):
            if m == v:
                continue
            ru, rd = int(r_up[i, v]), int(r_dn[v, i])
            if ru >= 0 and ru != v:
                up |= {(m, ru), (ru, v)}
            elif d_up[i, v] > 0:
                up.add((m, v))
            else:
                ok = False
            if rd >= 0 and rd != v:
                down |= {(v, rd), (rd, m)}
            elif d_dn[v, i] > 0:
                down.add((v, m))
            else:
                ok = False
        tree = Shape(v, tuple(sorted(up)), tuple(sorted(down)))
        if ok and (up or down) and _one_parent(tree):
            out.append(Column((tree,), "relay"))
    return out


def _one_parent(s: Shape) -> bool:
    """Every node of the in-tree has one parent and of the out-tree one parent."""
    kids = [a for a, _ in s.up]
    heads = [b for _, b in s.down]
    return len(kids) == len(set(kids)) and len(heads) == len(set(heads))


def _ring_columns(w: np.ndarray, members: tuple[int, ...]) -> list[Column]:
    try:
        order, _ = ring_order(w, members)
    except PlanError:
        return []
    p = len(order)
    out = []
    for k in range(p):
        ring = [order[(k + 1 + j) % p] for j in range(p)]
        bcast = [order[(k + j) % p] for j in range(p)]
        up = tuple(sorted(zip(ring[:-1], ring[1:], strict=True)))
        down = tuple(sorted(zip(bcast[:-1], bcast[1:], strict=True)))
        out.append(Column((Shape(order[k], up, down),), "ring"))
    return out


# --------------------------------------------------------------------------- the planner


def hop_latency(
    bw: np.ndarray, delay_s: np.ndarray | None, part_bytes: int = 0
) -> np.ndarray | None:
    """Seconds one part needs per hop: one-way delay + its serialisation at the link's rate."""
    w = check_bw(bw)
    if delay_s is None and part_bytes == 0:
        return None
    n = w.shape[0]
    hop = np.zeros((n, n)) if delay_s is None else np.array(delay_s, dtype=float)
    if part_bytes:
        with np.errstate(divide="ignore"):
            fill = np.where(w > 0, part_bytes / (w * BYTES_PER_S_PER_MBIT), np.inf)
        hop = hop + fill
    np.fill_diagonal(hop, 0.0)
    return hop


def plan_routes(
    bw: np.ndarray,
    members: Sequence[int],
    size: int,
    active: Collection[int] | None = None,
    *,
    shared: Sequence[SharedLink] | None = None,
    delay_s: np.ndarray | None = None,
    part_bytes: int = 0,
    time_budget_s: float | None = None,
    exact: bool | None = None,
    warm: bool = True,
    max_rounds: int | None = None,
) -> RoutePlanResult:
    """CREW's plan for one group: the route LP of this module's docstring.

    ``shared``: extra capacities over sets of pairs. ``delay_s``: n x n one-way delays in
    seconds (``None``: no latency term); ``part_bytes`` adds that many bytes' serialisation
    per hop (a part and the socket backlog it waits behind, as the coordinator passes them).
    ``exact`` forces (True) or forbids (False) Dreyfus-Wagner pricing (default: by size).

    ``warm``: reuse work of earlier calls in this process. The same inputs return the cached
    result; otherwise the columns that earlier plans of the same members and active set used
    join the seeds (a warm start: column generation then usually ends within a round or two).
    Either way the plan is the one this function would compute, up to the LP's GAP: warm
    columns only start the pool, pricing still has the last word.
    ``time_budget_s`` / ``max_rounds`` bound column generation (default: :func:`limits`'s,
    else ``DEFAULT_TIME_BUDGET_S`` / ``MAX_ROUNDS``); a plan cut short says by how much it may
    be above the optimum (``RoutePlanResult.gap``).
    Raises PlanError when the members cannot reach each other through active workers.
    """
    if time_budget_s is None:
        time_budget_s = _LIMITS.get("time_budget_s", DEFAULT_TIME_BUDGET_S)
    if max_rounds is None:
        max_rounds = _LIMITS.get("max_rounds", MAX_ROUNDS)
    if not is_int(max_rounds) or max_rounds < 1:
        raise PlanError("max_rounds", f"must be an int >= 1, got {max_rounds!r}")
    w = check_bw(bw)
    n = w.shape[0]
    ms = check_group(members, n)
    act = check_active(active, n, ms)
    total = check_size(size, ELEM_BYTES)
    sh = check_shared(shared, n)
    if not is_int(part_bytes) or part_bytes < 0:
        raise PlanError("part_bytes", f"must be an int >= 0, got {part_bytes!r}")
    delays = check_delays(delay_s, n, sh)
    if not isinstance(time_budget_s, int | float) or not time_budget_s > 0:
        raise PlanError("time_budget_s", f"must be a positive number, got {time_budget_s!r}")
    level_tol = float(_LIMITS.get("level_tolerance", 0.0))
    key = (
        w.tobytes(), ms, act.tobytes(), total, sh,
        None if delays is None else delays.tobytes(), int(part_bytes), exact, max_rounds,
        level_tol,
    )  # fmt: skip

    def plan() -> RoutePlanResult:
        return _plan(
            w, ms, act, total, sh, delays, int(part_bytes), time_budget_s, exact, warm,
            max_rounds, level_tol,
        )  # fmt: skip

    return _RESULTS.get(key, plan) if warm else plan()


def _plan(
    w: np.ndarray,
    ms: tuple[int, ...],
    act: np.ndarray,
    total: int,
    sh: tuple[SharedLink, ...],
    delays: np.ndarray | None,
    part_bytes: int,
    time_budget_s: float,
    exact: bool | None,
    warm: bool,
    max_rounds: int,
    level_tol: float = 0.0,
) -> RoutePlanResult:
    n = w.shape[0]
    size = total * ELEM_BYTES
    hop = hop_latency(w, delays, part_bytes)
    if len(ms) == 1:
        route = Route(0, total, ms[0], (), ())
        return RoutePlanResult((route,), 0.0, 0.0, 0.0, 0.0, 0, 1, True, ("trivial",))
    p = len(ms)
    if exact is None:
        exact = 3**p * n <= EXACT_PRICING_WORK and 2**p * n * n <= EXACT_PRICING_WORK
    usable = act[:, None] & act[None, :] & (w > 0)
    np.fill_diagonal(usable, False)
    master = _Master(w, sh, hop)
    for col in _seed_columns(w, ms, act, with_ring=not exact):
        master.add(col)
    if n >= CUT_CHECK_MIN_N and RELAY_SEEDS:
        for col in _relay_star_columns(w, ms, act):
            master.add(col)
    pool_key = (n, ms, act.tobytes())
    if warm:
        with _POOL_LOCK:
            warm_shapes = list(_POOL.get(pool_key, ()))
        for shape in warm_shapes:
            if all(usable[e] for e in (*shape.up, *shape.down)):
                master.add(Column((shape,), "warm"))
    roots = np.flatnonzero(act)
    eps = _TIE * master.r_ref / np.where(usable, w, np.inf)
    eps[~usable] = 0.0
    price = _price_exact if exact else _price_spt
    seconds_per_unit = size / (master.r_ref * BYTES_PER_S_PER_MBIT)
    t0 = time.perf_counter()
    rounds, optimal = 0, False
    cut = _cut_units(w, ms, act, size, sh, seconds_per_unit) if n >= CUT_CHECK_MIN_N else 0.0
    # Also seed, per root, the trees of least total link time (the duals of an LP where every
    # link is equally loaded): they start the pool near the optimum and save rounds.
    _, trees = price(eps / _TIE, usable, ms, roots, math.inf, limit=min(roots.size, TREE_SEEDS))
    for _, shape in trees:
        master.add(Column((shape,), "tree"))
    sol = master.solve() if master.cols else None
    lower = -math.inf  # best Lagrangian bound so far, and the dual weights that gave it
    center: np.ndarray | None = None
    for rounds in range(1, max_rounds + 1):  # noqa: B007 - rounds is reported
        if sol is None:  # no seed column (e.g. no usable star): price on zero duals
            t, mu, wt = math.inf, math.inf, np.zeros((n, n))
        else:
            _, t, y, mu = sol
            wt = master.link_weights(y)
        if t <= cut * (1 + GAP):
            optimal = True  # the LP reached the max-flow bound: no scheme at all does better
            break
        rc_cut = mu - GAP * (t if math.isfinite(t) else 0.0)
        # Wentges smoothing: the duals are very degenerate (most links price at 0), so price
        # first at a mix with the duals of the best bound so far; fall back to the plain duals
        # when that finds no improving column (a mis-price).
        new: list[Shape] = []
        wt_rows: list[list[float]] | None = None
        smoothed = [] if center is None else [SMOOTHING * center + (1 - SMOOTHING) * wt]
        for weights in [*smoothed, wt]:
            best, found = price(weights + eps, usable, ms, roots, math.inf)
            if best > lower:  # any weights with sum(y) = 1 give t >= min column cost
                lower, center = best, weights
            if found and wt_rows is None:
                wt_rows = wt.tolist()
            rows = wt_rows or []  # set whenever found has a shape to cost
            new = [s for _, s in found if _cost(s, rows) < rc_cut]
            if new:
                break
        log.debug("route LP round %d: t=%.9g, bound %.9g", rounds, t, lower)
        if sol is not None and exact and t - lower <= GAP * t:
            optimal = True  # Lagrangian bound: no mix of routes beats t by more than GAP
            break
        added = sum(master.add(Column((s,), "priced")) for s in new)
        if CROSS_PAIRS and n <= CROSS_MAX_N and sol is not None:
            for col in _crossed(master, sol[0], new):
                master.add(col)
        if not added:
            optimal = exact  # exact pricing found no improving column
            break
        sol = master.solve()
        if time.perf_counter() - t0 > time_budget_s:
            log.warning("route LP: column generation stopped after %d rounds (time budget)", rounds)
            break
    if sol is None:
        raise PlanError("bw", f"no route connects the members {ms} through active workers")
    if not optimal:
        for col in _ring_columns(w, ms):  # keep the guarantee over the ring when unproven
            master.add(col)
        if not cut and n < CUT_CHECK_MIN_N:
            cut = _cut_units(w, ms, act, size, sh, seconds_per_unit)
    x, t_lp, lat_used = _choose(master, seconds_per_unit, level_tol)
    if warm:  # used columns first, then the rest of the pool (see POOL_SHAPES)
        _remember(pool_key, master, x, sol[0], np.ones(len(master.cols)))
    if optimal:
        gap = 0.0
    else:  # lower bounds in LP units: Lagrangian (only valid with exact pricing) and max-flow
        best = max(lower if exact else 0.0, cut)
        t_final = t_lp / seconds_per_unit
        gap = max(0.0, t_final / best - 1.0) if best > 0 else math.inf
    plan = _integer_plan(master, x, total, size, t_lp, lat_used, rounds, optimal)
    return dataclasses.replace(plan, gap=gap)


def _crossed(master: _Master, x: np.ndarray, new: Sequence[Shape]) -> list[Column]:
    """A route's reduce tree and broadcast tree are independent given its root, so each new
    shape's in-tree also goes with the out-trees of the (at most ``CROSS_LIMIT``) most used
    routes at its root, and its out-tree with their in-trees. Pricing finds the best pair per
    root; the LP often wants to mix it with what it has, and the crossed pairs have latencies
    that neither parent has (a short reduce with a short broadcast)."""
    out = []
    order = np.argsort(-x, kind="stable")[: int(np.count_nonzero(x > 1e-12))]
    used = [master.cols[c].shapes[0] for c in order if len(master.cols[c].shapes) == 1]
    for s in new:
        for u in [u for u in used if u.root == s.root][:CROSS_LIMIT]:
            if u.down != s.down:
                out.append(Column((Shape(s.root, s.up, u.down),), "priced"))
            if u.up != s.up:
                out.append(Column((Shape(s.root, u.up, s.down),), "priced"))
    return out


def _cut_units(
    w: np.ndarray,
    ms: tuple[int, ...],
    act: np.ndarray,
    size: int,
    sh: tuple[SharedLink, ...],
    seconds_per_unit: float,
) -> float:
    """The max-flow cut bound (``bound.lower_bound``, bandwidth only) in LP units."""
    bound = lower_bound(w, ms, size, np.flatnonzero(act).tolist(), shared=sh or None)
    return bound / seconds_per_unit if math.isfinite(bound) else 0.0


@contextlib.contextmanager
def limits(
    *,
    max_rounds: int | None = None,
    time_budget_s: float | None = None,
    level_tolerance: float | None = None,
) -> Iterator[None]:
    """Within the block, plans whose caller gives no bound use these (a simulator that plans
    thousands of groups trades a proved gap for time, deterministically with ``max_rounds``).

    ``level_tolerance`` (default 0: exact): the latency-level search (:func:`_choose`) skips
    the levels that could improve the plan's modelled time by at most this share of it, so the
    plan is within a factor 1 / (1 - tolerance) of the best over the pool (on top of
    ``RoutePlanResult.gap``, which is the column generation's; the simulator states the
    tolerance in its summary)."""
    if level_tolerance is not None and not 0.0 <= level_tolerance < 1.0:
        raise PlanError("level_tolerance", f"must be in [0, 1), got {level_tolerance!r}")
    old = dict(_LIMITS)
    if max_rounds is not None:
        _LIMITS["max_rounds"] = max_rounds
    if time_budget_s is not None:
        _LIMITS["time_budget_s"] = time_budget_s
    if level_tolerance is not None:
        _LIMITS["level_tolerance"] = level_tolerance
    try:
        yield
    finally:
        _LIMITS.clear()
        _LIMITS.update(old)


def active_limits() -> tuple[tuple[str, float], ...]:
    """The :func:`limits` in force, for caches of plans made from this module's."""
    return tuple(sorted(_LIMITS.items()))


def _remember(key: tuple, master: _Master, *xs: np.ndarray) -> None:
    """Keep the single-shape columns that any of the solutions ``xs`` used (most recent first)
    for warm starts."""
    used: dict[Shape, None] = {}
    for x in xs:
        for c in np.flatnonzero(x > 0):
            col = master.cols[c]
            if len(col.shapes) == 1:
                used.setdefault(col.shapes[0])
    with _POOL_LOCK:
        for s in _POOL.pop(key, ()):
            used.setdefault(s)
        _POOL[key] = list(used)[:POOL_SHAPES]
        while len(_POOL) > CACHE_GROUPS:
            _POOL.popitem(last=False)


def clear_caches() -> None:
    """Forget cached results and warm columns, and the memoised bounds and star tie checks
    (benchmarks measure cold planning with it)."""
    from crew.plan import schemes

    _RESULTS.clear()
    with _POOL_LOCK:
        _POOL.clear()
    bound.BOUNDS.clear()
    schemes.STAR_TIES.clear()
    schemes.CREW_PLANS.clear()


def _choose(
    master: _Master,
    seconds_per_unit: float,
    tolerance: float = 0.0,
    level_rows_min_n: int | None = None,
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
    several latencies (the other used columns keep the bound at the solve's own T_bw): on
    planbench's random matrices (p = 4, 64 KiB parts) it cut the level solves per plan from
    16 to 13.5 at n = 8, 25 to 20 at n = 16 and 29 to 27 at n = 60 (session 9, depth first).

    Best first: the open intervals wait in a heap by their lower bound (re-ranked when later
    duals raised it); the one with the lowest is solved at the middle of its levels that can
    still beat the best found, so the solves go where the optimum can still be, the best found
    drops early and prunes the rest sooner. In ``crew.sim`` at n = 60 (p = 5) it halved the
    level solves per plan of the depth-first order (22.4 -> 10.3). Splitting at the level of
    lowest bound instead solved the levels nearly one by one (the bound grows with the level
    where no dual has reached it yet).

    From n >= ``level_rows_min_n`` (default ``LEVEL_ROWS_MIN_N``) the level solves below the
    top one use ``_LevelLP``, started from the rows that bind in the top (master) solve; each
    returns the full LP's optimum. Only the chosen level's solve gets the link-time tie-break,
    on the master.

    ``tolerance`` > 0 (:func:`limits`) also drops an interval that could improve the best
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
    min_n = LEVEL_ROWS_MIN_N if level_rows_min_n is None else level_rows_min_n
    level_lp: _LevelLP | None = None
    if master.w.shape[0] >= min_n and levels.size > 1:
        # start from the rows that bind at the top: most levels' optima load the same links
        load = top[0] @ coef
        binding = (top[2] > 0) | (load >= top[1] * (1 - LEVEL_ROWS_SLACK))
        binding[0] = False
        level_lp = _LevelLP(coef, np.flatnonzero(binding))

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
        if solves >= MAX_LATENCY_LEVELS:
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


def _round(master: _Master, x: np.ndarray, total: int) -> np.ndarray:
    """Whole elements per column: the floor of each share, then each element left over goes
    to the used column that raises the busiest resource least (ties: the largest remainder).
    Never worse than largest remainder on the busiest resource, and it keeps ties with other
    plans of the same LP value from being lost to rounding."""
    used = np.flatnonzero(x > 0)
    quota = x[used] / x[used].sum() * total
    elems = np.floor(quota).astype(np.int64)
    left = int(total - elems.sum())
    if left < 0 or left > used.size:  # float error only; fall back to the classic rounding
        out = np.zeros(x.size, dtype=np.int64)
        out[used] = largest_remainder(x[used], total)
        return out
    coef = master.coef_matrix(used)
    load = elems @ coef
    frac = quota - elems
    for _ in range(left):  # one element each: at most used.size steps
        worst = np.max(load[None, :] + coef, axis=1)
        k = int(np.lexsort((-frac, worst))[0])
        elems[k] += 1
        frac[k] -= 1.0  # its remainder is spent
        load += coef[k]
    out = np.zeros(x.size, dtype=np.int64)
    out[used] = elems
    if out.sum() != total:
        raise AssertionError("rounding lost elements")
    return out


def _integer_plan(
    master: _Master,
    x: np.ndarray,
    total: int,
    size: int,
    t_lp: float,
    lat_used: float,
    rounds: int,
    optimal: bool,
) -> RoutePlanResult:
    x = np.where(x > 1e-9 * x.sum(), x, 0.0)
    elems = _round(master, x, total)
    routes: list[Route] = []
    origins: list[str] = []
    pos = 0
    used_lat = 0.0
    for c in np.flatnonzero(elems):
        e = int(elems[c])
        col = master.cols[int(c)]
        for s in col.shapes:
            routes.append(Route(pos, pos + e, s.root, s.up, s.down))
            origins.append(col.origin)
        used_lat = max(used_lat, master.lat[int(c)])
        pos += e
    t_bw = bandwidth_time(routes, master.w, master.shared)
    return RoutePlanResult(
        tuple(routes),
        t_bw + used_lat,
        t_bw,
        used_lat,
        t_lp + lat_used,
        rounds,
        len(master.cols),
        optimal,
        tuple(origins),
    )


def bandwidth_time(
    routes: Sequence[Route], bw: np.ndarray, shared: Sequence[SharedLink] = ()
) -> float:
    """T_bw of routes: max over pairs and shared links of bytes / rate (seconds)."""
    w = check_bw(bw)
    n = w.shape[0]
    load = np.zeros((n, n))
    for r in routes:
        nbytes = r.elems * ELEM_BYTES
        for a, b in (*r.up, *r.down):
            load[a, b] += nbytes
    used = load > 0
    if not used.any():
        return 0.0
    if np.any(w[used] <= 0):
        raise PlanError("routes", "a route uses a dead link")
    t = float((load[used] / (w[used] * BYTES_PER_S_PER_MBIT)).max())
    for s in shared:
        tot = sum(load[a, b] for a, b in s.pairs)
        t = max(t, tot / (s.mbit * BYTES_PER_S_PER_MBIT))
    return t


def route_latency(routes: Sequence[Route], hop: np.ndarray | None) -> float:
    """Latency term of routes: the slowest route's longest reduce + broadcast path."""
    if hop is None:
        return 0.0
    hops = hop.tolist()
    return max(
        (
            _tree_depth(r.root, r.up, hops, False) + _tree_depth(r.root, r.down, hops, True)
            for r in routes
        ),
        default=0.0,
    )


def route_time(
    routes: Sequence[Route],
    bw: np.ndarray,
    shared: Sequence[SharedLink] | None = None,
    delay_s: np.ndarray | None = None,
    part_bytes: int = 0,
) -> float:
    """Any routes' time under this module's model: T_bw + the slowest route's latency."""
    w = check_bw(bw)
    sh = check_shared(shared, w.shape[0])
    hop = hop_latency(w, check_delays(delay_s, w.shape[0], sh), part_bytes)
    return bandwidth_time(routes, w, sh) + route_latency(routes, hop)
