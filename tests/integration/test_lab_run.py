"""End to end: a real lab (Mininet hosts, HTB links, torch workers) on a 3-worker topology.

One shared lab trains under every group scheme in turn; the tests read what it recorded in its
run database, and that nothing of it is left on the machine once it stopped. Gloo's lab and a
lab stopped while its workers start are built by their own tests. (A worker killed mid-run is
tested in test_crew_faults.)
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from labkit import assert_nothing_left, completed_groups, lab_pids, rows, small_opts, wait_until

from lab.net.preflight import check
from lab.orchestrate import commands as cmds
from lab.orchestrate.hostbusy import HostBusy
from lab.orchestrate.runner import REPO, LabRun, RunOptions
from lab.orchestrate.summary import summarize
from lab.spec.topology import TopologySpec, load_topology

pytestmark = pytest.mark.root

SMALL = REPO / "topologies" / "small.yaml"
FIRST_GROUP_WAIT_S = 120.0  # eight... here three torch imports on two cores take a while


def _opts(scheme: str) -> RunOptions:
    # A narrower model than the fault suites', and the lab's default stall timeout: this suite
    # tests ordinary runs, not how quickly a stalled link fails over.
    return small_opts(scheme=scheme, width=128, stall_timeout_s=RunOptions().stall_timeout_s)


FIRST_SCHEME = "preduce"  # the scheme the shared lab starts with; crew is switched to first
SCHEME_GROUPS = 6  # completed groups of the start scheme and of crew
ROUTE_SCHEMES = ["crew-paper", "ps", "ring", "a2a", "blink", "blink-pipe", "topoadopt"]
ROUTE_GROUPS = 2  # completed groups of every other group scheme
SAMPLE_WAIT_S = 15.0  # for the link monitor (1 s period) to sample the traffic


@dataclass(frozen=True)
class StoppedLab:
    """What a test reads of a lab that has run and stopped: its database and its footprint."""

    db: Path
    topo: TopologySpec
    tag: str
    pids: list[int]
    state_dir: Path


def _count(db: Path, scheme: str) -> int:
    sql = "SELECT COUNT(*) FROM groups WHERE status='completed' AND scheme=?"
    return rows(db, sql, (scheme,))[0][0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> StoppedLab:
    """One lab on small.yaml that trains under every group scheme in turn, then stops.

    It starts with preduce, and the dashboard's command switches the scheme for groups formed
    from then on: crew, then every routed scheme. The tests below only read what it recorded."""
    tmp = tmp_path_factory.mktemp("lab-run")
    topo = load_topology(SMALL)
    state_dir = tmp / "state"
    with LabRun(topo, check(topo), _opts(FIRST_SCHEME), tmp / "run", state_dir=state_dir) as lab:
        db = lab.db_path
        wait_until(
            lab,
            lambda: _count(db, FIRST_SCHEME) >= SCHEME_GROUPS,
            FIRST_GROUP_WAIT_S,
            f"{SCHEME_GROUPS} completed {FIRST_SCHEME} groups",
        )
        for scheme, want in [("crew", SCHEME_GROUPS)] + [(s, ROUTE_GROUPS) for s in ROUTE_SCHEMES]:
            cmds.submit(db, cmds.SetScheme(scheme=scheme))
            wait_until(
                lab,
                lambda scheme=scheme, want=want: _count(db, scheme) >= want,
                FIRST_GROUP_WAIT_S,
                f"{want} completed {scheme} groups",
            )
        # Until the link monitor has sampled a link that carried at least a group's traffic.
        wait_until(
            lab,
            lambda: max((r["b"] or 0 for r in _moved(db)), default=0) > 100_000,
            SAMPLE_WAIT_S,
            "link samples showing the groups' bytes",
        )
        stopped = StoppedLab(db, topo, lab.tag, lab_pids(lab), state_dir)
    return stopped


def _moved(db: Path) -> list:
    return rows(
        db,
        "SELECT src, dst, MAX(tx_bytes) - MIN(tx_bytes) AS b FROM link_samples GROUP BY src, dst",
    )


def test_a_stopped_lab_leaves_nothing_behind(trained: StoppedLab) -> None:
    assert_nothing_left(trained.tag, trained.pids, trained.state_dir)
    events = {r["kind"] for r in rows(trained.db, "SELECT kind FROM events")}
    assert {"start", "stop"} <= events


@pytest.mark.parametrize("scheme", [FIRST_SCHEME, "crew"])
def test_run_trains_in_groups_of_p_and_records_everything(trained: StoppedLab, scheme: str) -> None:
    db = trained.db
    groups = rows(db, "SELECT * FROM groups WHERE status='completed' AND scheme=?", (scheme,))
    assert len(groups) >= SCHEME_GROUPS
    for g in groups:
        members = json.loads(g["members"])
        assert len(members) == 2 and len(set(members)) == 2
        assert g["predicted_s"] > 0 and g["bound_s"] > 0
        assert g["ended_at"] >= g["started_at"]
        assert g["verify_err"] is not None and g["verify_err"] < 1e-3, "wrong average"
        plan = json.loads(g["plan"])
        assert plan["scheme"] == scheme
        aggregators = {w for w, e in enumerate(plan["elems"]) if e > 0}
        if scheme == "preduce":
            assert aggregators <= set(members)
    # Links that carried data were sampled and show bytes.
    moved = _moved(db)
    assert moved and max(r["b"] for r in moved) > 100_000
    everything = completed_groups(db)
    summary = summarize(db)
    assert summary["groups_completed"] == len(everything)
    assert sum(summary["rounds_per_worker"].values()) == 2 * len(everything)
    assert all(len(m) for m in summary["link_bytes"])
    # Every torch worker reported its time split; the summary's mean is of theirs.
    shares = summary["utilisation_per_worker"]
    assert set(shares) == set(summary["rounds_per_worker"])
    assert all(0 < s["utilisation"] < 1 and s["group_s"] > 0 for s in shares.values())
    mean = sum(s["utilisation"] for s in shares.values()) / len(shares)
    assert summary["compute_utilisation"] == pytest.approx(mean, abs=1e-4)
    acc = rows(db, "SELECT accuracy FROM iterations WHERE accuracy IS NOT NULL ORDER BY t")
    assert acc, "no held-out accuracy was recorded"
    # The host's training window opens once every worker has been ready, not at the launch.
    (window,) = rows(db, "SELECT value FROM meta WHERE key = 'host_busy'")
    busy = HostBusy.from_json(window["value"])
    (all_ready,) = rows(
        db,
        "SELECT MAX(t) AS t FROM (SELECT MIN(t) AS t FROM worker_states WHERE state = 'ready'"
        " GROUP BY worker)",
    )
    assert busy.started >= all_ready["t"] and busy.ended > busy.started
    assert 0 < summary["host_busy_share"] <= 1 and summary["host_cpu_s_per_link_gb"] > 0


def test_every_group_scheme_trains_in_one_lab(trained: StoppedLab) -> None:
    """The scheme switched by the dashboard's command for groups formed from then on: each
    scheme's groups complete with exact averages, on plans of that scheme."""
    db = trained.db
    for scheme in ROUTE_SCHEMES:
        groups = rows(db, "SELECT * FROM groups WHERE status='completed' AND scheme=?", (scheme,))
        assert len(groups) >= ROUTE_GROUPS
        assert all(g["verify_err"] is not None and g["verify_err"] < 1e-3 for g in groups)
        assert all(json.loads(g["plan"])["scheme"] == scheme for g in groups)
    applied = rows(db, "SELECT status FROM commands")
    assert [r["status"] for r in applied] == ["applied"] * (1 + len(ROUTE_SCHEMES))


