"""lab.studies.grouptime on a hand-written trace and run database: each spread's arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crew.runtime.planahead import PLAN_COSTS_META
from crew.runtime.rundb import connect
from lab.studies import grouptime
from lab.studies.frametrace import read_events

KB = 1000


def _trace(d: Path, me: int, lines: list[tuple]) -> None:
    text = "".join("\t".join(str(x) for x in line) + "\n" for line in lines)
    (d / f"frames-w{me}.tsv").write_text(text, encoding="ascii")


def _relayed_group(d: Path) -> None:
    """Group 5: worker 0 sends a 100 kB part to 1, which relays it to 2; links are 8 Mbit/s,
    so with goodput 1 the part takes 0.1 s a hop.

    0: queued 10.00, send starts 10.02 (socket queue 20 ms), arrives at 1 at 10.15 (30 ms beyond
    its 0.1 s); 1: queued onward 10.16 (relay wait 10 ms), send starts 10.16 (no queue), arrives
    at 2 at 10.30 (40 ms beyond). Data span: 10.00 -> 10.30."""
    part = ("SCATTER", 5, 0, 0, 64, 100 * KB)
    _trace(d, 0, [(10.00, "q", 1, *part), (10.02, "s", 1, *part)])
    _trace(d, 1, [(10.15, "r", 0, *part), (10.16, "q", 2, *part), (10.16, "s", 2, *part)])
    # another group's frame: not counted (group 9 is not completed in the database)
    _trace(d, 2, [(10.30, "r", 1, *part), (11.0, "r", 1, "SCATTER", 9, 0, 0, 0, 10)])


def _run_db(path: Path) -> None:
    conn = connect(path)
    with conn:
        conn.execute(
            "INSERT INTO groups (id, scheme, members, weights, formed_at, ended_at, status,"
            " predicted_s) VALUES (5, 'crew', '[0, 2]', '[0.5, 0.5]', 100.0, 100.5,"
            " 'completed', 0.2)"
        )
        costs = {"5": {"source": "inline", "blocked_ms": 120.0}}
        conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?)", (PLAN_COSTS_META, json.dumps(costs))
        )
        for src, dst in ((0, 1), (1, 2)):
            conn.execute(
                "INSERT INTO links (src, dst, rate_mbit, delay_ms, loss_pct)"
                " VALUES (?, ?, 8, 0, 0)",
                (src, dst),
            )
    conn.close()


def test_spreads_of_a_relayed_part(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _relayed_group(tmp_path)
    _run_db(tmp_path / "lab.db")
    groups, rates = grouptime.read_run(tmp_path / "lab.db")
    assert groups == {5: pytest.approx((0.5, 0.2, 0.12))} and rates[(0, 1)] == 8.0
    t = grouptime.group_times(read_events(tmp_path), groups, rates, goodput=1.0)
    assert t.recorded.median == pytest.approx(0.5) and t.planned.median == pytest.approx(0.2)
    assert t.data_span.median == pytest.approx(0.30)
    assert t.outside_data.median == pytest.approx(0.20)
    assert t.plan.median == pytest.approx(0.12) and t.control.median == pytest.approx(0.08)
    assert t.relay_wait.count == 1 and t.relay_wait.median == pytest.approx(0.01)
    assert t.socket_queue.count == 2 and t.socket_queue.mean == pytest.approx(0.01)
    assert t.beyond_serialisation.count == 2
    assert t.beyond_serialisation.mean == pytest.approx(0.035)
    out = tmp_path / "spreads.json"
    assert grouptime.main([str(tmp_path), str(tmp_path / "lab.db"), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["control"]["median"] == pytest.approx(0.08)
    assert "1 completed groups with traced frames" in capsys.readouterr().out


def test_refusals_name_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        grouptime.main([str(tmp_path), str(tmp_path / "none.db")])
    assert refused.value.code == 2 and "no such run database" in capsys.readouterr().err
    _run_db(tmp_path / "lab.db")
    assert grouptime.main([str(tmp_path), str(tmp_path / "lab.db")]) == 2
    assert "no frame events" in capsys.readouterr().err
    _trace(tmp_path, 0, [(1.0, "q", 1, "SCATTER", 7, 0, 0, 0, 10)])  # a group not in the db
    assert grouptime.main([str(tmp_path), str(tmp_path / "lab.db")]) == 2
    assert "no frames of" in capsys.readouterr().err
