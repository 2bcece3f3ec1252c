"""First-paint benchmark: how long a new user waits for the dashboard after ``lab.run``.

``sudo python -m lab.studies.firstpaint [--runs 3] [--topology topologies/default.yaml]`` does
what a new user does, ``--runs`` times: with a browser already open (Debian's Chromium, headless,
through Playwright), it starts ``python -m lab.run`` with its defaults (plus a free dashboard
port and a run directory), waits for the address the lab prints, opens it, and notes, every
half second, which parts of the page are drawn. Times are seconds since the command started.

Panels (drawn = on the page, with its chart or table, even before the lab has data for it):

* ``header``: the run metrics (run id, scheme, p, elapsed);
* ``network map`` and ``link table``; ``utilisation`` (time series and n x n heat map);
* ``groups`` (timeline, rounds and staleness), ``plans`` (the newest plan's chart, or the
  caption saying there is none yet), ``training`` (curves, rounds per minute);
* ``events`` (the log, or its "no events yet" caption); ``controls`` (the sidebar's forms).

Data (when the lab has produced it, which the page cannot hurry): ``traffic`` (a link in the
table above 0% utilisation), ``first plan`` (a group's plan charted), ``training data`` (a
point on the training curves).

Each run ends as soon as everything is seen, or ``--timeout`` seconds after the start, with
SIGTERM to the lab, which tears its network down as on Ctrl-C. It is a benchmark, not a
test: it prints figures, writes them with ``--json``, and exits 1 if a panel never appeared.
Other load on the machine slows everything it measures, so run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from crew.cli_options import command_parser
from lab.orchestrate import browser
from lab.orchestrate.runner import REPO, new_run_id
from lab.spec.shipped import add_topology_flag

PANELS = (
    "header",
    "network map",
    "link table",
    "utilisation",
    "groups",
    "plans",
    "training",
    "compute utilisation",
    "events",
    "controls",
)
DATA = ("traffic", "first plan", "training data")
POLL_S = 0.5
ADDRESS_RE = re.compile(r"dashboard: (http://\S+)")
STOP_WAIT_S = 90.0  # lab.run's teardown: workers' checkpoints, the network, the dashboard
VIEWPORT = {"width": 1600, "height": 1000}
OUTPUT_LINES_KEPT = 200  # of lab.run's output, for the error when it printed no address

# One evaluate for all panels (the link table is read by lab.orchestrate.browser.link_table): the
# page re-renders panels every few seconds, so element handles taken one by one could come from
# different renders.
_SEEN = """() => {
  const q = s => document.querySelector(s);
  const svg = k => !!q(`.st-key-${k} .main-svg`);
  const captions = [...document.querySelectorAll("[data-testid='stCaptionContainer']")]
    .map(c => c.innerText);
  const caption = t => captions.some(c => c.includes(t));
  const metrics = [...document.querySelectorAll("[data-testid='stMetric']")];
  return {
    "header": metrics.some(m => m.innerText.includes("Elapsed")),
    "network map": svg("network_map"),
    "utilisation": svg("util_timeseries") && svg("util_heatmap"),
    "groups": svg("group_timeline") && svg("rounds_staleness"),
    "plans": svg("plan_times") || caption("no plans recorded yet"),
    "training": svg("training_curves") && svg("rounds_per_minute"),
    "compute utilisation": svg("compute_shares"),
    "events": !!q(".st-key-event_log [data-testid='stTable']") || caption("no events yet"),
    "controls": !!q(".st-key-cut_link_submit button"),
    "first plan": svg("plan_times"),
    "training data": !!q(".st-key-training_curves .scatterlayer .trace"),
  };
}"""


def drawn_on(page: Any) -> dict[str, bool]:
    """Which of ``PANELS`` and ``DATA`` the page shows now."""
    table = browser.link_table(page)
    return dict(page.evaluate(_SEEN)) | {
        "link table": table is not None,
        "traffic": any((browser.util_pct(r) or 0) > 0 for r in (table or {}).values()),
    }


class FirstPaintError(RuntimeError):
    """The lab did not start, or did not print its dashboard's address."""


@dataclass
class RunTimes:
    """One run's milestones, in seconds since ``python -m lab.run`` was started."""

    run_dir: str
    address_printed: float | None = None
    page_loads: int = 0
    seen: dict[str, float] = field(default_factory=dict)

    @property
    def all_panels(self) -> float | None:
        """When the last panel appeared; None if one never did."""
        if any(p not in self.seen for p in PANELS):
            return None
        return max(self.seen[p] for p in PANELS)


def address_in(line: str) -> str | None:
    """The dashboard address in a line of lab.run's output, if the line announces it."""
    m = ADDRESS_RE.search(line)
    return m.group(1) if m else None


def median_or_none(values: Sequence[float | None]) -> float | None:
    """The median of the runs that reached a milestone; None unless all of them did."""
    if not values or any(v is None for v in values):
        return None
    return float(statistics.median(v for v in values if v is not None))


def milestones(runs: Sequence[RunTimes]) -> dict[str, list[float | None]]:
    """Milestone name -> its time in each run (None where the run never reached it)."""
    table: dict[str, list[float | None]] = {"address printed": [r.address_printed for r in runs]}
    for name in (*PANELS, "all panels", *DATA):
        table[name] = [r.all_panels if name == "all panels" else r.seen.get(name) for r in runs]
    return table


