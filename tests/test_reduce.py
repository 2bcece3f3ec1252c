"""The reduce engine over real TCP on loopback: every member ends with the weighted average."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from reduce_kit import assign_routes

from crew.control.assignment import (
    MAX_ROUTE_PART_ELEMS,
    MIN_ROUTE_PART_ELEMS,
    route_part_elems,
    route_part_sizes,
)
from crew.plan import planner
from crew.plan.routes import Route, relayed_star_routes, star_routes
from crew.runtime.prescatter import prescatter_frames
from crew.runtime.reduce import (
    FINISHED_KEPT,
    ReduceEngine,
    ReduceError,
    covered_parts,
    validate_assign,
)
from crew.wire.frames import Frame, FrameCodec, FrameKind
from crew.wire.protocol import Assign, Split
from crew.wire.transport import FlowOrder, Transport, _FlowQueue

RUN = 7
SECRET = b"s" * 32
WAIT_S = 20.0


class Cluster:
    """n engines, each with its own Transport on 127.0.0.1, as the workers would have."""

    def __init__(self, n: int):
        self.n = n
        self.done: dict[tuple[int, int], threading.Event] = {}
        self.reports: list[tuple[int, int, int]] = []
        self._lock = threading.Lock()
        codec = FrameCodec(SECRET, RUN)
        self.engines: list[ReduceEngine] = []
        self.transports: list[Transport] = []
        for i in range(n):
            eng = ReduceEngine(i, n, RUN, self._sender(i), self._reporter(i), prescatter=True)
            tr = Transport(i, ("127.0.0.1", 0), {}, codec, on_frame=eng.on_frame)
            self.engines.append(eng)
            self.transports.append(tr)
        addrs = {i: t.address for i, t in enumerate(self.transports)}
        for i, t in enumerate(self.transports):
            for j, a in addrs.items():
                if j != i:
                    t.set_peer(j, a)
            t.start()

    def _sender(self, i: int):
        def send(dst: int, frame: Frame, priority: int) -> None:
            self.transports[i].send(dst, frame, priority)

        return send

    def _reporter(self, i: int):
        def report(group: int, rev: int, nbytes: int) -> None:
            with self._lock:
                self.reports.append((i, group, rev))
                self.done.setdefault((i, group), threading.Event()).set()

        return report

    def event(self, worker: int, group: int) -> threading.Event:
        with self._lock:
            return self.done.setdefault((worker, group), threading.Event())

    def close(self) -> None:
        for t in self.transports:
            t.close()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster(5)
    try:
        yield c
    finally:
        c.close()


def _assign(
    plan: planner.Plan, group: int, members, weights, rev=0, part_elems=1000, pipelined=True
) -> Assign:
    segments = [(s.worker, s.start, s.stop) for s in plan.segments]
    return assign_routes(
        star_routes(segments, members),
        plan.total_elems,
        group,
        members,
        weights,
        rev,
        part_elems,
        pipelined,
    )


def _bw(n: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    bw = rng.uniform(10, 100, size=(n, n))
    np.fill_diagonal(bw, np.inf)
    return bw


def _run_group(c: Cluster, assign: Assign, vectors: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    participants = set(assign.members)
    for r in assign.routes:
        participants |= Route.from_list(r).nodes()
    for w in sorted(participants):  # aggregators first or last: order must not matter
        c.engines[w].assign(assign, vectors.get(w))
    for m in assign.members:
        assert c.event(m, assign.group).wait(WAIT_S), f"member {m} never got the whole result"
    results = {m: c.engines[m].finish(assign.group) for m in assign.members}
    for w in participants - set(assign.members):
        assert c.engines[w].finish(assign.group) is None
    return results


@pytest.mark.parametrize("pipelined", [True, False])
@pytest.mark.parametrize("kind", ["p2a", "p2p"])
def test_members_end_with_weighted_average(cluster: Cluster, kind: str, pipelined: bool) -> None:
    rng = np.random.default_rng(0)
    total = 10_007  # not a multiple of the part size
    members = (3, 0, 4)
    weights = (0.5, 0.3, 0.2)
    bw = _bw(cluster.n)
    if kind == "p2a":
        plan = planner.solve_p2a(bw, members, total * 4)
        assert len(plan.aggregators) > len(members)  # non-members carry blocks too
    else:
        plan = planner.solve_p2p(bw, members, total * 4)
        assert set(plan.aggregators) <= set(members)
    vectors = {m: rng.standard_normal(total).astype(np.float32) for m in members}
    expected = sum(np.float32(w) * vectors[m] for m, w in zip(members, weights, strict=True))
    results = _run_group(cluster, _assign(plan, 1, members, weights, pipelined=pipelined), vectors)
    for m in members:
        np.testing.assert_allclose(results[m], expected, rtol=1e-5, atol=1e-6)


def test_two_groups_in_flight_share_aggregators(cluster: Cluster) -> None:
    rng = np.random.default_rng(1)
    total = 5000
    bw = _bw(cluster.n, seed=2)
    g1, g2 = (0, 1), (2, 3)
    a1 = _assign(planner.solve_p2a(bw, g1, total * 4), 11, g1, (0.5, 0.5), part_elems=700)
    a2 = _assign(planner.solve_p2a(bw, g2, total * 4), 12, g2, (0.5, 0.5), part_elems=700)
    v = {m: rng.standard_normal(total).astype(np.float32) for m in g1 + g2}
    for a, members in ((a1, g1), (a2, g2)):
        nodes = set(members).union(*(Route.from_list(r).nodes() for r in a.routes))
        for w in sorted(nodes):
            cluster.engines[w].assign(a, v.get(w) if w in members else None)
    for gid, members in ((11, g1), (12, g2)):
        expected = (v[members[0]] + v[members[1]]) * np.float32(0.5)
        for m in members:
            assert cluster.event(m, gid).wait(WAIT_S)
            np.testing.assert_allclose(cluster.engines[m].finish(gid), expected, rtol=1e-5)


def test_new_revision_averages_survivors_only(cluster: Cluster) -> None:
    """A member is dropped mid-reduce: the next revision's result excludes it entirely."""
    rng = np.random.default_rng(2)
    total = 4000
    bw = _bw(cluster.n, seed=3)
    members = (0, 1, 2)
    v = {m: rng.standard_normal(total).astype(np.float32) for m in members}
    rev0 = _assign(planner.solve_p2a(bw, members, total * 4), 5, members, (1 / 3,) * 3)
    # Only two of three members scatter rev 0 (member 2 "dies" before sending anything).
    nodes0 = set().union(*(Route.from_list(r).nodes() for r in rev0.routes))
    for w in sorted(nodes0 - {2}):
        cluster.engines[w].assign(rev0, v.get(w))
    survivors = (0, 1)
    bw_dead = bw.copy()
    bw_dead[2, :] = 0
    bw_dead[:, 2] = 0
    bw_dead[2, 2] = np.inf
    plan1 = planner.solve_p2a(bw_dead, survivors, total * 4, active=[0, 1, 3, 4])
    rev1 = _assign(plan1, 5, survivors, (0.5, 0.5), rev=1)
    results = _run_group(cluster, rev1, v)
    expected = (v[0] + v[1]) * np.float32(0.5)
    for m in survivors:
        np.testing.assert_allclose(results[m], expected, rtol=1e-5)
    assert all(rev == 1 for _, g, rev in cluster.reports if g == 5)


