"""examples/train_digits.py under torchrun on loopback: 4 ranks, p = 2, no lab, no root."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def test_train_digits_with_torchrun_averages_and_learns(tmp_path):
    env = {
        **os.environ,
        "CREW_SECRET": "examples-test-secret-0123456789",
        "CREW_RUN_DIR": str(tmp_path / "run"),
        "TMPDIR": str(tmp_path),  # torchrun's torchelastic_* logs, which it leaves behind
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [
            str(TORCHRUN),
            "--standalone",
            "--nproc-per-node",
            "4",
            "examples/train_digits.py",
            "--group-size",
            "2",
            "--steps",
            "40",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = re.findall(r"rank (\d): averaged (\d+)/40 rounds, accuracy ([\d.]+)", proc.stdout)
    assert sorted(int(r) for r, _, _ in lines) == [0, 1, 2, 3], proc.stdout
    for _, averaged, accuracy in lines:
        assert int(averaged) >= 30  # p = 2 of 4: every step of a rank ends in its group
        assert float(accuracy) > 0.8  # the digits are learnt (chance is 0.1)
    assert (tmp_path / "run" / "run.db").exists()  # rank 0 hosted the coordinator
