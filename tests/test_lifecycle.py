"""The group life cycle driven with events and a fake clock: no sockets, no root.

Plans come from the real planners (``crew.plan.schemes.plan_group``) on small matrices, except where
a test needs a planner that fails or records what it was given."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from lifecycle_kit import SIZE, make_cfg, report_all, started

from crew.config import ConfigError, RunConfig
from crew.control import lifecycle as lc
from crew.control.grouping import GroupOutcome, WorkerState
from crew.control.rejections import REJECT_EVENTS, REJECT_WINDOW_S
from crew.plan import planner
from crew.plan.plancall import PlanCall
from crew.plan.schemes import plan_group
from crew.wire import protocol as proto


def of(outs: list[lc.Output], kind: type) -> list[Any]:
    return [o for o in outs if isinstance(o, kind)]


def sent(outs: list[lc.Output], kind: type) -> dict[int, Any]:
    return {o.worker: o.msg for o in outs if isinstance(o, lc.SendTo) and isinstance(o.msg, kind)}


def events(outs: list[lc.Output], kind: str | None = None) -> list[str]:
    return [e.message for e in of(outs, lc.EventRecord) if kind is None or e.kind == kind]


def form(life: lc.GroupLifecycle, members: tuple[int, ...], now: float = 1.0) -> list[lc.Output]:
    outs: list[lc.Output] = []
    for m in members:
        outs += life.handle(proto.Ready(m, 1, float(m + 1), -1), now)
    return outs


def beat(life: lc.GroupLifecycle, now: float, workers: tuple[int, ...] = (0, 1, 2, 3)) -> None:
    for w in workers:
        life.handle(proto.Heartbeat(w, 1), now)


def closed(outs: list[lc.Output]) -> lc.GroupClosedRecord:
    (rec,) = of(outs, lc.GroupClosedRecord)
    return rec


# -- the normal life ---------------------------------------------------------------------------


def test_worker_states_carry_the_time_of_the_event_that_set_them() -> None:
    """Not the time the coordinator writes them, after the call that also planned the group:
    a member waits from its Ready to the group's formation, and its group time holds the plan."""
    life = started()
    outs = life.handle(proto.Ready(0, 1, 1.0, -1), 1.0)
    outs += life.handle(proto.Ready(1, 1, 2.0, -1), 1.5)
    states = [(r.worker, r.state, r.t) for r in of(outs, lc.WorkerStatusRecord)]
    assert states == [
        (0, WorkerState.READY, 1.0),
        (1, WorkerState.READY, 1.5),
        (0, WorkerState.GROUPED, 1.5),
        (1, WorkerState.GROUPED, 1.5),
    ]
    (opened,) = of(outs, lc.GroupOpenedRecord)
    assert opened.group.formed_at == 1.5
    outs = report_all(life, 1, 2.25)
    trained = {r.worker: r.t for r in of(outs, lc.WorkerStatusRecord)}
    assert trained == {0: 2.25, 1: 2.25}


def test_ready_workers_form_a_planned_group_that_commits() -> None:
    life = started()
    outs = form(life, (0, 1))
    (opened,) = of(outs, lc.GroupOpenedRecord)
    assert opened.group.members == (0, 1) and opened.scheme == "crew"
    assert opened.bound_s <= opened.predicted_s * (1 + 1e-6)
    assigns = sent(outs, proto.Assign)
    assert set(assigns) == life.open[1].plan.participants() and {0, 1} <= set(assigns)
    assert all(a.rev == 0 and a.total == SIZE for a in assigns.values())
    grouped = {r.worker for r in of(outs, lc.WorkerStatusRecord) if r.state is WorkerState.GROUPED}
    assert grouped == {0, 1}

    outs = report_all(life, 1, 2.0)
    rec = closed(outs)
    assert rec.outcome is GroupOutcome.COMPLETED and rec.revisions == 0 and rec.dropped == ()
    assert rec.verify_err is not None and rec.verify_err < 1e-9
    assert rec.bytes_moved > 0
    assert set(sent(outs, proto.Commit)) == set(assigns)
    assert not life.open and life.former.rounds(0) == 1
    assert not events(outs, "error")


