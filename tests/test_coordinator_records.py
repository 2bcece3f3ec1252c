"""The coordinator's records as the run database holds them: the life cycle's outputs written
by ``crew.runtime.coordinator.write_record`` into a real SQLite run database (no sockets, no
root)."""

from __future__ import annotations

import json
from pathlib import Path

from lifecycle_kit import SIZE, make_cfg, report_all

from crew.control import lifecycle as lc
from crew.runtime.coordinator import write_record
from crew.runtime.rundb import RunDB
from crew.wire import protocol as proto


def run(db: RunDB, outs: list[lc.Output]) -> list[lc.SendTo]:
    sends = []
    for o in outs:
        if isinstance(o, lc.SendTo):
            sends.append(o)
        elif not isinstance(o, lc.StopRequested):
            write_record(db, o)
    return sends


def test_a_revised_group_is_recorded_as_the_dashboard_reads_it(tmp_path: Path) -> None:
    db = RunDB(tmp_path / "lab.db")
    life = lc.GroupLifecycle(make_cfg(n=4, p=3))
    for w in range(4):
        run(db, life.handle(proto.Register(w, 100 + w, 0, SIZE), 0.0))
    for m in (0, 1, 2):
        run(db, life.handle(proto.Ready(m, 1, float(m), -1), 1.0))
    (g,) = db.query("SELECT * FROM groups")
    assert g["status"] == "open" and json.loads(g["members"]) == [0, 1, 2]
    assert g["predicted_s"] > 0 and g["bound_s"] > 0 and g["started_at"] == 1.0
    states = {r["worker"]: r["state"] for r in db.query("SELECT * FROM worker_status")}
    assert states == {0: "reducing", 1: "reducing", 2: "reducing", 3: "training"}

    run(db, life.handle(lc.WorkerDisconnected(2, "control connection closed"), 2.0))
    run(db, report_all(life, 1, 3.0))
    (g,) = db.query("SELECT * FROM groups")
    assert g["status"] == "completed" and g["revisions"] == 1 and g["ended_at"] == 3.0
    assert json.loads(g["members"]) == [0, 1] and g["verify_err"] < 1e-9 and g["bytes"] > 0
    assert g["reason"] is None
    members = [r["worker"] for r in db.query("SELECT worker FROM group_members ORDER BY worker")]
    assert members == [0, 1]
    states = {r["worker"]: r["state"] for r in db.query("SELECT * FROM worker_status")}
    assert states == {0: "training", 1: "training", 2: "dead", 3: "training"}
    kinds = [(r["kind"], r["level"]) for r in db.query("SELECT * FROM events ORDER BY id")]
    assert ("fault", "warning") in kinds and ("recovery", "info") in kinds

    run(db, life.handle(proto.Metrics(0, 2, 0.5, None, 3.5), 3.5))
    (it,) = db.query("SELECT * FROM iterations")
    assert (it["worker"], it["iteration"], it["loss"], it["accuracy"]) == (0, 2, 0.5, None)
    run(db, life.handle(proto.Admin("set_p", {"p": 2}), 4.0))
    assert db.query("SELECT value FROM meta WHERE key='p'")[0]["value"] == "2"
    db.close()


def test_abandoned_and_gloo_groups(tmp_path: Path) -> None:
    db = RunDB(tmp_path / "lab.db")
    life = lc.GroupLifecycle(make_cfg(n=4, p=2, scheme="gloo"))
    for w in range(4):
        run(db, life.handle(proto.Register(w, 100 + w, 0, SIZE), 0.0))
    run(db, life.handle(proto.OpTime(0, 1, 5.0, 6.0, 400), 6.0))
    (g,) = db.query("SELECT * FROM groups")
    assert g["status"] == "completed" and json.loads(g["members"]) == [0, 1, 2, 3]
    assert g["bytes"] == 2 * 3 * 400 and g["ended_at"] == 6.0

    db.close()
    db = RunDB(tmp_path / "partial.db")  # a run is either Gloo or partial reduce
    life = lc.GroupLifecycle(make_cfg(n=4, p=2))
    for w in range(4):
        run(db, life.handle(proto.Register(w, 100 + w, 0, SIZE), 10.0))
    for m in (0, 1):
        run(db, life.handle(proto.Ready(m, 1, 1.0, -1), 11.0))
    sends = run(db, life.shutdown(12.0, "coordinator stopping"))
    g = db.query("SELECT * FROM groups WHERE id=1")[0]
    assert g["status"] == "abandoned" and g["reason"] == "run stopped"
    assert {s.worker for s in sends if isinstance(s.msg, proto.Stop)} == {0, 1, 2, 3}
    db.close()


