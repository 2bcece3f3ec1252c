"""A worker's control logic without sockets, threads or torch."""

from __future__ import annotations

import pytest

import crew.control.worker_control as wc
from crew.control.worker_control import WorkerControl, evaluation_due
from crew.wire import protocol as proto

ME = 1


def assign(group: int = 5, rev: int = 0, members: tuple[int, ...] = (0, 1), **kw) -> proto.Assign:
    fields = dict(
        group=group,
        rev=rev,
        scheme="crew",
        members=list(members),
        weights=[1 / len(members)] * len(members),
        routes=[],
        pipelined=True,
        total=64,
        part_elems=16,
        prescatter=[],
        iterations=[1] * len(members),
        split_epoch=-1,
    )
    fields.update(kw)
    return proto.Assign(**fields)


def test_member_assign_joins_with_the_offered_vector_and_commits() -> None:
    ctl = WorkerControl(ME)
    ctl.offer()
    actions = ctl.on_message(assign())
    assert actions == [wc.JoinGroup(assign(), member=True), wc.CancelPrescatter(frozenset())]
    assert ctl.my_group == 5
    assert ctl.on_message(proto.Commit(5, 0)) == [wc.DeliverOutcome(wc.Outcome(5, True, ""))]
    settlement, cleanup = ctl.settle(wc.Outcome(5, True), have_result=True)
    assert settlement is wc.Settlement.APPLY_AVERAGE and cleanup == wc.CancelPrescatter(frozenset())
    assert ctl.my_group is None and not ctl.offered


def test_commit_without_a_full_result_keeps_the_own_model() -> None:
    ctl = WorkerControl(ME)
    ctl.offer()
    ctl.on_message(assign())
    assert ctl.settle(wc.Outcome(5, True), have_result=False)[0] is wc.Settlement.KEEP_OWN_MISSING


def test_abandon_of_the_own_group_keeps_the_own_model() -> None:
    ctl = WorkerControl(ME)
    ctl.offer()
    ctl.on_message(assign())
    (deliver,) = ctl.on_message(proto.Abandon(5, "too many revisions", []))
    assert deliver == wc.DeliverOutcome(wc.Outcome(5, False, "too many revisions"))
    assert ctl.settle(deliver.outcome, have_result=True)[0] is wc.Settlement.KEEP_OWN_ABANDONED


def test_abandon_before_the_assign_is_the_own_groups_outcome() -> None:
    ctl = WorkerControl(ME)
    ctl.offer()
    (deliver,) = ctl.on_message(proto.Abandon(9, "no plan: x", [0, 1]))
    assert deliver == wc.DeliverOutcome(wc.Outcome(9, False, "no plan: x")) and ctl.my_group == 9
    # Not offered (training): an Abandon naming it is of nothing it waits for.
    idle = WorkerControl(ME)
    assert idle.on_message(proto.Abandon(9, "no plan: x", [0, 1])) == [wc.FinishCarried(9)]


def test_groups_it_only_carries_end_in_the_engine() -> None:
    ctl = WorkerControl(ME)
    ctl.offer()
    msg = assign(group=3, members=(0, 2))
    assert ctl.on_message(msg) == [wc.JoinGroup(msg, member=False)]
    assert ctl.my_group is None
    assert ctl.on_message(proto.Commit(3, 0)) == [wc.FinishCarried(3)]
    assert ctl.on_message(proto.Abandon(3, "x", [])) == [wc.FinishCarried(3)]


def test_a_revision_cancels_every_prescattered_part_rev0_keeps_covered_ones() -> None:
    ctl = WorkerControl(ME, nonblocking=True)
    ctl.offer()
    routes = [[0, 32, 2, [[0, 2], [1, 2]], [[2, 0], [2, 1]]], [32, 64, 0, [[1, 0]], [[0, 1]]]]
    # Aggregator 2 keeps its a2a prefix [0, 32); aggregator 0's a2a segment was elsewhere.
    pre = assign(prescatter=[[2, 0, 32], [3, 32, 64]], part_elems=16, routes=routes)
    (_, cancel) = ctl.on_message(pre)
    assert cancel == wc.CancelPrescatter(frozenset({(2, 0), (2, 16)}))
    (_, cancel) = ctl.on_message(assign(rev=1, prescatter=[[2, 0, 32]]))
    assert cancel.keep == frozenset()


def test_bench_workers_never_wait_for_outcomes() -> None:
    ctl = WorkerControl(ME, bench=True)
    ctl.offer()
    ctl.on_message(assign())
    assert ctl.on_message(proto.Commit(5, 0)) == [wc.FinishCarried(5)]


def test_split_is_used_for_prescatter_only_in_nonblocking_mode() -> None:
    split = proto.Split(2, [[0, 0, 32], [2, 32, 64]], 16)
    ctl = WorkerControl(ME, nonblocking=True)
    assert ctl.prescatter_split() is None
    assert ctl.on_message(split) == [wc.UseSplit(split)]  # the engine accepts parts by it
    assert ctl.prescatter_split() == split
    empty = proto.Split(3, [], 16)
    assert ctl.on_message(empty) == [wc.UseSplit(empty)] and ctl.prescatter_split() is None
    blocking = WorkerControl(ME)
    assert blocking.on_message(split) == []  # no split, so its engine accepts no pre-scatter
    assert blocking.prescatter_split() is None


def test_slowdown_stop_and_foreign_messages() -> None:
    ctl = WorkerControl(ME)
    assert ctl.on_message(proto.SetSlowdown(2.5)) == [wc.SetSlowdown(2.5)]
    assert ctl.on_message(proto.Stop("done")) == [wc.StopWorker("done")]
    with pytest.raises(proto.ProtocolError, match="is not for workers"):
        ctl.on_message(proto.Heartbeat(0, 1))


def test_evaluation_schedule() -> None:
    assert evaluation_due(10.0, 0.0, 2.0) and evaluation_due(12.0, 10.0, 2.0)
    assert not evaluation_due(11.9, 10.0, 2.0)


def test_a_restarted_coordinator_ends_the_own_group_or_offer_as_abandoned() -> None:
    from crew.control.worker_control import NO_GROUP

    ctl = WorkerControl(ME)
    assert ctl.coordinator_lost() == []  # training, nothing offered: nothing to end
    ctl.offer()
    assert ctl.coordinator_lost() == [
        wc.DeliverOutcome(wc.Outcome(NO_GROUP, False, "coordinator restarted"))
    ]
    ctl.on_message(assign())
    (deliver,) = ctl.coordinator_lost()
    assert deliver == wc.DeliverOutcome(wc.Outcome(5, False, "coordinator restarted"))
    assert ctl.settle(deliver.outcome, have_result=False)[0] is wc.Settlement.KEEP_OWN_ABANDONED
    assert ctl.coordinator_lost() == []
    assert WorkerControl(ME, bench=True).coordinator_lost() == []
