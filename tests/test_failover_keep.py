"""Failover that resends only what was lost: the keep-list logic (pure) and the reduce engine
carrying a kept route's sums across a revision after a dead relay."""

from __future__ import annotations

import numpy as np
import pytest

from crew.control.assignment import (
    ReduceError,
    keepable_routes,
    lost_ranges,
    place_routes,
    revision_routes,
    validate_assign,
)
from crew.control.verify import check_vector, project
from crew.plan.routes import Route, star_routes
from crew.runtime.reduce import ReduceEngine
from crew.wire.frames import Frame, FrameKind
from crew.wire.protocol import Assign, decode

RUN = 3


def _assign(routes: list[Route], total: int, members, rev: int, kept=()) -> Assign:
    return Assign(
        group=1,
        rev=rev,
        scheme="crew",
        members=list(members),
        weights=[1 / len(members)] * len(members),
        routes=[r.to_list() for r in routes],
        pipelined=True,
        total=total,
        part_elems=1 << 20,
        prescatter=[],
        iterations=[0] * len(members),
        split_epoch=-1,
        kept=[list(e) for e in kept],
    )


# -- the keep list (pure) ----------------------------------------------------------------------

STARS = star_routes([(0, 0, 100), (3, 100, 250), (5, 250, 400)], [0, 1, 2])


def test_routes_through_a_dead_link_or_node_are_lost_the_rest_kept() -> None:
    alive = {0, 1, 2, 3, 5}
    assert keepable_routes(STARS, alive, lambda s, d: True) == [0, 1, 2]
    assert keepable_routes(STARS, alive - {3}, lambda s, d: True) == [0, 2]
    # 1 -> 5 dead: only the route rooted at 5 scatters on it
    assert keepable_routes(STARS, alive, lambda s, d: (s, d) != (1, 5)) == [0, 1]
    # 0 -> 1 dead: route 0's broadcast uses it
    assert keepable_routes(STARS, alive, lambda s, d: (s, d) != (0, 1)) == [1, 2]


def test_lost_ranges_are_the_gaps_the_kept_routes_leave() -> None:
    assert lost_ranges(STARS, [0, 2], 400) == [(100, 250)]
    assert lost_ranges(STARS, [1], 400) == [(0, 100), (250, 400)]
    assert lost_ranges(STARS, [], 400) == [(0, 400)]
    assert lost_ranges(STARS, [0, 1, 2], 400) == []


def test_placed_routes_cover_the_lost_ranges_exactly_and_validate() -> None:
    kept = [1]
    lost = lost_ranges(STARS, kept, 400)
    compact = star_routes([(2, 0, 120), (4, 120, 250)], [0, 1, 2])  # planned on 250 elements
    placed = place_routes(compact, lost)
    assert [(r.start, r.stop, r.root) for r in placed] == [
        (0, 100, 2),
        (250, 270, 2),
        (270, 400, 4),
    ]
    routes, kept_list = revision_routes(STARS, kept, placed)
    assert kept_list == [[0, 1]] and routes[0] == STARS[1]
    validate_assign(_assign(routes, 400, [0, 1, 2], rev=1, kept=kept_list), 6)
    with pytest.raises(ReduceError, match="outside the lost length"):
        place_routes(star_routes([(2, 0, 300)], [0]), lost)


def test_kept_list_is_checked_and_travels_in_assign() -> None:
    routes = list(STARS)
    with pytest.raises(ReduceError, match="assign.kept"):
        validate_assign(_assign(routes, 400, [0, 1, 2], rev=1, kept=[[0, 0], [0, 1]]), 6)
    with pytest.raises(ReduceError, match="assign.kept"):
        validate_assign(_assign(routes, 400, [0, 1, 2], rev=0, kept=[[0, 0]]), 6)
    a = _assign(routes, 400, [0, 1, 2], rev=1, kept=[[0, 0], [2, 2]])
    assert decode(a.to_dict()) == a
    older = a.to_dict()
    del older["kept"]  # an Assign from before the field existed: nothing kept
    assert decode(older).kept == []  # type: ignore[attr-defined]


# -- the engine across a revision ----------------------------------------------------------------


class Wire:
    """Engines joined by an in-order frame queue that the test pumps; frames from or to a dead
    node vanish, and chosen frames can be held back and released later."""

    def __init__(self, n: int, check: np.ndarray | None = None):
        self.queue: list[tuple[int, Frame]] = []
        self.held: list[tuple[int, Frame]] = []
        self.dead: set[int] = set()
        self.hold: set[tuple[int, int]] = set()  # (sender, receiver) held back
        self.done: list[tuple[int, int]] = []
        self.sent: list[tuple[int, Frame]] = []
        self.engines = [
            ReduceEngine(i, n, RUN, self._send(i), self._report(i), check=check) for i in range(n)
        ]

    def _send(self, i: int):
        def send(dst: int, frame: Frame, priority: int) -> None:
            self.sent.append((dst, frame))
            self.queue.append((dst, frame))

        return send

    def _report(self, i: int):
        return lambda group, rev, nbytes: self.done.append((i, rev))

    def pump(self) -> None:
        for _ in range(100_000):
            if not self.queue:
                return
            dst, frame = self.queue.pop(0)
            if dst in self.dead or frame.sender in self.dead:
                continue
            if (frame.sender, dst) in self.hold:
                self.held.append((dst, frame))
                continue
            self.engines[dst].on_frame(frame)
        raise AssertionError("frames kept flowing")

    def release(self) -> None:
        self.hold.clear()
        self.queue.extend(self.held)
        self.held.clear()
        self.pump()


