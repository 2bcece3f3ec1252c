"""Compute utilisation: the meter's arithmetic on scripted times, its message, its rows in the
run database and their place in the summary."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from crew.control.utilisation import TimeSplit, UtilisationMeter
from crew.runtime import rundb
from crew.runtime.retention import RetentionPolicy
from crew.wire import protocol as proto
from lab.orchestrate.summary import utilisation_summary


def test_known_compute_and_wait_times_add_up_exactly():
    m = UtilisationMeter(start=100.0)
    m.offered(103.0)  # 3 s of compute
    m.settled(106.0, assigned_at=104.0, applied=True)  # 1 s ready, 2 s reducing
    m.offered(109.0)  # 3 s of compute
    m.settled(109.5, assigned_at=None, applied=False)  # stopped before any group: 0.5 s ready
    m.offered(110.0)  # 0.5 s of compute
    m.settled(111.0, assigned_at=110.25, applied=False)  # 0.25 s ready, 0.75 s stalled
    split = m.split(112.0)  # 1 s of compute still open
    assert split == TimeSplit(compute_s=7.5, ready_s=1.75, group_s=2.0, stalled_s=0.75)
    assert split.wall_s == 12.0
    assert split.utilisation == 0.625
    assert m.rounds == 3


def test_an_open_round_counts_as_ready_until_its_group_is_known():
    m = UtilisationMeter(start=0.0)
    m.offered(4.0)
    assert m.split(5.0) == TimeSplit(compute_s=4.0, ready_s=1.0)
    assert m.split(5.0).utilisation == 0.8


def test_an_assignment_stamped_before_the_offer_is_clamped_into_the_round():
    m = UtilisationMeter(start=0.0)
    m.offered(2.0)
    m.settled(3.0, assigned_at=1.5, applied=True)  # a clock read on another thread
    assert m.split(3.0) == TimeSplit(compute_s=2.0, ready_s=0.0, group_s=1.0)


def test_rounds_out_of_order_are_refused():
    m = UtilisationMeter(start=0.0)
    with pytest.raises(ValueError, match="without an offered round"):
        m.settled(1.0, None, True)
    m.offered(1.0)
    with pytest.raises(ValueError, match="offered twice"):
        m.offered(2.0)


def test_nothing_measured_yet_is_full_utilisation():
    assert TimeSplit().utilisation == 1.0


def test_the_message_refuses_negative_times_and_bytes():
    good = {
        "type": "utilisation",
        "worker": 1,
        "t": 5.0,
        "compute_s": 1.0,
        "ready_s": 0.5,
        "group_s": 0.25,
        "stalled_s": 0.0,
        "wan_bytes": 10,
    }
    assert proto.decode(good) == proto.Utilisation(1, 5.0, 1.0, 0.5, 0.25, 0.0, 10)
    for field, bad in (("ready_s", -1.0), ("wan_bytes", -3), ("compute_s", float("nan"))):
        with pytest.raises(proto.ProtocolError, match=field):
            proto.decode(good | {field: bad})


def _write(db_path: Path, rows: list[rundb.UtilisationRow]) -> None:
    db = rundb.RunDB(db_path)
    try:
        db.add_utilisation(rows)
    finally:
        db.close()


def test_the_newest_row_per_worker_is_its_split_and_feeds_the_summary(tmp_path: Path):
    db = tmp_path / "lab.db"
    _write(
        db,
        [
            rundb.UtilisationRow(10.0, 0, 1.0, 1.0, 0.0, 0.0, 0),
            rundb.UtilisationRow(20.0, 0, 6.0, 1.0, 1.0, 0.0, 3000),
            rundb.UtilisationRow(20.0, 1, 2.0, 1.0, 0.5, 0.5, 1000),
        ],
    )
    conn = rundb.connect(db, readonly=True)
    try:
        latest = rundb.latest_utilisation(conn)
        assert latest[0].compute_s == 6.0 and latest[1].stalled_s == 0.5
        assert rundb.latest_utilisation(conn, asof=15.0)[0].compute_s == 1.0
        summary = utilisation_summary(latest)
    finally:
        conn.close()
    assert summary["utilisation_per_worker"]["0"]["utilisation"] == 0.75
    assert summary["utilisation_per_worker"]["1"]["utilisation"] == 0.5
    assert summary["utilisation_per_worker"]["0"]["wan_bytes_per_compute_s"] == 500
    assert summary["compute_utilisation"] == 0.625


def test_a_database_without_the_table_reads_as_no_utilisation(tmp_path: Path):
    path = tmp_path / "old.db"
    sqlite3.connect(path).close()
    conn = rundb.connect(path, readonly=True)
    try:
        assert rundb.latest_utilisation(conn) == {}
    finally:
        conn.close()


def test_retention_keeps_each_buckets_last_cumulative_row(tmp_path: Path):
    db_path = tmp_path / "lab.db"
    rows = [rundb.UtilisationRow(float(t), 0, t * 0.8, t * 0.2, 0.0, 0.0, t) for t in range(1, 200)]
    _write(db_path, rows)
    db = rundb.RunDB(db_path)
    try:
        policy = RetentionPolicy(
            full_s=50.0, medium_step_s=10.0, medium_s=100.0, coarse_step_s=60.0
        )
        removed = db.compact(policy, now=200.0)
    finally:
        db.close()
    assert removed["utilisation"] > 0
    conn = rundb.connect(db_path, readonly=True)
    try:
        kept = conn.execute("SELECT t, compute_s FROM utilisation ORDER BY t").fetchall()
        assert rundb.latest_utilisation(conn)[0].compute_s == pytest.approx(199 * 0.8)
    finally:
        conn.close()
    assert len(kept) < len(rows)
    # Every kept row is an original row (cumulative counters are never averaged).
    assert all(r["compute_s"] == pytest.approx(r["t"] * 0.8) for r in kept)
