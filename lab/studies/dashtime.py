"""Dashboard paint benchmark: does a long run's database keep the page as fast as a new run's?

``python -m lab.studies.dashtime RUN [RUN ...] [--loads 5]`` serves each finished run's
database with the dashboard (``python -m dashboard RUN``, one server per run, in turn), opens it
in Chromium (Debian's, headless, through Playwright) and times, ``--loads`` times after one
warm-up load, how long a fresh page takes from the address being opened until every panel is
drawn: the run header, network map, link table, utilisation, groups, plans, training, compute
utilisation and events (``lab.studies.firstpaint``'s panels; a finished run shows no controls).
It prints each run's median and range, its size, and the median's ratio to the first run's.

A week-old database to compare with a new one comes from ``lab.studies.dbgrowth``::

    sudo python -m lab.soak --minutes 6 --out /tmp/src        # or any lab.run of a few minutes
    python -m lab.studies.dbgrowth /tmp/src --hours 168 --out /tmp/week.db
    python -m lab.studies.dashtime /tmp/src /tmp/week.db

The first run is the reference. A finished run's page shows the run as it was at its end, so
both pages draw the same panels over the same windows; only what the database holds differs.
It is a benchmark, not a test: run it on a quiet machine; it exits 1 if a panel never appeared.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from crew.cli_options import add_json_flag, command_parser, write_json
from lab.orchestrate import browser
from lab.orchestrate.runner import REPO
from lab.studies.firstpaint import PANELS, VIEWPORT, drawn_on

FINISHED_PANELS = tuple(p for p in PANELS if p != "controls")
POLL_S = 0.05
SERVER_WAIT_S = 60.0
DB_NAMES = ("lab.db", "run.db")  # a lab run's database, or a launched job's


def find_db(run: Path) -> Path | None:
    """The run database ``run`` names: the file itself, or one of ``DB_NAMES`` in it."""
    if run.is_dir():
        return next((run / name for name in DB_NAMES if (run / name).is_file()), None)
    return run if run.is_file() else None


@dataclass
class RunPaint:
    run: str
    size_mb: float
    seconds: list[float] = field(default_factory=list)  # per load; inf: a panel never came
    missing: list[str] = field(default_factory=list)  # panels never drawn in some load

    @property
    def median(self) -> float:
        return float(statistics.median(self.seconds)) if self.seconds else float("inf")


def time_load(page: Any, url: str, timeout: float) -> tuple[float, list[str]]:
    """Seconds from opening ``url`` until every finished-run panel is drawn, and the panels
    still missing when ``timeout`` ran out (then the time is inf)."""
    t0 = time.monotonic()
    browser.open_dashboard(page, url, timeout)
    seen: set[str] = set()
    # Bounded: one poll per POLL_S until the timeout.
    for _ in range(int(timeout / POLL_S) + 1):
        seen |= {name for name, drawn in drawn_on(page).items() if drawn}
        if all(p in seen for p in FINISHED_PANELS):
            return time.monotonic() - t0, []
        if time.monotonic() - t0 > timeout:
            break
        page.wait_for_timeout(POLL_S * 1000)
    return float("inf"), [p for p in FINISHED_PANELS if p not in seen]


def measure_run(
    pw_browser: Any, db: Path, loads: int, timeout: float, shot: Path | None = None
) -> RunPaint:
    port = browser.free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "dashboard", str(db), "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    result = RunPaint(str(db), round(db.stat().st_size / 1e6, 1))
    url = f"http://127.0.0.1:{port}/"
    try:
        for k in range(loads + 1):  # the first load warms the server's imports: not counted
            page = pw_browser.new_page(viewport=VIEWPORT)
            try:
                seconds, missing = time_load(page, url, timeout if k else SERVER_WAIT_S + timeout)
                if shot is not None and k == loads:
                    browser.screenshot(page, shot)
            finally:
                page.close()
            if k:
                result.seconds.append(round(seconds, 2))
                result.missing = sorted(set(result.missing) | set(missing))
            print(f"  {db}: load {k or 'warm-up'}: {seconds:.2f} s", flush=True)
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
    return result


def render(runs: Sequence[RunPaint]) -> str:
    ref = runs[0].median
    lines = ["every panel drawn, seconds from opening the page (median, range of loads):"]
    for r in runs:
        spread = f"{min(r.seconds):.2f}-{max(r.seconds):.2f}" if r.seconds else "-"
        ratio = r.median / ref if ref and ref != float("inf") else float("nan")
        lines.append(
            f"  {r.run}: {r.size_mb:,.1f} MB, median {r.median:.2f} s ({spread}),"
            f" x{ratio:.2f} of the first"
            + (f"; never drawn: {', '.join(r.missing)}" if r.missing else "")
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("python -m lab.studies.dashtime", __doc__)
    parser.add_argument("runs", type=Path, nargs="+", help="finished runs (folders or databases)")
    parser.add_argument("--loads", type=int, default=5, help="timed page loads per run (5)")
    parser.add_argument("--timeout", type=float, default=60.0, help="per load, seconds (60)")
    parser.add_argument(
        "--screenshots",
        type=Path,
        metavar="DIR",
        help="after the last load, save each run's whole page as DIR/<k>-<run>.png",
    )
    add_json_flag(parser, "the figures")
    args = parser.parse_args(argv)
    dbs = []
    for run in args.runs:
        db = find_db(run)
        if db is None:
            parser.error(f"{run}: no run database (lab.db or run.db) there")
        dbs.append(db)
    if args.loads < 1:
        parser.error("--loads must be at least 1")
    results = []
    with browser.sync_playwright() as pw:
        chromium = browser.launch(pw)
        try:
            for k, db in enumerate(dbs):
                shot = None
                if args.screenshots is not None:
                    shot = args.screenshots / f"{k}-{db.parent.name or db.stem}.png"
                results.append(measure_run(chromium, db, args.loads, args.timeout, shot))
        finally:
            chromium.close()
    if write_json(args.json, [asdict(r) | {"median_s": r.median} for r in results]):
        print(render(results))
    return 0 if all(not r.missing for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
