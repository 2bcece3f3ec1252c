"""Helpers shared by the integration tests that run a real lab through ``LabRun``.

The test modules import it as ``labkit``: pytest puts their folder on ``sys.path`` (the default
``prepend`` import mode; the folder has no ``__init__.py``). It is not collected, since its
name does not start with ``test_``.

Queries go through their own read-only connection to the run database, never the lab's writer
connection, so a test reads what the lab and its coordinator have committed and cannot change it.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from crew.runtime import rundb
from lab.net.cleanup import ROOT_NAME_PREFIX, root_link_names
from lab.orchestrate.runner import REPO, LabRun, RunOptions

POLL_S = 0.5  # between two polls of a lab; a group takes seconds, so finer polling buys nothing
LOG_TAIL_CHARS = 2000  # of each process log in a timeout's failure message


def small_opts(**overrides: Any) -> RunOptions:
    """Options for a small, quick lab: groups of two, a small model, 64 KiB parts, no dashboard,
    and a 3 s stall timeout so that a cut link fails over within a test's patience.

    ``overrides`` are ``RunOptions`` fields that replace these (``small_opts(p=3)``)."""
    base: dict[str, Any] = dict(
        p=2,
        scheme="crew",
        width=256,
        depth=2,
        dashboard=False,
        part_bytes=64 << 10,
        log_level="WARNING",
        stall_timeout_s=3.0,
    )
    return RunOptions(**(base | overrides))


def log_tails(run_dir: Path, tail: int = LOG_TAIL_CHARS) -> str:
    """The last ``tail`` characters of every process log of the run in ``run_dir``."""
    return "\n".join(
        f"--- {p.name}\n" + p.read_text(errors="replace")[-tail:]
        for p in sorted((run_dir / "logs").glob("*"))
    )


def wait_until(lab: LabRun, predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``lab`` until ``predicate()`` holds; after ``timeout`` seconds fail the test, naming
    ``what`` was awaited and showing the tail of every process log.

    ``lab.poll()`` reaps the lab's processes and plays its scenario, so a test that waits must
    poll rather than sleep."""
    deadline = time.monotonic() + timeout
    # Each round sleeps POLL_S, so the deadline ends the loop first; the count is a backstop.
    for _ in range(math.ceil(timeout / POLL_S) + 1):
        if time.monotonic() >= deadline:
            break
        lab.poll()
        if predicate():
            return
        time.sleep(POLL_S)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{log_tails(lab.run_dir)}")


def rows(db: Path, sql: str, params: Sequence[object] = ()) -> list[sqlite3.Row]:
    """The rows of one read-only query on the run database ``db``."""
    conn = rundb.connect(db, readonly=True)
    try:
        return conn.execute(sql, tuple(params)).fetchall()
    finally:
        conn.close()


def completed_groups(db: Path, since: float = 0.0) -> list[sqlite3.Row]:
    """The completed groups formed at or after ``since`` (a Unix time), oldest first."""
    return rows(
        db,
        "SELECT * FROM groups WHERE status='completed' AND formed_at >= ? ORDER BY formed_at",
        (since,),
    )


def lab_pids(lab: LabRun) -> list[int]:
    """The pids of the lab's workers and coordinator."""
    procs = [*lab.workers.values(), lab.coordinator]
    return [p.pid for p in procs if p is not None]


def assert_nothing_left(tag: str, pids: Sequence[int], state_dir: Path) -> None:
    """Nothing of the stopped lab ``tag`` is left: no interface, no process, no state file.

    Only this lab's own names: another lab may run on the machine at the same time."""
    assert not [n for n in root_link_names() if n.startswith(ROOT_NAME_PREFIX + tag)]
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid), f"pid {pid} still runs"
    assert not list(state_dir.glob("*.json")), "the lab's state file was not removed"


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def run_hostile(
    tmp_path: Path, args: Sequence[str], timeout_s: float
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``python -m lab.hostile ARGS --json`` as a user runs it; the process and its report.
    ``timeout_s`` bounds a hung run; it is not a timing assertion."""
    out = tmp_path / "hostile.json"
    proc = subprocess.run(
        [sys.executable, "-m", "lab.hostile", *args, "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert out.exists(), proc.stderr[-3000:]
    return proc, json.loads(out.read_text())
