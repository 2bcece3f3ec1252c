"""lab.studies.offerwait: each member's wait from its Ready to its group's end, from a run DB."""

from __future__ import annotations

from pathlib import Path

import pytest

from crew.config import Scheme
from crew.runtime.rundb import GroupMemberRow, GroupStatus, RunDB, WorkerState
from lab.studies import offerwait


def _group(db: RunDB, gid: int, members: dict[int, int], formed: float, ended: float) -> None:
    """A completed group of ``members`` (worker -> iteration) that ended at ``ended``."""
    workers = sorted(members)
    db.open_group(
        gid,
        scheme=Scheme.CREW,
        members=workers,
        weights=[1 / len(workers)] * len(workers),
        formed_at=formed,
        started_at=formed,
        predicted_s=None,
        bound_s=None,
        plan_json=None,
        member_rows=[GroupMemberRow(gid, w, members[w], 1, 1 / len(workers)) for w in workers],
        formed_by="beyond" if len(workers) > 2 else None,
    )
    db.close_group(
        gid,
        ended_at=ended,
        status=GroupStatus.COMPLETED,
        bytes_moved=0,
        reason=None,
        members=workers,
        weights=[1 / len(workers)] * len(workers),
        plan_json=None,
        revisions=0,
        verify_err=None,
    )


def _ready(db: RunDB, worker: int, iteration: int, t: float) -> None:
    db.set_worker_status(worker, WorkerState.READY.value, iteration=iteration, t=t)


def _run(path: Path) -> Path:
    """Three workers at a pace of 10 s: two meet at once, the third waits for the next burst."""
    path.mkdir()
    db = RunDB(path / "lab.db")
    try:
        for it, base in ((1, 10.0), (2, 20.0)):
            _ready(db, 0, it, base)
            _ready(db, 1, it, base + 0.5)
            _ready(db, 2, it, base + 1.0)
        _ready(db, 1, 1, 10.7)  # a repeated Ready row of the same iteration: the first counts
        _group(db, 1, {0: 1, 1: 1}, formed=10.5, ended=11.5)  # waits 1.5 and 1.0
        _group(db, 2, {2: 1, 0: 2, 1: 2}, formed=20.5, ended=21.0)  # waits 10.0, 1.0, 0.5
        db.set_worker_status(2, WorkerState.TRAINING.value, iteration=2, t=21.2)
    finally:
        db.close()
    return path


def test_each_offer_waits_from_its_first_ready_to_its_groups_end(tmp_path: Path) -> None:
    w = offerwait.offer_waits(_run(tmp_path / "run") / "lab.db")
    assert w.offers == 5
    assert w.median_s == pytest.approx(1.0)
    assert w.mean_s == pytest.approx((1.5 + 1.0 + 10.0 + 1.0 + 0.5) / 5)
    assert w.p90_s == pytest.approx(1.5 + 0.6 * (10.0 - 1.5))  # linear, sorted index 3.6
    assert w.pace_s == pytest.approx(10.0)  # each worker's two Readys, 10 s apart
    assert w.long_share == pytest.approx(1 / 5)  # worker 2's offer waited for the next burst
    assert w.sizes == {2: 1, 3: 1}
    assert w.formed_by == {"fixed p": 1, "beyond": 1}


def test_a_bench_folder_lists_its_training_runs(tmp_path: Path) -> None:
    for name in ("b-run", "a-run"):
        (tmp_path / "train" / name).mkdir(parents=True)
        (tmp_path / "train" / name / "lab.db").touch()
    (tmp_path / "train" / "no-db").mkdir()
    assert [p.name for p in offerwait.run_dirs(tmp_path)] == ["a-run", "b-run"]


def test_the_command_prints_a_line_per_run_and_refuses_a_folder_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path / "run")
    assert offerwait.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run: 5 offers, wait median 1.00 s")
    assert "20% waited over half of it" in out
    assert offerwait.main([str(tmp_path / "empty")]) == 2
    assert "no lab.db here or under train/*/" in capsys.readouterr().err


def test_a_run_without_a_completed_group_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    db = RunDB(tmp_path / "run" / "lab.db")
    _ready(db, 0, 1, 1.0)
    db.close()
    with pytest.raises(offerwait.OfferWaitError, match="no completed group"):
        offerwait.offer_waits(tmp_path / "run" / "lab.db")


@pytest.mark.parametrize("content", [b"", b"not a database, just text\n" * 40])
def test_a_file_that_is_not_a_run_database_is_refused_by_name(
    tmp_path: Path, content: bytes
) -> None:
    (tmp_path / "lab.db").write_bytes(content)
    with pytest.raises(offerwait.OfferWaitError, match="cannot read it as a run database"):
        offerwait.offer_waits(tmp_path / "lab.db")
