"""The run audit against hand-built run databases: a clean run passes, each breakage is named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from crew.runtime import rundb
from lab import audit as la
from lab.audit import (
    GROUP_MEMBERSHIP,
    GROUPS_ENDED,
    INFO_GROUPS,
    INFO_LOST_TO_CRASH,
    INFO_ROUNDS,
    NO_HUNG,
    NO_LOST_UPDATES,
    NO_OVERLAP,
    audit,
)

RUN_END = 100.0


class Run:
    """A run directory with a database and checkpoints, built row by row."""

    def __init__(self, root: Path, n: int = 3):
        self.dir = root / "run"
        self.db = self.dir / "lab.db"
        self.conn = rundb.connect(self.db)
        with self.conn:
            self.conn.executemany(
                "INSERT INTO workers (id, name, cloud, address) VALUES (?,?,?,?)",
                [(i, f"w{i}", f"c{i}", f"10.0.0.{i + 1}") for i in range(n)],
            )
            self.conn.execute("INSERT INTO meta VALUES ('ended_at', ?)", (str(RUN_END),))

    def group(
        self,
        gid: int,
        its: dict[int, int],
        formed: float,
        ended: float | None,
        *,
        status: str = "completed",
        weights: list[float] | None = None,
        reason: str | None = None,
        members: list[int] | None = None,
    ) -> None:
        """A group whose members are ``its``' keys, each at the given local iteration."""
        members = list(its) if members is None else members
        weights = [1 / len(its)] * len(its) if weights is None else weights
        with self.conn:
            self.conn.execute(
                "INSERT INTO groups (id, scheme, members, weights, formed_at, started_at,"
                " ended_at, status, reason) VALUES (?, 'crew', ?, ?, ?, ?, ?, ?, ?)",
                (gid, json.dumps(members), json.dumps(weights), formed, formed, ended, status,
                 reason),
            )  # fmt: skip
            self.conn.executemany(
                "INSERT INTO group_members (group_id, worker, iteration, weight)"
                " VALUES (?, ?, ?, ?)",
                [(gid, w, it, 1 / len(its)) for w, it in its.items()],
            )

    def iteration(self, t: float, worker: int, k: int) -> None:
        with self.conn:
            self.conn.execute(
                "INSERT INTO iterations (t, worker, iteration, loss) VALUES (?, ?, ?, 1.0)",
                (t, worker, k),
            )

    def event(self, t: float, message: str, *, kind: str = "fault") -> None:
        with self.conn:
            self.conn.execute(
                "INSERT INTO events (t, level, kind, message) VALUES (?, 'warning', ?, ?)",
                (t, kind, message),
            )

    def checkpoint(self, worker: int, iteration: int) -> None:
        path = self.dir / "checkpoints" / f"w{worker}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open(
            "wb"
        ) as fh:  # like crew.train.training.Trainer.save: an .npz under a .pt name
            np.savez(fh, vector=np.zeros(4, np.float32), iteration=np.int64(iteration))


@pytest.fixture
def clean(tmp_path: Path) -> Run:
    """Three workers, p=2: every reported iteration is averaged or held at the end."""
    r = Run(tmp_path)
    r.iteration(1.0, 0, 1)
    r.iteration(1.2, 1, 1)
    r.group(1, {0: 1, 1: 1}, formed=1.3, ended=2.0)
    r.iteration(1.5, 2, 1)
    r.iteration(2.5, 0, 2)
    r.group(2, {2: 1, 0: 2}, formed=2.6, ended=3.5, weights=[0.4, 0.6])
    r.iteration(2.8, 1, 2)  # never grouped again: held by w1's final checkpoint
    r.group(3, {1: 2}, formed=2.9, ended=3.0, status="abandoned", reason="no plan: isolated")
    r.iteration(4.0, 2, 2)
    r.iteration(4.1, 0, 3)
    r.group(4, {2: 2, 0: 3}, formed=4.2, ended=5.0)
    r.iteration(5.5, 0, 4)  # held
    for w, it in ((0, 4), (1, 2), (2, 2)):
        r.checkpoint(w, it)
    return r


def failing(report: la.AuditReport) -> set[str]:
    return {c.name for c in report.checks if not c.ok}


def test_clean_run_passes(clean: Run) -> None:
    report = audit(clean.dir)
    assert report.ok, report.to_dict()
    assert failing(report) == set()
    assert (
        "all 8 reported updates: 6 averaged, 2 held at the end"
        in report.check(NO_LOST_UPDATES).detail
    )
    assert report.check(INFO_GROUPS).detail == "4 groups: 3 completed, 1 abandoned, 0 open"
    assert report.check(INFO_ROUNDS).detail == "w0: 3, w1: 1, w2: 2"
    assert report.check(INFO_LOST_TO_CRASH).detail == "none"
    assert audit(clean.db).to_dict() == report.to_dict()  # the db path works as well
    d = report.to_dict()
    assert d["ok"] is True and {c["name"] for c in d["checks"]} >= {NO_OVERLAP, NO_HUNG}
    json.dumps(d)


def test_open_group_fails_groups_ended(clean: Run) -> None:
    clean.group(5, {1: 2}, formed=6.1, ended=None, status="open")
    report = audit(clean.dir)
    assert not report.ok
    assert failing(report) == {GROUPS_ENDED}
    assert "group 5 is open" in report.check(GROUPS_ENDED).detail


def test_overlapping_groups_fail(clean: Run) -> None:
    # w0 is put in group 5 while group 4 (formed 4.2, ended 5.0) still holds it.
    clean.group(5, {0: 3, 1: 2}, formed=4.5, ended=6.0)
    report = audit(clean.dir)
    assert failing(report) == {NO_OVERLAP}
    assert "worker 0 in groups 4 and 5 at once" in report.check(NO_OVERLAP).detail