def test_a_wrong_result_is_abandoned_before_any_member_applies_it() -> None:
    life = started()
    form(life, (0, 1))
    outs: list[lc.Output] = []
    for m in (0, 1):
        outs += life.handle(proto.HaveAll(m, 1, 0, 0, 99.0), 2.0)
    rec = closed(outs)
    assert rec.verify_err > 1e-3 and rec.outcome is GroupOutcome.ABANDONED
    assert "result check failed" in rec.reason
    assert any("result check failed" in m for m in events(outs, "error"))
    # Nobody is told to apply it: every member and participant hears Abandon, none Commit.
    assert not sent(outs, proto.Commit) and {0, 1} <= set(sent(outs, proto.Abandon))


def test_a_late_report_from_a_superseded_revision_is_ignored() -> None:
    life = started()
    form(life, (0, 1))
    life.handle(proto.HaveAll(0, 1, 0, 0, 1.5), 1.5)
    life.handle(lc.WorkerDisconnected(2, "gone"), 1.6)  # aggregator of rev 0: revision 1
    assert life.open[1].rev == 1
    outs = life.handle(proto.HaveAll(1, 1, 0, 0, 1.5), 1.7)  # rev 0: too late
    assert outs == [] and life.open[1].have_all == set()


# -- failover ----------------------------------------------------------------------------------


def test_member_death_revises_to_the_survivors_who_then_commit() -> None:
    life = started(make_cfg(n=4, p=3))
    form(life, (0, 1, 2))
    outs = life.handle(lc.WorkerDisconnected(1, "control connection closed"), 2.0)
    assert any("worker 1 lost" in m for m in events(outs, "fault"))
    assert [r for r in of(outs, lc.WorkerStatusRecord) if r.worker == 1][
        0
    ].state is WorkerState.DEAD
    og = life.open[1]
    assert og.rev == 1 and og.members == (0, 2) and math.isclose(sum(og.weights), 1.0)
    assert 1 not in og.plan.participants()
    assert "group 1 revision 1: member 1 lost" in events(outs, "recovery")
    assigns = sent(outs, proto.Assign)
    assert all(a.rev == 1 and a.members == [0, 2] for a in assigns.values())
    rec = closed(report_all(life, 1, 3.0))
    assert rec.outcome is GroupOutcome.COMPLETED and rec.revisions == 1
    assert rec.members == (0, 2) and rec.dropped == (1,)


def test_no_survivor_left_abandons_the_group() -> None:
    life = started()
    form(life, (0, 1))
    life.handle(lc.WorkerDisconnected(0, "gone"), 2.0)
    outs = life.handle(lc.WorkerDisconnected(1, "gone"), 2.1)
    rec = closed(outs)
    assert rec.outcome is GroupOutcome.ABANDONED and rec.reason == "worker 1 lost"
    assert "group 1 abandoned: worker 1 lost" in events(outs, "group")
    assert not life.open


def test_aggregator_death_replans_on_the_rest() -> None:
    life = started()
    form(life, (0, 1))
    assert 3 in life.open[1].plan.participants()  # equal links: every worker aggregates
    outs = life.handle(lc.WorkerDisconnected(3, "no heartbeat"), 2.0)
    og = life.open[1]
    assert og.rev == 1 and og.members == (0, 1) and 3 not in og.plan.participants()
    (why,) = events(outs, "recovery")
    assert why.startswith("group 1 revision 1: aggregator 3 lost")
    assert closed(report_all(life, 1, 3.0)).outcome is GroupOutcome.COMPLETED


@pytest.mark.parametrize(("link", "phase"), [((0, 2), "scatter"), ((2, 0), "broadcast")])
def test_link_failure_replans_around_the_link(link: tuple[int, int], phase: str) -> None:
    life = started()
    form(life, (0, 1))
    assert life.open[1].plan.phase_of(*link) == phase
    src, dst = link
    outs = life.handle(proto.LinkFailed(src, src, dst, "reset"), 2.0)
    assert f"link {src}->{dst} failed: reset" in events(outs, "fault")
    want = f"group 1 revision 1: link {src}->{dst} failed during {phase}"
    assert any(e.startswith(want) for e in events(outs))
    og = life.open[1]
    assert not og.plan.uses(src, dst) and life.capacity.planning[src, dst] == 0.0
    # A second report of the same link is no new failure, and the plan no longer uses it.
    assert life.handle(proto.LinkFailed(src, src, dst, "reset"), 2.1) == []
    assert closed(report_all(life, 1, 3.0)).revisions == 1