def test_single_member_group_keeps_its_vector(cluster: Cluster) -> None:
    v = np.arange(100, dtype=np.float32)
    plan = planner.solve_p2a(_bw(cluster.n), (2,), 400)
    results = _run_group(cluster, _assign(plan, 9, (2,), (1.0,)), {2: v})
    np.testing.assert_array_equal(results[2], v)


def test_forged_and_duplicate_frames_are_dropped_not_counted() -> None:
    sent: list[tuple[int, Frame]] = []
    eng = ReduceEngine(1, 3, RUN, lambda d, f, _prio: sent.append((d, f)), lambda *a: None)
    a = assign_routes(star_routes([(1, 0, 4)], [0, 2]), 4, 1, [0, 2], [0.5, 0.5], part_elems=4)
    eng.assign(a)
    good = Frame(
        FrameKind.SCATTER,
        0,
        RUN,
        group=1,
        rev=0,
        offset=0,
        payload=np.ones(4, np.float32).tobytes(),
    )
    eng.on_frame(good)
    eng.on_frame(good)  # duplicate from the same member: must not be summed twice
    eng.on_frame(
        Frame(
            FrameKind.SCATTER, 1, RUN, group=1, offset=0, payload=np.ones(4, np.float32).tobytes()
        )
    )  # not a member
    eng.on_frame(
        Frame(
            FrameKind.SCATTER, 2, RUN, group=1, offset=0, payload=np.ones(3, np.float32).tobytes()
        )
    )  # wrong length
    nan = np.array([1, np.nan, 1, 1], np.float32).tobytes()
    eng.on_frame(Frame(FrameKind.SCATTER, 2, RUN, group=1, offset=0, payload=nan))
    assert eng.dropped_frames == 4
    assert sent == []  # the part is not complete: nothing broadcast
    eng.on_frame(
        Frame(
            FrameKind.SCATTER,
            2,
            RUN,
            group=1,
            offset=0,
            payload=(2 * np.ones(4, np.float32)).tobytes(),
        )
    )
    assert sorted(d for d, _ in sent) == [0, 2]
    np.testing.assert_array_equal(np.frombuffer(sent[0][1].payload, np.float32), [3, 3, 3, 3])


