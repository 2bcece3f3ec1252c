"""The benchmark's trace former, alone and driving the group life cycle. Fake clock, no root."""

from __future__ import annotations

from typing import Any

import pytest
from lifecycle_kit import make_cfg, report_all, started

from crew.control import lifecycle as lc
from crew.control.former import FixedFormer, Former, former_for
from crew.control.grouping import GroupFormer, GroupingError, WorkerState
from crew.control.traceformer import TraceFormer
from crew.wire import protocol as proto

TRACE = [[0, 1], [2, 3, 1], [3, 0]]


def trace_former(trace: list[list[int]] = TRACE, n: int = 4) -> TraceFormer:
    return TraceFormer(trace, GroupFormer(n, 2, heartbeat_timeout=5.0))


def offered(former: TraceFormer, now: float = 0.0) -> TraceFormer:
    for w in range(former.n):
        former.join(w, now)
        assert former.ready(w, 0, now) == []  # an offer never forms a group itself
    return former


def of(outs: list[lc.Output], kind: type) -> list[Any]:
    return [o for o in outs if isinstance(o, kind)]


# -- the former alone --------------------------------------------------------------------------


def test_nothing_forms_before_every_worker_has_offered() -> None:
    f = trace_former()
    for w in range(3):
        f.join(w, 0.0)
        f.ready(w, 0, 0.0)
    assert f.form(1.0) == []
    f.ready(3, 0, 1.5)
    (g,) = f.form(2.0)
    assert g.id == 1 and g.members == (0, 1) and g.formed_at == 2.0


def test_groups_form_in_trace_order_one_at_a_time() -> None:
    f = offered(trace_former())
    formed = []
    for k in range(len(TRACE)):
        (g,) = f.form(float(k))
        assert f.form(float(k)) == []  # the open group holds the next back
        assert g.id == k + 1 and list(g.members) == TRACE[k]
        assert g.weights == tuple(1.0 / len(g.members) for _ in g.members)
        assert g.iterations == (0,) * len(g.members)
        formed.append(g.members)
        (f.complete if k % 2 == 0 else f.abandon)(g.id, float(k))
    assert formed == [tuple(t) for t in TRACE]
    assert f.form(10.0) == [] and f.upcoming() is None and f.position == len(TRACE)


def test_upcoming_names_the_group_after_the_open_one() -> None:
    f = offered(trace_former())
    assert f.upcoming() == (0, 1)
    f.form(1.0)
    assert f.upcoming() == (2, 3, 1)


def test_complete_counts_rounds_and_abandon_does_not() -> None:
    f = offered(trace_former())
    (g,) = f.form(1.0)
    f.complete(g.id, 2.0)
    (g,) = f.form(2.0)
    f.abandon(g.id, 3.0)
    assert [f.rounds(w) for w in range(4)] == [1, 1, 0, 0]
    with pytest.raises(GroupingError, match="group_id"):
        f.complete(g.id, 3.0)  # already closed


def test_a_dropped_member_leaves_the_others_equally_weighted() -> None:
    f = offered(trace_former())
    f.complete(f.form(1.0)[0].id, 1.0)
    (g,) = f.form(2.0)
    shrunk = f.drop_member(g.id, 3)
    assert shrunk.members == (2, 1) and shrunk.weights == (0.5, 0.5) and shrunk.dropped == (3,)
    assert f.open_groups() == [shrunk]
    with pytest.raises(GroupingError, match="not a member"):
        f.drop_member(g.id, 3)
    f.drop_member(g.id, 2)
    with pytest.raises(GroupingError, match="last member"):
        f.drop_member(g.id, 1)


def test_no_one_is_deferred_from_a_trace() -> None:
    f = trace_former()
    f.set_deferred({1, 2})
    assert f.deferred == frozenset()
    with pytest.raises(GroupingError, match="worker"):
        f.set_deferred({7})


def test_liveness_is_the_group_formers() -> None:
    f = trace_former()
    f.join(0, 0.0)
    f.join(1, 0.0)
    f.heartbeat(1, 4.0)
    assert f.expire(6.0) == [0]  # 0 silent for 6 s > 5 s
    assert f.state(0) is WorkerState.DEAD and f.alive() == {1}
    f.excuse(3.0, 9.5)  # 1 was last seen at 4.0; its 3 s of unwatched silence are excused
    assert f.expire(9.5) == []
    f.mark_dead(1, 10.0)
    assert f.alive() == set()
    with pytest.raises(GroupingError, match="p"):
        f.set_p(9)