def test_a_link_no_plan_uses_fails_without_a_revision() -> None:
    life = started(make_cfg(n=4, p=2))
    outs = life.handle(proto.LinkFailed(2, 2, 3, "reset"), 1.0)
    assert events(outs, "fault") == ["link 2->3 failed: reset"] and not events(outs, "recovery")


def test_missed_deadlines_revise_until_revisions_run_out() -> None:
    life = started()
    form(life, (0, 1))
    deadline = life.open[1].deadline
    assert deadline == pytest.approx(1.0 + life.cfg.group_timeout_min_s)
    beat(life, deadline)
    assert not events(life.tick(deadline), "recovery")  # due only once past it
    for rev in range(1, lc.MAX_REVISIONS):
        now = life.open[1].deadline + 0.01
        beat(life, now)
        outs = life.tick(now)
        assert f"group 1 revision {rev}: revision {rev - 1} missed its deadline" in events(outs)
    now = life.open[1].deadline + 0.01
    beat(life, now)
    outs = life.tick(now)
    rec = closed(outs)
    assert {0, 1} <= set(sent(outs, proto.Abandon))
    assert rec.outcome is GroupOutcome.ABANDONED
    assert rec.reason.startswith("too many revisions (revision 7 missed its deadline")
    assert rec.revisions == lc.MAX_REVISIONS - 1


def test_no_plan_for_a_revision_abandons() -> None:
    calls = []

    def flaky(*args: Any, **kw: Any):
        calls.append(args)
        if len(calls) > 1:
            raise planner.PlanError("bw", "nothing left")
        return plan_group(*args, **kw)

    life = started(plan=flaky)
    form(life, (0, 1))
    outs = life.handle(lc.WorkerDisconnected(2, "gone"), 2.0)
    rec = closed(outs)
    assert rec.outcome is GroupOutcome.ABANDONED
    assert rec.reason.startswith("no plan after aggregator 2 lost: bw: nothing left")


def test_a_group_without_a_plan_is_recorded_abandoned_at_once() -> None:
    def none(*args: Any, **kw: Any):
        raise planner.PlanError("bw", "no capacity")

    life = started(plan=none)
    outs = form(life, (0, 1))
    (rec,) = of(outs, lc.GroupUnplannedRecord)
    assert rec.reason == "no plan: bw: no capacity" and rec.group.members == (0, 1)
    assert set(sent(outs, proto.Abandon)) == {0, 1} and not life.open
    assert life.former.state(0) is WorkerState.TRAINING


def watched(
    life: lc.GroupLifecycle, t0: float, t1: float, beating: tuple[int, ...] = ()
) -> list[lc.Output]:
    """The coordinator runs from ``t0`` to ``t1``: a tick every quarter second, and a heartbeat
    from each of ``beating`` every second."""
    outs: list[lc.Output] = []
    for k in range(round((t1 - t0) / 0.25) + 1):
        now = t0 + 0.25 * k
        if k % 4 == 0:
            beat(life, now, beating)
        outs += life.tick(now)
    return outs


def test_silent_worker_is_lost_on_tick() -> None:
    life = started()
    form(life, (0, 1))
    outs = watched(life, 1.0, 2.0 + life.cfg.heartbeat_timeout_s, beating=(0, 1, 2))
    assert events(outs, "fault") == ["worker 3 lost: no heartbeat"]
    assert life.open[1].rev == 1
    assert life.former.state(3) is WorkerState.DEAD
    assert not events(outs, "coordinator")  # it watched all along: nothing to excuse