def test_frames_before_their_assignment_are_parked_and_replayed() -> None:
    sent: list[tuple[int, Frame]] = []
    eng = ReduceEngine(2, 3, RUN, lambda d, f, _prio: sent.append((d, f)), lambda *a: None)
    for sender in (0, 1):
        eng.on_frame(
            Frame(
                FrameKind.SCATTER,
                sender,
                RUN,
                group=3,
                offset=0,
                payload=np.full(2, sender + 1, np.float32).tobytes(),
            )
        )
    assert sent == []
    eng.assign(
        assign_routes(star_routes([(2, 0, 2)], [0, 1]), 2, 3, [0, 1], [0.5, 0.5], part_elems=2)
    )
    assert sorted(d for d, _ in sent) == [0, 1]


def test_validate_assign_rejects_gaps_and_bad_members() -> None:
    stars = star_routes([(0, 0, 4), (1, 5, 10)], [0])
    with pytest.raises(ReduceError, match="gap or an overlap"):
        validate_assign(assign_routes(stars, 10, 1, [0], [1.0]), 3)
    with pytest.raises(ReduceError, match="out of range"):
        validate_assign(assign_routes(star_routes([(0, 0, 10)], [7]), 10, 1, [7], [1.0]), 3)
    with pytest.raises(ReduceError, match="receives 9 of 10"):
        validate_assign(assign_routes(star_routes([(0, 0, 9)], [0]), 10, 1, [0], [1.0]), 3)
    no_path = Route(0, 10, 0, up=(), down=((0, 1),))
    with pytest.raises(ReduceError, match="does not reach root"):
        validate_assign(assign_routes([no_path], 10, 1, [0, 1], [0.5, 0.5]), 3)


@pytest.mark.parametrize("pipelined", [True, False])
def test_trees_with_relays_and_paths(cluster: Cluster, pipelined: bool) -> None:
    """Non-star routes: a ring-like path and a tree through a non-member relay."""
    rng = np.random.default_rng(5)
    members = (0, 1, 2)
    total = 3000
    v = {m: rng.standard_normal(total).astype(np.float32) for m in members}
    routes = [
        # [0, 1000): reduce along 1 -> 2 -> 0, broadcast 0 -> 1 -> 2
        Route(0, 1000, 0, up=((1, 2), (2, 0)), down=((0, 1), (1, 2))),
        # [1000, 3000): through relay 4 (no member): 0 -> 4 -> 3 (root), 1 -> 3, 2 -> 4
        Route(
            1000,
            3000,
            3,
            up=((0, 4), (2, 4), (4, 3), (1, 3)),
            down=((3, 4), (4, 0), (4, 2), (3, 1)),
        ),
    ]
    a = assign_routes(
        routes, total, 21, members, (0.25, 0.25, 0.5), part_elems=300, pipelined=pipelined
    )
    results = _run_group(cluster, a, v)
    expected = 0.25 * v[0] + 0.25 * v[1] + 0.5 * v[2]
    for m in members:
        np.testing.assert_allclose(results[m], expected, rtol=1e-5, atol=1e-6)


def test_all_to_all_routes_without_broadcast(cluster: Cluster) -> None:
    members = (1, 2, 3)
    total = 500
    v = {m: np.full(total, m, np.float32) for m in members}
    routes = [
        Route(0, total, m, up=tuple((o, m) for o in members if o != m), down=()) for m in members
    ]
    results = _run_group(cluster, assign_routes(routes, total, 31, members, (1 / 3,) * 3), v)
    for m in members:
        np.testing.assert_allclose(results[m], np.full(total, 2.0), rtol=1e-6)


