"""The processes of one scheme's lab run on the benchmark's shared network: is everything
still alive, what CPU did the workers spend, and ending what outlived the run."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from lab.net.cleanup import ROOT_NAME_PREFIX, root_link_names
from lab.orchestrate.runner import LabRun

log = logging.getLogger(__name__)

# Start-up allowance before the first op: n numpy-only workers import and register in well
# under a minute on 2 cores; Gloo workers import torch (about 20 s for eight) and rendezvous.
STARTUP_NUMPY_S = 60.0
STARTUP_TORCH_S = 180.0
POLL_S = 0.5
REAP_TIMEOUT_S = 10.0


class SchemeFailed(RuntimeError):
    """A scheme's lab run failed or timed out; the message says which process and why."""


def other_labs(own_tag: str | None = None) -> list[str]:
    """Tags of the labs whose management bridge (``crw<tag>br``) is in the root namespace."""
    try:
        names = root_link_names()
    except (OSError, subprocess.CalledProcessError):
        return []
    tags = {
        n[len(ROOT_NAME_PREFIX) : -2]
        for n in names
        if n.startswith(ROOT_NAME_PREFIX) and n.endswith("br")
    }
    return sorted(tags - {own_tag})


def log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def check_alive(lab: LabRun) -> None:
    """Raise SchemeFailed when the coordinator or a worker has exited: none may before stop."""
    lab.poll()
    if lab.coordinator is not None and lab.coordinator.poll() is not None:
        tail = log_tail(lab.run_dir / "logs" / "coordinator.log")
        raise SchemeFailed(f"coordinator exited with code {lab.coordinator.returncode}: {tail}")
    for i, code in sorted(lab.exit_codes.items()):
        tail = log_tail(lab.run_dir / "logs" / f"w{i}.log")
        raise SchemeFailed(f"worker {i} exited with code {code}: {tail}")


def reap(lab: LabRun) -> None:
    """Stop what the LabRun left running on the shared network, so the next scheme starts clean.

    ``LabRun`` waits for its processes but, when the network is the caller's, does not kill
    those that outlive the wait (an owned network's teardown would). We hold their handles, so
    we end them by pid.
    """
    net = lab.net
    for i, proc in lab.workers.items():
        if net is not None:
            try:
                net.stop_process(proc, timeout=REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.error("worker %d (pid %d) survived SIGKILL", i, proc.pid)
    coord = lab.coordinator
    if coord is not None and coord.poll() is None:
        log.warning("coordinator pid %d still runs after the lab stopped; killing it", coord.pid)
        try:
            os.killpg(coord.pid, signal.SIGKILL)  # its own session (start_new_session)
            coord.wait(REAP_TIMEOUT_S)
        except (ProcessLookupError, subprocess.TimeoutExpired) as exc:
            log.error("could not end coordinator pid %d: %s", coord.pid, exc)


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is the state (field 3 of proc(5)); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def workers_cpu_s(lab: LabRun) -> float:
    return sum(process_cpu_s(p.pid) or 0.0 for p in lab.workers.values())


def db_scalar(lab: LabRun, sql: str) -> Any:
    assert lab.db is not None
    return lab.db.query(sql)[0][0]
