"""The route LP's column generation: from a group's inputs to its plan. Pure, no I/O (the
wall clock bounds the search only when the settings' time budget runs out).

The pool starts with the seeds (:mod:`.seeds`), any warm columns (:mod:`.cache`) and, per
root, the trees of least total link time. Each round solves the master LP (:mod:`.master`)
and prices new columns at its duals (:mod:`.pricing`): first at Wentges-smoothed duals (a mix
with those of the best Lagrangian bound so far, as the duals are very degenerate and most
links price at 0 until they bind), then at the plain duals. With exact pricing the loop stops
when no column has negative reduced cost (Lagrangian gap <= ``gap``): the plan is then optimal
over all routes, so no route-based scheme has a lower cost under this model. From
``cut_check_min_n`` workers on it also stops once the LP reaches the max-flow bound
(:func:`crew.plan.bound.lower_bound`): optimal over every scheme. The loop is bounded
(``max_rounds``, ``time_budget_s``); if it stops early the ring's routes join the pool before
the final solve, so the plan stays at least as good as every seeded baseline, and
``RoutePlanResult.gap`` bounds how far it may be above the optimum. The latency-level search
(:mod:`.levels`) then picks the fractions, and :mod:`.result` rounds them to whole elements.

Cost: per round one warm-started LP solve and one pricing (exact: O(3^p n + 2^p n^2)).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Collection, Sequence

import numpy as np

from crew.plan import inputs
from crew.plan.bound import lower_bound
from crew.plan.inputs import BYTES_PER_S_PER_MBIT, ELEM_BYTES, PlanError, SharedLink
from crew.plan.routelp.cache import RouteLPCache
from crew.plan.routelp.cost import hop_latency
from crew.plan.routelp.levels import choose_level
from crew.plan.routelp.master import MasterLP
from crew.plan.routelp.pricing import price_exact, price_spt
from crew.plan.routelp.result import RoutePlanResult, integer_plan
from crew.plan.routelp.seeds import (
    crossed_columns,
    relay_star_columns,
    ring_columns,
    seed_columns,
    shape_cost,
)
from crew.plan.routelp.settings import DEFAULT_SETTINGS, RouteLPSettings
from crew.plan.routelp.shapes import Column, Shape
from crew.plan.routes import Route

log = logging.getLogger(__name__)

TIE = 1e-9
"""Relative weight of link time in pricing: ties go to routes over fewer or faster links."""


def plan_routes(
    bw: np.ndarray,
    members: Sequence[int],
    size: int,
    active: Collection[int] | None = None,
    *,
    shared: Sequence[SharedLink] | None = None,
    delay_s: np.ndarray | None = None,
    part_bytes: int = 0,
    settings: RouteLPSettings = DEFAULT_SETTINGS,
    cache: RouteLPCache | None = None,
) -> RoutePlanResult:
    """CREW's plan for one group: the route LP of :mod:`crew.plan.routelp`.

    ``shared``: extra capacities over sets of pairs. ``delay_s``: n x n one-way delays in
    seconds (``None``: no latency term); ``part_bytes`` adds that many bytes' serialisation
    per hop (a part and the socket backlog it waits behind, as the coordinator passes them).

    ``settings`` bound and tune the search (:class:`RouteLPSettings`); a plan cut short by
    ``max_rounds`` or ``time_budget_s`` says by how much it may be above the optimum
    (``RoutePlanResult.gap``).

    ``cache``: reuse the work of earlier calls with the same cache
    (:class:`~crew.plan.routelp.cache.RouteLPCache`). The same inputs return the cached result;
    otherwise the columns that earlier plans of the same members and active set used join the
    seeds (see the cache's docstring for what that may change). None: plan cold, keep nothing.
    Raises PlanError when the members cannot reach each other through active workers.
    """
    w = inputs.check_bw(bw)
    n = w.shape[0]
    ms = inputs.check_group(members, n)
    act = inputs.check_active(active, n, ms)
    total = inputs.check_size(size, ELEM_BYTES)
    sh = inputs.check_shared(shared, n)
    if not inputs.is_int(part_bytes) or part_bytes < 0:
        raise PlanError("part_bytes", f"must be an int >= 0, got {part_bytes!r}")
    delays = inputs.check_delays(delay_s, n, sh)
    if not isinstance(settings, RouteLPSettings):
        raise PlanError("settings", f"must be RouteLPSettings, got {settings!r}")
    key = (
        w.tobytes(), ms, act.tobytes(), total, sh,
        None if delays is None else delays.tobytes(), int(part_bytes), settings.exact,
        settings.max_rounds, settings.level_tolerance,
    )  # fmt: skip

    def plan() -> RoutePlanResult:
        return _plan(w, ms, act, total, sh, delays, int(part_bytes), settings, cache)

    return cache.result(key, plan) if cache is not None else plan()


def _plan(
    w: np.ndarray,
    ms: tuple[int, ...],
    act: np.ndarray,
    total: int,
    sh: tuple[SharedLink, ...],
    delays: np.ndarray | None,
    part_bytes: int,
    settings: RouteLPSettings,
    cache: RouteLPCache | None,
) -> RoutePlanResult:
    """Column generation (the module docstring), then the latency-level search and rounding."""
    n = w.shape[0]
    exact = settings.exact
    gap_tol = settings.gap
    size = total * ELEM_BYTES
    hop = hop_latency(w, delays, part_bytes)
    if len(ms) == 1:
        route = Route(0, total, ms[0], (), ())
        return RoutePlanResult((route,), 0.0, 0.0, 0.0, 0.0, 0, 1, True, ("trivial",))
    p = len(ms)
    if exact is None:
        work = settings.exact_pricing_work
        exact = 3**p * n <= work and 2**p * n * n <= work
    usable = act[:, None] & act[None, :] & (w > 0)
    np.fill_diagonal(usable, False)
    master = MasterLP(w, sh, hop, settings)
    for col in seed_columns(w, ms, act, with_ring=not exact):
        master.add(col)
    if n >= settings.cut_check_min_n and settings.relay_seeds:
        for col in relay_star_columns(w, ms, act):
            master.add(col)
    pool_key = RouteLPCache.group_key(n, ms, act.tobytes())
    if cache is not None:
        for shape in cache.warm_shapes(pool_key):
            if all(usable[e] for e in (*shape.up, *shape.down)):
                master.add(Column((shape,), "warm"))
    roots = np.flatnonzero(act)
    eps = TIE * master.r_ref / np.where(usable, w, np.inf)
    eps[~usable] = 0.0
    price = price_exact if exact else price_spt
    seconds_per_unit = size / (master.r_ref * BYTES_PER_S_PER_MBIT)
    t0 = time.perf_counter()
    rounds, optimal = 0, False
    cut = (
        _cut_units(w, ms, act, size, sh, seconds_per_unit) if n >= settings.cut_check_min_n else 0.0
    )
    # Also seed, per root, the trees of least total link time (the duals of an LP where every
    # link is equally loaded): they start the pool near the optimum and save rounds.
    _, trees = price(eps / TIE, usable, ms, roots, math.inf, min(roots.size, settings.tree_seeds))
    for _, shape in trees:
        master.add(Column((shape,), "tree"))
    sol = master.solve() if master.cols else None
    lower = -math.inf  # best Lagrangian bound so far, and the dual weights that gave it
    center: np.ndarray | None = None
    for rounds in range(1, settings.max_rounds + 1):  # noqa: B007 - rounds is reported
        if sol is None:  # no seed column (e.g. no usable star): price on zero duals
            t, mu, wt = math.inf, math.inf, np.zeros((n, n))
        else:
            _, t, y, mu = sol
            wt = master.link_weights(y)
        if t <= cut * (1 + gap_tol):
            optimal = True  # the LP reached the max-flow bound: no scheme at all does better
            break
        rc_cut = mu - gap_tol * (t if math.isfinite(t) else 0.0)
        # Wentges smoothing: the duals are very degenerate (most links price at 0), so price
        # first at a mix with the duals of the best bound so far; fall back to the plain duals
        # when that finds no improving column (a mis-price).
        new: list[Shape] = []
        wt_rows: list[list[float]] | None = None
        smoothing = settings.smoothing
        smoothed = [] if center is None else [smoothing * center + (1 - smoothing) * wt]
        for weights in [*smoothed, wt]:
            best, found = price(
                weights + eps, usable, ms, roots, math.inf, settings.columns_per_round
            )
            if best > lower:  # any weights with sum(y) = 1 give t >= min column cost
                lower, center = best, weights
            if found and wt_rows is None:
                wt_rows = wt.tolist()
            rows = wt_rows or []  # set whenever found has a shape to cost
            new = [s for _, s in found if shape_cost(s, rows) < rc_cut]
            if new:
                break
        log.debug("route LP round %d: t=%.9g, bound %.9g", rounds, t, lower)
        if sol is not None and exact and t - lower <= gap_tol * t:
            optimal = True  # Lagrangian bound: no mix of routes beats t by more than the gap
            break
        added = sum(master.add(Column((s,), "priced")) for s in new)
        if settings.cross_pairs and n <= settings.cross_max_n and sol is not None:
            for col in crossed_columns(master, sol[0], new, settings.cross_limit):
                master.add(col)
        if not added:
            optimal = exact  # exact pricing found no improving column
            break
        sol = master.solve()
        if time.perf_counter() - t0 > settings.time_budget_s:
            log.warning("route LP: column generation stopped after %d rounds (time budget)", rounds)
            break
    if sol is None:
        raise PlanError("bw", f"no route connects the members {ms} through active workers")
    if not optimal:
        for col in ring_columns(w, ms):  # keep the guarantee over the ring when unproven
            master.add(col)
        if not cut and n < settings.cut_check_min_n:
            cut = _cut_units(w, ms, act, size, sh, seconds_per_unit)
    x, t_lp, lat_used = choose_level(master, seconds_per_unit, settings)
    if cache is not None:  # used columns first, then the rest of the pool (see .cache)
        cache.remember(pool_key, _used_shapes(master, x, sol[0], np.ones(len(master.cols))))
    if optimal:
        gap = 0.0
    else:  # lower bounds in LP units: Lagrangian (only valid with exact pricing) and max-flow
        best = max(lower if exact else 0.0, cut)
        t_final = t_lp / seconds_per_unit
        gap = max(0.0, t_final / best - 1.0) if best > 0 else math.inf
    plan = integer_plan(master, x, total, size, t_lp, lat_used, rounds, optimal)
    return dataclasses.replace(plan, gap=gap)


def _cut_units(
    w: np.ndarray,
    ms: tuple[int, ...],
    act: np.ndarray,
    size: int,
    sh: tuple[SharedLink, ...],
    seconds_per_unit: float,
) -> float:
    """The max-flow cut bound (:func:`crew.plan.bound.lower_bound`, bandwidth only) in LP
    units."""
    bound = lower_bound(w, ms, size, np.flatnonzero(act).tolist(), shared=sh or None)
    return bound / seconds_per_unit if math.isfinite(bound) else 0.0


def _used_shapes(master: MasterLP, *xs: np.ndarray) -> list[Shape]:
    """The single-shape columns that any of the solutions ``xs`` used, in that order."""
    used: dict[Shape, None] = {}
    for x in xs:
        for c in np.flatnonzero(x > 0):
            col = master.cols[c]
            if len(col.shapes) == 1:
                used.setdefault(col.shapes[0])
    return list(used)
