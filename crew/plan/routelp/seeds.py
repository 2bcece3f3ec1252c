"""Where the route LP's columns come from besides pricing: the seeds that put every route
baseline in the pool, and the crossed pairs added after each pricing. Pure, no I/O.

The pool starts with CREW's stars (one per usable aggregator, which is also every PS plan),
BLINK's packed trees, the all-to-all bundle and, when pricing is heuristic, the ring's routes;
at larger n also one-relay stars. Since the master LP's optimum over the pool is never above
any column mix in it, no seeded baseline beats the plan under the LP's cost model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from crew.plan.inputs import PlanError
from crew.plan.ringorder import ring_order
from crew.plan.routelp.master import MasterLP
from crew.plan.routelp.shapes import Column, Edge, Shape
from crew.plan.routes import Route
from crew.plan.trees import eccentric_root, pack_trees, tree_routes


def shape_cost(s: Shape, wt: list[list[float]]) -> float:
    """The shape's total link weight (``wt`` as nested lists: numpy scalars index slowly)."""
    return float(sum(wt[a][b] for a, b in (*s.up, *s.down)))


def _star(root: int, members: Sequence[int]) -> Shape:
    others = [m for m in members if m != root]
    return Shape(root, tuple((m, root) for m in others), tuple((root, m) for m in others))


def _route_shape(r: Route) -> Shape:
    return Shape(r.root, tuple(sorted(r.up)), tuple(sorted(r.down)))


def seed_columns(
    w: np.ndarray, members: tuple[int, ...], act: np.ndarray, with_ring: bool
) -> list[Column]:
    """The stars of every usable aggregator, BLINK's packed trees, the all-to-all bundle (when
    every member pair has a live link) and, ``with_ring``, the ring's routes."""
    out: list[Column] = []
    rows = w[list(members), :]
    cols = w[:, list(members)]
    usable = act & (rows.min(axis=0) > 0) & (cols.min(axis=1) > 0)
    for v in np.flatnonzero(usable):  # CREW's stars, and every PS server
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
            out.extend(ring_columns(w, members))
    return out


def relay_star_columns(w: np.ndarray, members: tuple[int, ...], act: np.ndarray) -> list[Column]:
    """Per root, the star whose every leg takes the widest of the direct link and the two-hop
    paths through one active non-member (as :func:`crew.plan.starcost.two_hop`, but only for
    the legs of members, O(p n^2)): the first step from a star towards the relayed trees that large
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


def ring_columns(w: np.ndarray, members: tuple[int, ...]) -> list[Column]:
    """The ring baseline's routes, one column per chunk; none when no ring is found."""
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


def crossed_columns(
    master: MasterLP, x: np.ndarray, new: Sequence[Shape], limit: int
) -> list[Column]:
    """A route's reduce tree and broadcast tree are independent given its root, so each new
    shape's in-tree also goes with the out-trees of the (at most ``limit``) most used
    routes at its root, and its out-tree with their in-trees. Pricing finds the best pair per
    root; the LP often wants to mix it with what it has, and the crossed pairs have latencies
    that neither parent has (a short reduce with a short broadcast)."""
    out = []
    order = np.argsort(-x, kind="stable")[: int(np.count_nonzero(x > 1e-12))]
    used = [master.cols[c].shapes[0] for c in order if len(master.cols[c].shapes) == 1]
    for s in new:
        for u in [u for u in used if u.root == s.root][:limit]:
            if u.down != s.down:
                out.append(Column((Shape(s.root, s.up, u.down),), "priced"))
            if u.up != s.up:
                out.append(Column((Shape(s.root, u.up, s.down),), "priced"))
    return out
