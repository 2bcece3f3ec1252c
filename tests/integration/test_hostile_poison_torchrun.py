"""``python -m lab.hostile --target torchrun --phases poison`` end to end, small: a torchrun job
of examples/train_digits.py on the small topology (groups of two of three ranks, so every
group's data passes through the third), whose rank 2 runs the script inside the poisoner, under
a launched job's default secret check. Every group it tampered with must be abandoned, none
committed, and groups must keep completing."""

from __future__ import annotations

from pathlib import Path

import labkit
import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

TIMEOUT_S = 400.0  # a bound on a hung run, not a timing assertion


def test_a_poisoning_rank_of_a_torchrun_job_is_caught_by_the_secret_check(tmp_path: Path) -> None:
    proc, report = labkit.run_hostile(
        tmp_path,
        [
            "--target",
            "torchrun",
            "--topology",
            "small",
            "--phases",
            "poison",
            "--poisoner",
            "2",
            "--poison-duration",
            "30",
            "--out",
            str(tmp_path / "job"),
        ],
        TIMEOUT_S,
    )
    poison = report["poison"]
    missed = [v for v in report["verdicts"] if not v["met"]]
    assert proc.returncode == 0 and not missed, (missed, poison, proc.stderr[-3000:])
    assert poison["p"] == 2 and poison["worker"] == 2 and not poison["exact_check"]
    # The rank ran the example script with the poisoning engine, which tampered ...
    assert poison["tampered"] > 0 and poison["tampered_parts"] > 0
    # ... and the job's secret check abandoned those groups: none committed.
    assert poison["tampered_abandoned_secret"] > 0 and poison["poisoned_commits"] == 0
    assert poison["completed_after_detection"] > 0
    assert Path(poison["run_dir"]) == tmp_path / "job-poison"
    assert (tmp_path / "job-poison" / "run" / "run.db").exists()
