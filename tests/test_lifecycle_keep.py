"""Revision decisions of the group life cycle: what a failover keeps, what it plans again, and
the suspect time after a link of a worker fails (staggered cuts). Fake clock, no root."""

from __future__ import annotations

from lifecycle_kit import SIZE, make_cfg, report_all

from crew.config import RunConfig
from crew.control import lifecycle as lc
from crew.control.grouping import GroupOutcome
from crew.plan.routes import Route
from crew.wire import protocol as proto


def started(cfg: RunConfig | None = None) -> lc.GroupLifecycle:
    cfg = cfg or make_cfg()
    life = lc.GroupLifecycle(cfg)
    for w in range(cfg.n):
        life.handle(proto.Register(w, 100 + w, 0, SIZE), 0.0)
    return life


def form(life: lc.GroupLifecycle, members: tuple[int, ...], now: float = 1.0) -> None:
    for m in members:
        life.handle(proto.Ready(m, 1, float(m + 1), -1), now)


def assigns(outs: list[lc.Output]) -> dict[int, proto.Assign]:
    return {
        o.worker: o.msg
        for o in outs
        if isinstance(o, lc.SendTo) and isinstance(o.msg, proto.Assign)
    }


def _routes(a: proto.Assign) -> list[Route]:
    return [Route.from_list(r) for r in a.routes]


def test_dead_aggregator_keeps_the_other_routes_and_replans_its_range() -> None:
    life = started()
    form(life, (0, 1))
    old = list(life.open[1].plan.routes)
    lost = [r for r in old if 3 in r.nodes()]
    assert lost and len(lost) < len(old)
    outs = life.handle(lc.WorkerDisconnected(3, "no heartbeat"), 2.0)
    a = next(iter(assigns(outs).values()))
    routes = _routes(a)
    kept = [routes[new] for new, _ in a.kept]
    assert kept == [old[k] for _, k in a.kept] == [r for r in old if 3 not in r.nodes()]
    replanned = routes[len(a.kept) :]
    assert sum(r.elems for r in replanned) == sum(r.elems for r in lost)
    assert all(3 not in r.nodes() for r in routes)
    ev = [e for e in outs if isinstance(e, lc.EventRecord) and e.kind == "recovery"]
    assert ev[0].data is not None and ev[0].data["kept_routes"] == len(kept)
    assert closed_ok(life)


def test_member_loss_replans_everything() -> None:
    life = started(make_cfg(p=3))
    form(life, (0, 1, 2))
    outs = life.handle(lc.WorkerDisconnected(2, "no heartbeat"), 2.0)
    assert all(a.kept == [] for a in assigns(outs).values())
    assert life.open[1].members == (0, 1)


def test_stall_replans_everything() -> None:
    life = started()
    form(life, (0, 1))
    life.handle(proto.LinkHealth(0, [], []), 1.0)  # progress is reported
    outs = life.tick(1.0 + lc.STALL_MIN_S + 1.0)
    a = assigns(outs)
    assert a and all(x.rev == 1 and x.kept == [] for x in a.values())


def test_dead_link_keeps_routes_that_do_not_use_it() -> None:
    life = started()
    form(life, (0, 1))
    old = list(life.open[1].plan.routes)
    outs = life.handle(proto.LinkHealth(2, [0], []), 2.0)  # probes: 0 -> 2 dead
    a = next(iter(assigns(outs).values()))
    assert a.rev == 1 and a.kept
    routes = _routes(a)
    assert all((0, 2) not in r.up and (0, 2) not in r.down for r in routes)
    assert [old[k] for _, k in a.kept] == [
        r for r in old if (0, 2) not in r.up and (0, 2) not in r.down
    ]
    # bytes of the group: rev 0's plan plus only the re-planned routes of rev 1
    assert closed_ok(life)


def test_failed_links_to_two_peers_make_a_worker_suspect_for_a_while() -> None:
    life = started(make_cfg(n=6, p=2))
    life.handle(proto.LinkHealth(2, [5], []), 2.0)  # 5 -> 2 dead: no culprit yet
    assert life.former.deferred == frozenset()
    life.handle(proto.LinkHealth(2, [5, 4], []), 2.5)  # and 4 -> 2: 2 is the common end
    assert life.former.deferred == {2}
    life.tick(2.5 + lc.SUSPECT_S - 0.1)
    assert life.former.deferred == {2}
    life.tick(2.5 + lc.SUSPECT_S + 0.1)
    assert life.former.deferred == frozenset()
    # A cut both ways between two workers names no culprit either.
    life.handle(proto.LinkHealth(1, [0], []), 10.0)
    life.handle(proto.LinkHealth(0, [1], []), 10.0)
    assert life.former.deferred == frozenset()