# -- one run -------------------------------------------------------------------------------------


class _LabProcess:
    """``python -m lab.run`` as a child, its output read by a thread that spots the address."""

    def __init__(self, argv: list[str], t0: float):
        self.t0 = t0
        self.lines: deque[str] = deque(maxlen=OUTPUT_LINES_KEPT)
        self.address: str | None = None
        self.address_at: float | None = None
        self._announced = threading.Event()
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        self._reader = threading.Thread(target=self._read, name="lab-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if self.address is None and (url := address_in(line)):
                self.address, self.address_at = url, round(time.monotonic() - self.t0, 1)
                self._announced.set()
        self._announced.set()  # output ended: no address will come

    def wait_for_address(self, timeout: float) -> str:
        self._announced.wait(timeout)
        if self.address is None:
            tail = "\n".join(list(self.lines)[-15:])
            raise FirstPaintError(
                f"lab.run printed no dashboard address within {timeout:.0f} s"
                f" (exit code {self.proc.poll()}); its last lines:\n{tail}"
            )
        return self.address

    def stop(self) -> None:
        """SIGTERM (lab.run tears down as on Ctrl-C), SIGKILL if it hangs; the next lab run
        or ``python -m lab.net.cleanup`` removes what a killed one left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(timeout=10)


def measure_once(
    pw_browser: Any, topology: Path, run_dir: Path, timeout: float, shot: Path | None
) -> RunTimes:
    """One run of the new-user path (module docstring), against an open browser."""
    port = browser.free_port()
    argv = [
        sys.executable,
        "-m",
        "lab.run",
        "--topology",
        str(topology),
        "--duration",
        str(int(timeout + 30)),  # a backstop: the run is stopped once measured
        "--dashboard-port",
        str(port),
        "--out",
        str(run_dir),
    ]
    times = RunTimes(run_dir=str(run_dir))
    page = pw_browser.new_page(viewport=VIEWPORT)
    t0 = time.monotonic()
    lab = _LabProcess(argv, t0)
    try:
        url = lab.wait_for_address(timeout)
        times.address_printed = lab.address_at
        times.page_loads = browser.open_dashboard(page, url, timeout - (time.monotonic() - t0))
        wanted = (*PANELS, *DATA)
        for _ in range(int(timeout / POLL_S) + 1):
            now = time.monotonic() - t0
            for name, drawn in drawn_on(page).items():
                if drawn and name not in times.seen:
                    times.seen[name] = round(now, 1)
            if all(w in times.seen for w in wanted) or now > timeout:
                break
            page.wait_for_timeout(POLL_S * 1000)
        if shot is not None:
            browser.screenshot(page, shot)
    finally:
        page.close()
        lab.stop()
    return times


# -- the command ---------------------------------------------------------------------------------


def report(runs: Sequence[RunTimes], console: Console) -> None:
    table = Table(title="seconds from `python -m lab.run` to ...")
    table.add_column("milestone")
    for k in range(len(runs)):
        table.add_column(f"run {k + 1}", justify="right")
    table.add_column("median", justify="right", style="bold")

    def fmt(v: float | None) -> str:
        return "never" if v is None else f"{v:.1f}"

    for name, values in milestones(runs).items():
        table.add_row(name, *map(fmt, values), fmt(median_or_none(values)))
    table.add_row("page loads", *(str(r.page_loads) for r in runs), "")
    console.print(table)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("python -m lab.studies.firstpaint", __doc__)
    p.add_argument("--runs", type=int, default=3, help="how many labs to start (default 3)")
    add_topology_flag(p, "topology file (default topologies/default.yaml, lab.run's own default)")
    p.add_argument("--timeout", type=float, default=60.0, help="give up on a run after this (60 s)")
    p.add_argument(
        "--run-dir", type=Path, default=None, help="base of the runs (runs/firstpaint-<id>-<k>)"
    )
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument(
        "--screenshots",
        type=Path,
        default=None,
        help="save the whole page of each run, as it was when measuring ended, in this folder",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    if not args.topology.is_file():
        parser.error(f"--topology: no file {args.topology}")
    console = Console()
    base = args.run_dir or REPO / "runs" / f"firstpaint-{new_run_id()}"
    runs: list[RunTimes] = []
    try:
        with browser.sync_playwright() as pw:
            pw_browser = browser.launch(pw)
            try:
                for k in range(1, args.runs + 1):
                    console.print(f"run {k}/{args.runs}: starting python -m lab.run ...")
                    shot = args.screenshots / f"firstpaint-{k}.png" if args.screenshots else None
                    run = measure_once(
                        pw_browser, args.topology, Path(f"{base}-{k}"), args.timeout, shot
                    )
                    runs.append(run)
                    console.print(
                        f"run {k}/{args.runs}: all panels at "
                        + ("never" if run.all_panels is None else f"{run.all_panels:.1f} s")
                    )
            finally:
                pw_browser.close()
    except (browser.BrowserError, FirstPaintError) as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    report(runs, console)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "runs": [asdict(r) | {"all_panels": r.all_panels} for r in runs],
                    "median": {k: median_or_none(v) for k, v in milestones(runs).items()},
                },
                indent=1,
            )
        )
    return 0 if all(r.all_panels is not None for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
