"""How fast a run database grows over a long run, with and without retention.

``python -m lab.studies.dbgrowth runs/<id> --hours 24`` takes a real run's database (a
``lab.run`` of a few minutes on the topology of interest), and replays its rows of every table
that grows (link samples, iterations, groups and their members, worker states, events) end to
end, shifted in time, into a fresh database until ``--hours`` of run are written. Every simulated
minute it applies the retention policy as the lab's link monitor does, with the simulated clock.
It prints the file's size after each hour and the growth per hour over the last one; ``--out``
keeps the database (for example, to time the dashboard on a week-old run).

The replay keeps the source's row shapes and rates; the clock is the only thing made up.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from crew.cli_options import command_parser
from crew.runtime import rundb
from crew.runtime.retention import RetentionPolicy, compact

# Tables whose rows a run adds as it goes, with the columns that hold times and ids to shift.
_TIMES = {
    "link_samples": ("t",),
    "iterations": ("t",),
    "groups": ("formed_at", "started_at", "ended_at"),
    "group_members": (),
    "worker_states": ("t",),
    "events": ("t",),
    "utilisation": ("t",),
    "link_state": ("t",),
    "commands": ("t", "applied_at"),
}
# Tables written once at the start, copied as they are so that the grown database opens in the
# dashboard like the run it came from.
_STATIC = ("meta", "workers", "links", "worker_status")
_GROUP_ID = {"groups": "id", "group_members": "group_id", "worker_states": "group_id"}
_OWN_ID = ("events", "link_state", "commands")
CHUNK_S = 60.0  # one retention pass per simulated minute, as the link monitor does


@dataclass(frozen=True)
class Source:
    start: float
    period: float
    max_group: int
    rows: dict[str, tuple[tuple[str, ...], list[tuple[object, ...]]]]
    static: dict[str, tuple[tuple[str, ...], list[tuple[object, ...]]]]


def read_source(path: Path) -> Source:
    """Every growing table's rows from a finished run, and the span they cover."""
    with rundb.reading(path) as conn:
        t0, t1 = conn.execute("SELECT MIN(t), MAX(t) FROM link_samples").fetchone()
        if t0 is None or t1 - t0 < CHUNK_S:
            raise SystemExit(f"error: {path} holds under a minute of link samples to replay")
        rows, static = {}, {}
        for table in (*_TIMES, *_STATIC):
            cur = conn.execute(f"SELECT * FROM {table}")
            cols = tuple(d[0] for d in cur.description)
            (rows if table in _TIMES else static)[table] = (
                cols,
                [tuple(r) for r in cur.fetchall()],
            )
        max_group = conn.execute("SELECT COALESCE(MAX(id), 0) FROM groups").fetchone()[0]
    return Source(float(t0), float(t1 - t0) + 1.0, int(max_group), rows, static)


def _shifted(src: Source, table: str, cycle: int) -> tuple[list[str], list[tuple[object, ...]]]:
    cols, rows = src.rows[table]
    dt = cycle * src.period
    dg = cycle * src.max_group
    time_at = [cols.index(c) for c in _TIMES[table]]
    gid_at = cols.index(_GROUP_ID[table]) if table in _GROUP_ID else -1
    # Let SQLite number the rows of tables whose id is their own (not a group's).
    skip_id = cols.index("id") if table in _OWN_ID else -1
    out = []
    for r in rows:
        v = list(r)
        for i in time_at:
            if v[i] is not None:
                v[i] = float(v[i]) + dt  # type: ignore[arg-type]
        if gid_at >= 0 and v[gid_at] is not None:
            v[gid_at] = int(v[gid_at]) + dg  # type: ignore[call-overload]
        if skip_id >= 0:
            v.pop(skip_id)
        out.append(tuple(v))
    return [c for c in cols if not (table in _OWN_ID and c == "id")], out


def _size_mb(path: Path, conn: sqlite3.Connection) -> float:
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size / 1e6


def grow(src: Source, out: Path, hours: float, policy: RetentionPolicy | None) -> list[float]:
    """Write ``hours`` of replayed run into ``out``; the file's MB after each hour."""
    out.unlink(missing_ok=True)
    conn = rundb.connect(out)
    sizes: list[float] = []
    end = src.start + hours * 3600.0
    cycles = math.ceil(hours * 3600.0 / src.period)
    next_hour = src.start + 3600.0
    with conn:
        for table, (columns, rows) in src.static.items():
            rundb.insert_rows(conn, table, list(columns), rows, replace=True)
    for cycle in range(cycles):
        with conn:
            for table in _TIMES:
                columns, rows = _shifted(src, table, cycle)
                rundb.insert_rows(conn, table, columns, rows)
        now = src.start + (cycle + 1) * src.period
        if policy is not None:
            compact(conn, policy, now)
        while now >= next_hour and next_hour <= end:
            sizes.append(_size_mb(out, conn))
            print(f"  {len(sizes):4d} h: {sizes[-1]:8.1f} MB", flush=True)
            next_hour += 3600.0
    with conn:  # the run ended where the replay did
        rundb.insert_rows(conn, "meta", ("key", "value"), [("ended_at", str(end))], replace=True)
    conn.close()
    return sizes


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "python -m lab.studies.dbgrowth",
        "Replay a real run's rows for --hours of simulated run, applying the "
        "retention policy every simulated minute, and print the database's size per hour.",
    )
    p.add_argument("run", type=Path, help="a finished run's folder (with lab.db) to replay")
    p.add_argument("--hours", type=float, default=24.0, help="hours of run to write (24)")
    p.add_argument("--out", type=Path, default=None, help="keep the grown database here")
    p.add_argument("--no-retention", action="store_true", help="write every row as it came")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 1 <= args.hours <= 24 * 28:
        print(
            f"error: --hours must be in [1, 672] (sizes are per hour), got {args.hours}",
            file=sys.stderr,
        )
        return 2
    src = read_source(args.run / "lab.db")
    n_rows = {t: len(r) for t, (_, r) in src.rows.items()}
    print(f"source: {args.run}, {src.period:.0f} s of run; rows per second: ", end="")
    print(", ".join(f"{t} {n / src.period:.1f}" for t, n in n_rows.items()))
    out = args.out or Path(f"/tmp/dbgrowth-{time.time_ns()}.db")
    policy = None if args.no_retention else RetentionPolicy()
    started = time.monotonic()
    sizes = grow(src, out, args.hours, policy)
    last = sizes[-1] - sizes[-2] if len(sizes) > 1 else sizes[-1]
    print(
        f"{'no retention' if policy is None else 'default retention'}: {sizes[-1]:.1f} MB after "
        f"{len(sizes)} h; the last hour added {last:.1f} MB "
        f"(written in {time.monotonic() - started:.0f} s)"
    )
    if args.json:
        args.json.write_text(json.dumps({"mb_per_hour_last": last, "mb_after_hours": sizes}))
    if args.out is None:
        out.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
