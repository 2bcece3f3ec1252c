"""``python -m dashboard runs/<id> [--port N] [--host H]``: serve the dashboard for one run.

Replaces this process with ``streamlit run dashboard/app.py -- --run <run>`` so that signals
(Ctrl-C, the lab's shutdown) reach Streamlit directly.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

APP = Path(__file__).resolve().with_name("app.py")
DEFAULT_PORT = 8501
DEFAULT_HOST = "127.0.0.1"  # loopback: whoever reaches the page can cut links and kill workers


def streamlit_argv(run: Path, port: int, host: str) -> list[str]:
    """The argv that serves ``run``; headless, with usage statistics off (no internet here)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        # A lab page, not a development server: no "Deploy" button, no reruns on file edits.
        "--client.toolbarMode",
        "viewer",
        "--server.fileWatcherType",
        "none",
        "--",
        "--run",
        str(run),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dashboard", description=__doc__)
    parser.add_argument("run", type=Path, help="the run directory (runs/<id>) or its lab.db")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--host", default=DEFAULT_HOST)
    args = parser.parse_args(argv)
    db = args.run / "lab.db" if args.run.is_dir() else args.run
    if not db.is_file():
        parser.error(f"no run database at {db}")
    if not 0 < args.port < 65536:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    cmd = streamlit_argv(args.run.resolve(), args.port, args.host)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
