"""lab.export: one CSV per table of a run database, read back equal to the database."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import pytest

from crew.runtime.rundb import RunDB
from lab.export import export_csv, main


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    db = RunDB(run / "lab.db")
    db.set_meta({"run_id": "r1", "p": 3})
    db.executemany(
        "INSERT INTO workers (id, name, cloud, address) VALUES (?, ?, ?, ?)",
        [(0, "w0", 'aws-east, "quoted"', "10.0.0.1"), (1, "w1", "gcp\nwest", "10.0.0.2")],
    )
    db.execute(
        "INSERT INTO groups (id, scheme, members, weights, formed_at, status, plan)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (7, "crew", json.dumps([0, 1]), json.dumps([0.5, 0.5]), 12.5, "completed", None),
    )
    db.event("fault", "cut 0->1", worker=0, data={"src": 0, "dst": 1}, t=13.0)
    db.close()
    return run


def test_every_table_is_written_and_reads_back_equal(tmp_path: Path) -> None:
    run = _run(tmp_path)
    out = tmp_path / "csv"
    counts = export_csv(run, out)
    conn = sqlite3.connect(run / "lab.db")
    names = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    assert sorted(p.stem for p in out.glob("*.csv")) == sorted(names)
    assert counts["workers"] == 2 and counts["groups"] == 1 and counts["events"] == 1
    for name in names:
        cur = conn.execute(f'SELECT * FROM "{name}" ORDER BY rowid')
        columns = [d[0] for d in cur.description]
        want = [["" if v is None else str(v) for v in row] for row in cur]
        with open(out / f"{name}.csv", newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        assert rows[0] == columns
        assert rows[1:] == want, name
    conn.close()


def test_bad_inputs_are_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path / "missing"), "--csv", str(tmp_path / "a")]) == 2
    assert "no run database" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()

    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "lab.db").write_bytes(b"this is not sqlite" * 100)
    assert main([str(junk), "--csv", str(tmp_path / "b")]) == 2
    assert "not a" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()

    run = _run(tmp_path)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    assert main([str(run), "--csv", str(full)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert sorted(p.name for p in full.iterdir()) == ["keep.txt"]
    assert main([str(run), "--csv", str(full), "--overwrite"]) == 0
    assert (full / "groups.csv").is_file() and (full / "keep.txt").read_text() == "mine"
