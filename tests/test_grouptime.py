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


def test_hop_waits_add_the_relay_wait_where_the_sender_relayed(tmp_path: Path) -> None:
    # 0 -> 1: 30 ms beyond serialisation, 0 held the part itself; 1 -> 2: 40 ms beyond, after
    # 1 waited 10 ms to relay it.
    _relayed_group(tmp_path)
    _run_db(tmp_path / "lab.db")
    groups, rates = grouptime.read_run(tmp_path / "lab.db")
    waits = grouptime.hop_waits(read_events(tmp_path), groups, rates, goodput=1.0)
    assert sorted(waits) == pytest.approx([0.03, 0.05])


def test_a_hop_wait_is_counted_from_when_its_link_was_free(tmp_path: Path) -> None:
    # Two 100 kB parts of group 5 handed to the 0 -> 1 socket together at 10.00: the first
    # arrives at 10.10 (its 0.1 s), the second at 10.22. Beyond serialisation the second waited
    # 0.12 s, 0.1 s of it behind the first, which the simulator's link queue makes itself: its
    # hop wait is 0.02 s.
    first, second = ("SCATTER", 5, 0, 0, 64, 100 * KB), ("SCATTER", 5, 0, 1, 64, 100 * KB)
    sends = [(10.0, what, 1, *part) for part in (first, second) for what in ("q", "s")]
    _trace(tmp_path, 0, sends)
    _trace(tmp_path, 1, [(10.10, "r", 0, *first), (10.22, "r", 0, *second)])
    _run_db(tmp_path / "lab.db")
    groups, rates = grouptime.read_run(tmp_path / "lab.db")
    events = read_events(tmp_path)
    waits = grouptime.hop_waits(events, groups, rates, goodput=1.0)
    assert sorted(waits) == pytest.approx([0.0, 0.02])
    beyond = grouptime.group_times(events, groups, rates, goodput=1.0).beyond_serialisation
    assert beyond.mean == pytest.approx(0.06)  # (0 + 0.12) / 2: the spread keeps the queue


def test_hop_waits_file_round_trips_through_the_command(tmp_path: Path) -> None:
    _relayed_group(tmp_path)
    _run_db(tmp_path / "lab.db")
    out = tmp_path / "waits.json"
    assert grouptime.main([str(tmp_path), str(tmp_path / "lab.db"), "--hop-waits", str(out)]) == 0
    # the command counts serialisation at the run's default goodput, 0.95: 0.1 s / 0.95 a hop
    serial = 0.1 / grouptime.GOODPUT
    got = grouptime.read_hop_waits(out)
    assert sorted(got) == pytest.approx([0.13 - serial, 0.15 - serial], abs=1e-6)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not a readable JSON file"),
        ('{"other": [1]}', "needs a non-empty list 'hop_waits_s'"),
        ('{"hop_waits_s": []}', "needs a non-empty list"),
        ('{"hop_waits_s": [0.1, "x"]}', "must be finite seconds"),
        ('{"hop_waits_s": [0.1, true]}', "must be finite seconds"),
        ('{"hop_waits_s": [0.1, 1e999]}', "must be finite seconds"),
    ],
)
def test_a_bad_hop_waits_file_is_refused_by_name(tmp_path: Path, text: str, says: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(grouptime.HopWaitsError, match=says) as refused:
        grouptime.read_hop_waits(bad)
    assert str(bad) in str(refused.value)