def prescatter_assign(
    gid: int,
    members: tuple[int, int],
    bw: np.ndarray,
    a2a: planner.Plan,
    total: int,
    part: int,
    iteration: dict[int, int],
    sent_fraction: float,
) -> Assign:
    """The assignment of a pair whose members pre-scattered ``sent_fraction`` of the a2a split
    (epoch 3) before it formed: the non-blocking plan, as stars, weights 1/2 each."""
    sent = np.zeros_like(bw)
    for g in members:
        sent[g] = np.array(a2a.elems) * 4 * sent_fraction
    plan = planner.solve_p2a_nonblocking(bw, members, total * 4, sent, a2a=a2a)
    segs = [(s.worker, s.start, s.stop) for s in plan.segments]
    return Assign(
        group=gid,
        rev=0,
        scheme="crew",
        members=list(members),
        weights=[0.5, 0.5],
        routes=[r.to_list() for r in star_routes(segs, members)],
        pipelined=True,
        total=total,
        part_elems=part,
        prescatter=[[s.worker, s.start, s.stop] for s in a2a.segments],
        iterations=[iteration[m] for m in members],
        split_epoch=3,
    )


@pytest.mark.parametrize("sent_fraction", [0.0, 0.5, 1.0])
def test_nonblocking_reuses_prescattered_parts_and_stays_exact(
    cluster: Cluster, sent_fraction: float
) -> None:
    """Members pre-scatter along the a2a split, then the re-solved plan reuses what fits.

    Two groups are in flight at once, both pre-scattered, so parked parts of one group must not
    leak into the other."""
    rng = np.random.default_rng(7)
    total = 6000
    part = 500
    bw = _bw(cluster.n, seed=4)
    a2a = planner.solve_a2a(bw, total * 4)
    split = [[s.worker, s.start, s.stop] for s in a2a.segments]
    groups = {41: (0, 2), 42: (1, 3)}
    vectors = {m: rng.standard_normal(total).astype(np.float32) for g in groups.values() for m in g}
    iteration = {m: 10 + m for m in vectors}
    scatter_counts = {m: 0 for m in vectors}
    for e in cluster.engines:
        e.set_split(Split(3, split, part))
    for m, v in vectors.items():
        for dst, frame in prescatter_frames(m, RUN, v, split, 3, iteration[m], part):
            cluster.transports[m].send(dst, frame)
    assigns = {}
    for gid, members in groups.items():
        a = prescatter_assign(gid, members, bw, a2a, total, part, iteration, sent_fraction)
        assigns[gid] = a
        if sent_fraction == 1.0:
            assert covered_parts(a), "a plan equal to the split must reuse parts"
    # Count what members still send as SCATTER after the assignment.
    for m in vectors:
        original = cluster.engines[m]._send

        def counting(dst, frame, priority, m=m, original=original):
            if frame.kind == FrameKind.SCATTER and frame.sender == m:
                scatter_counts[m] += 1
            original(dst, frame, priority)

        cluster.engines[m]._send = counting
    for a in assigns.values():
        nodes = set(a.members).union(*(Route.from_list(r).nodes() for r in a.routes))
        for w in sorted(nodes):
            cluster.engines[w].assign(a, vectors.get(w) if w in a.members else None)
    for gid, members in groups.items():
        expected = (vectors[members[0]] + vectors[members[1]]) * np.float32(0.5)
        for m in members:
            assert cluster.event(m, gid).wait(WAIT_S), f"member {m} of group {gid} never done"
            np.testing.assert_allclose(cluster.engines[m].finish(gid), expected, rtol=1e-5)
    if sent_fraction == 1.0:
        covered = {gid: covered_parts(a) for gid, a in assigns.items()}
        for gid, members in groups.items():
            for m in members:
                parts = sum(len(range(r[0], r[1], part)) for r in assigns[gid].routes if r[2] != m)
                reused = sum(1 for agg, _ in covered[gid] if agg != m)
                assert scatter_counts[m] == parts - reused


