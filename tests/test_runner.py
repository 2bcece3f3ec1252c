"""LabRun's checks that need no network: they must refuse before anything is built."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from crew.runtime.rundb import RunDB
from lab.net.mesh import LabError
from lab.net.preflight import Capabilities
from lab.orchestrate.runner import REPO, LabRun, RunOptions
from lab.spec.topology import load_topology

CAPS = Capabilities(root=True, tools={}, htb=True, netem=False, iptables_statistic=True)


def test_a_run_directory_holding_a_run_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunDB(run_dir / "lab.db").close()
    before = (run_dir / "lab.db").read_bytes()
    topo = load_topology(REPO / "topologies" / "small.yaml")
    with pytest.raises(LabError, match="already holds a run"):
        LabRun(topo, CAPS, RunOptions(), run_dir)
    assert (run_dir / "lab.db").read_bytes() == before
    assert sorted(p.name for p in run_dir.iterdir()) == ["lab.db"]


def test_lab_run_refuses_a_used_run_directory_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lab.run import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunDB(run_dir / "lab.db").close()
    code = main(["--out", str(run_dir), "--duration", "5", "--no-dashboard"])
    assert code == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps at the terminal width
    assert f"--out: {run_dir} already holds a run" in err
    assert sorted(p.name for p in run_dir.iterdir()) == ["lab.db"]


def test_loss_is_offered_only_when_the_lab_will_apply_it() -> None:
    """The dashboard's controls come from lab_impairments; without netem, loss needs the
    iptables fallback to be accepted (--allow-missing loss), or set_link would refuse it."""
    from lab.orchestrate.runner import lab_impairments
    from lab.spec.topology import Impairment

    assert lab_impairments(CAPS) == {"rate"}
    accepted = replace(CAPS, allow_missing=frozenset({Impairment.LOSS}))
    assert lab_impairments(accepted) == {"rate", "loss"}
    no_statistic = replace(accepted, iptables_statistic=False)
    assert lab_impairments(no_statistic) == {"rate"}
    netem = replace(CAPS, netem=True, iptables_statistic=False)
    assert lab_impairments(netem) == {"rate", "delay", "jitter", "loss"}


def test_a_worker_that_ends_with_an_error_counts_as_crashed(tmp_path: Path) -> None:
    """LabRun.poll tells a worker that ended by itself with an error (crashed) from one that
    ended cleanly; the lab's own stops (stop_worker, a KillWorker command) record their exit
    code before poll sees it, so they never count. Real processes, a real run database."""
    import subprocess
    import sys

    topo = load_topology(REPO / "topologies" / "small.yaml")
    lab = LabRun(topo, CAPS, RunOptions(), tmp_path / "run")
    (tmp_path / "run").mkdir()
    lab.db = RunDB(lab.db_path)
    code = "import sys; sys.exit(int(sys.argv[1]))"
    lab.workers = {
        w: subprocess.Popen([sys.executable, "-c", code, str(rc)])
        for w, rc in ((0, 3), (1, 0), (2, 7))
    }
    for proc in lab.workers.values():
        proc.wait(timeout=30)
    lab.exit_codes[2] = -9  # as stop_worker records a kill the lab made
    lab.poll()
    assert lab.crashed == {0: 3}
    assert lab.exit_codes == {0: 3, 1: 0, 2: -9}
    # A RestartWorker: a new process for worker 0, which ends cleanly; the crash stays on record.
    lab.exit_codes.pop(0)
    lab.workers[0] = subprocess.Popen([sys.executable, "-c", code, "0"])
    lab.workers[0].wait(timeout=30)
    lab.poll()
    assert lab.crashed == {0: 3} and lab.exit_codes[0] == 0
    lab.db.close()


def test_helpers_left_out_are_recorded_as_the_planners_default_for_n(tmp_path: Path) -> None:
    topo = load_topology(REPO / "topologies" / "small.yaml")
    assert LabRun(topo, CAPS, RunOptions(), tmp_path / "a").opts.helpers == -1  # every worker
    assert LabRun(topo, CAPS, RunOptions(helpers=2), tmp_path / "b").opts.helpers == 2
