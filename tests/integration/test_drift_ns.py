"""A real lab whose links follow rate traces: synthetic workers keep completing groups while
the applier changes HTB rates in place, and each configured rate is in the run database; a lab
given traces in its options replays them itself and tells an oracle planner each rate."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from labkit import completed_groups, rows, small_opts, wait_until

from crew.ratetrace import DriftParams, RateTrace, generate
from lab.net.preflight import check
from lab.orchestrate.drift import DriftApplier, DriftSchedule
from lab.orchestrate.runner import REPO, LabRun
from lab.spec.topology import load_topology

pytestmark = pytest.mark.root
SMALL = REPO / "topologies" / "small.yaml"


def test_traced_links_change_rate_while_groups_complete(tmp_path: Path) -> None:
    topo = load_topology(SMALL)
    opts = small_opts(workload="synthetic", model_mb=1.0)
    steps = RateTrace((0.0, 1.0, 2.0, 3.0), (10.0, 40.0, 15.0, 30.0), "steps")
    with LabRun(topo, check(topo), opts, tmp_path / "run", state_dir=tmp_path / "state") as lab:
        db = lab.db_path
        wait_until(lab, lambda: len(completed_groups(db)) >= 2, 60.0, "two groups")
        assert lab.net is not None and lab.db is not None
        drifting = generate(DriftParams(topo.link(1, 2).rate_mbit, duration_s=10, seed=1), (1, 2))
        applier = DriftApplier(lab.net, lab.db, DriftSchedule({(0, 1): steps, (1, 2): drifting}))
        before = len(completed_groups(db))
        applier.start()
        try:
            wait_until(lab, lambda: applier.schedule.applied.get((0, 1)) == 30.0, 20.0, "4 steps")
        finally:
            applier.stop()
        assert lab.net.link_state(0, 1).rate_mbit == 30.0
        assert lab.net.link_state(1, 2).rate_mbit == applier.schedule.applied[(1, 2)]
        wait_until(lab, lambda: len(completed_groups(db)) > before + 2, 60.0, "groups go on")
    traced = rows(db, "SELECT src, dst, rate_mbit FROM link_state WHERE reason = 'trace'")
    assert [r["rate_mbit"] for r in traced if (r["src"], r["dst"]) == (0, 1)] == [
        10.0,
        40.0,
        15.0,
        30.0,
    ]
    assert any((r["src"], r["dst"]) == (1, 2) for r in traced)


def test_a_lab_given_traces_replays_them_and_its_oracle_planner_keeps_completing(
    tmp_path: Path,
) -> None:
    topo = load_topology(SMALL)
    steps = RateTrace((0.0, 2.0, 4.0), (20.0, 60.0, 25.0), "steps")
    opts = replace(
        small_opts(workload="synthetic", model_mb=1.0, capacity="oracle"),
        rate_traces={(0, 1): steps, (1, 0): steps},
    )
    with LabRun(topo, check(topo), opts, tmp_path / "run", state_dir=tmp_path / "state") as lab:
        db = lab.db_path
        assert lab.drift is not None and lab.drift.on_change is not None
        wait_until(lab, lambda: lab.drift.schedule.applied.get((1, 0)) == 25.0, 30.0, "3 steps")
        assert lab.net is not None and lab.net.link_state(1, 0).rate_mbit == 25.0
        wait_until(lab, lambda: len(completed_groups(db)) >= 4, 60.0, "groups under the oracle")
    traced = rows(db, "SELECT src, dst, rate_mbit FROM link_state WHERE reason = 'trace'")
    assert [r["rate_mbit"] for r in traced if (r["src"], r["dst"]) == (1, 0)] == [20.0, 60.0, 25.0]
    assert not [g for g in completed_groups(db) if g["verify_err"] is None]