def test_a_short_prescattered_part_is_never_stretched_over_a_whole_part(
    cluster: Cluster,
) -> None:
    """A member that pre-scatters one value where a part is due must not get it broadcast
    over the part: the group then lacks that contribution, and no member applies a poisoned
    average."""
    total, part, members = 6000, 500, (0, 2)
    bw = _bw(cluster.n, seed=4)
    a2a = planner.solve_a2a(bw, total * 4)
    split = [[s.worker, s.start, s.stop] for s in a2a.segments]
    rng = np.random.default_rng(3)
    vectors = {m: rng.standard_normal(total).astype(np.float32) for m in members}
    poisoned = False
    for e in cluster.engines:
        e.set_split(Split(3, split, part))
    for m, v in vectors.items():
        for dst, frame in prescatter_frames(m, RUN, v, split, 3, 10 + m, part):
            if m == 0 and dst != 0 and not poisoned:
                frame = dataclasses.replace(frame, payload=np.float32([1e6]).tobytes())
                poisoned = True
            cluster.transports[m].send(dst, frame)
    assert poisoned
    a = prescatter_assign(51, members, bw, a2a, total, part, {m: 10 + m for m in members}, 1.0)
    nodes = set(a.members).union(*(Route.from_list(r).nodes() for r in a.routes))
    for w in sorted(nodes):
        cluster.engines[w].assign(a, vectors.get(w) if w in a.members else None)
    expected = (vectors[0] + vectors[2]) * np.float32(0.5)
    for m in members:
        if cluster.event(m, 51).wait(3.0):  # done only with the honest sum
            np.testing.assert_allclose(cluster.engines[m].finish(51), expected, rtol=1e-5)
    assert sum(e.dropped_frames for e in cluster.engines) >= 1


def _engine(me: int = 1, *, prescatter: bool = False) -> ReduceEngine:
    return ReduceEngine(me, 4, RUN, lambda *a: None, lambda *a: None, prescatter=prescatter)


def _pre(sender: int, offset: int, values: int, epoch: int = 3) -> Frame:
    payload = np.ones(values, dtype=np.float32).tobytes()
    return Frame(FrameKind.PRESCATTER, sender, RUN, rev=epoch, block=1, part=9, offset=offset,
                 payload=payload)  # fmt: skip


def test_prescattered_parts_are_held_to_the_split_exactly() -> None:
    blocking = _engine()
    blocking.on_frame(_pre(0, 1000, 500))
    assert blocking.dropped_frames == 1 and not blocking._pre  # blocking mode refuses all
    engine = _engine(prescatter=True)
    engine.on_frame(_pre(0, 1000, 500))  # before its split (the data plane overtook it) ...
    assert engine.dropped_frames == 0 and not engine._pre
    engine.set_split(Split(3, [[0, 0, 1000], [1, 1000, 2200]], 500))
    assert sorted(engine._pre[0].parts) == [1000]  # ... kept, and counted once it came
    for bad in (
        _pre(0, 1000, 499),  # a value short
        _pre(0, 1000, 501),  # a value long
        _pre(0, 1100, 500),  # not a part boundary
        _pre(0, 0, 500),  # another aggregator's segment
        _pre(0, 1000, 500, epoch=2),  # an older split
    ):
        engine.on_frame(bad)
    assert engine.dropped_frames == 5 and sorted(engine._pre[0].parts) == [1000]
    engine.on_frame(_pre(0, 2000, 200))  # the segment's last, shorter part
    assert sorted(engine._pre[0].parts) == [1000, 2000] and engine.dropped_frames == 5
    engine.set_split(Split(4, [[1, 0, 2200]], 500))  # a new split: the old offer is dropped
    assert not engine._pre


def test_an_engine_remembers_a_bounded_number_of_ended_groups() -> None:
    engine = _engine()
    for gid in range(1, 3 * FINISHED_KEPT):
        engine.finish(gid)
    assert len(engine._finished) == FINISHED_KEPT == len(engine._finished_order)
    late = Frame(FrameKind.SCATTER, 0, RUN, group=5, payload=np.ones(4, np.float32).tobytes())
    engine.on_frame(late)  # long ended, forgotten by id: still not parked
    assert not engine._early and engine.superseded()(late)