@pytest.mark.slow
def test_gloo_trains_with_synchronous_all_reduce(tmp_path: Path) -> None:
    """Gloo: every iteration, all n workers all-reduce (no partial groups)."""
    topo = load_topology(SMALL)
    with LabRun(
        topo, check(topo), _opts(scheme="gloo"), tmp_path / "run", state_dir=tmp_path / "state"
    ) as lab:
        db = lab.db_path
        wait_until(
            lab, lambda: len(completed_groups(db)) >= 3, FIRST_GROUP_WAIT_S, "three all-reduces"
        )
        pids, tag = lab_pids(lab), lab.tag
    assert_nothing_left(tag, pids, tmp_path / "state")
    groups = completed_groups(db)
    assert all(g["scheme"] == "gloo" for g in groups)
    assert all(len(json.loads(g["members"])) == topo.n for g in groups)
    iterations = rows(db, "SELECT worker, MAX(iteration) AS it FROM iterations GROUP BY worker")
    assert len(iterations) == topo.n  # everyone trains, in lock step


def test_a_lab_stopped_while_workers_start_ends_them_without_sigkill(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Workers still importing torch have not registered, so the coordinator's stop cannot
    reach them; the lab must still end them by SIGTERM, not wait and kill them."""
    topo = load_topology(SMALL)
    state_dir = tmp_path / "state"
    with LabRun(topo, check(topo), _opts("crew"), tmp_path / "run", state_dir=state_dir) as lab:
        pids = lab_pids(lab)
        tag = lab.tag
    codes = {i: p.returncode for i, p in lab.workers.items()}
    assert len(codes) == topo.n
    # 0: stopped gracefully; -SIGTERM: ended before its handler was installed. Never SIGKILL.
    assert set(codes.values()) <= {0, -15}, codes
    assert "did not stop in time" not in caplog.text
    assert_nothing_left(tag, pids, state_dir)


def _query(db: Path, sql: str) -> list:
    """``rows`` of a database that may not have its tables yet (the lab is still starting)."""
    try:
        return rows(db, sql) if db.is_file() else []
    except sqlite3.OperationalError:
        return []


def test_lab_run_exits_non_zero_when_a_worker_crashed(tmp_path: Path) -> None:
    """``python -m lab.run`` as a user runs it. A worker killed from outside the lab (as the
    kernel's OOM killer would) crashed: the run exits 1 and names it. A worker the lab kills on a
    fault command (here KillWorker, as the dashboard sends it) did not crash."""
    run_dir, summary, log = tmp_path / "run", tmp_path / "summary.json", tmp_path / "lab.log"
    argv = [
        *(sys.executable, "-m", "lab.run", "--topology", str(SMALL), "--group-size", "2"),
        *("--width", "128", "--depth", "2", "--no-dashboard", "--duration", "300"),
        *("--out", str(run_dir), "--json", str(summary), "--state-dir", str(tmp_path / "state")),
    ]
    db = run_dir / "lab.db"

    def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{what}: not seen\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)

    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        pid_sql = "SELECT worker, pid FROM worker_status WHERE pid IS NOT NULL"
        wait_for(
            lambda: (
                {1, 2} <= {r["worker"] for r in _query(db, pid_sql)}
                and bool(_query(db, "SELECT id FROM groups WHERE status='completed'"))
            ),
            FIRST_GROUP_WAIT_S,
            "workers 1 and 2 registered and a group completed",
        )
        pids = {r["worker"]: r["pid"] for r in _query(db, pid_sql)}
        cmds.submit(db, cmds.KillWorker(worker=2))
        wait_for(
            lambda: bool(_query(db, "SELECT id FROM commands WHERE status='applied'")),
            30,
            "the KillWorker command applied",
        )
        os.kill(pids[1], signal.SIGKILL)
        exited = "SELECT message FROM events WHERE worker=1 AND message LIKE '%exited with code%'"
        wait_for(lambda: bool(_query(db, exited)), 30, "the lab noticing worker 1's end")
        proc.send_signal(signal.SIGTERM)  # lab.run treats it as Ctrl-C: a full teardown
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    text = " ".join(log.read_text(errors="replace").split())
    assert proc.returncode == 1, text[-3000:]
    crashed = json.loads(summary.read_text())["workers_crashed"]
    assert set(crashed) == {"1"} and crashed["1"] != 0, crashed
    assert "workers crashed: w1" in text
