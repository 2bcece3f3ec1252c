"""Every SQL statement the dashboard runs, each returning a pandas DataFrame.

All reads take an ``asof`` time (Unix seconds): a live page passes "now", a replay passes the
slider's time, and every panel then shows the run as it was at that moment. Statements are
parameterised and shaped for the indexes in ``crew.runtime.rundb``: time ranges on
``link_samples_t``,
``iterations_t``, ``events_t`` and ``groups_formed``; per-link lookups on ``link_state_link``.

The two tables that grow with the run's length (``link_samples``: n·(n−1) rows a second;
``iterations``) are read through ``WindowCache``, which keeps what it has read and only asks for
rows newer than the last it saw, so a refresh of a 30-minute run reads seconds of rows, not
minutes.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from dataclasses import dataclass
from typing import Any

import pandas as pd
import yaml

from crew.runtime.rundb import GROUP_LOOKBACK_S, GroupStatus, WorkerState, latest_utilisation

log = logging.getLogger(__name__)

MEMBERSHIP_WINDOW_S = 3600.0  # rounds and staleness panels: the last hour of the run
LINK_SAMPLE_COLUMNS = ["t", "src", "dst", "mbit"]
ITERATION_COLUMNS = ["t", "worker", "iteration", "loss", "accuracy"]
GROUP_COLUMNS = [
    "id",
    "scheme",
    "members",
    "formed_at",
    "started_at",
    "ended_at",
    "status",
    "bytes",
    "predicted_s",
    "bound_s",
    "plan",
    "reason",
]


def _frame(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...], columns: list[str]):
    rows = conn.execute(sql, params).fetchall()
    return pd.DataFrame([tuple(r) for r in rows], columns=columns)


# -- run-level facts -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunInfo:
    """The header facts of a run, from ``meta`` and ``workers``."""

    run_id: str
    topology: str
    scheme: str
    p: int | None
    started_at: float | None
    ended_at: float | None
    n: int
    simulated: bool = False  # written by crew.sim, not by a lab

    @property
    def live(self) -> bool:
        return self.ended_at is None


def meta(conn: sqlite3.Connection) -> dict[str, str]:
    return {r[0]: r[1] for r in conn.execute("SELECT key, value FROM meta").fetchall()}


def workload(conn: sqlite3.Connection) -> str:
    """The run's workload, ``mlp`` or ``lm`` (lab.run's options in meta; ``mlp`` if absent)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'options'").fetchone()
    try:
        return str(json.loads(row[0]).get("workload", "mlp")) if row else "mlp"
    except (ValueError, TypeError, AttributeError):
        return "mlp"