def test_lost_update_fails(clean: Run) -> None:
    clean.iteration(7.0, 1, 3)  # w1 reports iteration 3; no group, checkpoint still at 2
    report = audit(clean.dir)
    assert failing(report) == {NO_LOST_UPDATES}
    detail = report.check(NO_LOST_UPDATES).detail
    assert "worker 1: iterations 3 neither averaged nor held (final checkpoint: 2)" in detail


def test_missing_checkpoint_means_not_held(clean: Run) -> None:
    (clean.dir / "checkpoints" / "w0.pt").unlink()
    report = audit(clean.dir)
    assert failing(report) == {NO_LOST_UPDATES}
    assert "worker 0: iterations 4 neither" in report.check(NO_LOST_UPDATES).detail
    assert "final checkpoint: none" in report.check(NO_LOST_UPDATES).detail


def test_group_members_mismatch_fails(clean: Run) -> None:
    with clean.conn:  # a row for a worker the group does not list
        clean.conn.execute(
            "INSERT INTO group_members (group_id, worker, iteration, weight) VALUES (1, 2, 1, 0)"
        )
    report = audit(clean.dir)
    assert failing(report) == {GROUP_MEMBERSHIP}
    assert "group 1: group_members disagree" in report.check(GROUP_MEMBERSHIP).detail
    assert "extra [2]" in report.check(GROUP_MEMBERSHIP).detail


@pytest.mark.parametrize(
    ("members", "weights", "expect"),
    [
        ([2, 2], [0.5, 0.5], "members repeated [2]"),
        ([2], [1.0], "missing [], extra [0]"),
        ([2, 0], [0.5, 0.6], "weights sum to 1.1"),
        ([2, 0], [1.0], "1 weights for 2 members"),
    ],
)
def test_bad_membership_records_fail(
    tmp_path: Path, members: list[int], weights: list[float], expect: str
) -> None:
    r = Run(tmp_path)
    r.iteration(1.0, 2, 1)
    r.iteration(1.0, 0, 1)
    r.group(1, {2: 1, 0: 1}, formed=1.5, ended=2.0, members=members, weights=weights)
    for w in range(3):
        r.checkpoint(w, 1)
    report = audit(r.dir)
    assert GROUP_MEMBERSHIP in failing(report)
    assert expect in report.check(GROUP_MEMBERSHIP).detail


def test_hung_group_and_silent_abandon_fail(clean: Run) -> None:
    clean.group(5, {1: 2}, formed=10.0, ended=700.0)
    clean.group(6, {2: 2}, formed=10.0, ended=11.0, status="abandoned", reason="")
    report = audit(clean.dir)
    assert failing(report) == {NO_HUNG}
    detail = report.check(NO_HUNG).detail
    assert "group 5 took 690.0 s" in detail and "group 6 abandoned without a reason" in detail
    assert audit(clean.dir, max_group_s=1000).check(NO_HUNG).detail.count("group") == 1


def test_update_lost_to_a_recorded_crash_is_not_a_violation(clean: Run) -> None:
    clean.iteration(7.0, 2, 3)  # w2's checkpoint (its last commit) is at 2
    clean.event(8.0, "kill worker 2 (command #2)")
    report = audit(clean.dir)
    assert report.ok, report.to_dict()
    assert report.check(INFO_LOST_TO_CRASH).detail.startswith("w2: 1 (3)")
    assert "1 lost to crash" in report.check(NO_LOST_UPDATES).detail


def test_group_after_a_crash_does_not_cover_the_earlier_life(clean: Run) -> None:
    clean.iteration(7.0, 2, 3)
    clean.event(8.0, "worker 2 exited with code -9")
    clean.iteration(30.0, 2, 3)  # the restarted process re-reaches iteration 3 from checkpoint 2
    clean.iteration(30.0, 1, 3)
    clean.group(5, {1: 3, 2: 3}, formed=30.5, ended=31.0)
    clean.checkpoint(1, 3)
    report = audit(clean.dir)
    assert report.ok, report.to_dict()
    assert report.check(INFO_LOST_TO_CRASH).detail.startswith("w2: 1 (3)")
    # Group 5 holds w2 at iteration 3, but it formed after the crash: the first report of
    # iteration 3 died with the old process, so it counts as lost to crash, not averaged.
    detail = report.check(NO_LOST_UPDATES).detail
    assert detail == "all 11 reported updates: 9 averaged, 1 held at the end, 1 lost to crash"


def test_clean_exit_is_not_a_crash(clean: Run) -> None:
    clean.iteration(7.0, 1, 3)
    clean.event(8.0, "worker 1 exited with code 0", kind="fault")
    clean.event(8.5, "kill worker 2 (command #3)", kind="command")  # not a fault event
    clean.checkpoint(1, 3)
    report = audit(clean.dir)
    assert report.ok and report.check(INFO_LOST_TO_CRASH).detail == "none"


def test_cli_exit_status_and_table(clean: Run, capsys: pytest.CaptureFixture[str]) -> None:
    assert la.main([str(clean.dir)]) == 0
    out = capsys.readouterr().out
    assert NO_LOST_UPDATES in out and "no violations" in out
    clean.group(5, {1: 2}, formed=10.0, ended=None, status="open")
    assert la.main([str(clean.db), "--json", "-"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] is False
    assert [c["name"] for c in d["checks"] if not c["ok"]] == [GROUPS_ENDED]
    assert la.main([str(clean.dir / "nope")]) == 2
    assert "no run database" in capsys.readouterr().err
