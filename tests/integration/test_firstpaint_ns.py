"""The first-paint benchmark, once, on the small topology: every panel it looks for appears.

Not a timing test: it checks that ``python -m lab.studies.firstpaint`` starts ``lab.run`` as a user
would, finds the address, recognises every panel and every data milestone on the real page
(a selector that no longer matches would report "never" and fail here), and stops the lab
cleanly. The figures themselves are the benchmark's to print.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from lab.orchestrate.browser import CHROMIUM
from lab.orchestrate.runner import REPO
from lab.studies.firstpaint import DATA, PANELS, main

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin"),
]


def test_every_panel_and_milestone_is_seen_and_the_lab_stops(tmp_path: Path) -> None:
    out = tmp_path / "firstpaint.json"
    code = main(
        [
            "--runs",
            "1",
            "--topology",
            str(REPO / "topologies" / "small.yaml"),
            "--timeout",
            "150",
            "--run-dir",
            str(tmp_path / "fp"),
            "--json",
            str(out),
            "--screenshots",
            str(tmp_path / "shots"),
        ]
    )
    figures = json.loads(out.read_text())
    run = figures["runs"][0]
    assert code == 0, figures
    assert set(run["seen"]) == {*PANELS, *DATA}, figures
    assert 0 < run["address_printed"] <= run["seen"]["header"] <= run["all_panels"]
    assert run["page_loads"] >= 1
    assert (tmp_path / "shots" / "firstpaint-1.png").stat().st_size > 10_000
    # Stopped by SIGTERM, the lab ended as on Ctrl-C: its run is marked finished.
    with sqlite3.connect(tmp_path / "fp-1" / "lab.db") as db:
        ended = db.execute("SELECT value FROM meta WHERE key = 'ended_at'").fetchone()
    assert ended is not None and float(ended[0]) > 0