def test_a_coordinator_away_longer_than_the_heartbeat_timeout_loses_no_worker() -> None:
    """A frozen host or a blocked write stops the coordinator, not the workers: on waking it
    must not find them all silent (a CI run lost all eight this way, and p fell to 1)."""
    life = started()
    life.tick(0.25)
    away = 2 * life.cfg.heartbeat_timeout_s
    outs = life.tick(0.25 + away)
    assert not events(outs, "fault")
    assert events(outs, "coordinator") == [
        f"the coordinator was away {away:.1f} s (no event or tick reached it):"
        " the workers' silence in that time is not counted"
    ]
    assert all(life.former.state(w) is WorkerState.TRAINING for w in range(4))
    # Only the time it was away is excused: silence it watches still counts.
    outs = watched(life, 0.5 + away, 1.0 + away + life.cfg.heartbeat_timeout_s, beating=(0, 1))
    assert events(outs, "fault") == ["worker 2 lost: no heartbeat", "worker 3 lost: no heartbeat"]


def test_a_worker_lost_to_silence_that_speaks_again_is_back_in_groups() -> None:
    life = started()
    watched(life, 0.25, 1.0 + life.cfg.heartbeat_timeout_s, beating=(0, 1, 2))
    assert life.former.state(3) is WorkerState.DEAD
    now = 2.0 + life.cfg.heartbeat_timeout_s
    outs = life.handle(proto.Heartbeat(3, 1), now)
    assert events(outs, "recovery") == [
        "worker 3 heard again after it was lost to silence: back in groups"
    ]
    assert not events(outs, "warning")  # not refused
    assert life.former.state(3) is WorkerState.TRAINING
    trained = [r for r in of(outs, lc.WorkerStatusRecord) if r.worker == 3]
    assert [r.state for r in trained] == [WorkerState.TRAINING]
    outs = form(life, (3, 0), now)
    (opened,) = of(outs, lc.GroupOpenedRecord)
    assert opened.group.members == (3, 0)


def test_a_disconnected_worker_is_not_taken_back_by_a_stray_message() -> None:
    life = started()
    life.handle(lc.WorkerDisconnected(3, "control connection closed"), 1.0)
    outs = life.handle(proto.Heartbeat(3, 1), 1.5)
    assert not events(outs, "recovery")
    assert events(outs, "warning") == ["refused msg: worker: 3 is DEAD; it must join first"]
    assert life.former.state(3) is WorkerState.DEAD


def test_shutdown_abandons_open_groups_and_stops_workers() -> None:
    life = started()
    form(life, (0, 1))
    outs = life.shutdown(2.0, "coordinator stopping")
    assert closed(outs).reason == "run stopped"
    assert set(sent(outs, proto.Stop)) == {0, 1, 2, 3}


# -- capacity ----------------------------------------------------------------------------------


def test_new_groups_are_planned_on_capacity_left_by_groups_in_flight() -> None:
    seen: list[np.ndarray] = []

    def spy(scheme, bw, *args: Any, **kw: Any):
        seen.append(np.array(bw))
        return plan_group(scheme, bw, *args, **kw)

    life = started(plan=spy)
    form(life, (0, 1), now=1.0)
    form(life, (2, 3), now=1.0)
    payload = life.capacity.planning * life.cfg.goodput
    assert np.array_equal(seen[0], payload)
    assert (seen[1] <= payload).all() and (seen[1] < payload).any()
    # Without committed capacity, every group sees the full matrix.
    seen.clear()
    life = started(make_cfg(committed_capacity=False), plan=spy)
    form(life, (0, 1))
    form(life, (2, 3))
    assert np.array_equal(seen[1], payload)


@pytest.mark.parametrize("goodput", [1.0, 0.95, 0.5])
def test_plans_count_the_payload_rate_and_the_bound_the_frame_rate(goodput: float) -> None:
    """A plan's rates are goodput x the configured (frame) rates, so its predicted time is the
    configured-rate plan's / goodput (no latency term here); the recorded bound stays on the
    frame rates, which binds any transport."""
    whole = of(form(started(make_cfg(goodput=1.0)), (0, 1)), lc.GroupOpenedRecord)[0]
    life = started(make_cfg(goodput=goodput))
    opened = of(form(life, (0, 1)), lc.GroupOpenedRecord)[0]
    # the same routes (only the scale changed); the per-hop part time scales with the rate too
    assert json.loads(opened.plan_json)["routes"] == json.loads(whole.plan_json)["routes"]
    assert opened.predicted_s == pytest.approx(whole.predicted_s / goodput, rel=1e-6)
    bound = planner.lower_bound(life.capacity.planning, (0, 1), SIZE * 4)
    assert opened.bound_s == whole.bound_s == pytest.approx(bound, rel=1e-9)


