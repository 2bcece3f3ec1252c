"""crew.runtime.planahead: a plan made ahead answers only the identical call, with the same plan
or error, and the caller's waiting is recorded. Real planners (crew's route LP), no root."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np
import pytest

from crew.config import Scheme
from crew.plan.plancall import PlanCall
from crew.plan.planner import PlanError
from crew.plan.schemes import GroupPlan, GroupPlanner, plan_group
from crew.runtime.planahead import KEEP, AheadPlanner, PlanSource

BW = np.array([[0, 20, 40, 60], [20, 0, 80, 100], [40, 80, 0, 30], [60, 100, 30, 0]], dtype=float)
SIZE = 4 << 20


class Counting:
    """plan_group, counting its calls; ``gate`` (if set) holds each call until it is set."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.calls = 0
        self.gate = gate

    def __call__(self, *args: Any, **kw: Any) -> GroupPlan:
        self.calls += 1
        if self.gate is not None:
            assert self.gate.wait(10.0), "test gate never opened"
        return plan_group(*args, **kw)


def _call(bw: np.ndarray = BW, members: tuple[int, ...] = (0, 1, 2)) -> PlanCall:
    return PlanCall.of(Scheme.CREW, bw, members, SIZE, active=(0, 1, 2, 3), seed=0, part_bytes=0)


def _wait_done(ahead: AheadPlanner, call: PlanCall) -> None:
    fut = ahead._ahead[call.key()]
    fut.result(timeout=30.0)


def test_a_plan_made_ahead_answers_the_identical_call_without_planning_again() -> None:
    fn = Counting()
    ahead = AheadPlanner(fn)
    try:
        call = _call()
        ahead.submit(call)
        _wait_done(ahead, call)
        got = ahead(Scheme.CREW, BW.copy(), [0, 1, 2], SIZE, active=(0, 1, 2, 3), seed=0,
                    part_bytes=0)  # fmt: skip
        assert fn.calls == 1
        assert got == plan_group(Scheme.CREW, BW, (0, 1, 2), SIZE, active=(0, 1, 2, 3))
        (cost,) = ahead.drain()
        assert cost.source is PlanSource.AHEAD and cost.members == (0, 1, 2)
        assert ahead.drain() == []  # drained once
        # asked again: nothing is ahead any more, so it is planned on the caller's thread
        call.run(ahead)
        assert fn.calls == 2 and ahead.drain()[0].source is PlanSource.INLINE
    finally:
        ahead.close()


def test_a_call_whose_inputs_changed_is_planned_inline() -> None:
    fn = Counting()
    ahead = AheadPlanner(fn)
    try:
        ahead.submit(_call())
        _wait_done(ahead, _call())
        moved = BW.copy()
        moved[0, 1] = np.nextafter(moved[0, 1], 0)  # one ulp slower: another problem
        plan = _call(moved).run(ahead)
        assert fn.calls == 2
        assert plan == plan_group(Scheme.CREW, moved, (0, 1, 2), SIZE, active=(0, 1, 2, 3))
        assert [c.source for c in ahead.drain()] == [PlanSource.INLINE]
        _call((BW), (0, 1, 3)).run(ahead)  # other members: inline too
        assert fn.calls == 3
    finally:
        ahead.close()


def test_a_plan_still_being_made_is_waited_for_not_made_twice() -> None:
    gate = threading.Event()
    fn = Counting(gate)
    ahead = AheadPlanner(fn)
    try:
        ahead.submit(_call())
        opener = threading.Timer(0.3, gate.set)
        opener.start()
        t0 = time.perf_counter()
        plan = _call().run(ahead)
        waited = time.perf_counter() - t0
        assert fn.calls == 1 and plan.members == (0, 1, 2)
        (cost,) = ahead.drain()
        assert cost.source is PlanSource.WAITED
        assert cost.blocked_s == pytest.approx(waited, abs=0.05) and cost.blocked_s >= 0.2
    finally:
        gate.set()
        ahead.close()


