"""``python -m dashboard RUN [--port N] [--host H]``: serve the dashboard for one run.

Whoever reaches the page can cut links and kill workers, so it listens on loopback by default.
Bound beyond it, the controls need a token: ``--token`` (or ``CREW_DASHBOARD_TOKEN``), given in
the page's address as ``?token=...``; without the right one the page shows the run and no
controls. ``lab.run --dashboard-host`` makes one and prints the address with it.

``RUN`` is a run database or the directory that holds it: a lab run's ``runs/<id>`` (its
``lab.db``), or a ``crew.Averager`` job's ``CREW_RUN_DIR`` (rank 0's ``run.db``). Both are the
same SQLite schema (``crew.runtime.rundb``); a job's has no emulated links, so its network
panels stay empty while groups, plans and training fill in.

Replaces this process with ``streamlit run dashboard/app.py -- --run <database>`` so that
signals (Ctrl-C, the lab's shutdown) reach Streamlit directly.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from lab.orchestrate.commands import DASHBOARD_TOKEN_ENV, LOOPBACK_HOSTS

APP = Path(__file__).resolve().with_name("app.py")
DEFAULT_PORT = 8501
DEFAULT_HOST = "127.0.0.1"  # loopback: whoever reaches the page can cut links and kill workers
# What a run directory holds: a lab run's database, or a launched job's (crew.runtime.launch).
DB_NAMES = ("lab.db", "run.db")
TOKEN_ENV = DASHBOARD_TOKEN_ENV  # the app reads the controls' token from here


def find_db(run: Path) -> Path | None:
    """The run database ``run`` names: the file itself, or the first of ``DB_NAMES`` in the
    directory; None if there is none."""
    if run.is_dir():
        return next((run / name for name in DB_NAMES if (run / name).is_file()), None)
    return run if run.is_file() else None


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
    parser.add_argument(
        "run",
        type=Path,
        help="a run database, or its directory: a lab run's runs/<id> (lab.db) or a"
        " crew.Averager job's CREW_RUN_DIR (run.db)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help="the controls need ?token=TOKEN in the page's address (default: $"
        + TOKEN_ENV
        + "); required when --host is not loopback",
    )
    args = parser.parse_args(argv)
    if args.host not in LOOPBACK_HOSTS and not args.token:
        parser.error(
            f"--host {args.host} lets other machines reach the controls: give --token (or"
            f" {TOKEN_ENV}), which the page's address must carry as ?token=..."
        )
    db = find_db(args.run)
    if db is None:
        looked = " or ".join(str(args.run / n) for n in DB_NAMES) if args.run.is_dir() else args.run
        parser.error(f"no run database at {looked}")
    if not 0 < args.port < 65536:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    if importlib.util.find_spec("streamlit") is None:  # say so here, not in Streamlit's stead
        parser.error("streamlit is not installed: pip install 'crew-lab[dashboard]'")
    cmd = streamlit_argv(db.resolve(), args.port, args.host)
    os.environ.pop(TOKEN_ENV, None)  # Streamlit inherits this environment
    if args.token:
        os.environ[TOKEN_ENV] = args.token
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