def test_plans_and_the_capacity_estimator_count_the_same_payload_share() -> None:
    """The estimator scales measured payload rates up by TCP_GOODPUT to frame rates; plans scale
    frame rates down by RunConfig.goodput. With different defaults a measured link would be
    planned above or below what it delivered."""
    from crew.control.capacity import TCP_GOODPUT

    assert RunConfig.default("goodput") == TCP_GOODPUT


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan"), True, "0.9"])
def test_goodput_out_of_range_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="goodput: must be in"):
        make_cfg(goodput=bad)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "65536"])
def test_a_hop_backlog_that_is_not_a_byte_count_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="hop_backlog_bytes: must be an int >= 0"):
        make_cfg(hop_backlog_bytes=bad)


def test_the_planned_hop_backlog_is_what_the_transport_leaves_unsent() -> None:
    """The route LP counts the bytes a part waits behind at each hop; by default that is the
    transport's TCP_NOTSENT_LOWAT. Were one changed without the other, plans would price a hop
    at a backlog the connections do not have."""
    from crew.wire.transport import NOTSENT_LOWAT

    assert RunConfig.default("hop_backlog_bytes") == NOTSENT_LOWAT > 0


def test_measured_drift_replans_new_groups() -> None:
    life = started(make_cfg(capacity="measured"))
    slow = [[0.0, 10e6 * 0.95 / 8, 1.0]]  # 10 Mbit/s of payload from 0, seen by 1
    outs: list[lc.Output] = []
    for t in range(10):
        outs += life.handle(proto.LinkRates(1, slow), 1.0 + t)
    drift = events(outs, "capacity")
    assert drift and drift[0].startswith("link 0->1 measured ")
    assert life.capacity.planning[0, 1] < 75.0


def test_reregistration_forgets_link_failures() -> None:
    life = started()
    life.handle(proto.LinkFailed(0, 0, 1, "reset"), 1.0)
    life.handle(lc.WorkerDisconnected(1, "gone"), 1.1)
    life.handle(proto.Register(1, 200, 0, SIZE), 1.2)
    assert life.capacity.planning[0, 1] == 100.0 and not life.capacity.failed


# -- admin requests and the rest ---------------------------------------------------------------


def test_admin_set_p_forms_from_the_waiting_queue() -> None:
    life = started(make_cfg(p=3))
    assert not of(form(life, (0, 1)), lc.GroupOpenedRecord)
    outs = life.handle(proto.Admin("set_p", {"p": 2}), 2.0)
    assert of(outs, lc.MetaRecord)[0].values == {"p": "2"}
    assert of(outs, lc.GroupOpenedRecord)[0].group.members == (0, 1)


def test_admin_set_scheme_applies_to_new_groups_and_refuses_unknown() -> None:
    life = started()
    outs = life.handle(proto.Admin("set_scheme", {"scheme": "crew-paper"}), 1.0)
    assert of(outs, lc.MetaRecord)[0].values == {"scheme": "crew-paper"}
    assert of(form(life, (0, 1)), lc.GroupOpenedRecord)[0].scheme == "crew-paper"
    outs = life.handle(proto.Admin("set_scheme", {"scheme": "bogus"}), 2.0)
    assert events(outs, "warning") == ["refused msg: admin.args.scheme: unknown 'bogus'"]
    assert life.scheme == "crew-paper"


