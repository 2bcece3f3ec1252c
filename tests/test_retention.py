"""Retention of the run database's time series (crew.runtime.retention): what is folded, what
is kept, and that readers' arithmetic survives the folding. No root."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from crew.config import Scheme
from crew.runtime import rundb
from crew.runtime.retention import RetentionError, RetentionPolicy, compact
from crew.runtime.rundb import GroupMemberRow, IterationRow, LinkSampleRow, RunDB
from lab.net.monitor import LinkMonitor

T0 = 1_699_999_200.0  # a multiple of 60 s: a bucket boundary for every step used here
LINKS = ((0, 1), (1, 0))
SMALL = RetentionPolicy(full_s=100.0, medium_step_s=10.0, medium_s=400.0, coarse_step_s=60.0)


def _samples(seconds: int) -> list[LinkSampleRow]:
    """1 Hz cumulative counters; link (src, dst) sends (1 + src) * 1000 + t bytes in second t."""
    rows, tx = [], dict.fromkeys(LINKS, 0)
    for s in range(seconds):
        for src, dst in LINKS:
            sent = (1 + src) * 1000 + s
            tx[(src, dst)] += sent
            rows.append(LinkSampleRow(T0 + s, src, dst, tx[(src, dst)], sent * 8 / 1e6))
    return rows


def _db(tmp_path: Path, seconds: int) -> RunDB:
    db = RunDB(tmp_path / "lab.db")
    db.add_link_samples(_samples(seconds))
    return db


def _rows(db: RunDB, src: int = 0, dst: int = 1) -> list[tuple[float, int, float]]:
    q = "SELECT t, tx_bytes, mbit FROM link_samples WHERE src=? AND dst=? ORDER BY t"
    return [(r[0], r[1], r[2]) for r in db.query(q, (src, dst))]


def test_recent_rows_stay_and_older_rows_fold_into_buckets(tmp_path: Path) -> None:
    db = _db(tmp_path, 300)
    removed = db.compact(SMALL, now=T0 + 300)
    rows = _rows(db)
    # [T0, T0+200) folds into 20 buckets of 10 s; [T0+200, T0+300) stays at 1 Hz.
    assert [t for t, _, _ in rows[:20]] == [T0 + 10 * k + 9 for k in range(20)]
    assert [t for t, _, _ in rows[20:]] == [T0 + s for s in range(200, 300)]
    assert removed == {
        "link_samples": 2 * (200 - 20),
        "iterations": 0,
        "utilisation": 0,
        "plans": 0,
    }


def test_folded_counters_keep_every_difference_and_the_mean_rate(tmp_path: Path) -> None:
    original = {t: (tx, mbit) for t, tx, mbit in _rows(_db(tmp_path / "a", 300))}
    db = _db(tmp_path / "b", 300)
    db.compact(SMALL, now=T0 + 300)
    rows = _rows(db)
    for t, tx, _ in rows:
        assert tx == original[t][0]  # the bucket's last counter, not a sum or a mean
    for k in range(20):
        t, _, mbit = rows[k]
        bucket = [original[T0 + 10 * k + i][1] for i in range(10)]
        assert mbit == pytest.approx(sum(bucket) / 10)
    assert rows[-1][1] - rows[0][1] == original[T0 + 299][0] - original[T0 + 9][0]


def test_compaction_is_idempotent_and_incremental(tmp_path: Path) -> None:
    once = _db(tmp_path / "once", 700)
    once.compact(SMALL, now=T0 + 700)
    stepwise = _db(tmp_path / "step", 700)
    for now in range(150, 701, 50):
        stepwise.compact(SMALL, now=T0 + now)
    assert stepwise.compact(SMALL, now=T0 + 700) == {
        "link_samples": 0,
        "iterations": 0,
        "utilisation": 0,
        "plans": 0,
    }
    assert _rows(stepwise) == _rows(once)
    assert _rows(stepwise, 1, 0) == _rows(once, 1, 0)


def test_rows_older_than_the_medium_window_fold_into_coarse_buckets(tmp_path: Path) -> None:
    db = _db(tmp_path, 700)
    db.compact(SMALL, now=T0 + 700)
    times = [t for t, _, _ in _rows(db)]
    coarse = [t for t in times if t < T0 + 300]  # older than medium_s = 400 s
    assert coarse == [T0 + 60 * k + 59 for k in range(5)]
    medium = [t for t in times if T0 + 300 <= t < T0 + 600]
    assert medium == [T0 + 10 * k + 9 for k in range(30, 60)]
    assert len([t for t in times if t >= T0 + 600]) == 100


def test_iterations_keep_the_last_step_and_average_what_was_measured(tmp_path: Path) -> None:
    db = RunDB(tmp_path / "lab.db")
    rows = [
        IterationRow(T0 + s, 0, s + 1, float(s), 0.5 if s == 3 else None) for s in range(10)
    ] + [IterationRow(T0 + 10 + s, 0, 11 + s, 1.0, None) for s in range(200)]
    db.add_iterations(rows)
    db.compact(SMALL, now=T0 + 210)
    first = db.query("SELECT t, iteration, loss, accuracy FROM iterations ORDER BY t LIMIT 2")
    assert tuple(first[0]) == (T0 + 9, 10, pytest.approx(4.5), 0.5)
    assert first[1]["accuracy"] is None  # no evaluation in that bucket: still none


def test_groups_and_states_are_never_folded(tmp_path: Path) -> None:
    db = _db(tmp_path, 300)
    db.add_events([rundb.EventRow(T0 + s, "info", "test", None, "e", None) for s in range(50)])
    db.compact(SMALL, now=T0 + 10_000)
    assert db.query("SELECT COUNT(*) FROM events")[0][0] == 50


@pytest.mark.parametrize(
    "kwargs",
    [
        {"full_s": 0.0},
        {"medium_step_s": float("nan")},
        {"coarse_step_s": float("inf")},
        {"full_s": 500.0, "medium_s": 400.0},
        {"medium_step_s": 120.0, "coarse_step_s": 60.0},
    ],
)
def test_a_policy_that_cannot_be_honoured_is_refused_by_name(kwargs: dict[str, float]) -> None:
    with pytest.raises(RetentionError, match=next(iter(kwargs))):
        RetentionPolicy(**kwargs)


def test_an_empty_database_compacts_to_nothing(tmp_path: Path) -> None:
    conn = rundb.connect(tmp_path / "lab.db")
    assert compact(conn, SMALL, now=T0) == {
        "link_samples": 0,
        "iterations": 0,
        "utilisation": 0,
        "plans": 0,
    }


class _Counters:
    def __init__(self) -> None:
        self.calls = 0

    def tx_bytes(self) -> dict[tuple[int, int], int]:
        self.calls += 1
        return {link: 1000 * self.calls for link in LINKS}


def test_the_link_monitor_applies_the_policy_while_it_samples(tmp_path: Path) -> None:
    db = RunDB(tmp_path / "lab.db")
    old = [LinkSampleRow(time.time() - 3600 + s, 0, 1, s, 0.0) for s in range(600)]
    db.add_link_samples(old)
    policy = RetentionPolicy(full_s=60.0, medium_step_s=60.0, medium_s=7200.0)
    mon = LinkMonitor(_Counters(), db, interval=0.05, retention=policy, compact_every_s=0.1)
    with mon:
        deadline = time.monotonic() + 10.0
        while mon.rows_compacted == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert mon.rows_compacted >= 600 - 11  # ten minutes of 1 Hz rows fold into ~10 rows
    left = db.query("SELECT COUNT(*) FROM link_samples WHERE t < ?", (time.time() - 120,))
    assert left[0][0] <= 11


def _group(db: RunDB, gid: int, formed_at: float, *, close: bool = True) -> None:
    db.open_group(
        gid,
        scheme=Scheme.CREW,
        members=[0, 1],
        weights=[0.5, 0.5],
        formed_at=formed_at,
        started_at=formed_at,
        predicted_s=0.1,
        bound_s=0.1,
        plan_json='{"routes": "' + "x" * 2000 + '"}',
        member_rows=[GroupMemberRow(gid, w, gid, 1, 0.5) for w in (0, 1)],
    )
    if close:
        db.execute("UPDATE groups SET status='completed', ended_at=? WHERE id=?", (formed_at, gid))


def test_old_groups_keep_one_plan_a_bucket_and_every_row(tmp_path: Path) -> None:
    db = RunDB(tmp_path / "lab.db")
    for s in range(300):
        _group(db, s + 1, T0 + s, close=s != 5)  # group 6 never closed: its plan stays
    removed = db.compact(SMALL, now=T0 + 300)
    rows = db.query("SELECT id, plan IS NOT NULL AS has, status FROM groups ORDER BY id")
    assert [r["id"] for r in rows] == list(range(1, 301))  # no group lost
    kept = [r["id"] for r in rows if r["has"]]
    # Before T0 + 180: the first group of each minute, plus the open one; after: every plan.
    assert kept == [1, 6, 61, 121] + list(range(181, 301))
    assert removed["plans"] == 180 - 4
    members = db.query("SELECT COUNT(*) FROM group_members")[0][0]
    assert members == 600


def test_dropped_plans_free_their_pages_for_later_rows(tmp_path: Path) -> None:
    db = RunDB(tmp_path / "lab.db")
    for s in range(600):
        _group(db, s + 1, T0 + s)
    db.compact(SMALL, now=T0 + 700)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = (tmp_path / "lab.db").stat().st_size
    free = db.query("PRAGMA freelist_count")[0][0]
    assert free * 4096 > size / 2  # most pages the plans filled are free for reuse