def test_relayed_stars_compute_the_average(cluster: Cluster) -> None:
    """crew-relay: slow direct links are replaced by one-relay paths; results stay exact."""
    rng = np.random.default_rng(11)
    bw = np.full((cluster.n, cluster.n), 100.0)
    np.fill_diagonal(bw, np.inf)
    bw[0, 3] = bw[3, 0] = 5.0  # member 0 <-> aggregator 3: relaying via anyone is faster
    better, relay = planner.two_hop(bw)
    assert better[0, 3] == 100.0 and relay[0, 3] >= 0
    members = (0, 1, 2)
    total = 4000
    plan = planner.solve_pipelined(better, members, total * 4)
    segments = [(s.worker, s.start, s.stop) for s in plan.segments]
    routes = relayed_star_routes(segments, members, relay)
    to3 = next(r for r in routes if r.root == 3)
    assert (0, 3) not in to3.up and (3, 0) not in to3.down
    v = {m: rng.standard_normal(total).astype(np.float32) for m in members}
    a = assign_routes(routes, total, 51, members, (0.2, 0.3, 0.5), part_elems=400)
    results = _run_group(cluster, a, v)
    expected = 0.2 * v[0] + 0.3 * v[1] + 0.5 * v[2]
    for m in members:
        np.testing.assert_allclose(results[m], expected, rtol=1e-5, atol=1e-6)


# -- relays on multi-hop routes, one engine at a time (frames captured, not sent) ---------------


def _part(sender: int, kind: FrameKind, block: int, offset: int, values, rev: int = 0) -> Frame:
    return Frame(
        kind,
        sender,
        RUN,
        group=61,
        rev=rev,
        block=block,
        offset=offset,
        payload=np.asarray(values, np.float32).tobytes(),
    )


def _relay_chain(rev: int = 0, members=(0, 1, 2)) -> Assign:
    # reduce 0 -> 1 -> 3 (root) and 2 -> 3; broadcast 3 -> 1 -> 0 and 3 -> 2. Worker 1 is a
    # member that relays 0's stream; worker 3 is a non-member root.
    up = tuple(e for e in ((0, 1), (1, 3), (2, 3)) if e[0] in members or e[0] == 1)
    down = tuple(e for e in ((3, 1), (1, 0), (3, 2)) if e[1] in members or e[1] == 1)
    route = Route(0, 6, 3, up=up, down=down)
    w = [1.0 / len(members)] * len(members)
    return assign_routes([route], 6, 61, members, w, rev=rev, part_elems=2)


def test_member_relay_adds_its_copy_and_forwards_one_stream_part_by_part() -> None:
    sent: list[tuple[int, Frame]] = []
    relay = ReduceEngine(1, 4, RUN, lambda d, f, _prio: sent.append((d, f)), lambda *a: None)
    own = np.arange(6, dtype=np.float32)
    relay.assign(_relay_chain(), own)
    assert sent == []  # it waits for its child: its own copy never travels alone
    relay.on_frame(_part(0, FrameKind.SCATTER, 0, 0, [10, 20]))
    # Cut-through: part 0 goes up at once, before parts 1 and 2 of the child arrived.
    assert [(d, f.kind, f.offset) for d, f in sent] == [(3, FrameKind.SCATTER, 0)]
    np.testing.assert_allclose(np.frombuffer(sent[0][1].payload, np.float32), [10, 20 + 1 / 3])
    relay.on_frame(_part(0, FrameKind.SCATTER, 0, 0, [10, 20]))  # a duplicate: not summed again
    relay.on_frame(_part(2, FrameKind.SCATTER, 0, 2, [1, 1]))  # 2 is not its child
    assert relay.dropped_frames == 2 and len(sent) == 1
    relay.on_frame(_part(0, FrameKind.SCATTER, 0, 4, [0, 0]))
    relay.on_frame(_part(0, FrameKind.SCATTER, 0, 2, [0, 0]))
    assert [f.offset for _, f in sent] == [0, 4, 2]  # each part as it completes, one frame each
    # The broadcast passes through the same way, one part at a time, and the relay keeps it.
    sent.clear()
    relay.on_frame(_part(3, FrameKind.RESULT, 0, 2, [7, 8]))
    assert [(d, f.kind, f.offset) for d, f in sent] == [(0, FrameKind.RESULT, 2)]
    assert relay.result(61) is None  # parts 0 and 4 still missing
    relay.on_frame(_part(3, FrameKind.RESULT, 0, 0, [5, 6]))
    relay.on_frame(_part(3, FrameKind.RESULT, 0, 4, [9, 9]))
    np.testing.assert_array_equal(relay.result(61), [5, 6, 7, 8, 9, 9])


