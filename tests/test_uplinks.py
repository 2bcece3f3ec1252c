"""Shared uplinks: the topology option, its planner capacities and their way to the planner.

No root needed: the emulated gateways are tested in tests/integration (root)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lifecycle_kit import make_cfg

from crew.config import ConfigError, RunConfig
from crew.control import lifecycle as lc
from crew.plan import planner
from crew.plan.schemes import plan_group
from crew.wire import protocol as proto
from lab.spec.topology import (
    TopologyError,
    Uplinks,
    load_topology,
    parse_topology,
    planner_shared_links,
)

REPO = Path(__file__).resolve().parents[1]
CLOUDS_4X2 = REPO / "topologies" / "clouds-4x2.yaml"


def two_clouds(uplinks: str | None = "shared") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "t",
        "intra_cloud_mbit": 400,
        "clouds": [{"name": "a", "workers": 2}, {"name": "b", "workers": 3}],
        "links": [{"between": ["a", "b"], "mbit": {"forward": 40, "reverse": 10}, "delay_ms": 5}],
    }
    if uplinks is not None:
        doc["uplinks"] = uplinks
    return doc


def test_default_is_private_and_has_no_shared_uplinks() -> None:
    spec = parse_topology(two_clouds(None))
    assert spec.uplinks is Uplinks.PRIVATE
    assert spec.shared_uplinks() == ()
    assert "uplinks" not in spec.to_dict()  # private files stay as they were


def test_shared_uplinks_cover_every_crossing_pair_once_per_direction() -> None:
    spec = parse_topology(two_clouds())
    ab, ba = spec.shared_uplinks()
    assert (ab.src_cloud, ab.dst_cloud, ab.rate_mbit, ab.delay_ms) == ("a", "b", 40.0, 5.0)
    assert set(ab.pairs) == {(i, j) for i in (0, 1) for j in (2, 3, 4)}
    assert (ba.rate_mbit, set(ba.pairs)) == (10.0, {(j, i) for i in (0, 1) for j in (2, 3, 4)})
    # Each pair alone may use the whole WAN rate; intra-cloud pairs are fast and unshared.
    bw = spec.bw_matrix()
    assert bw[0, 2] == bw[1, 4] == 40.0 and bw[3, 0] == 10.0 and bw[0, 1] == bw[2, 4] == 400.0
    assert parse_topology(spec.to_dict()) == spec  # the mode survives the run DB's YAML


def test_unknown_uplink_mode_is_a_clear_error() -> None:
    with pytest.raises(TopologyError, match=r"uplinks: unknown mode 'gateway'.*private, shared"):
        parse_topology(two_clouds("gateway"))


def test_planner_shared_links_map_rates_and_delays() -> None:
    links = planner_shared_links(parse_topology(two_clouds()))
    assert [(sl.mbit, sl.delay_s, len(sl.pairs)) for sl in links] == [
        (40.0, 0.005, 6),
        (10.0, 0.005, 6),
    ]
    assert planner_shared_links(parse_topology(two_clouds("private"))) == ()


def test_clouds_4x2_ships_shared_and_uneven() -> None:
    spec = load_topology(CLOUDS_4X2)
    assert spec.uplinks is Uplinks.SHARED and spec.n == 8 and len(spec.clouds) == 4
    ups = spec.shared_uplinks()
    assert len(ups) == 12 and all(len(u.pairs) == 4 for u in ups)
    assert len({u.rate_mbit for u in ups}) > 3  # uneven WAN rates
    assert all(u.rate_mbit < spec.intra_cloud_mbit for u in ups)


def test_shared_capacity_raises_the_lower_bound() -> None:
    """Two workers of cloud a sending to cloud b: with a shared uplink they cannot both use the
    full rate, so no scheme can be as fast as on private links."""
    spec = parse_topology(two_clouds())
    bw = spec.bw_matrix()
    shared = planner_shared_links(spec)
    size = 8 << 20
    members = (0, 1, 2, 3, 4)
    private = planner.lower_bound(bw, members, size)
    assert planner.lower_bound(bw, members, size, shared=shared) > 1.2 * private


def test_run_config_carries_shared_links_through_json(tmp_path: Path) -> None:
    shared = planner_shared_links(parse_topology(two_clouds()))
    cfg = make_cfg(n=5, shared=shared)
    cfg.save(tmp_path / "c.json")
    assert RunConfig.load(tmp_path / "c.json").shared == shared
    with pytest.raises(ConfigError, match=r"shared\[0\]: a pair names a worker outside"):
        make_cfg(n=4, shared=shared)  # worker 4 does not exist


def test_lifecycle_plans_and_bounds_with_the_shared_links() -> None:
    shared = planner_shared_links(parse_topology(two_clouds()))
    spec_bw = parse_topology(two_clouds()).bw_matrix()
    bw = np.where(np.isfinite(spec_bw), spec_bw, 0.0).tolist()
    seen: list[Any] = []

    def spy(scheme: str, bw_: np.ndarray, *args: Any, **kw: Any) -> Any:
        seen.append(kw.get("shared"))
        return plan_group(scheme, bw_, *args, **kw)

    bounds: list[Any] = []

    def bound(*args: Any, **kw: Any) -> float:
        bounds.append(kw.get("shared"))
        return planner.lower_bound(*args, **kw)

    cfg = make_cfg(n=5, p=5, bw=bw, shared=shared)
    life = lc.GroupLifecycle(cfg, plan=spy, lower_bound=bound)
    for w in range(cfg.n):
        life.handle(proto.Register(w, 100 + w, 0, 1 << 14), 0.0)
    for m in range(5):
        life.handle(proto.Ready(m, 1, float(m + 1), -1), 1.0)
    # plans count the payload share of each uplink's rate; the bound counts the whole rate
    payload = tuple(dataclasses.replace(s, mbit=s.mbit * cfg.goodput) for s in shared)
    assert seen and seen[0] == payload and bounds[0] == shared


def test_check_never_measures_two_links_over_one_uplink_at_once() -> None:
    from lab.check import schedule

    spec = load_topology(CLOUDS_4X2)
    uplink_of = {p: (u.src_cloud, u.dst_cloud) for u in spec.shared_uplinks() for p in u.pairs}
    batches = schedule(list(spec.links), 4, uplink_of)
    assert sum(len(b) for b in batches) == len(spec.links)
    for batch in batches:
        crossing = [uplink_of[(lk.src, lk.dst)] for lk in batch if (lk.src, lk.dst) in uplink_of]
        assert len(crossing) == len(set(crossing))
        hosts = [h for lk in batch for h in (lk.src, lk.dst)]
        assert len(hosts) == len(set(hosts))
    # Without the mapping two workers of us-east may send to eu-west at once.
    plain = schedule(list(spec.links), 4)
    assert any(
        len([lk for lk in b if uplink_of.get((lk.src, lk.dst)) == ("us-east", "eu-west")]) > 1
        for b in plain
    )


def test_every_pair_has_a_sender_interface_behind_gateways_too() -> None:
    # lab.run records each link's sender interface; a pair behind a shared uplink has no veth
    # of its own, so it names the worker's veth to its gateway.
    from lab.net.mesh import LabError, LabNetwork

    net = LabNetwork(load_topology(CLOUDS_4X2), tag="t")
    assert net.sender_intf(0, 1) == net.intf(0, 1) == "w0-w1"  # same cloud: direct
    assert net.sender_intf(0, 2) == "w0-gw" and net.sender_intf(7, 0) == "w7-gw"
    with pytest.raises(LabError, match="share an uplink"):
        net.intf(0, 2)
    with pytest.raises(LabError, match="no link 0->0"):
        net.sender_intf(0, 0)


def test_check_keeps_both_directions_of_a_cloud_pair_apart() -> None:
    # A flow's ACKs queue in the reverse uplink: w4 -> w2 must not run beside w3 -> w5.
    from lab.check import schedule, uplink_keys

    spec = load_topology(CLOUDS_4X2)
    keys = uplink_keys(spec)
    assert keys[(4, 2)] == keys[(3, 5)] == keys[(2, 4)]
    assert (0, 1) not in keys  # same cloud: its own link
    for batch in schedule(list(spec.links), 4, keys):
        crossing = [keys[(lk.src, lk.dst)] for lk in batch if (lk.src, lk.dst) in keys]
        assert len(crossing) == len(set(crossing))


def test_shared_goodput_is_all_bits_over_the_longest_window() -> None:
    from lab.check import LinkResult, shared_goodput

    def flow(mbit: float, window_s: float) -> LinkResult:
        return LinkResult(0, 2, 20, 19.1, mbit, 0, 0, "ok", window_s=window_s)

    # Two flows over a 20 Mbit/s uplink: one stopped at 1.7 s, the other drained its queue
    # alone until 2.2 s. Their rates add up to 22.1 (over 20), their bits to 19.1 Mbit/s.
    a, b = flow(9.55, 1.7), flow((9.55 * 1.7 + 19.1 * 0.5) / 2.2, 2.2)
    assert a.measured_mbit + b.measured_mbit > 20
    assert shared_goodput([a, b]) == pytest.approx(19.1, rel=1e-9)
    assert shared_goodput([]) == 0.0