def test_a_restarted_coordinator_abandons_the_open_groups_and_numbers_on(tmp_path: Path) -> None:
    from crew.runtime.coordinator import RESTART_REASON, resume_from_db

    db = RunDB(tmp_path / "lab.db")
    life = lc.GroupLifecycle(make_cfg(n=4, p=2))
    for w in range(4):
        run(db, life.handle(proto.Register(w, 100 + w, 0, SIZE), 0.0))
    for m in (0, 1):
        run(db, life.handle(proto.Ready(m, 1, float(m), -1), 1.0))
    run(db, report_all(life, 1, 2.0))  # group 1 completes
    for m in (2, 3):
        run(db, life.handle(proto.Ready(m, 1, float(m), -1), 3.0))  # group 2: open at the crash

    run(db, life.handle(proto.Admin("set_scheme", {"scheme": "preduce"}), 4.0))
    db.execute(
        "INSERT INTO link_state (t, src, dst, rate_mbit, up, reason) VALUES (4, 0, 1, 7.5, 1, 'x')"
    )
    fresh = lc.GroupLifecycle(make_cfg(n=4, p=2))  # the restarted process
    assert resume_from_db(db, fresh, 5.0) == 1
    assert fresh.scheme == "preduce" and fresh.capacity.planning[0, 1] == 7.5
    status = {r["id"]: (r["status"], r["reason"]) for r in db.query("SELECT * FROM groups")}
    assert status == {1: ("completed", None), 2: ("abandoned", RESTART_REASON)}
    for w in range(4):
        run(db, fresh.handle(proto.Register(w, 200 + w, 1, SIZE), 6.0))
    for m in (2, 3):
        run(db, fresh.handle(proto.Ready(m, 2, float(m), -1), 7.0))
    # ids 3..6 may have reached workers unrecorded (one batch, at most n = 4 groups)
    assert [r["id"] for r in db.query("SELECT id FROM groups WHERE status='open'")] == [7]
    assert resume_from_db(RunDB(tmp_path / "empty.db"), lc.GroupLifecycle(make_cfg()), 1.0) == 0
    db.close()


def test_a_restart_never_reuses_an_id_sent_before_its_row_was_written(tmp_path: Path) -> None:
    """A crash between a batch's Assign messages and its rows: the workers hold group ids the
    database lacks, and a worker ignores an id it has ended, so none may be used again."""
    from crew.runtime.coordinator import resume_from_db

    db = RunDB(tmp_path / "lab.db")
    life = lc.GroupLifecycle(make_cfg(n=6, p=2))
    for w in range(6):
        run(db, life.handle(proto.Register(w, 100 + w, 0, SIZE), 0.0))
    run(db, life.handle(proto.Ready(0, 1, 0.0, -1), 1.0))
    run(db, life.handle(proto.Ready(1, 1, 1.0, -1), 1.0))  # group 1, recorded
    sent: set[int] = set()
    for m in range(2, 6):  # groups 2 and 3: assigned, then the coordinator dies unrecorded
        outs = life.handle(proto.Ready(m, 1, float(m), -1), 2.0)
        sent |= {
            o.msg.group
            for o in outs
            if isinstance(o, lc.SendTo) and isinstance(o.msg, proto.Assign)
        }
    assert sent == {2, 3} and [r["id"] for r in db.query("SELECT id FROM groups")] == [1]
    fresh = lc.GroupLifecycle(make_cfg(n=6, p=2))
    resume_from_db(db, fresh, 3.0)
    for w in range(6):
        run(db, fresh.handle(proto.Register(w, 200 + w, 1, SIZE), 4.0))
    for m in range(6):
        run(db, fresh.handle(proto.Ready(m, 2, float(m), -1), 5.0))
    new = [r["id"] for r in db.query("SELECT id FROM groups WHERE id > 1")]
    assert len(new) == 3 and not set(new) & sent, new
    db.close()
