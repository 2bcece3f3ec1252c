"""The long-run memory benchmark's meter (lab.studies.longrun) and the soak's RSS timeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crew.sim.engine import SimConfig, Simulation
from crew.sim.topogen import generate
from lab.soak import rss_timeline
from lab.studies import longrun


def test_a_run_without_history_keeps_only_open_groups() -> None:
    cfg = SimConfig(
        scheme="preduce", p=2, duration_s=1e9, size_bytes=4000, history=False,
        stop_after_groups=300,
    )  # fmt: skip
    sim = Simulation(generate(4, 2, 0, "none"), cfg)
    res = sim.run()
    assert res.completed == 300  # stopped at the count, not at the (huge) duration
    assert res.group_times == [] and sim.life.records == []
    assert len(sim.group_start) <= 2  # the open groups' starts only (n = 4, p = 2)
    with pytest.raises(ValueError, match="stop_after_groups"):
        SimConfig(stop_after_groups=0)


def test_checkpoints_every_k_groups_with_the_controller_share(tmp_path: Path) -> None:
    out = tmp_path / "longrun.json"
    argv = ["--groups", "600", "--every", "200", "--n", "4", "--p", "2", "--size-mb", "0.004"]
    assert longrun.main([*argv, "--quiet", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    groups = [c["groups"] for c in report["checkpoints"]]
    assert groups[0] >= 200 and len(groups) == 3 and groups == sorted(groups)
    for c in report["checkpoints"]:
        assert 0 < c["controller_mb"] <= c["all_mb"] <= c["peak_mb"]
    first, last = report["checkpoints"][0], report["checkpoints"][-1]
    assert report["controller_growth_mb"] == pytest.approx(
        last["controller_mb"] - first["controller_mb"]
    )
    assert report["ok"] is (report["controller_growth_mb"] <= 10.0)


def test_longrun_refuses_fewer_than_two_checkpoints(capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit):
        longrun.main(["--groups", "100", "--every", "100"])
    assert "at least twice --every" in capsys.readouterr().err


def test_rss_timeline_shows_each_process_at_evenly_spread_times() -> None:
    series = {
        "coordinator/pid1": [(t * 15.0, 80.0 + t) for t in range(241)],  # an hour
        "w4/pid9": [(t * 15.0, 300.0) for t in range(200, 241)],  # restarted at minute 50
    }
    lines = rss_timeline(series, columns=7)
    assert lines[1].split() == ["0", "10", "20", "30", "40", "50", "60"]
    assert lines[2].split()[1:] == ["80.0", "120.0", "160.0", "200.0", "240.0", "280.0", "320.0"]
    assert lines[3].split()[1:] == ["-", "-", "-", "-", "-", "300.0", "300.0"]
    assert rss_timeline({}) == []


def test_soak_draws_only_the_fault_kinds_asked_for() -> None:
    from lab.net.preflight import Capabilities
    from lab.orchestrate.runner import lab_limits
    from lab.soak import SoakOptions, chaos_scenario
    from lab.spec.topology import load_topology

    caps = Capabilities(root=True, tools={}, htb=True, netem=False, iptables_statistic=True)
    opts = SoakOptions(minutes=10, faults=("slow", "cut"))
    topo = load_topology(opts.topology)
    limits = lab_limits(topo, caps)
    kinds = {s.command.KIND.value for s in chaos_scenario(topo, opts, limits).steps}
    assert kinds and kinds <= {"slow_worker", "cut_link", "restore_link"}
    every = chaos_scenario(topo, SoakOptions(minutes=10), limits)
    assert "kill_worker" in {s.command.KIND.value for s in every.steps}
