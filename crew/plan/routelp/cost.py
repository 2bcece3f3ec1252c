"""Any routes' time under the route LP's cost model. Pure, no I/O.

Every resource (a directed link, or a :class:`~crew.plan.inputs.SharedLink` over several)
drains its load at its rate, all at once: fluid, cut-through forwarding of parts, free adds. So
the bandwidth time is ``T_bw = max over resources of load / rate`` (:func:`bandwidth_time`).
With one-way delays and a part size, each hop also costs the part one delay plus its
serialisation (:func:`hop_latency`), and the routes end after the slowest route's longest
reduce path plus longest broadcast path (:func:`route_latency`). :func:`route_time` is the
sum: exact for one route on idle links in the fluid limit; a model, not a bound.

Not modelled: TCP's and HTB's sharing of one connection among several flows, aggregation CPU,
and that each route is a separate stream in the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from crew.plan.inputs import (
    BYTES_PER_S_PER_MBIT,
    ELEM_BYTES,
    PlanError,
    SharedLink,
    check_bw,
    check_delays,
    check_shared,
)
from crew.plan.routelp.shapes import tree_depth
from crew.plan.routes import Route


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
            tree_depth(r.root, r.up, hops, False) + tree_depth(r.root, r.down, hops, True)
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
    """Any routes' time under this cost model: T_bw + the slowest route's latency."""
    w = check_bw(bw)
    sh = check_shared(shared, w.shape[0])
    hop = hop_latency(w, check_delays(delay_s, w.shape[0], sh), part_bytes)
    return bandwidth_time(routes, w, sh) + route_latency(routes, hop)
