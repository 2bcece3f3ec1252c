"""A lab killed with -9 leaves its run open; the next lab's clean-up closes it (no root)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from crew.config import Scheme
from crew.runtime.rundb import GroupStatus, RunDB, connect
from lab.net.cleanup import KILLED_REASON, LabState, cleanup_leftovers, close_killed_run


def _run_with_open_group(path: Path) -> None:
    db = RunDB(path)
    try:
        db.event("start", "lab started", t=100.0)
        for gid, formed in ((1, 101.0), (2, 105.5)):
            db.open_group(
                gid,
                scheme=Scheme.CREW,
                members=[0, 1],
                weights=[0.5, 0.5],
                formed_at=formed,
                started_at=formed,
                predicted_s=None,
                bound_s=None,
                plan_json=None,
                member_rows=[],
            )
        db.close_group(
            1,
            ended_at=103.0,
            status=GroupStatus.COMPLETED,
            bytes_moved=10,
            reason=None,
            members=[0, 1],
            weights=[0.5, 0.5],
            plan_json=None,
            revisions=0,
            verify_err=0.0,
        )
    finally:
        db.close()


def test_a_killed_labs_state_file_leads_to_its_run_being_closed(tmp_path: Path) -> None:
    run_db = tmp_path / "run" / "lab.db"
    _run_with_open_group(run_db)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        state = LabState(tmp_path / "state" / "t1.json", "t1", owner_pid=owner.pid)
        state.add_run_db(str(run_db))
        assert cleanup_leftovers(tmp_path / "state").skipped == ["t1"]  # its lab still runs
    finally:
        owner.kill()  # the lab is killed with -9
        owner.wait()
    report = cleanup_leftovers(tmp_path / "state")
    assert report.cleaned == ["t1"] and report.closed_groups == [2]
    conn = connect(run_db, readonly=True)
    try:
        groups = {r["id"]: tuple(r) for r in conn.execute("SELECT id, status, reason FROM groups")}
        ended = conn.execute("SELECT value FROM meta WHERE key = 'ended_at'").fetchone()[0]
    finally:
        conn.close()
    assert groups[1][1] == "completed"
    assert groups[2][1:] == ("abandoned", KILLED_REASON)
    assert float(ended) == 105.5  # the last thing the run recorded
    assert close_killed_run(run_db) == []  # an ended run is left alone
    assert close_killed_run(tmp_path / "missing.db") == []