def test_non_member_relay_holds_nothing_and_a_new_revision_drops_its_partial_sums() -> None:
    sent: list[tuple[int, Frame]] = []
    root = ReduceEngine(3, 4, RUN, lambda d, f, _prio: sent.append((d, f)), lambda *a: None)
    root.assign(_relay_chain())
    root.on_frame(_part(1, FrameKind.SCATTER, 0, 0, [1, 1]))  # 0 + 1 through the relay
    assert sent == []  # 2's copy of part 0 is still missing
    # Member 0 dies: revision 1 without it. The relay's sum of rev 0 must not count.
    root.assign(_relay_chain(rev=1, members=(1, 2)))
    root.on_frame(_part(1, FrameKind.SCATTER, 0, 0, [1, 1]))  # stale revision: ignored
    root.on_frame(_part(1, FrameKind.SCATTER, 0, 0, [2, 2], rev=1))
    root.on_frame(_part(2, FrameKind.SCATTER, 0, 0, [3, 3], rev=1))
    assert sorted((d, f.rev) for d, f in sent) == [(1, 1), (2, 1)]
    np.testing.assert_array_equal(np.frombuffer(sent[0][1].payload, np.float32), [5, 5])
    assert root.result(61) is None  # a relay, not a member: it keeps no result


def test_validate_assign_rejects_a_relay_with_nothing_below_it() -> None:
    dead_end = Route(0, 4, 0, up=((1, 0), (2, 0)), down=((0, 1),))
    with pytest.raises(ReduceError, match="relay 2 has no children"):
        validate_assign(assign_routes([dead_end], 4, 1, [0, 1], [0.5, 0.5]), 3)


def test_frames_further_along_their_route_get_the_earlier_priority() -> None:
    # On _relay_chain: 0 -> 1 -> 3 and 2 -> 3 up, 3 -> 1 -> 0 and 3 -> 2 down. A leaf's own
    # copy has travelled 0 hops, the relay's sum 1, the root's results 2, the relay's
    # forwarded results 3: the transport sends lower priorities first.
    sent: dict[int, list[tuple[int, FrameKind, int]]] = {w: [] for w in range(4)}
    engines = {
        w: ReduceEngine(
            w, 4, RUN, lambda d, f, prio, w=w: sent[w].append((d, f.kind, prio)), lambda *a: None
        )
        for w in range(4)
    }
    assign = _relay_chain()
    for w, eng in engines.items():
        eng.assign(assign, np.ones(6, np.float32) if w in (0, 1, 2) else None)
    assert set(sent[0]) == {(1, FrameKind.SCATTER, 0)}
    assert set(sent[2]) == {(3, FrameKind.SCATTER, 0)}
    engines[1].on_frame(_part(0, FrameKind.SCATTER, 0, 0, [1, 1]))
    assert set(sent[1]) == {(3, FrameKind.SCATTER, -1)}
    for s in (0, 2, 4):
        engines[3].on_frame(_part(2, FrameKind.SCATTER, 0, s, [1, 1]))
        engines[3].on_frame(_part(1, FrameKind.SCATTER, 0, s, [2, 2]))
    assert set(sent[3]) == {(1, FrameKind.RESULT, -2), (2, FrameKind.RESULT, -2)}
    engines[1].on_frame(_part(3, FrameKind.RESULT, 0, 0, [1, 1]))
    assert (0, FrameKind.RESULT, -3) in sent[1]


