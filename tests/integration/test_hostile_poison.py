"""``python -m lab.hostile --phases poison`` end to end, small: a lab on the small topology
(groups of two of three workers, so every group's data passes through the third) whose worker 2
is the poisoning relay, under the secret check. Every group it tampered with must be abandoned,
no poisoned average applied, and groups must keep completing."""

from __future__ import annotations

from pathlib import Path

import labkit
import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

TIMEOUT_S = 300.0  # a bound on a hung run, not a timing assertion


def test_a_poisoning_relay_is_caught_by_the_secret_check(tmp_path: Path) -> None:
    proc, report = labkit.run_hostile(
        tmp_path,
        [
            "--topology",
            "small",
            "--phases",
            "poison",
            "--poisoner",
            "2",
            "--poison-duration",
            "30",
            "--out",
            str(tmp_path / "run"),
        ],
        TIMEOUT_S,
    )
    poison = report["poison"]
    missed = [v for v in report["verdicts"] if not v["met"]]
    assert proc.returncode == 0 and not missed, (missed, poison, proc.stderr[-3000:])
    assert poison["p"] == 2 and poison["worker"] == 2
    assert poison["tampered"] > 0 and poison["tampered_parts"] > 0
    assert poison["abandoned_secret"] > 0
    assert poison["tampered_abandoned_secret"] > 0
    assert poison["poisoned_commits"] == 0 and poison["wrong_averages"] == 0
    assert poison["completed_after_detection"] > 0
    assert Path(poison["run_dir"]) == tmp_path / "run-poison"
    assert (tmp_path / "run-poison" / "lab.db").exists() and not (tmp_path / "run").exists()