def test_a_planner_error_made_ahead_is_raised_to_the_caller() -> None:
    dead = BW.copy()
    dead[:, 2] = 0.0  # nobody reaches worker 2: no plan for a group with it
    with pytest.raises(PlanError) as direct:
        _call(dead).run(plan_group)
    ahead = AheadPlanner(plan_group)
    try:
        ahead.submit(_call(dead))
        _wait_done_raising(ahead, _call(dead))
        with pytest.raises(PlanError) as made_ahead:
            _call(dead).run(ahead)
        assert str(made_ahead.value) == str(direct.value)
        assert ahead.drain()[0].source is PlanSource.AHEAD
    finally:
        ahead.close()


def _wait_done_raising(ahead: AheadPlanner, call: PlanCall) -> None:
    fut = ahead._ahead[call.key()]
    assert fut.exception(timeout=30.0) is not None


def test_only_the_latest_calls_ahead_are_kept() -> None:
    gate = threading.Event()
    fn = Counting(gate)
    ahead = AheadPlanner(fn)
    try:
        groups = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
        assert len(groups) > KEEP + 1
        for g in groups:
            ahead.submit(_call(members=g))
        gate.set()
        for g in groups[-KEEP:]:
            _wait_done(ahead, _call(members=g))
        for g in groups:
            _call(members=g).run(ahead)
        sources = {c.members: c.source for c in ahead.drain()}
        assert all(sources[g] is PlanSource.INLINE for g in groups[1:-KEEP])
        assert all(sources[g] is PlanSource.AHEAD for g in groups[-KEEP:])
    finally:
        gate.set()
        ahead.close()


def test_after_close_nothing_is_made_ahead() -> None:
    fn = Counting()
    ahead = AheadPlanner(fn)
    ahead.close()
    ahead.submit(_call())
    assert fn.calls == 0
    _call().run(ahead)  # still a plan function: inline
    assert fn.calls == 1


def test_plan_call_keys_are_exact() -> None:
    a = _call()
    assert a.key() == _call(BW.copy()).key()
    assert a.key() != _call(BW.astype(np.float32).astype(float) * 1.0000001).key()
    b = PlanCall.of(Scheme.CREW, BW, (0, 1, 2), SIZE, active=(0, 1, 2), seed=0, part_bytes=0)
    assert a.key() != b.key()  # another active set
    c = PlanCall.of(Scheme.CREW_STAR, BW, (0, 1, 2), SIZE, active=(0, 1, 2, 3), seed=0,
                    part_bytes=0)  # fmt: skip
    assert a.key() != c.key()


def test_plans_made_on_two_threads_at_once_are_those_made_one_by_one() -> None:
    """The planners' caches are shared by the event loop and the plan-ahead thread: planning
    groups on two threads at once gives each group the plan it gets alone (no cache entry
    of one group leaks into another's)."""
    rng = np.random.default_rng(7)
    bw = rng.uniform(10, 100, size=(8, 8))
    np.fill_diagonal(bw, 0)
    groups = [(0, 1, 2, 3), (4, 5, 6, 7), (0, 2, 4, 6), (1, 3, 5, 7), (0, 1, 6, 7), (2, 3, 4, 5)]

    def plan(planner: GroupPlanner, g: tuple[int, ...]) -> GroupPlan:
        return planner(Scheme.CREW, bw, g, SIZE, part_bytes=1 << 16)

    one_by_one = GroupPlanner()
    alone = {g: plan(one_by_one, g) for g in groups}
    shared = GroupPlanner()
    together: dict[tuple[int, ...], GroupPlan] = {}
    start = threading.Barrier(2)

    def half(gs: list[tuple[int, ...]]) -> None:
        start.wait(10.0)
        for g in gs:
            together[g] = plan(shared, g)

    threads = [threading.Thread(target=half, args=(groups[k::2],)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    assert together == alone
    assert len(shared.route_cache) == len(groups)  # both threads filled one planner's cache


def test_the_cost_record_keeps_the_newest_groups_only() -> None:
    from crew.runtime.planahead import CostRecord, PlanCost, PlanSource, costs_json

    record = CostRecord(keep=3)
    for gid in range(1, 8):
        record.add(gid, PlanCost((0, 1), PlanSource.AHEAD, gid / 1e3))
    assert list(record.costs) == [5, 6, 7]
    assert set(json.loads(costs_json(record.costs))) == {"5", "6", "7"}
    with pytest.raises(ValueError, match="keep"):
        CostRecord(keep=0)
