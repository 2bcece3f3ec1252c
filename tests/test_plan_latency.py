"""The topology's one-way delays reach the plans: run config -> capacity view -> plan_group
and the lower bound. (The latency term itself is tested in tests/test_routelp.py.)

No root needed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lifecycle_kit import make_cfg

from crew.config import ConfigError, RunConfig
from crew.control import lifecycle as lc
from crew.control.capacity import CapacityView
from crew.plan import planner
from crew.plan.schemes import GroupPlan, plan_group
from crew.wire import protocol as proto
from lab.net.preflight import Capabilities
from lab.orchestrate.runner import planned_delays
from lab.spec.topology import Impairment, parse_topology

# Members 0 and 1 on a 10 Mbit/s link, helper 2 at 100 Mbit/s to both (0 used as the JSON
# diagonal). 400 kB: 0.32 s direct, ~0.03 s through the relay.
TRIANGLE = [[0.0, 10.0, 100.0], [10.0, 0.0, 100.0], [100.0, 100.0, 0.0]]
SIZE_ELEMS = 100_000
FAR_MS = 500.0  # helper 2 is 500 ms from both members: a relay costs >= 1 s
NEAR_MS = 10.0  # the members are 10 ms apart


def far_helper() -> list[list[float]]:
    d = [[0.0] * 3 for _ in range(3)]
    for a, b in ((0, 2), (2, 0), (1, 2), (2, 1)):
        d[a][b] = FAR_MS
    d[0][1] = d[1][0] = NEAR_MS
    return d


def plan_of_first_group(
    cfg: RunConfig, *after: proto.Admin, size_elems: int = SIZE_ELEMS
) -> tuple[GroupPlan, dict, float]:
    """Run the real life cycle until it plans the group (0, 1); what it planned, with which
    keywords, and the bound it recorded."""
    seen: list[tuple[GroupPlan, dict[str, Any]]] = []

    def spy(*args: Any, **kw: Any) -> GroupPlan:
        plan = plan_group(*args, **kw)
        seen.append((plan, kw))
        return plan

    bounds: list[float] = []

    def bound(*args: Any, **kw: Any) -> float:
        bounds.append(planner.lower_bound(*args, **kw))
        return bounds[-1]

    life = lc.GroupLifecycle(cfg, plan=spy, lower_bound=bound)
    for msg in after:
        life.handle(msg, 0.0)
    for w in range(cfg.n):
        life.handle(proto.Register(w, 100 + w, 0, size_elems), 0.0)
    for m in (0, 1):
        life.handle(proto.Ready(m, 1, float(m + 1), -1), 1.0)
    assert len(seen) == 1 and len(bounds) == 1
    assert seen[0][0].members == (0, 1)
    return seen[0][0], seen[0][1], bounds[0]


def uses_relay(plan: GroupPlan) -> bool:
    return any(2 in r.nodes() for r in plan.routes)


def test_configured_delays_make_the_coordinator_drop_a_far_relay() -> None:
    near, kw, near_bound = plan_of_first_group(make_cfg(n=3, p=2, bw=TRIANGLE))
    assert "delay_s" not in kw  # no delays configured: no latency term
    assert uses_relay(near) and near.predicted_s < 0.1

    far, kw, far_bound = plan_of_first_group(
        make_cfg(n=3, p=2, bw=TRIANGLE, delay_ms=tuple(map(tuple, far_helper())))
    )
    assert kw["delay_s"][0, 2] == pytest.approx(FAR_MS / 1000)
    assert not uses_relay(far)  # the relay's 1 s of latency costs more than it saves
    # 0.32 s of direct transfer plus the near delay, plus per hop one part's fill and the socket
    # backlog ahead of it (the route LP counts both since plans pass part_bytes: 2 x 64 KiB at
    # 9.5 Mbit/s, 0.11 s); far below the relay's 1 s.
    assert 0.32 + NEAR_MS / 1000 < far.predicted_s < 0.32 + NEAR_MS / 1000 + 0.15
    # the bound counts the shortest delay path between the members too
    assert far_bound == pytest.approx(near_bound + NEAR_MS / 1000, rel=1e-6)


def test_the_socket_backlog_at_each_hop_makes_a_marginal_relay_not_pay() -> None:
    """A relay through helper 2 at 4 Mbit/s takes some of 1 MB off the members' 10 Mbit/s link.
    Counting each hop's part alone, that pays; counting the 64 KiB of unsent bytes a part also
    waits behind at each hop (RunConfig.hop_backlog_bytes), the relay's two extra hops cost
    more than its bandwidth saves, and the coordinator plans the direct link alone."""
    slow_relay = [[0.0, 10.0, 4.0], [10.0, 0.0, 4.0], [4.0, 4.0, 0.0]]
    alone, kw_alone, _ = plan_of_first_group(
        make_cfg(n=3, p=2, bw=slow_relay, hop_backlog_bytes=0), size_elems=250_000
    )
    counted, kw, _ = plan_of_first_group(make_cfg(n=3, p=2, bw=slow_relay), size_elems=250_000)
    assert kw["part_bytes"] == kw_alone["part_bytes"] + RunConfig.default("hop_backlog_bytes")
    assert uses_relay(alone) and not uses_relay(counted)
    # a wait the old model left out can only make the plan slower, never faster
    assert counted.predicted_s > alone.predicted_s


def test_a_delay_set_at_run_time_reaches_the_next_plan() -> None:
    cfg = make_cfg(n=3, p=2, bw=TRIANGLE)
    cut_off = [
        proto.Admin("set_link", {"src": a, "dst": b, "rate_mbit": 100.0, "delay_ms": FAR_MS})
        for a, b in ((0, 2), (2, 0), (1, 2), (2, 1))
    ]
    plan, kw, _ = plan_of_first_group(cfg, *cut_off)
    assert kw["delay_s"][2, 1] == pytest.approx(FAR_MS / 1000)
    assert not uses_relay(plan)


def test_run_config_carries_delays_through_json(tmp_path: Path) -> None:
    delays = tuple(map(tuple, far_helper()))
    cfg = make_cfg(n=3, p=2, bw=TRIANGLE, delay_ms=delays)
    cfg.save(tmp_path / "c.json")
    assert RunConfig.load(tmp_path / "c.json").delay_ms == delays
    assert make_cfg(n=3).delay_ms == ()  # default: no delays
    with pytest.raises(ConfigError, match="delay_ms: must be 3x3"):
        make_cfg(n=3, delay_ms=((0.0, 1.0),))
    with pytest.raises(ConfigError, match=r"delay_ms: must be finite and >= 0, not at \[\(0, 1\)"):
        make_cfg(n=2, delay_ms=((0.0, -1.0), (0.0, 0.0)))


def test_capacity_view_keeps_delays_in_seconds_and_none_when_all_zero() -> None:
    view = CapacityView(TRIANGLE, measured=False, delay_ms=far_helper())
    assert view.delay_s is not None and view.delay_s[1, 2] == pytest.approx(0.5)
    assert np.all(np.diag(view.delay_s) == 0)
    assert CapacityView(TRIANGLE, measured=False, delay_ms=np.zeros((3, 3))).delay_s is None
    assert CapacityView(TRIANGLE, measured=False).delay_s is None
    with pytest.raises(ValueError, match="delay_ms: must have shape"):
        CapacityView(TRIANGLE, measured=False, delay_ms=[[0.0]])


def test_the_lab_passes_delays_only_where_it_applies_them() -> None:
    topo = parse_topology(
        {
            "name": "t",
            "clouds": [{"name": "a", "workers": 1}, {"name": "b", "workers": 1}],
            "links": [
                {"between": ["a", "b"], "mbit": 50, "delay_ms": {"forward": 20, "reverse": 30}}
            ],
        }
    )
    netem = Capabilities(root=True, tools={}, htb=True, netem=True, iptables_statistic=True)
    assert planned_delays(topo, netem) == ((0.0, 20.0), (30.0, 0.0))
    no_netem = replace(netem, netem=False, allow_missing=frozenset({Impairment.DELAY}))
    assert planned_delays(topo, no_netem) == ()  # the links run without delay: plan so
    plain = parse_topology(
        {
            "name": "p",
            "clouds": [{"name": "a", "workers": 1}, {"name": "b", "workers": 1}],
            "links": [{"between": ["a", "b"], "mbit": 50}],
        }
    )
    assert planned_delays(plain, netem) == ()
