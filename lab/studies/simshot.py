"""A screenshot of a (simulated) run's dashboard replay.

    python -m lab.studies.simshot RUN --out PNG

Serves ``python -m dashboard RUN`` on a free local port, opens it in Debian's Chromium through
Playwright (``lab.orchestrate.browser``, as ``lab.studies.firstpaint`` does), waits ``--settle``
seconds for every panel to draw, saves the whole page, and stops the dashboard it started.
The README's 60-worker picture is made this way::

    python -m crew.sim --n 60 --p 5 --bwd 2 --duration 50 --scheme crew --seed 1 --out R
    python -m lab.studies.simshot R --out docs/sim-dashboard-60.png
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from crew.cli_options import command_parser
from lab.orchestrate import browser

WIDTH = 1600  # wide enough for the 60-worker map and heat map side by side with the sidebar


def shoot(run: Path, out: Path, settle_s: float, wait_s: float = 60.0) -> None:
    port = browser.free_port()
    cmd = [sys.executable, "-m", "dashboard", str(run), "--port", str(port), "--host", "127.0.0.1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with browser.sync_playwright() as pw:
            chromium = browser.launch(pw)
            try:
                page = chromium.new_page(viewport={"width": WIDTH, "height": 1000})
                browser.open_dashboard(page, f"http://127.0.0.1:{port}", wait_s)
                page.wait_for_timeout(settle_s * 1000)
                browser.screenshot(page, out)
            finally:
                chromium.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("python -m lab.studies.simshot", __doc__)
    parser.add_argument("run", type=Path, help="the run directory (with lab.db)")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds to let panels draw")
    args = parser.parse_args(argv)
    if not (args.run / "lab.db").is_file():
        parser.error(f"{args.run}: no lab.db there")
    shoot(args.run, args.out, args.settle)
    print(f"screenshot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
