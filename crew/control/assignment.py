"""An assignment, checked, the parts it splits into and the hops its routes' data travels: pure,
shared by the reduce engine and the worker's control logic (``crew.control.worker_control``),
which must agree on them without talking. The hop counts (:func:`up_heights`,
:func:`down_depth`) set the engine's transport priorities (``crew.runtime.reduce``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from crew.plan.routes import Route, RouteError, validate_routes
from crew.wire.protocol import Assign


class ReduceError(ValueError):
    """An assignment or frame is inconsistent; the message says what."""


def routes_of(assign: Assign) -> list[Route]:
    try:
        return [Route.from_list(r) for r in assign.routes]
    except RouteError as exc:
        raise ReduceError(f"assign.routes: {exc}") from None


def validate_assign(assign: Assign, n: int) -> list[Route]:
    """Check an assignment and return its routes."""
    if assign.part_elems <= 0:
        raise ReduceError(f"assign.part_elems: must be positive, got {assign.part_elems}")
    if not assign.members or len(set(assign.members)) != len(assign.members):
        raise ReduceError(f"assign.members: must be distinct and non-empty: {assign.members}")
    if any(not 0 <= m < n for m in assign.members):
        raise ReduceError(f"assign.members: worker out of range 0..{n - 1}")
    if len(assign.weights) != len(assign.members):
        raise ReduceError("assign.weights: one weight per member")
    routes = routes_of(assign)
    try:
        validate_routes(routes, assign.members, n, assign.total)
    except RouteError as exc:
        raise ReduceError(f"assign.routes: {exc}") from None
    news = [e[0] for e in assign.kept if len(e) == 2]
    olds = [e[1] for e in assign.kept if len(e) == 2]
    if (
        len(news) != len(assign.kept)
        or len(set(news)) != len(news)
        or len(set(olds)) != len(olds)
        or any(not 0 <= k < len(routes) for k in news)
        or any(k < 0 for k in olds)
        or (assign.kept and assign.rev == 0)
    ):
        raise ReduceError(f"assign.kept: not distinct [new, old] route indices: {assign.kept}")
    members = set(assign.members)
    for k, r in enumerate(routes):
        # A relay with nothing below it would never complete a part, and its parent would wait
        # for it until the group's deadline: refuse the plan instead.
        for relay in {c for c, _ in r.up} - members:
            if not r.children_up(relay):
                raise ReduceError(
                    f"assign.routes: route {k}: relay {relay} has no children on the reduce tree"
                )
    return routes


PARTS_PER_ROUTE = 8
"""A route is cut into at least this many parts (while parts stay >= ``MIN_ROUTE_PART_ELEMS``).

Why: a relay or inner node forwards a part only once it holds all of it, so every hop adds one
part's time at the hop's rate, and a route whose whole range is one or two parts is stored and
forwarded. A route's parts scale with the route, not with the vector: with k parts, each extra
hop costs about 1/k of the route's own transfer time."""

MIN_ROUTE_PART_ELEMS = 16 << 10
"""No route part below 64 KiB (unless the route is smaller): per-frame costs (framing, MAC,
a Python call per hop) stay small against the bytes
(docs/decisions/2026-12-03-keep-64-kib-route-parts.md)."""

MAX_ROUTE_PART_ELEMS = 64 << 10
"""No route part above 256 KiB: a part crosses each hop whole before the next hop starts it, so
a 1 MB part costs 0.1-0.4 s per hop at 20-80 Mbit/s. On the one-slow-pair topology (16.8 MB,
p = n = 4) the route LP's 8.4 MB route reduces along 2 -> 1 -> 3 -> 0 and broadcasts along
0 -> 3 -> 1 -> 2; in 1 MB parts its links run at 60-65% of their rates."""


def hop_bytes(part_elems: int, backlog_bytes: int, scale: float = 1.0) -> int:
    """The bytes crew's route LP counts a part to wait for at each hop (its ``part_bytes``):
    the part itself, at the smallest size the engine cuts a multi-hop route into
    (``MIN_ROUTE_PART_ELEMS``, or ``part_elems`` if smaller), plus the unsent bytes queued
    ahead of it in the connection (``backlog_bytes``, ``RunConfig.hop_backlog_bytes``).

    Float32 bytes, as the planners count: ``scale`` (4 / wire bytes per element, 1.0 for an
    uncompressed run) turns the backlog's wire bytes into them, like the planning rates."""
    return 4 * min(part_elems, MIN_ROUTE_PART_ELEMS) + round(backlog_bytes * scale)


