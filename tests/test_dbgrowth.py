"""lab.studies.dbgrowth replays a run's rows end to end: times and group ids shift per cycle,
and the retention policy folds them as they age."""

from __future__ import annotations

from pathlib import Path

from crew.config import Scheme
from crew.runtime import rundb
from crew.runtime.retention import RetentionPolicy
from crew.runtime.rundb import EventRow, GroupMemberRow, LinkSampleRow, RunDB
from lab.studies import dbgrowth

T0 = 1_699_999_200.0


def _source(tmp_path: Path) -> Path:
    db = RunDB(tmp_path / "src" / "lab.db")
    db.set_meta({"run_id": "src-run"})
    db.add_link_samples(
        [LinkSampleRow(T0 + s, src, 1 - src, 100 * s, 1.0) for s in range(120) for src in (0, 1)]
    )
    for gid in (1, 2):
        db.open_group(
            gid,
            scheme=Scheme.CREW,
            members=[0, 1],
            weights=[0.5, 0.5],
            formed_at=T0 + 10 * gid,
            started_at=T0 + 10 * gid,
            predicted_s=None,
            bound_s=None,
            plan_json=None,
            member_rows=[GroupMemberRow(gid, w, gid, 1, 0.5) for w in (0, 1)],
        )
    db.add_events([EventRow(T0 + 5, "info", "start", None, "started")])
    db.close()
    return tmp_path / "src" / "lab.db"


def test_replayed_cycles_shift_times_and_group_ids(tmp_path: Path) -> None:
    src = dbgrowth.read_source(_source(tmp_path))
    assert src.period == 120.0 and src.max_group == 2
    out = tmp_path / "grown.db"
    sizes = dbgrowth.grow(src, out, hours=1.0, policy=None)
    assert len(sizes) == 1 and sizes[0] > 0
    conn = rundb.connect(out, readonly=True)
    ids = [r[0] for r in conn.execute("SELECT id FROM groups ORDER BY id")]
    assert ids == list(range(1, 61))  # 30 cycles of two groups, none colliding
    formed = [r[0] for r in conn.execute("SELECT formed_at FROM groups ORDER BY id LIMIT 4")]
    assert formed == [T0 + 10, T0 + 20, T0 + 130, T0 + 140]
    assert conn.execute("SELECT COUNT(*) FROM link_samples").fetchone()[0] == 30 * 240
    assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 30
    # It opens like the run it came from, ended where the replay did (the dashboard reads it).
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    assert meta["run_id"] == "src-run" and float(meta["ended_at"]) == T0 + 3600.0


def test_hours_below_one_are_refused(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert dbgrowth.main([str(_source(tmp_path).parent), "--hours", "0.5"]) == 2
    assert "--hours must be in [1, 672]" in capsys.readouterr().err


def test_the_policy_folds_the_replayed_rows_as_they_age(tmp_path: Path) -> None:
    src = dbgrowth.read_source(_source(tmp_path))
    policy = RetentionPolicy(full_s=600.0, medium_step_s=60.0, medium_s=1800.0, coarse_step_s=60)
    dbgrowth.grow(src, tmp_path / "grown.db", hours=1.0, policy=policy)
    conn = rundb.connect(tmp_path / "grown.db", readonly=True)
    old = conn.execute("SELECT COUNT(*) FROM link_samples WHERE t < ?", (T0 + 2400,)).fetchone()
    assert old[0] == 2 * 40  # 40 minutes of 1 Hz rows on 2 links, one per minute per link
    recent = conn.execute("SELECT COUNT(*) FROM link_samples WHERE t >= ?", (T0 + 3000,))
    assert recent.fetchone()[0] == 2 * 600  # the newest 600 s untouched