def test_admin_set_link_slow_worker_stop_and_bad_requests() -> None:
    life = started()
    life.handle(proto.LinkFailed(0, 0, 1, "reset"), 1.0)
    life.handle(proto.Admin("set_link", {"src": 0, "dst": 1, "rate_mbit": 40.0}), 1.1)
    cap = life.capacity
    assert cap.planning[0, 1] == cap.configured[0, 1] == 40.0 and not cap.failed
    outs = life.handle(proto.Admin("slow_worker", {"worker": 2, "factor": 3.0}), 1.2)
    assert sent(outs, proto.SetSlowdown) == {2: proto.SetSlowdown(3.0)}
    assert of(life.handle(proto.Admin("stop", {}), 1.3), lc.StopRequested)
    for op, args in [("bogus", {}), ("set_p", {}), ("set_link", {"src": 0, "dst": 9})]:
        outs = life.handle(proto.Admin(op, args), 1.4)
        assert len(events(outs, "warning")) == 1, (op, outs)


def test_bad_messages_are_refused_not_raised() -> None:
    life = started()
    outs = life.handle(proto.Heartbeat(9, 0), 1.0)
    assert events(outs, "warning") == ["refused msg: worker: 9 is not a worker of this run"]
    outs = life.handle(proto.Register(0, 1, 0, SIZE + 1), 1.0)
    assert "differs from the run's" in events(outs, "warning")[0]
    outs = life.handle(proto.LinkFailed(0, 0, 0, "x"), 1.0)
    assert len(events(outs, "warning")) == 1
    outs = life.handle(proto.Stop("x"), 1.0)
    assert events(outs, "warning") == ["refused msg: worker: None is not a worker of this run"]


def test_metrics_and_gloo_op_times_become_records() -> None:
    life = started(make_cfg(scheme="gloo"))
    (it,) = life.handle(proto.Metrics(2, 5, 0.3, 0.9, 12.0), 1.0)
    assert it == lc.IterationRecord(12.0, 2, 5, 0.3, 0.9)
    (op,) = life.handle(proto.OpTime(0, 1, 3.0, 4.0, 1000), 4.0)
    assert op == lc.AllReduceRecord("gloo", 4, 3.0, 4.0, 2 * 3 * 1000)


def test_rejected_frames_are_rate_limited() -> None:
    life = started()
    outs: list[lc.Output] = []
    for i in range(REJECT_EVENTS + 10):
        outs += life.handle(proto.Rejected(1, f"10.9.9.{i % 3}:1", "BadMac"), 1.0)
    assert len(events(outs, "security")) == REJECT_EVENTS
    (summary,) = events(life.tick(1.0 + REJECT_WINDOW_S), "security")
    assert summary.startswith("worker 1 rejected 10 frame(s) (BadMac) from 10.9.9.")


def test_benchmark_trace_runs_groups_one_at_a_time() -> None:
    life = started(make_cfg(extra={"trace": [[0, 1], [2, 3, 1]]}))
    assert not of(life.tick(0.5), lc.GroupOpenedRecord)  # nobody has offered a vector yet
    for w in range(4):
        assert life.handle(proto.Ready(w, 0, float(w), -1), 1.0) == []
    outs = life.tick(1.0)
    assert of(outs, lc.GroupOpenedRecord)[0].group.members == (0, 1)
    assert not of(life.tick(1.1), lc.GroupOpenedRecord)  # one at a time
    report_all(life, 1, 2.0)
    outs = life.tick(2.0)
    assert of(outs, lc.GroupOpenedRecord)[0].group.members == (2, 3, 1)
    assert of(outs, lc.MetaRecord)[0].values == {"trace_started_all": "1"}
    life.handle(lc.WorkerDisconnected(3, "gone"), 2.5)  # trace groups shrink equally weighted
    assert life.open[2].members == (2, 1) and life.open[2].weights == (0.5, 0.5)