def test_suspect_workers_neither_aggregate_nor_relay_in_a_replan() -> None:
    life = started(make_cfg(n=6, p=2))
    form(life, (0, 1))
    assert {4, 5} <= life.open[1].plan.participants()  # equal links: everyone aggregates
    # 2 -> 5 and 3 -> 5 die (5 is suspect; the group uses neither 2 nor 3): 5 is set aside
    # at once, in one revision that keeps the routes clear of it.
    old = list(life.open[1].plan.routes)
    outs = life.handle(proto.LinkHealth(5, [2, 3], []), 2.0)
    a = next(iter(assigns(outs).values()))
    assert a.rev == 1
    assert [old[k] for _, k in a.kept] == [r for r in old if 5 not in r.nodes()]
    assert all(5 not in r.nodes() for r in _routes(a))
    # then the aggregator 4 is lost: the re-plan of 4's range must not go to 5 either.
    outs = life.handle(lc.WorkerDisconnected(4, "no heartbeat"), 2.5)
    a = next(iter(assigns(outs).values()))
    assert a.rev == 2
    assert all(not ({4, 5} & r.nodes()) for r in _routes(a))


def test_a_new_suspect_is_set_aside_once_in_every_open_group() -> None:
    life = started(make_cfg(n=8, p=2))
    form(life, (0, 1))
    form(life, (2, 3))
    assert all(7 in og.plan.participants() for og in life.open.values())
    # The probes find 7's cut links one after another, about a second apart.
    life.handle(proto.LinkHealth(7, [4], []), 2.0)  # one link: no culprit, nothing revised
    assert [og.rev for og in life.open.values()] == [0, 0]
    outs = life.handle(proto.LinkHealth(7, [4, 5], []), 3.0)  # 7 is suspect
    assert {(a.group, a.rev) for a in assigns_all(outs)} == {(1, 1), (2, 1)}
    assert all(7 not in og.plan.participants() for og in life.open.values())
    # Its other cuts, found later, cost no more revisions: no plan uses 7 any more.
    life.handle(proto.LinkHealth(7, [4, 5, 6], []), 4.0)
    life.handle(proto.LinkHealth(0, [7], []), 4.5)
    life.handle(proto.LinkHealth(2, [7], []), 5.0)
    assert [og.rev for og in life.open.values()] == [1, 1]
    for gid in (1, 2):
        outs = report_all(life, gid, 5.5)
        assert [o.outcome for o in outs if isinstance(o, lc.GroupClosedRecord)] == [
            GroupOutcome.COMPLETED
        ]


def test_new_plans_leave_a_suspect_out_unless_it_is_a_member() -> None:
    life = started(make_cfg(n=8, p=2))
    life.handle(proto.LinkHealth(7, [4, 5], []), 1.0)  # 7 is suspect until 4.0
    form(life, (0, 1), now=1.5)
    assert 7 not in life.open[1].plan.participants()
    assert life.open[1].plan.participants() - {0, 1}  # others still aggregate
    # once the suspicion is over, 7 aggregates again
    life.tick(1.0 + lc.SUSPECT_S + 0.1)
    report_all(life, 1, 4.2)
    form(life, (0, 1), now=4.3)
    og = next(og for og in life.open.values() if og.members == (0, 1))
    assert 7 in og.plan.participants()


def test_a_member_that_becomes_suspect_is_dropped_if_two_members_remain() -> None:
    life = started(make_cfg(n=8, p=3))
    form(life, (0, 1, 2))
    assert life.open[1].members == (0, 1, 2)
    outs = life.handle(proto.LinkHealth(2, [5, 6], []), 2.0)  # 2 is suspect
    og = life.open[1]
    assert og.members == (0, 1) and og.weights == (0.5, 0.5) and og.rev == 1
    told = [o.msg for o in outs if isinstance(o, lc.SendTo) and o.worker == 2]
    assert any(isinstance(m, proto.Abandon) and m.group == 1 for m in told)
    assert all(a.kept == [] for a in assigns_all(outs))  # the weights changed: all re-planned
    assert 2 not in og.plan.participants()
    outs = report_all(life, 1, 3.0)
    rec = [o for o in outs if isinstance(o, lc.GroupClosedRecord)]
    assert rec[0].outcome is GroupOutcome.COMPLETED and rec[0].dropped == (2,)


def test_a_suspect_member_stays_when_fewer_than_two_would_remain() -> None:
    life = started(make_cfg(n=8, p=2))
    form(life, (0, 1))
    outs = life.handle(proto.LinkHealth(1, [5, 6], []), 2.0)  # 1 is suspect
    og = life.open[1]
    assert og.members == (0, 1)
    assert not any(isinstance(o, lc.SendTo) and isinstance(o.msg, proto.Abandon) for o in outs)


def test_the_links_of_a_lost_worker_make_no_one_suspect() -> None:
    life = started(make_cfg(n=8, p=2))
    life.handle(lc.WorkerDisconnected(6, "control connection closed"), 1.0)
    # the probes find all of 6's links dead a little later; then one more link of 0 fails
    life.handle(proto.LinkHealth(0, [6], []), 2.0)
    life.handle(proto.LinkHealth(1, [6], []), 2.0)
    life.handle(proto.LinkHealth(0, [6, 5], []), 2.5)
    assert life.links.suspects(2.5) == set()
    assert life.former.deferred == frozenset()


def assigns_all(outs: list[lc.Output]) -> list[proto.Assign]:
    return [o.msg for o in outs if isinstance(o, lc.SendTo) and isinstance(o.msg, proto.Assign)]


def closed_ok(life: lc.GroupLifecycle) -> bool:
    outs = report_all(life, 1, 5.0)
    rec = [o for o in outs if isinstance(o, lc.GroupClosedRecord)]
    return len(rec) == 1 and rec[0].outcome is GroupOutcome.COMPLETED