RELAY_MEMBERS = (0, 1, 2)
RELAY_TOTAL = 300_000
# Route 0: a star at member 0; route 1: a tree through non-member relay 4 to root 3.
RELAY_ROUTES = [
    Route(0, 100_000, 0, up=((1, 0), (2, 0)), down=((0, 1), (0, 2))),
    Route(
        100_000,
        RELAY_TOTAL,
        3,
        up=((0, 4), (2, 4), (4, 3), (1, 3)),
        down=((3, 4), (4, 0), (4, 2), (3, 1)),
    ),
]


def _rev0_with_relay_4_dead(w: Wire, v: dict[int, np.ndarray]) -> None:
    w.dead = {4}
    rev0 = _assign(RELAY_ROUTES, RELAY_TOTAL, RELAY_MEMBERS, rev=0)
    for node in range(4):
        w.engines[node].assign(rev0, v.get(node))
    w.pump()
    assert w.done == []  # route 1 never completes: its relay is dead


def _rev1_around_relay_4() -> tuple[list[int], Assign]:
    """What the coordinator revises to: the routes that avoid 4 kept, the lost range re-planned
    as a star at 3. Returns the kept route indices and revision 1."""
    kept = keepable_routes(RELAY_ROUTES, {0, 1, 2, 3}, lambda s, d: 4 not in (s, d))
    placed = place_routes(
        star_routes([(3, 0, RELAY_TOTAL - 100_000)], list(RELAY_MEMBERS)),
        lost_ranges(RELAY_ROUTES, kept, RELAY_TOTAL),
    )
    routes, kept_list = revision_routes(RELAY_ROUTES, kept, placed)
    return kept, _assign(routes, RELAY_TOTAL, RELAY_MEMBERS, rev=1, kept=kept_list)


def test_a_revision_after_a_dead_relay_keeps_the_delivered_parts() -> None:
    """Route 0 (a star at 0) is complete but for 2's parts, which are still on their way;
    route 1 goes through relay 4, which dies. Revision 1 keeps route 0 and re-plans route 1's
    range as a star at 3: nothing of route 0 is sent again, 2's late rev-0 parts still count,
    and every member ends with the exact average."""
    rng = np.random.default_rng(4)
    members = RELAY_MEMBERS
    v = {m: rng.standard_normal(RELAY_TOTAL).astype(np.float32) for m in members}
    check = check_vector(RUN, RELAY_TOTAL)
    w = Wire(5, check)
    w.hold = {(2, 0)}
    _rev0_with_relay_4_dead(w, v)
    assert w.held, "2's route-0 parts are held back"

    kept, rev1 = _rev1_around_relay_4()
    assert kept == [0]
    sent_before = len(w.sent)
    for node in range(4):
        w.engines[node].assign(rev1, v.get(node))
    w.pump()
    resent = [f for _, f in w.sent[sent_before:] if f.offset < 100_000]
    assert resent == [], "route 0 was kept: none of its parts is sent again"
    # 2's rev-0 parts of the kept route arrive now, after the revision: they still count.
    useless = w.engines[0].superseded()
    assert not any(useless(f) for _, f in w.held)
    w.release()
    expected = sum(np.float32(1 / 3) * v[m] for m in members)
    assert sorted(w.done) == [(0, 1), (1, 1), (2, 1)]
    for m in members:
        result = w.engines[m].result(1)
        assert result is not None
        np.testing.assert_allclose(result, np.asarray(expected), rtol=1e-5, atol=1e-6)
        # The projection summed part by part counts the kept route's rev-0 parts once.
        proj = w.engines[m].result_projection(1)
        assert proj == pytest.approx(project(check, result), rel=1e-9)
    assert all(e.dropped_frames == 0 for e in w.engines)


def test_a_kept_routes_delivered_results_stay_in_the_result_projection() -> None:
    """Route 0 completes in rev 0 (its results are delivered), route 1's relay dies; rev 1
    keeps route 0. Each member's part-by-part projection must still count route 0's results,
    delivered before the revision, exactly once."""
    rng = np.random.default_rng(5)
    v = {m: rng.standard_normal(RELAY_TOTAL).astype(np.float32) for m in RELAY_MEMBERS}
    check = check_vector(RUN, RELAY_TOTAL)
    w = Wire(5, check)
    _rev0_with_relay_4_dead(w, v)
    kept, rev1 = _rev1_around_relay_4()
    assert kept == [0]
    for node in range(4):
        w.engines[node].assign(rev1, v.get(node))
    w.pump()
    assert sorted(w.done) == [(0, 1), (1, 1), (2, 1)]
    for m in RELAY_MEMBERS:
        result = w.engines[m].result(1)
        assert result is not None
        proj = w.engines[m].result_projection(1)
        assert proj == pytest.approx(project(check, result), rel=1e-9)


def test_frames_of_routes_a_revision_dropped_are_superseded() -> None:
    route0 = Route(0, 10, 0, up=((1, 0),), down=((0, 1),))
    route1 = Route(10, 20, 1, up=((0, 1),), down=((1, 0),))
    moved = Route(10, 20, 0, up=((1, 0),), down=((0, 1),))
    w = Wire(2)
    w.engines[0].assign(_assign([route0, route1], 20, (0, 1), rev=0), np.ones(20, np.float32))
    w.engines[0].assign(_assign([route0, moved], 20, (0, 1), rev=1, kept=[[0, 0]]))
    useless = w.engines[0].superseded()
    assert useless(Frame(FrameKind.SCATTER, 0, RUN, group=1, rev=0, block=1, offset=10))
    assert not useless(Frame(FrameKind.SCATTER, 0, RUN, group=1, rev=0, block=0))  # kept
    assert not useless(Frame(FrameKind.RESULT, 0, RUN, group=1, rev=1, block=1, offset=10))
    w.engines[0].finish(1)
    assert w.engines[0].superseded()(Frame(FrameKind.SCATTER, 0, RUN, group=1, rev=1, block=0))