def test_a_restart_goes_on_after_the_recorded_groups_and_the_one_maybe_sent() -> None:
    f = offered(trace_former())
    f.continue_ids_after(1)  # group 2 may have been assigned unrecorded: it is not run again
    (g,) = f.form(1.0)
    assert g.id == 3 and g.members == (3, 0)
    f.continue_ids_after(99)  # more recorded than traced: nothing left
    f.complete(g.id, 2.0)
    assert f.form(3.0) == []


@pytest.mark.parametrize(
    ("trace", "match"),
    [([[0, 0]], "distinct"), ([[]], "distinct"), ([[0, 4]], "no worker"), ([[-1, 2]], "no worker")],
)
def test_a_bad_trace_is_refused_with_its_group(trace: list[list[int]], match: str) -> None:
    with pytest.raises(GroupingError, match=match) as err:
        trace_former(trace)
    assert err.value.field == "trace" and "group 0" in str(err.value)


def test_former_for_builds_the_trace_former_only_for_a_trace() -> None:
    fixed = former_for(make_cfg(extra={"trace": TRACE}))
    assert isinstance(fixed, TraceFormer) and isinstance(fixed, FixedFormer)
    assert fixed.trace == tuple(tuple(t) for t in TRACE)
    plain: Former = former_for(make_cfg(p=3, heartbeat_timeout_s=7.0))
    assert isinstance(plain, GroupFormer) and not isinstance(plain, FixedFormer)
    assert plain.p == 3 and plain.heartbeat_timeout == 7.0


# -- driving the life cycle --------------------------------------------------------------------


def test_the_life_cycle_runs_the_trace_former_it_is_given() -> None:
    """The trace comes with the former, not the config: a config without one still runs it."""
    cfg = make_cfg()
    assert "trace" not in cfg.extra
    life = started(cfg, former=TraceFormer(TRACE, GroupFormer(4, 2)))
    outs: list[lc.Output] = []
    for w in range(4):
        outs += life.handle(proto.Ready(w, 0, float(w), -1), 1.0)
    assert outs == []  # offers: no readiness status, no group yet
    members = []
    for k in range(len(TRACE)):
        outs = life.tick(1.0 + k)
        (opened,) = of(outs, lc.GroupOpenedRecord)
        members.append(list(opened.group.members))
        report_all(life, opened.group.id, 1.5 + k)
    assert members == TRACE
    assert of(outs, lc.MetaRecord) == [lc.MetaRecord({"trace_started_all": "1"})]


def test_a_readiness_former_ignores_a_trace_in_the_config() -> None:
    cfg = make_cfg(extra={"trace": TRACE})
    life = started(cfg, former=GroupFormer(4, 2))
    outs = life.handle(proto.Ready(2, 1, 1.0, -1), 1.0) + life.handle(
        proto.Ready(3, 1, 2.0, -1), 1.0
    )
    (opened,) = of(outs, lc.GroupOpenedRecord)
    assert opened.group.members == (2, 3)  # the ready ones, not the trace's first group


def test_a_trace_keeps_a_suspect_member_and_defers_no_one() -> None:
    """Readiness drops a member that becomes suspect (test_lifecycle_keep); a trace's groups
    are the benchmark's and keep their live members, and no one is recorded as deferred."""
    life = started(make_cfg(n=8, p=3, extra={"trace": [[0, 1, 2], [3, 4]]}))
    for w in range(8):
        life.handle(proto.Ready(w, 0, float(w), -1), 1.0)
    life.tick(1.0)
    assert life.open[1].members == (0, 1, 2)
    outs = life.handle(proto.LinkHealth(2, [5, 6], []), 2.0)  # 2 is suspect
    assert 2 in life.links.suspects(2.0)
    assert life.open[1].members == (0, 1, 2)
    assert not [o for o in outs if isinstance(o, lc.SendTo) and isinstance(o.msg, proto.Abandon)]
    assert not [e for e in of(outs, lc.EventRecord) if "deferred" in e.message]
    assert life.former.deferred == frozenset()


def test_a_lost_member_shrinks_a_trace_group_with_equal_weights() -> None:
    life = started(make_cfg(n=4, p=3, extra={"trace": [[0, 1, 2]]}))
    for w in range(4):
        life.handle(proto.Ready(w, 0, float(w), -1), 1.0)
    life.tick(1.0)
    life.handle(lc.WorkerDisconnected(1, "gone"), 2.0)
    og = life.open[1]
    assert og.members == (0, 2) and og.weights == (0.5, 0.5) and og.rev == 1
    rec = of(report_all(life, 1, 3.0), lc.GroupClosedRecord)[0]
    assert rec.dropped == (1,) and rec.verify_err is not None and rec.verify_err < 1e-9