def route_part_elems(route: Route, part_elems: int, prescatter: bool = False) -> int:
    """Elements per part of ``route``: ``part_elems`` and ``MAX_ROUTE_PART_ELEMS`` at most, the
    route cut into ``PARTS_PER_ROUTE`` parts where that stays above ``MIN_ROUTE_PART_ELEMS``.

    Derived from the assignment alone, so every node of the route (and the worker's control
    logic) cuts it the same way. Non-blocking groups (``prescatter``) keep ``part_elems``: their
    pre-scattered parts were cut with it before the plan existed (``covered_parts``)."""
    if prescatter:
        return part_elems
    step = max(MIN_ROUTE_PART_ELEMS, -(-route.elems // PARTS_PER_ROUTE))
    return max(1, min(part_elems, MAX_ROUTE_PART_ELEMS, step))


def route_part_sizes(assign: Assign, routes: list[Route]) -> list[int]:
    """``route_part_elems`` of every route of ``assign``."""
    pre = bool(assign.prescatter)
    return [route_part_elems(r, assign.part_elems, pre) for r in routes]


def part_starts(route: Route, part_elems: int) -> list[int]:
    """Starts of the parts of ``route`` cut every ``part_elems`` elements (see
    ``route_part_elems`` for the size a route's parts have)."""
    return list(range(route.start, route.stop, part_elems))


def covered_parts(assign: Assign) -> frozenset[tuple[int, int]]:
    """Non-blocking mode: ``(aggregator, part start)`` of the plan's parts that every member
    already sent whole, unweighted, while the group did not exist yet.

    A member pre-scatters the parts of its a2a segments, cut from each segment's start. The
    re-solved plan keeps each aggregator's prefix of its a2a segment (``planner.
    solve_p2a_nonblocking``), so its parts start where the pre-scattered ones did; a plan part
    is covered when a pre-scattered part to the same aggregator starts there and is at least as
    long. Member and aggregator both derive the set from the assignment alone, so they agree on
    what is not sent again.
    """
    if not assign.prescatter:
        return frozenset()
    step = assign.part_elems
    pre: dict[tuple[int, int], int] = {}
    for agg, start, stop in assign.prescatter:
        for s in range(start, stop, step):
            pre[(agg, s)] = min(s + step, stop) - s
    out = set()
    for r in routes_of(assign):
        for s in part_starts(r, step):
            if pre.get((r.root, s), 0) >= min(s + step, r.stop) - s:
                out.add((r.root, s))
    return frozenset(out)


# -- failover that resends only what was lost ------------------------------------------------


def edges_of(route: Route) -> set[tuple[int, int]]:
    """Directed links ``route`` sends on (reduce and broadcast)."""
    return set(route.up) | set(route.down)


def keepable_routes(
    routes: list[Route], alive: set[int], usable: Callable[[int, int], bool]
) -> list[int]:
    """Indices of the routes a revision can keep as they are: every node alive, every link
    usable. Their parts' sums and contributors stay where they are; only the other routes'
    ranges are planned again (``revision_routes``)."""
    return [
        k
        for k, r in enumerate(routes)
        if r.nodes() <= alive and all(usable(s, d) for s, d in edges_of(r))
    ]


def lost_ranges(routes: list[Route], kept: list[int], total: int) -> list[tuple[int, int]]:
    """The element ranges of ``[0, total)`` no kept route covers, merged and in order."""
    covered = sorted((routes[k].start, routes[k].stop) for k in kept)
    out: list[tuple[int, int]] = []
    at = 0
    for start, stop in covered:
        if start > at:
            out.append((at, start))
        at = max(at, stop)
    if at < total:
        out.append((at, total))
    return out


def place_routes(compact: list[Route], ranges: list[tuple[int, int]]) -> list[Route]:
    """Lay routes planned over ``[0, L)`` (L = the ranges' total length) onto ``ranges``,
    cutting a route where a range ends: each piece keeps its route's trees."""
    length = sum(b - a for a, b in ranges)
    out: list[Route] = []
    for r in compact:
        if not 0 <= r.start < r.stop <= length:
            raise ReduceError(f"route [{r.start}, {r.stop}) outside the lost length {length}")
        offset = 0  # compact position of the current range's start
        for a, b in ranges:
            lo, hi = max(r.start, offset), min(r.stop, offset + (b - a))
            if lo < hi:
                out.append(replace(r, start=a + lo - offset, stop=a + hi - offset))
            offset += b - a
    return out


def revision_routes(
    old: list[Route], kept: list[int], placed: list[Route]
) -> tuple[list[Route], list[list[int]]]:
    """A revision's routes (the kept ones first, then ``placed``) and its ``Assign.kept``:
    ``[new index, index in the previous revision]`` per kept route."""
    routes = [old[k] for k in kept] + placed
    return routes, [[i, k] for i, k in enumerate(kept)]


def up_heights(route: Route) -> dict[int, int]:
    """Per node of the reduce tree: the most hops any contribution has travelled when it
    leaves that node (0 at a leaf)."""
    height: dict[int, int] = {}

    def visit(node: int, depth: int) -> int:
        if depth > len(route.up):
            raise ReduceError(f"route [{route.start}, {route.stop}): reduce tree has a cycle")
        h = max((visit(c, depth + 1) + 1 for c in route.children_up(node)), default=0)
        height[node] = h
        return h

    visit(route.root, 0)
    return height


def down_depth(route: Route, node: int) -> int:
    """Broadcast hops from the route's root to ``node``."""
    parent = {c: p for p, c in route.down}
    depth = 0
    while node != route.root and node in parent and depth <= len(route.down):
        node = parent[node]
        depth += 1
    return depth
