"""crew.runtime.rundb.reading: a read-only connection to a run database, closed on leaving."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from crew.runtime import rundb


def test_reading_sees_the_data_refuses_writes_and_closes(tmp_path: Path) -> None:
    db = rundb.RunDB(tmp_path / "lab.db")
    db.set_meta({"topology_name": "small"})
    db.close()
    with rundb.reading(tmp_path / "lab.db") as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = 'topology_name'").fetchone()
        assert row["value"] == "small"
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            conn.execute("DELETE FROM meta")
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")


def test_reading_closes_when_the_body_raises(tmp_path: Path) -> None:
    rundb.RunDB(tmp_path / "lab.db").close()
    with pytest.raises(RuntimeError), rundb.reading(tmp_path / "lab.db") as conn:
        raise RuntimeError("the body failed")
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")