def _number(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        return float(json.loads(raw))
    except (ValueError, TypeError):
        return None


def _topology_name(text: str | None) -> str:
    """The ``name`` in the topology text (YAML, or JSON which YAML also reads), else its first
    line; used when meta has no ``topology_name``."""
    if not text:
        return "?"
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = None
    if isinstance(doc, dict) and doc.get("name"):
        return str(doc["name"])
    return text.strip().splitlines()[0][:60]


def run_info(conn: sqlite3.Connection) -> RunInfo:
    m = meta(conn)
    n = int(conn.execute("SELECT COUNT(*) FROM workers").fetchone()[0])
    p = _number(m.get("p"))
    scheme = m.get("scheme", "?")
    # RunDB.set_meta JSON-encodes non-strings only, so a scheme may arrive either way.
    if scheme.startswith('"'):
        scheme = json.loads(scheme)
    return RunInfo(
        run_id=m.get("run_id", "?"),
        topology=m.get("topology_name") or _topology_name(m.get("topology")),
        scheme=scheme,
        p=None if p is None else int(p),
        started_at=_number(m.get("started_at")),
        ended_at=_number(m.get("ended_at")),
        n=n,
        simulated=m.get("simulated") == "1",
    )


def data_span(conn: sqlite3.Connection) -> tuple[float, float] | None:
    """First and last sample time, for runs whose meta lacks started_at/ended_at.

    Two scalar subqueries, each one seek at an end of the time index: ``MIN(t), MAX(t)`` in
    one SELECT would read the whole index (a week-long run holds a million samples)."""
    row = conn.execute(
        "SELECT (SELECT MIN(t) FROM link_samples), (SELECT MAX(t) FROM link_samples)"
    ).fetchone()
    if row is None or row[0] is None:
        return None
    return float(row[0]), float(row[1])


def workers(conn: sqlite3.Connection) -> pd.DataFrame:
    return _frame(
        conn,
        "SELECT id, name, cloud, address FROM workers ORDER BY id",
        (),
        ["id", "name", "cloud", "address"],
    )


def links(conn: sqlite3.Connection) -> pd.DataFrame:
    """The links as configured at start."""
    return _frame(
        conn,
        "SELECT src, dst, rate_mbit, delay_ms, loss_pct FROM links ORDER BY src, dst",
        (),
        ["src", "dst", "rate_mbit", "delay_ms", "loss_pct"],
    )


# -- links ---------------------------------------------------------------------------------------


def link_state_asof(conn: sqlite3.Connection, asof: float) -> pd.DataFrame:
    """The newest ``link_state`` row per link at or before ``asof`` (links never changed: none)."""
    return _frame(
        conn,
        "SELECT s.src, s.dst, s.t, s.rate_mbit, s.up, s.reason FROM link_state s"
        " JOIN (SELECT MAX(id) AS id FROM link_state WHERE t <= ? GROUP BY src, dst) n"
        " ON n.id = s.id",
        (asof,),
        ["src", "dst", "t", "rate_mbit", "up", "reason"],
    )


def link_state_history(conn: sqlite3.Connection, asof: float) -> pd.DataFrame:
    """Every link change up to ``asof``, oldest first (few rows: one per fault or reshape)."""
    return _frame(
        conn,
        "SELECT t, src, dst, rate_mbit, up FROM link_state WHERE t <= ? ORDER BY t, id",
        (asof,),
        ["t", "src", "dst", "rate_mbit", "up"],
    )


def latest_link_samples(conn: sqlite3.Connection, asof: float, horizon_s: float) -> pd.DataFrame:
    """The newest sample per link within ``horizon_s`` before ``asof``.

    A link with no sample in the horizon is absent (the monitor stopped seeing traffic or the
    run had not started), which the caller shows as 0 Mbit/s.
    """
    df = _frame(
        conn,
        "SELECT t, src, dst, mbit FROM link_samples WHERE t > ? AND t <= ? ORDER BY t",
        (asof - horizon_s, asof),
        LINK_SAMPLE_COLUMNS,
    )
    return df.groupby(["src", "dst"], as_index=False).last()


def link_samples(conn: sqlite3.Connection, start: float, end: float) -> pd.DataFrame:
    return _frame(
        conn,
        "SELECT t, src, dst, mbit FROM link_samples WHERE t > ? AND t <= ? ORDER BY t",
        (start, end),
        LINK_SAMPLE_COLUMNS,
    )


def iterations(conn: sqlite3.Connection, start: float, end: float) -> pd.DataFrame:
    return _frame(
        conn,
        "SELECT t, worker, iteration, loss, accuracy FROM iterations"
        " WHERE t > ? AND t <= ? ORDER BY t",
        (start, end),
        ITERATION_COLUMNS,
    )


class WindowCache:
    """A time window of a growing table, read incrementally.

    ``read(conn, start, end)`` returns the rows with ``start < t <= end``. When the new window
    extends the cached one forward, only rows after the cached end (less ``overlap_s``, to catch
    rows a writer committed late with slightly older timestamps) are fetched; anything else (a
    replay slider moved backwards, a wider window) refetches the whole window. Duplicates from
    the overlap are dropped on the table's natural key.
    """

    def __init__(self, fetch, key: list[str], *, overlap_s: float = 3.0):
        self._fetch = fetch
        self._key = key
        self._overlap_s = overlap_s
        self._start: float | None = None
        self._end: float | None = None
        self._frame: pd.DataFrame | None = None
        self.rows_fetched = 0  # for tests and benchmarks: what the last read cost

    def read(self, conn: sqlite3.Connection, start: float, end: float) -> pd.DataFrame:
        cached = self._frame is not None and self._start is not None and self._end is not None
        if cached and start >= self._start and end >= self._end:  # type: ignore[operator]
            since = max(start, self._end - self._overlap_s)  # type: ignore[operator]
            new = self._fetch(conn, since, end)
            self.rows_fetched = len(new)
            parts = [f for f in (self._frame, new) if not f.empty]
            frame = pd.concat(parts, ignore_index=True) if parts else new
            frame = frame.drop_duplicates(subset=self._key, keep="last")
            frame = frame[frame["t"] > start].sort_values("t", kind="stable")
        else:
            frame = self._fetch(conn, start, end)
            self.rows_fetched = len(frame)
        self._frame = frame.reset_index(drop=True)
        self._start, self._end = start, end
        return self._frame


def iteration_bins(
    conn: sqlite3.Connection,
    t0: float,
    start: float,
    end: float,
    bin_s: float,
    *,
    split_evaluations: bool = False,
) -> pd.DataFrame:
    """``iterations`` in ``(start, end]`` folded into one row per worker and ``bin_s`` bin
    (bins counted from ``t0``): the mean ``t``, ``loss`` and ``accuracy`` and the last
    ``iteration``. A long run's training curves are drawn from these, so the page reads a few
    thousand rows instead of every row the run kept. ``split_evaluations``: evaluation rows
    (``accuracy`` set) fold apart from training rows, for workloads whose evaluation rows carry
    a different loss (``lm``)."""
    split = ", accuracy IS NULL" if split_evaluations else ""
    return _frame(
        conn,
        "SELECT AVG(t), worker, MAX(iteration), AVG(loss), AVG(accuracy) FROM iterations"
        f" WHERE t > ? AND t <= ? GROUP BY worker, CAST((t - ?) / ? AS INTEGER){split}"
        " ORDER BY 1",
        (start, end, t0, bin_s),
        ITERATION_COLUMNS,
    )


def latest_evaluations(conn: sqlite3.Connection, asof: float) -> pd.DataFrame:
    """Each worker's newest ``iterations`` row with an evaluation (``accuracy`` set) at or
    before ``asof``: one seek back from ``asof`` per worker through ``iterations_worker``."""
    return _frame(
        conn,
        "SELECT i.t, i.worker, i.iteration, i.loss, i.accuracy FROM workers w"
        " JOIN iterations i ON i.rowid = (SELECT rowid FROM iterations WHERE worker = w.id"
        " AND t <= ? AND accuracy IS NOT NULL ORDER BY t DESC LIMIT 1) ORDER BY i.worker",
        (asof,),
        ITERATION_COLUMNS,
    )


def link_sample_cache() -> WindowCache:
    return WindowCache(link_samples, ["t", "src", "dst"])


def iteration_cache() -> WindowCache:
    return WindowCache(iterations, ["t", "worker", "iteration"])


# -- groups --------------------------------------------------------------------------------------


def groups(conn: sqlite3.Connection, start: float, asof: float) -> pd.DataFrame:
    """Groups formed in ``(start, asof]`` plus any formed earlier and still open at ``asof``.

    Status and end are rewound to ``asof``: a group that ended later shows as ``open``.
    ``members`` is decoded to a list of worker ids.
    """
    cols = ", ".join(GROUP_COLUMNS)
    # Each part reads an index range, not the whole table (a week-long run holds millions of
    # groups): those formed in the window; those still open (by status); and those formed up
    # to GROUP_LOOKBACK_S before it that ended after ``asof`` (a replay's past).
    df = _frame(
        conn,
        f"SELECT {cols} FROM groups WHERE formed_at > ? AND formed_at <= ?"
        f" UNION SELECT {cols} FROM groups WHERE status = ? AND formed_at <= ?"
        f" UNION SELECT {cols} FROM groups WHERE formed_at > ? AND formed_at <= ?"
        " AND ended_at > ? ORDER BY id",
        (start, asof, GroupStatus.OPEN.value, start, start - GROUP_LOOKBACK_S, start, asof),
        GROUP_COLUMNS,
    )
    return rewind_groups(df, asof)


def rewind_groups(df: pd.DataFrame, asof: float) -> pd.DataFrame:
    """Show groups as they were at ``asof``: later endings become ``open``."""
    df = df.copy()
    later = df["ended_at"].notna() & (df["ended_at"] > asof)
    df.loc[later, "status"] = GroupStatus.OPEN.value
    df.loc[later, "ended_at"] = None
    df["members"] = [json.loads(m) if isinstance(m, str) else list(m) for m in df["members"]]
    return df


def latest_plans(conn: sqlite3.Connection, asof: float, limit: int) -> pd.DataFrame:
    """The newest ``limit`` groups that carry a plan, newest first."""
    df = _frame(
        conn,
        f"SELECT {', '.join(GROUP_COLUMNS)} FROM groups"
        " WHERE formed_at <= ? AND plan IS NOT NULL ORDER BY formed_at DESC LIMIT ?",
        (asof, limit),
        GROUP_COLUMNS,
    )
    return rewind_groups(df, asof)


def completed_memberships(
    conn: sqlite3.Connection, asof: float, window_s: float = MEMBERSHIP_WINDOW_S
) -> pd.DataFrame:
    """One row per (completed group, member) that ended in the ``window_s`` before ``asof``:
    rounds and staleness. Read through the groups' formation index, so a week-long run costs
    what its last window holds."""
    since = asof - window_s
    # "+g.status": not through the status index, which would read every completed group.
    return _frame(
        conn,
        "SELECT m.worker, m.group_id, g.ended_at, m.staleness, m.iteration"
        " FROM groups g JOIN group_members m ON m.group_id = g.id"
        " WHERE g.formed_at > ? AND g.formed_at <= ? AND +g.status = ?"
        " AND g.ended_at > ? AND g.ended_at <= ? ORDER BY g.ended_at",
        (since - GROUP_LOOKBACK_S, asof, GroupStatus.COMPLETED.value, since, asof),
        ["worker", "group_id", "ended_at", "staleness", "iteration"],
    )


ROUND_COLUMNS = ["worker", "minute", "rounds", "staleness_sum", "staleness_max"]


def completed_rounds(
    conn: sqlite3.Connection, t0: float, asof: float, window_s: float = MEMBERSHIP_WINDOW_S
) -> pd.DataFrame:
    """``completed_memberships`` counted in SQL: per worker and minute of the run (whole
    minutes of ``ended_at`` since ``t0``), the rounds it completed and the sum and maximum of
    their staleness. The rounds, staleness and rounds-per-minute charts need nothing more, and
    an hour of a busy run holds tens of thousands of memberships."""
    since = asof - window_s
    return _frame(
        conn,
        "SELECT m.worker, CAST((g.ended_at - ?) / 60.0 AS INTEGER) AS minute, COUNT(*),"
        " SUM(m.staleness), MAX(m.staleness)"
        " FROM groups g JOIN group_members m ON m.group_id = g.id"
        " WHERE g.formed_at > ? AND g.formed_at <= ? AND +g.status = ?"
        " AND g.ended_at > ? AND g.ended_at <= ? GROUP BY m.worker, minute"
        " ORDER BY m.worker, minute",
        (t0, since - GROUP_LOOKBACK_S, asof, GroupStatus.COMPLETED.value, since, asof),
        ROUND_COLUMNS,
    )


def compute_shares(conn: sqlite3.Connection, asof: float) -> pd.DataFrame:
    """Each worker's wall time at ``asof`` split into computing and waiting, in seconds
    (``crew.control.utilisation``); empty when the run recorded none."""
    rows = latest_utilisation(conn, asof).values()
    return pd.DataFrame(
        [(r.worker, r.compute_s, r.ready_s, r.group_s, r.stalled_s, r.wan_bytes) for r in rows],
        columns=["worker", "compute_s", "ready_s", "group_s", "stalled_s", "wan_bytes"],
    )


def worker_status(conn: sqlite3.Connection, asof: float | None = None) -> pd.DataFrame:
    """Every worker's state at ``asof`` (the newest, when None), ordered by worker.

    States come from the ``worker_states`` history, so a replay shows them as they were; a run
    recorded before that table existed has only the newest states, shown for any ``asof``.
    ``updated_at`` is when the worker entered its state: ready workers sorted by it are in the
    ready queue's FIFO order.
    """
    cols = ["worker", "state", "iteration", "group_id", "updated_at"]
    if _has_table(conn, "worker_states"):
        # One index seek per worker (worker, t), not a scan of every state a run recorded.
        return _frame(
            conn,
            "SELECT s.worker, s.state, s.iteration, s.group_id, s.t FROM"
            " (SELECT id AS worker FROM workers UNION SELECT worker FROM worker_status) w"
            " JOIN worker_states s ON s.rowid = (SELECT rowid FROM worker_states"
            " WHERE worker = w.worker AND t <= ? ORDER BY t DESC, rowid DESC LIMIT 1)"
            " ORDER BY s.worker",
            (float("inf") if asof is None else asof,),
            cols,
        )
    return _frame(
        conn,
        "SELECT worker, state, iteration, group_id, updated_at FROM worker_status ORDER BY worker",
        (),
        cols,
    )


def ready_in_fifo_order(status: pd.DataFrame) -> list[int]:
    """The ready workers in the order they became ready (the ready queue decides groups in it)."""
    ready = status[status["state"] == WorkerState.READY.value].sort_values(["updated_at", "worker"])
    return [int(w) for w in ready["worker"]]


def _has_table(conn: sqlite3.Connection, table: str) -> bool:
    """False for a database recorded before ``table`` existed (readers never add tables)."""
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    return row is not None


# -- log and commands ----------------------------------------------------------------------------


def events(conn: sqlite3.Connection, asof: float, limit: int) -> pd.DataFrame:
    """The newest ``limit`` events at or before ``asof``, newest first."""
    return _frame(
        conn,
        "SELECT id, t, level, kind, worker, message FROM events WHERE t <= ?"
        " ORDER BY t DESC, id DESC LIMIT ?",
        (asof, limit),
        ["id", "t", "level", "kind", "worker", "message"],
    )


def commands(conn: sqlite3.Connection, limit: int) -> pd.DataFrame:
    """The newest ``limit`` commands with their status, newest first."""
    return _frame(
        conn,
        "SELECT id, t, kind, args, status, reason, applied_at FROM commands"
        " ORDER BY id DESC LIMIT ?",
        (limit,),
        ["id", "t", "kind", "args", "status", "reason", "applied_at"],
    )