def test_a_trace_announces_its_next_group_with_the_call_that_will_plan_it() -> None:
    """PlanAhead carries exactly the call (same key) the next group is planned with when it
    starts, though the current group was in flight (committed capacity) when it was made."""
    made: list[PlanCall] = []

    def recording(*args: Any, **kw: Any) -> Any:
        made.append(PlanCall.of(*args, **kw))
        return plan_group(*args, **kw)

    bw = [[0.0, 20, 40, 60], [20, 0, 80, 100], [40, 80, 0, 30], [60, 100, 30, 0]]
    cfg = make_cfg(bw=bw, extra={"trace": [[0, 1], [1, 2, 3], [0, 3]]})
    life = started(cfg, plan=recording)
    for w in range(4):
        life.handle(proto.Ready(w, 0, float(w), -1), 1.0)
    outs = life.tick(1.0)
    (ahead,) = of(outs, lc.PlanAhead)
    assert ahead.call.members == (1, 2, 3) and [c.members for c in made] == [(0, 1)]
    # in flight, group 1 takes capacity: a plan made now would differ from the announced one
    assert not np.array_equal(life.planning.payload_bw(life.open.values(), 1.0), ahead.call.bw)
    report_all(life, 1, 2.0)
    outs = life.tick(2.0)
    assert made[-1].members == (1, 2, 3) and made[-1].key() == ahead.call.key()
    (nxt,) = of(outs, lc.PlanAhead)
    assert nxt.call.members == (0, 3)
    report_all(life, 2, 3.0)
    outs = life.tick(3.0)
    assert made[-1].key() == nxt.call.key()
    assert not of(outs, lc.PlanAhead)  # the trace's last group: nothing after it


def test_nonblocking_split_is_sent_and_used_by_new_groups() -> None:
    life = lc.GroupLifecycle(make_cfg(nonblocking=True))
    outs: list[lc.Output] = []
    for w in range(4):
        outs += life.handle(proto.Register(w, 100 + w, 0, SIZE), 0.0)
    splits = sent(outs, proto.Split)
    assert set(splits) == {0, 1, 2, 3} and life.split_epoch == 3
    outs = []
    for m in (0, 1):
        outs += life.handle(proto.Ready(m, 1, 1.0, life.split_epoch), 1.0)
    assign = sent(outs, proto.Assign)[0]
    assert assign.prescatter and assign.split_epoch == life.split_epoch
    life.handle(lc.WorkerDisconnected(3, "gone"), 1.5)  # a revision never pre-scatters
    assert life.split_epoch == 4 and life.open[1].rev == 1


def test_snapshot_restores_open_groups_into_a_new_life_cycle() -> None:
    life = started()
    form(life, (0, 1))
    life.handle(proto.HaveAll(0, 1, 0, 0, 1.5), 1.5)
    snap = life.snapshot()
    assert [g.group.id for g in snap.open_groups] == [1] and snap.open_groups[0].have_all == {0}
    other = lc.GroupLifecycle(life.cfg, former=life.former)
    other.restore(snap)
    assert other.snapshot() == snap
    rec = closed(other.handle(proto.HaveAll(1, 1, 0, 0, 1.5), 2.0))
    assert rec.outcome is GroupOutcome.COMPLETED and rec.verify_err < 1e-9


# -- probes and progress ---------------------------------------------------------------------


def test_a_probed_dead_link_revises_at_once_and_returns_when_probes_pass() -> None:
    life = started()
    form(life, (0, 1))
    assert life.open[1].plan.uses(0, 2)
    outs = life.handle(proto.LinkHealth(2, [0], []), 2.0)  # 2 hears no probes from 0
    assert "link 0->2 failed: no probes arrive" in events(outs, "fault")
    assert "link 2->0 failed: no probes arrive on 0->2, which carries its ACKs" in events(outs)
    og = life.open[1]
    assert og.rev == 1 and not og.plan.uses(0, 2) and not og.plan.uses(2, 0)
    assert life.handle(proto.LinkHealth(2, [0], []), 2.5) == []  # no news, no revision
    outs = life.handle(proto.LinkHealth(2, [], []), 3.0)
    assert "link 0->2 alive again (probes): back in plans" in events(outs, "recovery")
    assert life.capacity.planning[0, 2] == life.capacity.planning[2, 0] == 100.0
    assert life.open[1].rev == 1  # a revived link does not disturb a running revision


def test_a_link_failed_with_data_is_not_retried_before_its_probes_pass() -> None:
    life = started()
    life.handle(proto.LinkFailed(0, 0, 2, "no progress"), 2.0)
    for t in (5.0, 30.0, 100.0):
        beat(life, t)
        assert not events(life.tick(t), "recovery") and life.capacity.planning[0, 2] == 0.0
    life.handle(proto.LinkHealth(2, [], []), 101.0)
    beat(life, 101.0 + 2.0)
    outs = life.tick(101.0 + 2.0)
    assert "link 0->2 back in plans: its probes pass again" in events(outs, "recovery")


