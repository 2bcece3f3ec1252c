"""lab.hostile's target descriptions without root: built from a lab's config and from what a
launched job records, and the attacks run against a live two-rank job on loopback (the torchrun
job in the lab is tests/integration/test_hostile_torchrun.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from lifecycle_kit import make_cfg

from crew.runtime.rundb import RunDB
from lab import hostile
from lab.orchestrate import hostile_target as ht
from lab.orchestrate import replay

try:
    from test_averager import ARGS, SECRET, run_ranks
except ImportError:  # tests/ became a package
    from tests.test_averager import ARGS, SECRET, run_ranks


def test_listeners_name_the_coordinator_first_then_every_worker_in_its_namespace() -> None:
    cfg = replace(
        make_cfg(n=3),
        coordinator_host="10.0.0.9",
        coordinator_port=7000,
        identities=("10.0.1.0", "10.0.1.1", "10.0.1.2"),
        data_ports=(7100, 7101, 7102),
    )
    got = ht.listeners_of(cfg, 40, [40, 41, 42])
    assert [(t.name, t.host, t.port, t.netns_pid, w) for t, w in got] == [
        ("coordinator", "10.0.0.9", 7000, 40, None),
        ("w0", "10.0.1.0", 7100, 40, 0),
        ("w1", "10.0.1.1", 7101, 41, 1),
        ("w2", "10.0.1.2", 7102, 42, 2),
    ]
    # The coordinator's handshake deadline is its own, the workers' their transport's.
    assert got[0][0].deadline_s == 10.0 and got[1][0].deadline_s == ht.WORKER_HANDSHAKE_S
    with pytest.raises(ht.TargetError):
        ht.listeners_of(cfg, None, [None, None])


def test_a_job_without_a_recorded_config_is_not_a_target_yet(tmp_path: Path) -> None:
    with pytest.raises(ht.TargetError, match="no run database"):
        ht.job_config(tmp_path / "run.db")
    db = RunDB(tmp_path / "run.db")
    db.set_meta({"run_id": "x"})
    with pytest.raises(ht.TargetError, match="not recorded its config"):
        ht.job_config(tmp_path / "run.db")
    db.set_meta({"config": "{not json"})
    with pytest.raises(ht.TargetError):
        ht.job_config(tmp_path / "run.db")
    # A config before the coordinator listens (port 0) names nothing to attack.
    db.set_meta({"config": make_cfg(n=2).to_json()})
    db.close()
    with pytest.raises(ht.TargetError, match="no listening ports"):
        ht.job_config(tmp_path / "run.db")


def test_the_options_and_the_flag_choose_the_target() -> None:
    args = hostile.build_parser().parse_args(["--target", "torchrun", "--steps", "500"])
    assert args.target is ht.TargetKind.TORCHRUN and args.steps == 500
    assert hostile.build_parser().parse_args([]).target is ht.TargetKind.LAB
    with pytest.raises(SystemExit):
        hostile.build_parser().parse_args(["--target", "gloo"])
    with pytest.raises(ValueError):
        hostile.HostileOptions(target=ht.TargetKind.TORCHRUN, steps=0)
    assert hostile.HostileOptions(target=ht.TargetKind.TORCHRUN).to_dict()["target"] == "torchrun"


def test_the_trainer_is_found_under_its_launcher_not_the_launcher_itself() -> None:
    """torchrun's own command line names the script too: only a descendant counts."""
    child = "import time; time.sleep(30)"
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}, 'mark' + 'er-7'])"  # noqa: E501
    proc = subprocess.Popen([sys.executable, "-c", code, "marker-7"])
    found = None
    try:
        for _ in range(200):  # bounded: the child appears within a second or so
            found = ht.descendant_running(proc.pid, "marker-7")
            if found is not None:
                break
            time.sleep(0.05)
        assert found is not None and found != proc.pid
        assert ht.children(proc.pid) == [found]
    finally:
        if found is not None:
            subprocess.run(["kill", str(found)], check=False)
        proc.kill()
        proc.wait()
    assert ht.descendant_running(proc.pid, "marker-7") is None  # gone: nothing to find


def test_a_launched_jobs_record_describes_it_and_its_listeners_refuse_the_attacks(
    tmp_path: Path,
) -> None:
    """Two ranks on loopback: the description read from the job's folder names the live
    coordinator, every data plane and the job's own run number; replays, impersonations and a
    worker's Admin are refused, and the job has no admin key to replay a session of."""
    job_dir = tmp_path / "job"
    (job_dir / "run").mkdir(parents=True)
    (job_dir / ht.SECRET_FILE).write_text(SECRET)
    done = threading.Event()
    seen: dict[str, object] = {}

    def body(rank, averager, tensors):
        averager.step()
        if rank != 0:
            done.wait(60)  # its data plane stays up while rank 0 attacks it
            return None
        try:
            desc = ht.job_target(job_dir, [None, None])
            host = averager.host
            seen["ports"] = (desc.coordinator.port, host.coordinator.port)
            seen["run"] = (desc.keys.run_num, host.run_num)
            seen["data"] = [(t.host, t.port) for t, w in desc.listeners if w is not None]
            seen["identity"] = desc.admin_identity
            since = time.time()
            seen["replay"] = replay.replay_all(list(desc.listeners), desc.keys, 2, 2, wait_s=1.0)
            seen["admin"] = replay.admin_from_worker(desc.coordinator, desc.keys, 2, new_p=1)
            time.sleep(0.5)  # the coordinator writes its event
            seen["refusals"] = replay.admin_refused_in_db(desc.db_path, since)
            seen["p"] = host.coordinator.life.former.p
        finally:
            done.set()
        return averager.step()

    res = run_ranks(2, body, args={**ARGS, "run_dir": job_dir / "run"})
    assert not any(isinstance(r, Exception) for r in res.values()), res
    assert seen["ports"][0] == seen["ports"][1] != 0
    assert seen["run"][0] == seen["run"][1]
    db = RunDB(job_dir / "run" / "run.db")
    try:
        roster = [r["address"] for r in db.query("SELECT address FROM workers ORDER BY id")]
    finally:
        db.close()
    assert [f"{h}:{p}" for h, p in seen["data"]] == roster
    counts = seen["replay"]
    assert counts.errors == []
    kinds = {"replay@coordinator", "impersonate@coordinator", "lab-hello@coordinator"}
    kinds |= {f"{k}@w{i}" for k in ("replay", "impersonate") for i in (0, 1)}
    assert set(counts.attempts) == kinds and all(v == 2 for v in counts.attempts.values())
    assert counts.refused == counts.attempts and not counts.kept
    assert seen["admin"] == 2 and seen["p"] == 2
    p_now, refusals = seen["refusals"]
    assert p_now == "2" and refusals >= 1
    assert str(seen["identity"]).startswith("none")
