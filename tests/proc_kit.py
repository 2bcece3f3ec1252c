"""Run several commands at once and collect every result, each wait bounded."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_all(
    commands: Sequence[Sequence[str]], timeout_s: float
) -> list[subprocess.CompletedProcess[str]]:
    """Start every command (in the repository's root), then wait for each up to ``timeout_s``;
    whatever still runs at the end, on success or failure, is killed."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for argv in commands:
            pipe = subprocess.PIPE
            procs.append(subprocess.Popen(argv, cwd=REPO, stdout=pipe, stderr=pipe, text=True))
        results = []
        for p in procs:
            out, err = p.communicate(timeout=timeout_s)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
