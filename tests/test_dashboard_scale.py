"""The dashboard's queries read index ranges, never a whole growing table: a week-long run holds
millions of groups, memberships and worker states, and every panel must paint as fast as on a
new run (python -m lab.studies.dashtime measures it). Checked with SQLite's own query plans."""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_dashboard_figures import make_run

from crew.runtime import rundb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboard"))
import queries  # noqa: E402  (the dashboard's modules import each other by bare name)

# Tables a long run grows without bound (retention folds only the time series).
GROWING = ("groups", "group_members", "worker_states")


def _plans(db: Path, call: Any) -> list[str]:
    """The query plan of every statement ``call(conn)`` runs through ``queries._frame``."""
    seen: list[tuple[str, tuple[Any, ...]]] = []
    original = queries._frame

    def recording(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...], columns: list[str]):
        seen.append((sql, params))
        return original(conn, sql, params, columns)

    conn = rundb.connect(db, readonly=True)
    try:
        queries._frame = recording
        call(conn)
        return [
            " | ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
            for sql, params in seen
        ]
    finally:
        queries._frame = original
        conn.close()


@pytest.mark.parametrize(
    "name",
    ["groups", "completed_memberships", "worker_status", "worker_status_now"],
)
def test_panel_queries_never_scan_a_growing_table(tmp_path: Path, name: str) -> None:
    db = make_run(tmp_path)
    t = time.time()
    calls = {
        "groups": lambda c: queries.groups(c, t - 120.0, t),
        "completed_memberships": lambda c: queries.completed_memberships(c, t),
        "worker_status": lambda c: queries.worker_status(c, t),
        "worker_status_now": lambda c: queries.worker_status(c, None),
    }
    plans = _plans(db, calls[name])
    assert plans
    for plan in plans:
        scans = [
            step
            for step in plan.split(" | ")
            if step.startswith("SCAN") and any(table in step.split()[1:2] for table in GROWING)
        ]
        # "SCAN g" is how SQLite names a full pass over an aliased table.
        aliased = [s for s in plan.split(" | ") if s in ("SCAN g", "SCAN s", "SCAN m")]
        assert not scans and not aliased, plan
        if name == "completed_memberships":  # every completed group ever: a scan by another name
            assert "groups_status" not in plan, plan