def test_a_revision_that_stops_moving_data_is_revised_and_a_moving_one_is_not() -> None:
    life = started()
    form(life, (0, 1))
    og = life.open[1]
    stall = life.stall_after(og.plan)
    assert stall >= lc.STALL_MIN_S and og.deadline - 1.0 > 3 * stall
    # Moving: every report shows new bytes, well past the stall window; no revision.
    t = 1.0
    for k in range(1, 12):
        t = 1.0 + k * 0.5
        life.handle(proto.LinkHealth(1, [], [[1, 0, 1000 * k]]), t)
        beat(life, t)
        assert not events(life.tick(t), "recovery")
    assert t - 1.0 > stall
    # Stopped: the same byte count again; revised once the window passes since the last bytes.
    life.handle(proto.LinkHealth(1, [], [[1, 0, 11000]]), t + 1.0)
    beat(life, t + stall - 0.1)
    assert not events(life.tick(t + stall - 0.1), "recovery")
    beat(life, t + stall + 0.1)
    outs = life.tick(t + stall + 0.1)
    assert any("revision 0 received no data for" in e for e in events(outs, "recovery"))
    assert life.open[1].rev == 1
    # Reports of the superseded revision are not progress of the new one.
    life.handle(proto.LinkHealth(1, [], [[1, 0, 99000]]), t + stall + 0.5)
    assert life.open[1].received == {}


def test_a_poorly_reached_worker_is_kept_out_of_groups_for_a_bounded_wait() -> None:
    # p=5 of 7 live workers; probes say every link into worker 6 but one is dead.
    life = started(make_cfg(n=7, p=5))
    outs = life.handle(proto.LinkHealth(6, [0, 1, 2, 3, 4], []), 0.5)
    assert life.capacity.planning[6, 0] == 0.0  # the reverse direction (ACKs) too
    beat(life, 1.0, tuple(range(7)))
    outs += life.tick(1.0)
    (msg,) = events(outs, "capacity")
    assert msg.startswith("worker 6 deferred: its live links reach it at 100.0 Mbit/s")
    assert life.former.deferred == {6}
    outs = form(life, (6, 0, 1, 2, 3, 4), now=1.5)
    (opened,) = of(outs, lc.GroupOpenedRecord)
    assert 6 not in opened.group.members
    report_all(life, opened.group.id, 2.0)
    outs = form(life, (0, 1, 2, 3), now=2.5)
    assert not of(outs, lc.GroupOpenedRecord)  # waits for a fifth non-deferred worker ...
    beat(life, 11.6, tuple(range(7)))
    (opened,) = of(life.tick(11.6), lc.GroupOpenedRecord)  # ... at most 10 s from its ready
    assert opened.group.members[0] == 6
    # Its links pass probes again: no longer deferred.
    life.handle(proto.LinkHealth(6, [], []), 12.0)
    beat(life, 12.5, tuple(range(7)))
    assert "worker 6 no longer deferred: reached at 600.0 Mbit/s" in events(
        life.tick(12.5), "capacity"
    )


def test_the_plan_counts_the_parts_pipeline_fill() -> None:
    # A relay forwards a part only once it holds all of it, so a vector of one or two parts
    # gains nothing from non-member aggregators (each extra hop costs the whole vector's time
    # on that link): _plan must pass the part size to the route LP, which then keeps the tiny
    # group among its members. The same group with a 4 MB vector does use the other workers.
    tiny = 1 << 14  # 64 KB: one part
    for size, helpers_pay in ((tiny, False), (SIZE, True)):
        cfg = make_cfg()
        life = lc.GroupLifecycle(cfg)
        for w in range(cfg.n):
            life.handle(proto.Register(w, 100 + w, 0, size), 0.0)
        form(life, (0, 1))
        plan = life.open[1].plan
        assert (plan.participants() != {0, 1}) is helpers_pay, plan
        fluid = plan_group("crew", np.array(cfg.bw_mbit), (0, 1), size * 4)
        assert plan.predicted_s >= fluid.predicted_s  # the fill is counted, never free