def test_each_route_is_cut_into_its_own_parts() -> None:
    # A small route of a multi-hop plan gets small parts (so its relays pipeline), a large one
    # is capped by the assignment's part size, and both ends agree from the assignment alone.
    big = Route(0, 1 << 20, 0, ((1, 0),), ((0, 1),))
    small = Route(1 << 20, (1 << 20) + 200_000, 1, ((0, 1),), ((1, 0),))
    tiny = Route((1 << 20) + 200_000, (1 << 20) + 200_100, 1, ((0, 1),), ((1, 0),))
    total = tiny.stop
    a = assign_routes([big, small, tiny], total, 5, [0, 1], [0.5, 0.5], part_elems=1 << 16)
    steps = route_part_sizes(a, [big, small, tiny])
    assert steps == [1 << 16, 25_000, MIN_ROUTE_PART_ELEMS]
    assert route_part_elems(small, 1 << 16, prescatter=True) == 1 << 16
    assert route_part_elems(big, 1 << 18) == MAX_ROUTE_PART_ELEMS  # never a 1 MB part per hop
    got: dict[int, list[Frame]] = {0: [], 1: []}
    engines = [
        ReduceEngine(w, 2, RUN, lambda d, f, _p: got[d].append(f), lambda *a: None) for w in (0, 1)
    ]
    vec = np.arange(total, dtype=np.float32)
    for eng in engines:
        eng.assign(a, vec)
    sizes = sorted({(f.block, len(f.payload) // 4) for f in got[1] if f.kind is FrameKind.SCATTER})
    assert sizes == [(1, 25_000), (2, 100)]  # 0's scatter to root 1: routes 1 and 2
    sizes = sorted({(f.block, len(f.payload) // 4) for f in got[0] if f.kind is FrameKind.SCATTER})
    assert sizes == [(0, 1 << 16)]  # 1's scatter to root 0: route 0, in 16 parts
    for _ in range(3):  # scatter, then results (bounded)
        pending = {d: list(fs) for d, fs in got.items()}
        for fs in got.values():
            fs.clear()
        for d, frames in pending.items():
            for f in frames:
                engines[d].on_frame(f)
    for eng in engines:
        np.testing.assert_array_equal(eng.result(5), vec)


def test_a_nodes_own_parts_are_interleaved_across_the_routes_of_a_link() -> None:
    # Worker 0 sends up two routes to root 1 (three parts and two) and one to root 2. Route by
    # route, route b would leave last on 0 -> 1 and reach root 1 only at the link's end, and
    # its broadcast would run after; interleaved by progress, part j of a route with m parts
    # goes at (j + 1/2) / m: a 1/6, b 1/4, a 1/2, b 3/4, a 5/6 (and c's one part at 1/2).
    a = Route(0, 3000, 1, ((0, 1),), ((1, 0),))
    b = Route(3000, 5000, 1, ((0, 1),), ((1, 0),))
    c = Route(5000, 6000, 2, ((0, 2), (1, 2)), ((2, 0), (2, 1)))
    assign = assign_routes([a, b, c], 6000, 3, [0, 1], [0.5, 0.5], part_elems=1000)
    assert route_part_sizes(assign, [a, b, c]) == [1000, 1000, 1000]
    sent: list[tuple[int, int, int]] = []
    eng = ReduceEngine(
        0, 3, RUN, lambda d, f, _p: sent.append((d, f.block, f.offset)), lambda *a: None
    )
    eng.assign(assign, np.ones(6000, np.float32))
    assert sent == [(1, 0, 0), (1, 1, 3000), (1, 0, 1000), (2, 2, 5000), (1, 1, 4000), (1, 0, 2000)]


def _two_root_star(pipelined: bool) -> Assign:
    # The original partial reduce on two members: route 0 rooted at 0, route 1 rooted at 1,
    # each scattered to its root by the other member and broadcast back.
    routes = [Route(0, 8, 0, ((1, 0),), ((0, 1),)), Route(8, 16, 1, ((0, 1),), ((1, 0),))]
    return assign_routes(routes, 16, 61, [0, 1], [0.5, 0.5], part_elems=2, pipelined=pipelined)


@pytest.mark.parametrize("pipelined", [False, True])
def test_store_and_forward_links_are_first_come_first_served(pipelined: bool) -> None:
    # Worker 0 queues its scatter of route 1 for root 1 first; then its own route 0 fills up
    # and it broadcasts that to 1 on the same link. Store and forward: the link is FCFS, so
    # root 1 gets the whole scatter before 0's broadcast (with hop priorities the broadcast
    # overtook the scatter's tail, and root 1's own broadcast waited for it: bench-hetero
    # preduce ops took 1.53x their plan). Pipelined plans keep "furthest along first".
    link = _FlowQueue(FlowOrder.FCFS)
    eng = ReduceEngine(0, 2, RUN, lambda d, f, prio: link.push(f, prio), lambda *a: None)
    eng.assign(_two_root_star(pipelined), np.ones(16, np.float32))
    first = [link.pop()]  # one scatter frame is on the wire already
    for s in range(0, 8, 2):
        eng.on_frame(_part(1, FrameKind.SCATTER, 0, s, [1, 1]))
    kinds = [f.kind for f in first + link.drain()]
    assert kinds.count(FrameKind.SCATTER) == 4 and kinds.count(FrameKind.RESULT) == 4
    if pipelined:
        assert kinds[:2] == [FrameKind.SCATTER, FrameKind.RESULT]
    else:
        assert kinds == [FrameKind.SCATTER] * 4 + [FrameKind.RESULT] * 4
