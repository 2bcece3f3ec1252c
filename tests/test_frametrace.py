"""lab.studies.frametrace on a hand-written trace: per-link bytes, timing and the starved-link
ratio."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.studies import frametrace

MB = 1_000_000


def _write(d: Path, me: int, lines: list[tuple]) -> None:
    text = "".join("\t".join(str(x) for x in line) + "\n" for line in lines)
    (d / f"frames-w{me}.tsv").write_text(text + "12.5\tr\t0\tSCAT", encoding="ascii")  # cut line


def test_link_rows_show_a_starved_first_frame(tmp_path: Path) -> None:
    # 0 -> 1: three frames of 1 MB; the first takes 0.5 s, the next ones 0.1 s each.
    sends = [(10.0 + i * 0.01, "s", 1, "SCATTER", 7, 0, 1, i, MB) for i in range(3)]
    queued = [(10.0, "q", 1, "SCATTER", 7, 0, 1, i, MB) for i in range(3)]
    _write(tmp_path, 0, queued + sends)
    got = [(t, "r", 0, "SCATTER", 7, 0, 1, i, MB) for i, t in enumerate((10.5, 10.6, 10.7))]
    other = [(10.2, "r", 0, "SCATTER", 8, 0, 1, 0, MB)]  # another group: not counted
    _write(tmp_path, 1, got + other)
    events = frametrace.read_events(tmp_path)
    t0, rows = frametrace.link_rows(events, 7, window_s=30)
    assert t0 == 10.0
    (row,) = rows
    assert (row.src, row.dst, row.nbytes, row.frames) == (0, 1, 3 * MB, 3)
    assert row.first_received == pytest.approx(0.5) and row.last_received == pytest.approx(0.7)
    assert row.first_frame_over_steady == pytest.approx(5.0)
    assert row.mbit_s == pytest.approx(24 / 0.7)
    assert frametrace.main([str(tmp_path), "--group", "7"]) == 0
    assert frametrace.main([str(tmp_path / "empty")]) == 2
