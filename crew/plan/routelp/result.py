"""The route LP's result: its fractional optimum turned into whole-element routes. Pure.

Each used column gets the floor of its share; the few elements left over go one by one where
they raise the busiest resource least; the predicted time is recomputed from the whole-element
routes (:func:`~crew.plan.routelp.cost.bandwidth_time` plus the used columns' latency), so a
plan's prediction is the cost model applied to what the workers will move.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from crew.plan.rounding import largest_remainder
from crew.plan.routelp.cost import bandwidth_time
from crew.plan.routelp.master import MasterLP
from crew.plan.routes import Route


@dataclass(frozen=True)
class RoutePlanResult:
    """The chosen routes (whole elements) and their time under the route LP's cost model
    (:mod:`crew.plan.routelp.cost`)."""

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


def round_columns(master: MasterLP, x: np.ndarray, total: int) -> np.ndarray:
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


def integer_plan(
    master: MasterLP,
    x: np.ndarray,
    total: int,
    size: int,
    t_lp: float,
    lat_used: float,
    rounds: int,
    optimal: bool,
) -> RoutePlanResult:
    """The plan of the LP's fractions ``x``: whole elements per column (:func:`round_columns`),
    laid out in column order, with its time recomputed from them."""
    x = np.where(x > 1e-9 * x.sum(), x, 0.0)
    elems = round_columns(master, x, total)
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
