"""An assignment, checked, and the parts it splits into: pure, shared by the reduce engine and
the worker's control logic (``crew.control.worker_control``), which must agree on them without
talking.
"""

from __future__ import annotations

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


def part_starts(route: Route, part_elems: int) -> list[int]:
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
