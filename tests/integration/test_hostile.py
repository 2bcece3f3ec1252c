"""Hostile input against a running lab: a peer without the run's secret, oversized frames, and
nonsense dashboard commands. None of it may be accepted, crash a worker, or change the lab.

The attacker is ``python -m lab.fuzz attack`` started inside worker 0's namespace, so its
packets reach worker 1 over the emulated link 0->1 from worker 0's identity address, as a
compromised or misconfigured host in another cloud would send them. Every hostile connection
must be dropped by worker 1 and reported once: worker 1 sends a ``Rejected`` message and the
coordinator writes an event of kind ``security``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from labkit import completed_groups, rows, small_opts, wait_until

from crew.runtime import rundb
from lab.net.preflight import check
from lab.orchestrate.runner import REPO, LabRun
from lab.spec.topology import load_topology

pytestmark = [pytest.mark.root, pytest.mark.slow]

SMALL = REPO / "topologies" / "small.yaml"
START_WAIT_S = 120.0
WAIT_S = 60.0
ATTACK_TIMEOUT_S = 90.0
VICTIM = 1
K = 15  # hostile connections per attack


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabRun]:
    tmp = tmp_path_factory.mktemp("hostile")
    topo = load_topology(SMALL)
    with LabRun(topo, check(topo), small_opts(), tmp / "run", state_dir=tmp / "state") as run:
        wait_until(
            run, lambda: len(completed_groups(run.db_path)) >= 2, START_WAIT_S, "first groups"
        )
        yield run


def _security(lab: LabRun, since: float) -> Counter[str]:
    """Rejection reasons worker VICTIM reported since ``since``."""
    events = rows(
        lab.db_path,
        "SELECT data FROM events WHERE kind='security' AND worker=? AND t >= ?",
        (VICTIM, since),
    )
    out: Counter[str] = Counter()
    for r in events:  # the coordinator batches rejections: one row per reason, with a count
        data = json.loads(r["data"])
        out[data["reason"]] += data["count"]
    return out


def _attack(lab: LabRun, mode: str, seed: int) -> dict:
    """Run the attacker in worker 0's namespace against worker VICTIM's data port."""
    assert lab.net is not None and lab.cfg is not None
    target = f"{lab.cfg.identities[VICTIM]}:{lab.cfg.data_port}"
    proc = lab.net.popen(
        0,
        [
            sys.executable,
            "-m",
            "lab.fuzz",
            "attack",
            "--to",
            target,
            "--frames",
            str(K),
            "--mode",
            mode,
            "--seed",
            str(seed),
            "--wait",
            "5",
        ],
        label=f"attacker {mode}",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        out, err = proc.communicate(timeout=ATTACK_TIMEOUT_S)
    finally:
        lab.net.stop_process(proc)  # already ended normally; this also forgets its record
    assert out.strip(), f"attacker printed nothing; stderr:\n{err.decode()[-2000:]}"
    return json.loads(out.decode().strip().splitlines()[-1])


def _assert_training_goes_on(lab: LabRun, since: float) -> None:
    """Groups keep completing, worker VICTIM takes part in one, and every result is exact."""
    db = lab.db_path
    wait_until(
        lab,
        lambda: (
            len(completed_groups(db, since)) >= 3
            and any(VICTIM in json.loads(g["members"]) for g in completed_groups(db, since))
        ),
        WAIT_S,
        f"groups with worker {VICTIM} after the attack",
    )
    for g in completed_groups(db):
        assert g["verify_err"] is not None and g["verify_err"] < 1e-3, (
            f"group {g['id']} averaged wrongly: relative error {g['verify_err']}"
        )
    assert lab.workers[VICTIM].poll() is None, f"worker {VICTIM} died"


def test_peer_without_the_secret_is_rejected_and_counted(lab: LabRun) -> None:
    since = time.time()
    forged = _attack(lab, "wrong-mac", seed=1)
    garbage = _attack(lab, "garbage", seed=2)
    for report in (forged, garbage):
        assert report["dropped"] == K, report  # worker 1 closed every hostile connection
        assert report["ended"].get("answered", 0) == 0 and report["ended"].get("kept_open", 0) == 0
    wait_until(
        lab,
        lambda: sum(_security(lab, since).values()) >= 2 * K,
        WAIT_S,
        "the rejections to reach the run database",
    )
    reasons = _security(lab, since)
    # Exactly one rejection per hostile connection. Before its HELLO a server reads only a
    # HELLO's bytes: a forgery of another size is refused for it (HandshakeError), before its
    # MAC is even computed; a forged HELLO fails the MAC, whatever it claims.
    assert sum(reasons.values()) == 2 * K, reasons
    assert reasons["BadMac"] + reasons["HandshakeError"] == K, reasons
    _assert_training_goes_on(lab, since)


def test_oversized_frames_are_refused_without_crashing_the_worker(lab: LabRun) -> None:
    since = time.time()
    pid = lab.workers[VICTIM].pid
    report = _attack(lab, "oversized", seed=3)
    assert report["dropped"] == K, report
    wait_until(
        lab,
        lambda: _security(lab, since)["Oversized"] >= K,
        WAIT_S,
        "Oversized rejections in the run database",
    )
    assert _security(lab, since) == {"Oversized": K}
    assert lab.workers[VICTIM].pid == pid and lab.workers[VICTIM].poll() is None
    _assert_training_goes_on(lab, since)


# kind, args text, the field the rejection must name
NONSENSE = [
    ("format_disk", "{}", "kind"),
    ("kill_worker", '{"worker": 99}', "worker"),
    ("kill_worker", '{"worker": true}', "worker"),
    ("kill_worker", '{"worker": -1}', "worker"),
    ("cut_link", '{"src": 1, "dst": 1}', "dst"),
    ("cut_link", '{"src": 0, "dst": 1, "both": "yes"}', "both"),
    ("set_link", '{"src": 0, "dst": 1, "rate_mbit": -5}', "rate_mbit"),
    ("set_link", '{"src": 0, "dst": 1, "rate_mbit": "NaN"}', "rate_mbit"),
    ("set_link", '{"src": 0, "dst": 1}', "rate_mbit"),
    ("set_link", "{not json", "args"),
    ("slow_worker", "[1, 2]", "args"),
    ("slow_worker", "null", "args"),
    ("slow_worker", '{"worker": 0, "factor": 0}', "factor"),
    ("restart_worker", '{"worker": 1}', "worker"),  # valid, but worker 1 is running
    ("start_contention", '{"src": 0, "dst": 2, "rate_mbit": 1e12}', "rate_mbit"),
    ("stop_contention", '{"src": 0, "dst": 2}', "src/dst"),  # none is running
    ("set_p", '{"p": 0}', "p"),
    ("set_scheme", '{"scheme": "rm -rf /"}', "scheme"),
    ("cut_link", '{"src": 0, "dst": 1, "extra": 1}', "extra"),
]


def test_nonsense_commands_are_rejected_and_change_nothing(lab: LabRun) -> None:
    assert lab.net is not None
    since = time.time()
    pids = {i: p.pid for i, p in lab.workers.items()}
    links_before = {(lk.src, lk.dst): lab.net.link_state(lk.src, lk.dst) for lk in lab.topo.links}
    link_rows_before = len(rows(lab.db_path, "SELECT id FROM link_state"))
    conn = rundb.connect(lab.db_path)
    try:
        with conn:
            ids = [
                conn.execute(
                    "INSERT INTO commands (t, kind, args, status) VALUES (?, ?, ?, 'pending')",
                    (time.time(), kind, args),
                ).lastrowid
                for kind, args, _ in NONSENSE
            ]
    finally:
        conn.close()
    wait_until(
        lab,
        lambda: not rows(lab.db_path, "SELECT id FROM commands WHERE status='pending'"),
        WAIT_S,
        "the commands to be handled",
    )
    commands = {r["id"]: r for r in rows(lab.db_path, "SELECT * FROM commands")}
    for cid, (kind, args, field) in zip(ids, NONSENSE, strict=True):
        r = commands[cid]
        assert r["status"] == "rejected", (kind, args, r["status"], r["reason"])
        assert r["reason"] and r["reason"].startswith(f"{field}:"), (kind, args, r["reason"])
    # Nothing changed: links, their recorded history, processes, contention flows.
    assert {k: lab.net.link_state(*k) for k in links_before} == links_before
    assert len(rows(lab.db_path, "SELECT id FROM link_state")) == link_rows_before
    assert {i: p.pid for i, p in lab.workers.items()} == pids
    assert all(p.poll() is None for p in lab.workers.values())
    assert lab.faults is not None and lab.faults.flows == {}
    assert not rows(lab.db_path, "SELECT id FROM events WHERE kind='fault' AND t >= ?", (since,))
    rejected_events = rows(
        lab.db_path,
        "SELECT id FROM events WHERE kind='command' AND t >= ? AND message LIKE '%rejected%'",
        (since,),
    )
    assert len(rejected_events) == len(NONSENSE)
    _assert_training_goes_on(lab, since)


def test_state_file_lists_no_attacker(lab: LabRun) -> None:
    """The attackers were recorded while they ran and forgotten once they ended."""
    assert lab.net is not None and lab.net.state is not None
    state = json.loads(Path(lab.net.state.path).read_text())
    assert not [p for p in state["procs"] if p["label"].startswith("attacker")]
