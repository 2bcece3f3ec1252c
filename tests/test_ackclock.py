"""lab.studies.ackclock: transfers from frame events, split by their reverse's load."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.studies.ackclock import Row, classify, main, transfers
from lab.studies.frametrace import Event

RATES = {(0, 1): 8.0, (1, 0): 1.0, (2, 3): 4.0, (3, 2): 4.0}


def _transfer(group: int, src: int, dst: int, start: float, end: float, nbytes: int) -> list:
    # "s" is logged by the sender (me = src), "r" by the receiver (me = dst)
    return [
        Event(start, "s", src, dst, "SCATTER", group, 0, 0, nbytes),
        Event(end, "r", dst, src, "SCATTER", group, 0, 0, nbytes),
    ]


def test_a_fast_link_behind_a_busy_slow_reverse_shows_the_reverses_rate() -> None:
    events = sorted(
        _transfer(1, 1, 0, 0.0, 10.0, 1_187_500)  # 1 Mbit/s x 0.95 for 10 s: its own rate
        + _transfer(2, 0, 1, 0.0, 8.0, 950_000)  # 8 Mbit/s link at 1 Mbit/s x 0.95
        + _transfer(3, 2, 3, 0.0, 2.0, 950_000),  # 4 Mbit/s x 0.95, reverse idle
        key=lambda e: e.t,
    )
    xs = transfers(events)
    assert {(t.src, t.dst, t.nbytes) for t in xs} == {
        (1, 0, 1_187_500),
        (0, 1, 950_000),
        (2, 3, 950_000),
    }
    rows = classify(xs, RATES, goodput=0.95, faster=1.5, min_bytes=100_000)
    assert [(r.reverse_busy, r.faster, r.count) for r in rows] == [
        (True, True, 1),
        (True, False, 1),
        (False, False, 1),
    ]
    clocked, slow, alone = rows
    assert clocked.own[0] == pytest.approx(0.125) and clocked.reverse[0] == pytest.approx(1.0)
    assert slow.own[0] == pytest.approx(1.0) and slow.reverse[0] == pytest.approx(0.125)
    assert alone == Row(False, False, 1, (1.0, 1.0, 1.0), (1.0, 1.0, 1.0))
    # Small transfers are left out.
    assert classify(xs, RATES, goodput=0.95, min_bytes=2_000_000) == []


def test_the_command_refuses_bad_input(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as refused:
        main([str(tmp_path), str(tmp_path / "lab.db"), "--faster", "0.5"])
    assert refused.value.code == 2
    assert "--faster must be above 1, got 0.5" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main([str(tmp_path), str(tmp_path / "lab.db")])
    assert refused.value.code == 2
    assert "no such run database" in capsys.readouterr().err
