"""Export a run's database as CSV: ``python -m lab.export runs/<id> --csv DIR``.

One file per table of ``runs/<id>/lab.db`` (``groups.csv``, ``link_samples.csv``, ...), with a
header row of the column names and every row in primary-key (or insertion) order, so that a
spreadsheet, pandas or R sees exactly what the dashboard and the audit read. JSON columns
(``members``, ``plan``, ``data``, ...) stay JSON text. The database is opened read-only, so a
run that is still going can be exported too (what is committed so far).

Errors: a run directory without ``lab.db``, a file that is not a run database, or an output
directory that exists and is not empty (without ``--overwrite``) exit with status 2 and a
message naming the path; nothing is written in those cases.
"""

from __future__ import annotations

import argparse
import csv
import io
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from crew.cli_options import command_parser
from crew.runtime.rundb import connect, reading


class ExportError(Exception):
    """The run cannot be exported; the message names the path and the problem."""


def run_db_path(run: Path) -> Path:
    """``run`` may be the run directory or its ``lab.db``."""
    path = run / "lab.db" if run.is_dir() else run
    if not path.is_file():
        raise ExportError(f"{run}: no run database (expected {path})")
    return path


def tables(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        " ORDER BY name"
    ).fetchall()
    return [r[0] for r in rows]


def export_csv(run: Path, out: Path, *, overwrite: bool = False) -> dict[str, int]:
    """Write one CSV per table of ``run``'s database into ``out``; returns rows per table."""
    path = run_db_path(run)
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out}: not empty (use --overwrite to replace its CSV files)")
    try:
        conn = connect(path, readonly=True)
        names = tables(conn)
    except sqlite3.DatabaseError as exc:
        raise ExportError(f"{path}: not a readable run database ({exc})") from None
    if "groups" not in names or "meta" not in names:
        conn.close()
        raise ExportError(f"{path}: not a run database (no groups or meta table)")
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    try:
        for name in names:
            with open(out / f"{name}.csv", "w", newline="", encoding="utf-8") as fh:
                counts[name] = write_table(conn, name, fh)
    finally:
        conn.close()
    return counts


def write_table(conn: sqlite3.Connection, name: str, fh: TextIO) -> int:
    """Write table ``name`` as CSV (header, then rows in rowid order); returns the row count."""
    if name not in tables(conn):
        raise ExportError(f"no table {name!r} in this run database")
    cur = conn.execute(f'SELECT * FROM "{name}" ORDER BY rowid')
    writer = csv.writer(fh)
    writer.writerow([d[0] for d in cur.description])
    n = 0
    for row in cur:
        writer.writerow(["" if v is None else v for v in row])
        n += 1
    return n


def table_csv(db: Path, name: str) -> str:
    """Table ``name`` of the run database at ``db`` as CSV text, from a connection of its own
    (the dashboard's download buttons call this on a thread of their own)."""
    with reading(db) as conn:
        buf = io.StringIO()
        write_table(conn, name, buf)
        return buf.getvalue()


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "python -m lab.export",
        "Export a run's database (runs/<id>/lab.db) as one CSV file per table.",
    )
    parser.add_argument("run", type=Path, help="the run directory (runs/<id>) or its lab.db")
    parser.add_argument(
        "--csv", type=Path, required=True, metavar="DIR", help="directory to write the CSV files"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace CSV files in a non-empty DIR"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        counts = export_csv(args.run, args.csv, overwrite=args.overwrite)
    except ExportError as exc:
        print(f"lab.export: {exc}", file=sys.stderr)
        return 2
    width = max(len(n) for n in counts)
    for name, n in counts.items():
        print(f"{name:<{width}}  {n:>8} rows  -> {args.csv / (name + '.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
