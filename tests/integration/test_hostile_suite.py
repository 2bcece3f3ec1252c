"""``python -m lab.hostile`` end to end at small counts: a lab on the small topology, a short
flood of every listener, the replays, and the report. The run must keep going, and the
command must say so with its counts."""

from __future__ import annotations

from pathlib import Path

import labkit
import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

TIMEOUT_S = 600.0


def test_a_small_hostile_run_keeps_the_lab_going(tmp_path: Path) -> None:
    proc, report = labkit.run_hostile(
        tmp_path,
        [
            "--topology",
            "small",
            "--connections",
            "50",
            "--duration",
            "20",
            "--baseline",
            "20",
            "--slowloris",
            "2",
            "--frames",
            "6",
            "--replays",
            "2",
            "--phases",
            "flood,replay",  # the poison phase: test_hostile_poison.py
            "--out",
            str(tmp_path / "run"),
        ],
        TIMEOUT_S,
    )
    missed = [v for v in report["verdicts"] if not v["met"]]
    assert proc.returncode == 0 and not missed, (missed, proc.stderr[-3000:])
    # 50 idle connections over the coordinator and the three workers, all ended by the target.
    idle = [sum(f["idle"].values()) for f in report["flood"]]
    assert idle == [13, 13, 12, 12]
    assert all(f["idle"].get("kept_open", 0) == 0 for f in report["flood"])
    # Two tries of each attack: replay and impersonation everywhere, two more at the coordinator.
    assert sum(report["replay"]["attempts"].values()) == 2 * (2 * 4 + 2)
    assert report["replay"]["refused"] == report["replay"]["attempts"]
    assert report["workers_back"] == 3 and report["groups_after_replay"] > 0
