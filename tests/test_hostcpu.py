"""The host's CPU as a capacity of crew's route LP (crew.plan.hostcpu): the resource, the
config fields, and the coordinator's life cycle passing it to the planner only."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from lifecycle_kit import make_cfg, started

from crew.config import ConfigError
from crew.plan import routelp
from crew.plan.hostcpu import host_cpu_link
from crew.plan.planner import PlanError, SharedLink
from crew.plan.schemes import plan_group


def test_the_cpu_link_spans_every_directed_pair_at_cores_over_cost() -> None:
    link = host_cpu_link(3, 12.5, 2.0)
    assert sorted(link.pairs) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    assert link.mbit == pytest.approx(2.0 / 12.5 * 8000)  # 0.16 GB/s = 1280 Mbit/s
    with pytest.raises(PlanError, match="host cpu"):
        host_cpu_link(3, 0.0, 2.0)


def test_a_cpu_bound_plan_moves_fewer_bytes_and_predicts_the_cpu_time() -> None:
    # 4 workers, 2 members, fast links: relaying through the two non-members spreads the
    # load, but every relay byte costs the one host's CPU too. With a CPU that moves only
    # 20 Mbit/s of link bytes, the plan is CPU-bound: its time is its bytes / that rate.
    n, size = 4, 8 << 20
    bw = np.full((n, n), 100.0)
    np.fill_diagonal(bw, np.inf)
    free = routelp.plan_routes(bw, (0, 1), size)
    cpu = host_cpu_link(n, 2.0 / 20 * 8000, 2.0)  # 20 Mbit/s of link bytes
    bound = routelp.plan_routes(bw, (0, 1), size, shared=(cpu,))

    def link_bytes(rp: routelp.RoutePlanResult) -> int:
        return sum(r.elems * 4 * (len(r.up) + len(r.down)) for r in rp.routes)

    assert link_bytes(bound) <= link_bytes(free)
    # two members: at least one copy each way of the vector, 2 x 8 MiB at 20 Mbit/s
    assert bound.bandwidth_s == pytest.approx(link_bytes(bound) * 8 / 20e6, rel=1e-6)
    assert bound.bandwidth_s > free.bandwidth_s


def test_config_takes_both_fields_or_neither() -> None:
    make_cfg(host_cpu_s_per_gb=12.0, host_cores=2.0)
    with pytest.raises(ConfigError, match="set both or neither"):
        make_cfg(host_cpu_s_per_gb=12.0)
    with pytest.raises(ConfigError, match="host_cores"):
        make_cfg(host_cpu_s_per_gb=12.0, host_cores=float("nan"))


def test_the_life_cycle_gives_the_cpu_to_the_planner_and_not_to_the_bound() -> None:
    seen: dict[str, Any] = {}

    def spy_plan(*args: Any, **kw: Any) -> Any:
        seen["plan"] = kw.get("shared", ())
        return plan_group(*args, **kw)

    def spy_bound(*args: Any, **kw: Any) -> float:
        seen["bound"] = kw.get("shared", ())
        return 1.0

    cfg = make_cfg(n=4, p=2, host_cpu_s_per_gb=10.0, host_cores=2.0)
    life = started(cfg, plan=spy_plan, lower_bound=spy_bound)
    life.plan_for((0, 1), 1.0)
    cpu = [s for s in seen["plan"] if isinstance(s, SharedLink) and len(s.pairs) == 12]
    assert len(cpu) == 1 and cpu[0].mbit == pytest.approx(2.0 / 10.0 * 8000)
    assert not seen["bound"]
    plain = started(make_cfg(n=4, p=2), plan=spy_plan, lower_bound=spy_bound)
    plain.plan_for((0, 1), 1.0)
    assert not seen["plan"]
