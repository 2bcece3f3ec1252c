"""Children the lab starts end when the lab is killed with -9 (lab.net.lifeline; no root)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 10.0

# A stand-in for the lab: it starts a long-running child, prints the child's pid, and waits.
PARENT = """
import subprocess, sys, time
from lab.net.lifeline import lifeline
with_lifeline = sys.argv[1] == "yes"
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(60)"],
    preexec_fn=lifeline() if with_lifeline else None,
)
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def _child_after_parent_killed(with_lifeline: bool) -> int:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, "yes" if with_lifeline else "no"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    return child


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_a_child_with_a_lifeline_ends_when_its_parent_is_killed() -> None:
    assert _wait_gone(_child_after_parent_killed(with_lifeline=True))


def test_without_it_the_child_would_run_on() -> None:
    child = _child_after_parent_killed(with_lifeline=False)
    try:
        time.sleep(1.0)
        assert _alive(child)  # what the lifeline is for
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
