"""The reduce engine over real TCP on loopback: every member ends with the weighted average."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

from crew import planner
from crew.frames import Frame, FrameCodec, FrameKind
from crew.protocol import Assign
from crew.reduce import ReduceEngine, ReduceError, parts_of, validate_assign
from crew.transport import Transport

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
            eng = ReduceEngine(i, n, RUN, self._sender(i), self._reporter(i))
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
        def send(dst: int, frame: Frame) -> None:
            self.transports[i].send(dst, frame)

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


def _assign(plan: planner.Plan, group: int, members, weights, rev=0, part_elems=1000) -> Assign:
    return Assign(
        group=group, rev=rev, scheme="test", members=list(members), weights=list(weights),
        segments=[[s.worker, s.start, s.stop] for s in plan.segments],
        total=plan.total_elems, part_elems=part_elems,
    )


def _bw(n: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    bw = rng.uniform(10, 100, size=(n, n))
    np.fill_diagonal(bw, np.inf)
    return bw


def _run_group(c: Cluster, assign: Assign, vectors: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    participants = set(assign.members) | {s[0] for s in assign.segments}
    for w in sorted(participants):  # aggregators first or last: order must not matter
        c.engines[w].assign(assign, vectors.get(w))
    for m in assign.members:
        assert c.event(m, assign.group).wait(WAIT_S), f"member {m} never got the whole result"
    results = {m: c.engines[m].finish(assign.group) for m in assign.members}
    for w in participants - set(assign.members):
        assert c.engines[w].finish(assign.group) is None
    return results


@pytest.mark.parametrize("kind", ["p2a", "p2p"])
def test_members_end_with_weighted_average(cluster: Cluster, kind: str) -> None:
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
    results = _run_group(cluster, _assign(plan, 1, members, weights), vectors)
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
        for w in sorted(set(members) | {s[0] for s in a.segments}):
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
    for w in sorted({s[0] for s in rev0.segments} - {2}):
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
    eng = ReduceEngine(1, 3, RUN, lambda d, f: sent.append((d, f)), lambda *a: None)
    a = Assign(group=1, rev=0, scheme="t", members=[0, 2], weights=[0.5, 0.5],
               segments=[[1, 0, 4]], total=4, part_elems=4)
    eng.assign(a)
    good = Frame(FrameKind.SCATTER, 0, RUN, group=1, rev=0, offset=0,
                 payload=np.ones(4, np.float32).tobytes())
    eng.on_frame(good)
    eng.on_frame(good)  # duplicate from the same member: must not be summed twice
    eng.on_frame(Frame(FrameKind.SCATTER, 1, RUN, group=1, offset=0,
                       payload=np.ones(4, np.float32).tobytes()))  # not a member
    eng.on_frame(Frame(FrameKind.SCATTER, 2, RUN, group=1, offset=0,
                       payload=np.ones(3, np.float32).tobytes()))  # wrong length
    nan = np.array([1, np.nan, 1, 1], np.float32).tobytes()
    eng.on_frame(Frame(FrameKind.SCATTER, 2, RUN, group=1, offset=0, payload=nan))
    assert eng.dropped_frames == 4
    assert sent == []  # the part is not complete: nothing broadcast
    eng.on_frame(Frame(FrameKind.SCATTER, 2, RUN, group=1, offset=0,
                       payload=(2 * np.ones(4, np.float32)).tobytes()))
    assert sorted(d for d, _ in sent) == [0, 2]
    np.testing.assert_array_equal(np.frombuffer(sent[0][1].payload, np.float32), [3, 3, 3, 3])


def test_frames_before_their_assignment_are_parked_and_replayed() -> None:
    sent: list[tuple[int, Frame]] = []
    eng = ReduceEngine(2, 3, RUN, lambda d, f: sent.append((d, f)), lambda *a: None)
    for sender in (0, 1):
        eng.on_frame(Frame(FrameKind.SCATTER, sender, RUN, group=3, offset=0,
                           payload=np.full(2, sender + 1, np.float32).tobytes()))
    assert sent == []
    eng.assign(Assign(group=3, rev=0, scheme="t", members=[0, 1], weights=[0.5, 0.5],
                      segments=[[2, 0, 2]], total=2, part_elems=2))
    assert sorted(d for d, _ in sent) == [0, 1]


def test_validate_assign_rejects_gaps_and_bad_members() -> None:
    base = dict(group=1, rev=0, scheme="t", weights=[1.0], total=10, part_elems=4)
    with pytest.raises(ReduceError, match="continue"):
        validate_assign(Assign(members=[0], segments=[[0, 0, 4], [1, 5, 10]], **base), 3)
    with pytest.raises(ReduceError, match="out of range"):
        validate_assign(Assign(members=[7], segments=[[0, 0, 10]], **base), 3)
    with pytest.raises(ReduceError, match="cover"):
        validate_assign(Assign(members=[0], segments=[[0, 0, 9]], **base), 3)
    a = Assign(members=[0], segments=[[0, 0, 6], [1, 6, 10]], **base)
    assert [(p.aggregator, p.start, p.stop) for p in parts_of(a)] == [
        (0, 0, 4), (0, 4, 6), (1, 6, 10)]
