"""The route LP's restricted master: minimise t over the column pool, kept warm in one HiGHS
model. Pure, no I/O.

The LP, with every rate divided by the largest one (``r_ref``) so that coefficients stay near
1::

    minimise t  s.t.  sum_c x_c = 1,  x >= 0,
                      sum_c x_c * uses_c(k) * r_ref / rate_k <= t     for every resource k

Resources are the directed links any column uses and the shared links
(:class:`~crew.plan.inputs.SharedLink`) over them; t is the bandwidth time in units of
``M / (r_ref * 1e6 / 8)`` seconds. Its duals price new columns (:mod:`.pricing`); the level
search (:mod:`.levels`) re-solves it with some columns fixed at 0.

Cost: adding a column is O(its edges); a re-solve after new columns or rows starts from the
last basis (primal simplex), so each round of column generation costs a few pivots.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.sparse import csr_array

from crew.plan.highs import INF, OPTIMAL, Solver, new_solver, status_text
from crew.plan.inputs import PlanError, SharedLink
from crew.plan.routelp.settings import DEFAULT_SETTINGS, RouteLPSettings
from crew.plan.routelp.shapes import Column, Edge, Shape, tree_depth

PRIMAL_SIMPLEX = 4
"""HiGHS's ``simplex_strategy`` value for the primal simplex."""
DUAL_SIMPLEX = 1
"""HiGHS's ``simplex_strategy`` value for the dual simplex."""


def new_lp(simplex_strategy: int) -> Solver:
    """A HiGHS LP "minimise t" with the variable t (column 0) and the convexity row (row 0,
    sum of the route fractions = 1, no fractions yet): what the master and the level LPs start
    from. No presolve: the models are re-solved from their last basis."""
    h = new_solver(presolve="off", simplex_strategy=simplex_strategy)
    h.addVar(0.0, INF)
    h.changeColCost(0, 1.0)
    h.addRow(1.0, 1.0, 0, np.zeros(0, dtype=np.int32), np.zeros(0))
    return h


class MasterLP:
    """The restricted master LP over a growing column pool, kept in one HiGHS instance so that
    every re-solve after adding columns (or rows, as new links appear) warm-starts from the
    previous basis. Column 0 is t; row 0 is ``sum x = 1``; every other row is a resource."""

    def __init__(
        self,
        w: np.ndarray,
        shared: tuple[SharedLink, ...],
        hop: np.ndarray | None,
        settings: RouteLPSettings = DEFAULT_SETTINGS,
    ) -> None:
        self.settings = settings
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
        # every solve of the level search, the level LPs and the rounding read them, and
        # rebuilding them from the column's edges each time costs more than the small LPs.
        self.col_rows: list[np.ndarray] = []
        self.col_vals: list[np.ndarray] = []
        self.tie: list[float] = []
        self.lat: list[float] = []
        # add() runs for a few hundred columns per plan, in Python: plain lists index faster
        # than numpy scalars, and the crossed pairs (``seeds.crossed_columns``) reuse the same
        # trees, whose depths are kept per (direction, root, edges).
        self.rates: list[list[float]] = w.tolist()
        self.hops: list[list[float]] | None = None if hop is None else hop.tolist()
        self.depths: dict[tuple[bool, int, tuple[Edge, ...]], float] = {}
        # Primal simplex: after columns are added the old basis stays primal feasible, so
        # primal re-solves from it without a phase 1.
        self.h = new_lp(PRIMAL_SIMPLEX)

    def _row(self, key: tuple[str, int, int], rate: float) -> int:
        row = self.row_of.get(key)
        if row is None:
            row = self.row_of[key] = len(self.row_rate)
            self.row_rate.append(rate)
            self.h.addRow(-INF, 0.0, 1, np.zeros(1, dtype=np.int32), np.array([-1.0]))
        return row

    def add(self, col: Column) -> bool:
        """Add ``col`` to the pool (its rows too, for links and shared links new to the LP);
        False if the same shapes are already there."""
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
        self.h.addCol(0.0, 0.0, INF, rows.size, rows, vals)
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
                up = depths[False, s.root, s.up] = tree_depth(s.root, s.up, hops, False)
            down = depths.get((True, s.root, s.down))
            if down is None:
                down = depths[True, s.root, s.down] = tree_depth(s.root, s.down, hops, True)
            worst = max(worst, up + down)
        return worst

    def _run(self) -> None:
        self.h.run()
        if self.h.getModelStatus() != OPTIMAL:
            raise PlanError("bw", f"route LP: {status_text(self.h)}")

    def solve(
        self, allowed: np.ndarray | None = None, tie_break: bool = False
    ) -> tuple[np.ndarray, float, np.ndarray, float] | None:
        """(x over all columns, t, resource duals y >= 0, mu); None if no allowed column.

        ``allowed``: only these columns may be used (the others are fixed at 0 for this solve).
        ``tie_break``: then keep t within the settings' ``gap`` of its optimum and minimise the
        link time."""
        k = len(self.cols)
        if k == 0 or (allowed is not None and not allowed.any()):
            return None
        idx = np.arange(1, k + 1, dtype=np.int32)
        if allowed is not None:
            upper = np.where(allowed, INF, 0.0)
            self.h.changeColsBounds(k, idx, np.zeros(k), upper)
            if self.settings.dual_for_levels:
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
                self.h.changeColBounds(0, 0.0, t * (1 + self.settings.gap) + 1e-12)
                try:
                    self._run()
                    x = np.asarray(self.h.getSolution().col_value)[1:].copy()
                except PlanError:
                    pass  # keep the first optimum
                finally:
                    self.h.changeColCost(0, 1.0)
                    self.h.changeColsCost(k, idx, np.zeros(k))
                    self.h.changeColBounds(0, 0.0, INF)
        finally:
            if allowed is not None:
                self.h.changeColsBounds(k, idx, np.zeros(k), np.full(k, INF))
                if self.settings.dual_for_levels:
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
