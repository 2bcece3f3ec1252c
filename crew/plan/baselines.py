"""Route planners for the baseline schemes: capacity matrix + group -> routes. Pure, no I/O.

Every scheme is priced and executed in the route vocabulary of :mod:`crew.plan.routes`, so all of
them run on the same transport and the same emulated links. Conventions are those of
:mod:`crew.plan.inputs`: ``bw`` is n x n Mbit/s (``bw[i][j]`` the rate of i -> j, 0 = dead link,
diagonal ignored), ``group`` the member indices, ``size`` the bytes of the vector (elements of
:data:`~crew.plan.inputs.ELEM_BYTES` bytes), times in seconds.

The schemes, and how they relate to what the CREW paper compares against:

* **PS** (:func:`plan_ps`): one parameter server, any active worker, aggregates the whole
  vector and sends it back. The server minimising its predicted time is chosen.
* **Ring** (:func:`plan_ring`): the classic reduce-scatter + all-gather ring among the members,
  in the order with the fastest slowest link.
* **All-to-all direct** (:func:`plan_a2a`): every member sends its whole vector to every other.
* **BLINK** (:func:`plan_blink`): spanning trees packed over the members' links, each carrying
  a share of the vector proportional to its rate, reduce up and broadcast down the same tree.
  The original (Wang et al., MLSys 2020) packs directed spanning arborescences with a
  multiplicative-weights approximation and streams chunks through them; we pack undirected
  maximum spanning trees greedily (see :func:`crew.plan.trees.pack_trees`) and offer both a streamed
  (``blink-pipe``) and a store-and-forward (``blink``) execution.
* **TopoAdopt** (:func:`plan_topoadopt`): simulated annealing over a few spanning trees of the
  members, their roots and data fractions, minimising the store-and-forward time. The published
  description stops at that level; the moves, temperature schedule and start point are ours.
* P-Reduce and CREW itself are stars over planner plans (:func:`crew.plan.routes.star_routes`).

Two cost models price route sets (both ignore latency and aggregation time, and treat every
directed link as an independent pipe of rate ``bw[i][j]``: no shared NIC):

* :func:`cost_pipelined` -- fluid streaming, T = max over links of load / rate;
* :func:`cost_store_and_forward` -- whole ranges hop by hop, links serve first-ready-first.

Both are achievable by some execution of the routes, so neither can beat
:func:`crew.plan.bound.lower_bound`, and store-and-forward is never below pipelined.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from crew.config import Scheme
from crew.plan import inputs
from crew.plan.inputs import BYTES_PER_S_PER_MBIT, ELEM_BYTES, PlanError, plan_json_object
from crew.plan.ringorder import ring_order
from crew.plan.rounding import largest_remainder
from crew.plan.routes import Route, RouteError, link_load, validate_routes
from crew.plan.trees import eccentric_root, pack_trees, tree_routes

log = logging.getLogger(__name__)


BASELINE_SCHEMES = (
    Scheme.PS,
    Scheme.RING,
    Scheme.A2A,
    Scheme.BLINK,
    Scheme.BLINK_PIPE,
    Scheme.TOPOADOPT,
)


@dataclass(frozen=True)
class RoutePlan:
    """A baseline's routes for one group, and their predicted time.

    ``total`` is the vector length in elements. ``pipelined`` says how the executor should run
    the routes (stream parts, or forward whole ranges); ``predicted_s`` is the matching cost
    model's time, or ``nan`` when the plan was built without a capacity matrix
    (:func:`plan_a2a` without ``bw``). Construction validates the routes
    (:func:`crew.plan.routes.validate_routes`): a RoutePlan always computes the group's sum for
    every member exactly once."""

    scheme: Scheme
    group: tuple[int, ...]
    n: int
    total: int
    routes: tuple[Route, ...]
    pipelined: bool
    predicted_s: float

    def __post_init__(self) -> None:
        if self.scheme not in BASELINE_SCHEMES:
            raise PlanError("scheme", f"unknown scheme {self.scheme!r}")
        object.__setattr__(self, "scheme", Scheme(self.scheme))
        if not inputs.is_int(self.n) or self.n < 1:
            raise PlanError("n", f"must be a positive int, got {self.n!r}")
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "group", inputs.check_group(self.group, self.n))
        if not inputs.is_int(self.total) or self.total < 1:
            raise PlanError("total", f"must be a positive int, got {self.total!r}")
        object.__setattr__(self, "total", int(self.total))
        if not isinstance(self.pipelined, bool):
            raise PlanError("pipelined", f"must be a bool, got {self.pipelined!r}")
        p = self.predicted_s
        if not isinstance(p, float) or not (math.isnan(p) or (math.isfinite(p) and p >= 0)):
            raise PlanError("predicted_s", f"must be a finite non-negative float or nan, got {p!r}")
        object.__setattr__(self, "routes", tuple(self.routes))
        if not all(isinstance(r, Route) for r in self.routes):
            raise PlanError("routes", "must all be crew.plan.routes.Route")
        try:
            validate_routes(self.routes, self.group, self.n, self.total)
        except RouteError as exc:
            raise PlanError("routes", f"{self.scheme}: {exc}") from exc

    def link_load(self, elem_bytes: int = ELEM_BYTES) -> np.ndarray:
        """n x n bytes each directed link carries (one copy of a range per tree edge)."""
        return link_load(self.routes, self.n, elem_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scheme": str(self.scheme),
            "group": list(self.group),
            "n": self.n,
            "total": self.total,
            "routes": [r.to_list() for r in self.routes],
            "pipelined": self.pipelined,
            "predicted_s": None if math.isnan(self.predicted_s) else self.predicted_s,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoutePlan:
        try:
            pred = data["predicted_s"]
            return cls(
                scheme=data["scheme"],
                group=tuple(data["group"]),
                n=data["n"],
                total=data["total"],
                routes=tuple(Route.from_list(r) for r in data["routes"]),
                pipelined=data["pipelined"],
                predicted_s=math.nan if pred is None else float(pred),
            )
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError("plan", f"malformed route plan: {exc!r}") from exc

    @classmethod
    def from_json(cls, text: str) -> RoutePlan:
        return cls.from_dict(plan_json_object(text))


# --------------------------------------------------------------------------- cost models


def _priced_bw(bw: np.ndarray, n: int) -> np.ndarray:
    w = inputs.check_bw(bw)
    if not inputs.is_int(n) or w.shape[0] != n:
        raise PlanError("n", f"bw is {w.shape[0]} x {w.shape[0]} but n = {n!r}")
    return w


def _check_live(routes: Sequence[Route], w: np.ndarray) -> None:
    for k, r in enumerate(routes):
        for a, b in (*r.up, *r.down):
            if not w[a, b] > 0:
                raise PlanError("routes", f"route {k} uses dead link {a}->{b}")


def cost_pipelined(
    routes: Sequence[Route], bw: np.ndarray, n: int, elem_bytes: int = ELEM_BYTES
) -> float:
    """Seconds for the routes when every range streams through its trees (fluid model).

    Each range is cut into infinitely small parts; a node forwards a part (its sum, on the
    reduce tree; a copy, on the broadcast tree) as soon as it has it. All routes start at once
    and share every link in proportion to their bytes, so that link j -> k simply has to carry
    its load (:func:`crew.plan.routes.link_load`) and the routes end together when the busiest link
    is done: ``T = max_{j,k} load(j -> k) / bw[j][k]``. Assumes no latency, free aggregation,
    independent links and no pipeline fill. Raises PlanError for a route on a dead link.
    """
    w = _priced_bw(bw, n)
    routes = tuple(routes)
    _check_live(routes, w)
    load = link_load(routes, n, elem_bytes)
    used = load > 0
    if not used.any():
        return 0.0
    return float((load[used] / (w[used] * BYTES_PER_S_PER_MBIT)).max())


def cost_store_and_forward(
    routes: Sequence[Route], bw: np.ndarray, n: int, elem_bytes: int = ELEM_BYTES
) -> float:
    """Seconds for the routes when every hop moves a whole range (discrete-event model).

    A **transfer** is one range over one tree edge. On the reduce tree, node x may send its
    partial sum to its parent once it holds the whole range from every child (a member's own
    copy is there at time 0); on the broadcast tree, a node forwards once it has the whole sum
    (the root: when its reduce is complete). Each directed link sends one transfer at a time at
    its full rate ``bw[j][k]``, serving transfers in the order they became ready (ties: route
    order, then reduce before broadcast, then edge order) -- the lab's default FCFS
    per-destination queue. All routes start at 0; T is when the last transfer ends.

    For a star (PS, P-Reduce, a2a) this is exactly ``max S / a + max S / b``; for a tree it is
    level-by-level store-and-forward. Compared with BLINK's "each tree gets its packed rate on
    every link" (``2 * height * share / rate`` per tree), FCFS lets a transfer use the whole link
    while others are not ready, and queues it behind earlier ones otherwise. Not modelled:
    latency, aggregation time, schedules that interleave ranges on purpose (Ring's steps are
    priced by :func:`plan_ring` itself). Every link must eventually carry its load at its rate,
    so this is never below :func:`cost_pipelined`. Raises PlanError for a route on a dead link.
    """
    w = _priced_bw(bw, n)
    routes = tuple(routes)
    _check_live(routes, w)
    return _fifo_time(routes, w.tolist(), elem_bytes)


def _fifo_time(routes: Sequence[Route], w: list[list[float]], elem_bytes: int) -> float:
    # w as nested lists: numpy scalar indexing dominated TopoAdopt's annealing loop
    link: list[tuple[int, int]] = []
    dur: list[float] = []
    deps_left: list[int] = []
    dependents: list[list[int]] = []
    for r in routes:
        seconds = r.elems * elem_bytes / BYTES_PER_S_PER_MBIT
        into: dict[int, list[int]] = {}  # node -> reduce transfers arriving at it
        base = len(link)
        for child, parent in r.up:
            into.setdefault(parent, []).append(len(link))
            link.append((child, parent))
            dur.append(seconds / w[child][parent])
            dependents.append([])
        got: dict[int, int] = {}  # node -> broadcast transfer that delivers the sum to it
        for parent, child in r.down:
            got[child] = len(link)
            link.append((parent, child))
            dur.append(seconds / w[parent][child])
            dependents.append([])
        deps_left.extend([0] * (len(link) - base))
        for t in range(base, len(link)):
            a, b = link[t]
            if t - base < len(r.up) or a == r.root:
                need = into.get(a, [])  # a sends once all its children delivered
            else:
                need = [got[a]] if a in got else []
            deps_left[t] = len(need)
            for d in need:
                dependents[d].append(t)
    ready = [0.0] * len(link)
    heap = [(0.0, t) for t in range(len(link)) if deps_left[t] == 0]
    heapq.heapify(heap)
    free: dict[tuple[int, int], float] = {}
    end = 0.0
    done = 0
    while heap:  # each transfer is pushed exactly once: bounded by len(link)
        at, t = heapq.heappop(heap)
        finish = max(at, free.get(link[t], 0.0)) + dur[t]
        free[link[t]] = finish
        end = max(end, finish)
        done += 1
        for d in dependents[t]:
            ready[d] = max(ready[d], finish)
            deps_left[d] -= 1
            if deps_left[d] == 0:
                heapq.heappush(heap, (ready[d], d))
    if done != len(link):
        raise PlanError("routes", "broadcast edges not reachable from their root")
    return end


# --------------------------------------------------------------------------- helpers


def _trivial(scheme: Scheme, members: tuple[int, ...], n: int, total: int) -> RoutePlan:
    """p = 1: the member already holds the sum; nothing moves."""
    route = Route(0, total, members[0], (), ())
    return RoutePlan(scheme, members, n, total, (route,), False, 0.0)


def _finish(
    scheme: Scheme,
    members: tuple[int, ...],
    w: np.ndarray,
    total: int,
    routes: Sequence[Route],
    pipelined: bool,
    predicted: float,
) -> RoutePlan:
    _check_live(routes, w)
    plan = RoutePlan(scheme, members, w.shape[0], total, tuple(routes), pipelined, predicted)
    log.debug("%s plan for %s: %d routes, %.4g s", scheme, members, len(routes), predicted)
    return plan


# --------------------------------------------------------------------------- PS


def plan_ps(
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    active: Collection[int] | None = None,
) -> RoutePlan:
    """Parameter server: one active worker s aggregates the whole vector and sends it back.

    Route: a single star rooted at s over the members (s may be a non-member, which then only
    adds up and relays). Store-and-forward, so with a_s = min_g bw[g][s] and b_s = min_g bw[s][g]
    over members g != s the time is ``M / a_s + M / b_s`` (:func:`cost_store_and_forward`).
    **Rule:** s is the active worker with live links from and to every other member that
    minimises this time, ties to the lowest index. (A single sharded server or a server per
    layer, as in real PS systems, is not modelled; CREW's p2a plan is the load-balanced form.)
    Raises PlanError when no active worker qualifies.
    """
    w = inputs.check_bw(bw)
    n = w.shape[0]
    members = inputs.check_group(group, n)
    act = inputs.check_active(active, n, members)
    total = inputs.check_size(size, ELEM_BYTES)
    if len(members) == 1:
        return _trivial(Scheme.PS, members, n, total)
    best: tuple[float, int] | None = None
    for s in np.flatnonzero(act):
        s = int(s)
        others = [g for g in members if g != s]
        a = min(float(w[g, s]) for g in others)
        b = min(float(w[s, g]) for g in others)
        if a <= 0 or b <= 0:
            continue
        t = size / (a * BYTES_PER_S_PER_MBIT) + size / (b * BYTES_PER_S_PER_MBIT)
        if best is None or t < best[0]:
            best = (t, s)
    if best is None:
        raise PlanError("bw", f"ps: no active worker has live links from and to all of {members}")
    server = best[1]
    others = tuple(g for g in members if g != server)
    route = Route(
        0, total, server, tuple((g, server) for g in others), tuple((server, g) for g in others)
    )
    return _finish(
        Scheme.PS, members, w, total, [route], False, cost_store_and_forward([route], w, n)
    )


# --------------------------------------------------------------------------- Ring


def plan_ring(bw: np.ndarray, group: Sequence[int], size: int) -> RoutePlan:
    """Ring all-reduce: reduce-scatter, then all-gather, among the members.

    Order: the directed cycle o_0 -> o_1 -> ... -> o_0 maximising the slowest of its p links
    (ties: the larger second-slowest link, and so on; then the lexicographically first order
    with the lowest-index member first), found by :func:`crew.plan.ringorder.ring_order`: exact
    up to ``RING_EXACT_MAX`` members, above by a heuristic that may miss the optimum, and may
    raise PlanError for a graph whose only live cycles it did not find.

    Chunks: p near-equal chunks (largest remainder), chunk k owned by o_k. Its reduce path
    starts at o_{k+1} and runs around the ring to o_k (the root); its broadcast path runs from
    o_k onward to o_{k-1}. Every ring link then carries 2(p - 1) chunks.

    Cost: Ring's natural step form (pipelined=False): 2(p - 1) steps, in each of which every
    member sends one chunk to its successor; a step ends when the slowest ring link delivers
    the largest chunk, so ``T = 2(p - 1) * max_chunk / bottleneck``. Raises PlanError when the
    members' live links hold no Hamiltonian cycle.
    """
    w = inputs.check_bw(bw)
    n = w.shape[0]
    members = inputs.check_group(group, n)
    total = inputs.check_size(size, ELEM_BYTES)
    p = len(members)
    if p == 1:
        return _trivial(Scheme.RING, members, n, total)
    order, bottleneck = ring_order(w, members)
    chunks = largest_remainder(np.ones(p), total)
    routes = []
    pos = 0
    for k in range(p):
        if chunks[k] == 0:
            continue
        ring = [order[(k + 1 + j) % p] for j in range(p)]  # o_{k+1}, ..., o_k
        up = tuple(zip(ring[:-1], ring[1:], strict=True))
        bcast = [order[(k + j) % p] for j in range(p)]  # o_k, ..., o_{k-1}
        down = tuple(zip(bcast[:-1], bcast[1:], strict=True))
        routes.append(Route(pos, pos + int(chunks[k]), order[k], up, down))
        pos += int(chunks[k])
    chunk_bytes = int(chunks.max()) * ELEM_BYTES
    predicted = 2 * (p - 1) * chunk_bytes / (bottleneck * BYTES_PER_S_PER_MBIT)
    return _finish(Scheme.RING, members, w, total, routes, False, predicted)


# --------------------------------------------------------------------------- all-to-all


def plan_a2a(group: Sequence[int], size: int, n: int, bw: np.ndarray | None = None) -> RoutePlan:
    """All-to-all direct: every member sends its whole vector to every other member.

    Per member m one route over the whole vector rooted at m: its reduce tree is the star of
    the other members into m, its broadcast tree is empty (m sums what it received itself).
    Each member -> member link carries M once, so every member sends (p - 1) M. Both cost models
    agree (one hop, one range per link): ``T = M / min_{g != h} bw[g][h]``. Without ``bw`` the
    plan is not priced (``predicted_s`` is nan) and dead links cannot be checked; with it, a
    dead link between members raises PlanError.
    """
    if not inputs.is_int(n) or n < 1:
        raise PlanError("n", f"must be a positive int, got {n!r}")
    members = inputs.check_group(group, n)
    total = inputs.check_size(size, ELEM_BYTES)
    if len(members) == 1:
        return _trivial(Scheme.A2A, members, n, total)
    routes = [Route(0, total, m, tuple((g, m) for g in members if g != m), ()) for m in members]
    if bw is None:
        return RoutePlan(Scheme.A2A, members, n, total, tuple(routes), False, math.nan)
    w = _priced_bw(bw, n)
    try:
        _check_live(routes, w)
    except PlanError as exc:
        raise PlanError("bw", f"a2a: a link between members is dead ({exc})") from None
    return _finish(Scheme.A2A, members, w, total, routes, False, cost_pipelined(routes, w, n))


# --------------------------------------------------------------------------- BLINK


def plan_blink(
    bw: np.ndarray, group: Sequence[int], size: int, pipelined: bool, max_trees: int = 4
) -> RoutePlan:
    """BLINK-style trees: :func:`pack_trees`, shares proportional to tree rates.

    Tree t with rate r_t carries ``round(M * r_t / sum r)`` elements (largest remainder; trees
    whose share rounds to 0 are dropped). Root: the member with the fewest hops to its farthest
    member (lowest index on ties), which minimises store-and-forward depth; the streamed cost
    does not depend on the root. Reduce up the tree to the root, broadcast down its reverse.
    ``pipelined`` selects the execution and the model: :func:`cost_pipelined` (scheme
    ``blink-pipe``) or :func:`cost_store_and_forward` (``blink``). Under the packed rates the
    streamed time is at most M / sum r, as in BLINK's analysis. Raises PlanError when the
    members are not connected by links live in both directions.
    """
    w = inputs.check_bw(bw)
    n = w.shape[0]
    members = inputs.check_group(group, n)
    total = inputs.check_size(size, ELEM_BYTES)
    if not isinstance(pipelined, bool):
        raise PlanError("pipelined", f"must be a bool, got {pipelined!r}")
    scheme = Scheme.BLINK_PIPE if pipelined else Scheme.BLINK
    if len(members) == 1:
        return _trivial(scheme, members, n, total)
    trees = pack_trees(w, members, max_trees)
    if not trees:
        raise PlanError("bw", f"blink: links live both ways do not connect {members}")
    elems = largest_remainder(np.array([t.rate for t in trees]), total)
    roots = [eccentric_root(t.edges, members) for t in trees]
    routes = tree_routes([t.edges for t in trees], roots, elems.tolist())
    cost = cost_pipelined if pipelined else cost_store_and_forward
    return _finish(scheme, members, w, total, routes, pipelined, cost(routes, w, n))


# --------------------------------------------------------------------------- TopoAdopt


def plan_topoadopt(
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    seed: int = 0,
    trees: int = 3,
    iterations: int = 2000,
) -> RoutePlan:
    """TopoAdopt-style: simulated annealing over ``trees`` spanning trees and data fractions.

    State: ``trees`` spanning trees over the members (edges live in both directions), a root
    per tree and a weight per tree (its data fraction, rounded by largest remainder). Energy:
    :func:`cost_store_and_forward` of the resulting routes; no pipelining. Start: BLINK's
    packing (:func:`pack_trees` with ``max_trees=trees``, weights = rates, eccentricity roots),
    padded with copies of the first tree at weight 0 -- so the start is exactly
    ``plan_blink(..., pipelined=False, max_trees=trees)``. Moves, equally likely: swap one edge
    of a tree for another edge reconnecting the two halves; re-root a tree at a random member;
    move a random part (up to half) of one tree's weight to another. Metropolis acceptance at a
    temperature cooling geometrically from 5% to 0.01% of the start energy over ``iterations``
    steps. The best state seen is returned, so the result is never worse than the start.
    Deterministic for a given ``seed`` (numpy's default generator). Simplified relative to the
    system the paper compares against: no topology probing, trees over members only.
    """
    w = inputs.check_bw(bw)
    n = w.shape[0]
    members = inputs.check_group(group, n)
    total = inputs.check_size(size, ELEM_BYTES)
    for name, value, low in (("seed", seed, 0), ("trees", trees, 1), ("iterations", iterations, 0)):
        if not inputs.is_int(value) or value < low:
            raise PlanError(name, f"must be an int >= {low}, got {value!r}")
    if len(members) == 1:
        return _trivial(Scheme.TOPOADOPT, members, n, total)
    packed = pack_trees(w, members, trees)
    if not packed:
        raise PlanError("bw", f"topoadopt: links live both ways do not connect {members}")
    ms = sorted(members)
    allowed = sorted(e for e in itertools.combinations(ms, 2) if w[e] > 0 and w[e[::-1]] > 0)
    state_trees = [t.edges for t in packed] + [packed[0].edges] * (trees - len(packed))
    weights = np.array([t.rate for t in packed] + [0.0] * (trees - len(packed)))
    roots = [eccentric_root(t, members) for t in state_trees]
    rates = w.tolist()

    def energy(ts: list[tuple[tuple[int, int], ...]], rs: list[int], ws: np.ndarray) -> float:
        elems = largest_remainder(ws, total).tolist()
        return _fifo_time(tree_routes(ts, rs, elems), rates, ELEM_BYTES)

    rng = np.random.default_rng(seed)
    cur = energy(state_trees, roots, weights)
    best = (cur, list(state_trees), list(roots), weights.copy())
    start = cur
    t_hot, t_cold = 0.05 * start, 1e-4 * start
    for it in range(iterations):
        temp = t_hot * (t_cold / t_hot) ** (it / max(iterations - 1, 1))
        ts, rs, ws = list(state_trees), list(roots), weights.copy()
        move = int(rng.integers(3))
        k = int(rng.integers(trees))
        if move == 0:
            swapped = _swap_edge(ts[k], allowed, ms, rng)
            if swapped is None:
                continue
            ts[k] = swapped
        elif move == 1:
            rs[k] = ms[int(rng.integers(len(ms)))]
        else:
            j = int(rng.integers(trees))
            if j == k or ws[k] <= 0:
                continue
            part = ws[k] * 0.5 * float(rng.random())
            ws[k] -= part
            ws[j] += part
        e = energy(ts, rs, ws)
        if e <= cur or rng.random() < math.exp(-(e - cur) / temp):
            state_trees, roots, weights, cur = ts, rs, ws, e
            if e < best[0]:
                best = (e, list(ts), list(rs), ws.copy())
    cost, ts, rs, ws = best
    routes = tree_routes(ts, rs, largest_remainder(ws, total).tolist())
    log.debug("topoadopt for %s: %.4g s -> %.4g s", members, start, cost)
    return _finish(
        Scheme.TOPOADOPT, members, w, total, routes, False, cost_store_and_forward(routes, w, n)
    )


def _swap_edge(
    tree: tuple[tuple[int, int], ...],
    allowed: Sequence[tuple[int, int]],
    ms: Sequence[int],
    rng: np.random.Generator,
) -> tuple[tuple[int, int], ...] | None:
    """Drop a random edge of ``tree`` and add a random other allowed edge across the cut."""
    drop = tree[int(rng.integers(len(tree)))]
    rest = [e for e in tree if e != drop]
    side = {drop[0]}
    frontier = [drop[0]]
    for x in frontier:
        for a, b in rest:
            y = b if a == x else a if b == x else None
            if y is not None and y not in side:
                side.add(y)
                frontier.append(y)
    across = [e for e in allowed if e != drop and ((e[0] in side) != (e[1] in side))]
    if not across:
        return None
    return tuple(sorted([*rest, across[int(rng.integers(len(across)))]]))


# --------------------------------------------------------------------------- dispatch


def plan_for(
    scheme: Scheme,
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    active: Collection[int] | None = None,
    seed: int = 0,
) -> RoutePlan:
    """The plan of baseline ``scheme`` ("ps", "ring", "a2a", "blink", "blink-pipe",
    "topoadopt"). ``active`` limits PS's choice of server; the other schemes use members only,
    who must all be active. ``seed`` drives TopoAdopt's annealing."""
    if scheme not in BASELINE_SCHEMES:
        raise PlanError(
            "scheme", f"unknown baseline {scheme!r}; known: {', '.join(BASELINE_SCHEMES)}"
        )
    which = Scheme(scheme)
    w = inputs.check_bw(bw)
    members = inputs.check_group(group, w.shape[0])
    inputs.check_active(active, w.shape[0], members)
    if which is Scheme.PS:
        return plan_ps(w, members, size, active)
    if which is Scheme.RING:
        return plan_ring(w, members, size)
    if which is Scheme.A2A:
        return plan_a2a(members, size, w.shape[0], bw=w)
    if which in (Scheme.BLINK, Scheme.BLINK_PIPE):
        return plan_blink(w, members, size, pipelined=which is Scheme.BLINK_PIPE)
    return plan_topoadopt(w, members, size, seed=seed)
