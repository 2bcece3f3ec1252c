"""The run database: one SQLite file per run, ``runs/<run-id>/lab.db``.

Everything a run records goes here, and the dashboard, the audit and the benchmark read only
this. SQLite in WAL mode lets the coordinator, the link monitor and the lab's command applier
write while the dashboard reads. All times are Unix epoch seconds (float).

Schema (see ``SCHEMA``):

``meta(key, value)``
    run_id, started_at, ended_at, scheme, p, topology (YAML text), config (JSON: a launched
    job's RunConfig, ``crew.runtime.launch``); the coordinator adds ``plan_costs`` (JSON, when
    it stops: each group's planning wait, ``crew.runtime.planahead.costs_json``).
``workers(id, name, cloud, address)``
    one row per worker; ``address`` is the identity address peers use.
``links(src, dst, rate_mbit, delay_ms, jitter_ms, loss_pct, intf)``
    every directed link as configured at start; ``intf`` is the sender-side interface.
``link_state(id, t, src, dst, rate_mbit, up, reason)``
    every change of a link at run time (rate change, cut, restore); the newest row per link wins.
``link_samples(t, src, dst, tx_bytes, mbit)``
    1 Hz samples of the sender interface's byte counter (cumulative) and the rate over the last
    interval in Mbit/s.
``groups(id, scheme, members, weights, formed_at, started_at, ended_at, status, bytes,
predicted_s, bound_s, plan, reason, revisions, verify_err, formed_by)``
    every group; ``members``/``weights``/``plan`` are JSON; ``status`` is one of
    ``open``, ``completed``, ``abandoned``; ``bytes`` is what the plans of all its revisions
    put on the links (payload, without headers); ``revisions`` counts re-plans after faults;
    ``verify_err`` is the relative error of the result check (``crew.control.verify``), NULL when
    the group did not complete. ``formed_by``: why the quorum rule closed the group at its
    size (``beyond``, ``window``, ``cap`` or ``quorum``; ``crew.control.quorum``), NULL with a
    fixed p.
``group_members(group_id, worker, iteration, staleness, weight)``
    who was in each group, with the local iteration its update came from.
``iterations(t, worker, iteration, loss, accuracy)``
    per-worker training progress; ``accuracy`` is held-out accuracy, NULL when not evaluated.
``utilisation(t, worker, compute_s, ready_s, group_s, stalled_s, wan_bytes)``
    each worker's wall time so far split into computing and waiting
    (``crew.control.utilisation``), cumulative, every few seconds; ``wan_bytes`` is what its
    transport has sent (wire bytes).
``worker_status(worker, state, iteration, group_id, updated_at, pid)``
    the newest state of each worker (``training``, ``ready``, ``reducing``, ``dead``, ...).
``worker_states(t, worker, state, iteration, group_id)``
    every change of ``worker_status``, in order: the history that replay shows.
``events(id, t, level, kind, worker, message, data)``
    the event log: start, stop, warnings, faults, recoveries; ``data`` is JSON.
``commands(id, t, kind, args, status, reason, applied_at)``
    what the dashboard (or a scenario) asks the lab to do; ``status`` is ``pending``,
    ``applied`` or ``rejected`` with ``reason``.
"""

from __future__ import annotations

import enum
import json
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from crew.config import Scheme
from crew.control.grouping import GroupStatus as GroupStatus
from crew.control.grouping import WorkerState as WorkerState
from crew.control.utilisation import TimeSplit
from crew.runtime import retention
from crew.runtime.retention import RetentionPolicy


class CommandStatus(enum.StrEnum):
    """A command's ``commands.status``: pending until the lab applies or rejects it."""

    PENDING = "pending"
    APPLIED = "applied"
    REJECTED = "rejected"


SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workers (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, cloud TEXT NOT NULL, address TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS links (
    src INTEGER NOT NULL, dst INTEGER NOT NULL, rate_mbit REAL NOT NULL,
    delay_ms REAL NOT NULL DEFAULT 0, jitter_ms REAL NOT NULL DEFAULT 0,
    loss_pct REAL NOT NULL DEFAULT 0, intf TEXT, PRIMARY KEY (src, dst));
CREATE TABLE IF NOT EXISTS link_state (
    id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL, src INTEGER NOT NULL,
    dst INTEGER NOT NULL, rate_mbit REAL NOT NULL, up INTEGER NOT NULL, reason TEXT);
CREATE INDEX IF NOT EXISTS link_state_link ON link_state (src, dst, id);
CREATE TABLE IF NOT EXISTS link_samples (
    t REAL NOT NULL, src INTEGER NOT NULL, dst INTEGER NOT NULL,
    tx_bytes INTEGER NOT NULL, mbit REAL NOT NULL);
CREATE INDEX IF NOT EXISTS link_samples_t ON link_samples (t);
CREATE INDEX IF NOT EXISTS link_samples_link ON link_samples (src, dst, t);
CREATE TABLE IF NOT EXISTS groups (
    id INTEGER PRIMARY KEY, scheme TEXT NOT NULL, members TEXT NOT NULL,
    weights TEXT NOT NULL, formed_at REAL NOT NULL, started_at REAL, ended_at REAL,
    status TEXT NOT NULL DEFAULT '{GroupStatus.OPEN}', bytes INTEGER NOT NULL DEFAULT 0,
    predicted_s REAL, bound_s REAL, plan TEXT, reason TEXT, revisions INTEGER NOT NULL DEFAULT 0,
    verify_err REAL, formed_by TEXT);
CREATE INDEX IF NOT EXISTS groups_formed ON groups (formed_at);
CREATE INDEX IF NOT EXISTS groups_status ON groups (status);
CREATE TABLE IF NOT EXISTS group_members (
    group_id INTEGER NOT NULL, worker INTEGER NOT NULL, iteration INTEGER NOT NULL,
    staleness INTEGER NOT NULL DEFAULT 1, weight REAL NOT NULL,
    PRIMARY KEY (group_id, worker));
CREATE INDEX IF NOT EXISTS group_members_worker ON group_members (worker, group_id);
CREATE TABLE IF NOT EXISTS iterations (
    t REAL NOT NULL, worker INTEGER NOT NULL, iteration INTEGER NOT NULL,
    loss REAL, accuracy REAL);
CREATE INDEX IF NOT EXISTS iterations_t ON iterations (t);
CREATE INDEX IF NOT EXISTS iterations_worker ON iterations (worker, t);
CREATE TABLE IF NOT EXISTS utilisation (
    t REAL NOT NULL, worker INTEGER NOT NULL, compute_s REAL NOT NULL, ready_s REAL NOT NULL,
    group_s REAL NOT NULL, stalled_s REAL NOT NULL, wan_bytes INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS utilisation_worker ON utilisation (worker, t);
CREATE TABLE IF NOT EXISTS worker_status (
    worker INTEGER PRIMARY KEY, state TEXT NOT NULL, iteration INTEGER NOT NULL DEFAULT 0,
    group_id INTEGER, updated_at REAL NOT NULL, pid INTEGER);
CREATE TABLE IF NOT EXISTS worker_states (
    t REAL NOT NULL, worker INTEGER NOT NULL, state TEXT NOT NULL, iteration INTEGER,
    group_id INTEGER);
CREATE INDEX IF NOT EXISTS worker_states_worker ON worker_states (worker, t);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL, level TEXT NOT NULL,
    kind TEXT NOT NULL, worker INTEGER, message TEXT NOT NULL, data TEXT);
CREATE INDEX IF NOT EXISTS events_t ON events (t);
CREATE TABLE IF NOT EXISTS commands (
    id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL, kind TEXT NOT NULL,
    args TEXT NOT NULL, status TEXT NOT NULL DEFAULT '{CommandStatus.PENDING}', reason TEXT,
    applied_at REAL);
CREATE INDEX IF NOT EXISTS commands_status ON commands (status, id);
"""

TABLES = frozenset(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", SCHEMA))
BUSY_TIMEOUT_S = 10.0
GROUP_LOOKBACK_S = 3600.0
"""No group stays open longer (its deadline abandons it first): readers of a window of groups
find them through the formation index from this far before the window."""


# -- typed rows: what the writes below take, one per table, fields in the table's column order.
# Immutable named tuples rather than dataclasses: the simulator writes 10^5 samples at once, and a
# tuple goes to sqlite3 as it is.


class WorkerRow(NamedTuple):
    id: int
    name: str
    cloud: str
    address: str


class LinkRow(NamedTuple):
    src: int
    dst: int
    rate_mbit: float
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0


class LinkStateRow(NamedTuple):
    t: float
    src: int
    dst: int
    rate_mbit: float
    up: bool
    reason: str | None


class LinkSampleRow(NamedTuple):
    t: float
    src: int
    dst: int
    tx_bytes: int
    mbit: float


class IterationRow(NamedTuple):
    t: float
    worker: int
    iteration: int
    loss: float | None
    accuracy: float | None


class UtilisationRow(NamedTuple):
    t: float
    worker: int
    compute_s: float
    ready_s: float
    group_s: float
    stalled_s: float
    wan_bytes: int

    @property
    def split(self) -> TimeSplit:
        return TimeSplit(self.compute_s, self.ready_s, self.group_s, self.stalled_s)


class EventRow(NamedTuple):
    t: float
    level: str
    kind: str
    worker: int | None
    message: str
    data: Mapping[str, Any] | None = None


class GroupRow(NamedTuple):
    """A ``groups`` row as first written; ``members``/``weights`` as JSON, ``id`` None: next."""

    id: int | None
    scheme: str
    members: str
    weights: str
    formed_at: float
    started_at: float | None
    ended_at: float | None = None
    status: str = GroupStatus.OPEN
    bytes: int = 0
    predicted_s: float | None = None
    bound_s: float | None = None
    plan: str | None = None
    reason: str | None = None
    formed_by: str | None = None


class GroupMemberRow(NamedTuple):
    """A ``group_members`` row (its ``group_id`` first)."""

    group_id: int
    worker: int
    iteration: int
    staleness: int
    weight: float


class WorkerStatusRow(NamedTuple):
    worker: int
    state: str
    iteration: int
    group_id: int | None
    updated_at: float


def _insert_sql(table: str, row_type: type[tuple], *, replace: bool = False) -> str:
    """The INSERT of one row type: its fields name the columns, in order."""
    cols: tuple[str, ...] = row_type._fields  # type: ignore[attr-defined]
    verb = "INSERT OR REPLACE" if replace else "INSERT"
    return f"{verb} INTO {table} ({', '.join(cols)}) VALUES ({','.join('?' * len(cols))})"


def _json_lists(members: Sequence[int], weights: Sequence[float]) -> tuple[str, str]:
    return json.dumps(list(members)), json.dumps(list(weights))


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def insert_rows(
    conn: sqlite3.Connection,
    table: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    replace: bool = False,
) -> None:
    """Insert raw rows of ``columns`` into ``table`` (a replay of another run's rows);
    ``replace``: a row whose key is taken replaces the one there."""
    if table not in TABLES or not all(c.isidentifier() for c in columns):
        raise ValueError(f"not a run database table and columns: {table} {list(columns)}")
    marks = ", ".join("?" * len(columns))
    verb = "INSERT OR REPLACE" if replace else "INSERT"
    conn.executemany(f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)


def connect(path: str | Path, *, readonly: bool = False) -> sqlite3.Connection:
    """Open the run database. Writers create the schema; readers never write."""
    path = Path(path)
    if readonly:
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False
        )
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(SCHEMA)
        _add_missing_columns(conn)
    conn.row_factory = sqlite3.Row
    return conn


@contextmanager
def reading(path: str | Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to the run database (:func:`connect`), closed on leaving."""
    conn = connect(path, readonly=True)
    try:
        yield conn
    finally:
        conn.close()


# Columns added since a table was first shipped: a database written before gains them when a
# writer opens it (CREATE TABLE IF NOT EXISTS leaves an existing table as it is).
ADDED_COLUMNS = (("groups", "formed_by", "TEXT"),)


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    for table, column, decl in ADDED_COLUMNS:
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")


def latest_utilisation(
    conn: sqlite3.Connection, asof: float | None = None
) -> dict[int, UtilisationRow]:
    """Each worker's newest ``utilisation`` row (at or before ``asof``): its cumulative time
    split. Empty for runs that recorded none (older databases, Gloo and benchmark workers)."""
    try:
        rows = conn.execute(
            "SELECT u.* FROM utilisation u JOIN (SELECT worker, MAX(t) AS t FROM utilisation"
            " WHERE t <= ? GROUP BY worker) m ON u.worker = m.worker AND u.t = m.t"
            " ORDER BY u.worker",
            (float("inf") if asof is None else asof,),
        ).fetchall()
    except sqlite3.OperationalError:  # a database written before the table existed
        return {}
    return {int(r[1]): UtilisationRow(*r) for r in rows}


class RunDB:
    """A thread-safe writer for one run database.

    Each process that writes (lab, coordinator) holds one ``RunDB``; a lock serialises its
    threads, and SQLite's WAL plus the busy timeout serialise the processes.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._conn = connect(self.path)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def execute(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Cursor:
        with self._lock, self._conn:
            return self._conn.execute(sql, tuple(params))

    def executemany(self, sql: str, rows: Iterable[Iterable[Any]]) -> None:
        with self._lock, self._conn:
            self._conn.executemany(sql, [tuple(r) for r in rows])

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, tuple(params)).fetchall()

    def compact(self, policy: RetentionPolicy, now: float | None = None) -> dict[str, int]:
        """Downsample the time series older than the policy's full-resolution window
        (``crew.runtime.retention``); returns the rows removed per table."""
        with self._lock:
            return retention.compact(self._conn, policy, time.time() if now is None else now)

    # -- the writes every part of the lab shares -------------------------------------------

    def _insert(
        self, table: str, row_type: type[tuple], rows: Iterable[tuple], *, replace: bool = False
    ) -> None:
        """Insert ``rows`` of a row type above into ``table``."""
        self.executemany(_insert_sql(table, row_type, replace=replace), rows)

    def add_workers(self, rows: Iterable[WorkerRow]) -> None:
        """Insert (or replace) workers by id."""
        self._insert("workers", WorkerRow, rows, replace=True)

    def add_links(self, rows: Iterable[LinkRow]) -> None:
        """Insert (or replace) links as configured at start; ``intf`` is set apart."""
        self._insert("links", LinkRow, rows, replace=True)

    def set_link_intfs(self, intfs: Mapping[tuple[int, int], str]) -> None:
        """Record each link's sender-side interface, once the mesh exists."""
        self.executemany(
            "UPDATE links SET intf=? WHERE src=? AND dst=?",
            [(intf, src, dst) for (src, dst), intf in intfs.items()],
        )

    def add_link_states(self, rows: Iterable[LinkStateRow]) -> None:
        self._insert("link_state", LinkStateRow, rows)

    def add_link_samples(self, rows: Iterable[LinkSampleRow]) -> None:
        self._insert("link_samples", LinkSampleRow, rows)

    def add_iterations(self, rows: Iterable[IterationRow]) -> None:
        self._insert("iterations", IterationRow, rows)

    def add_utilisation(self, rows: Iterable[UtilisationRow]) -> None:
        self._insert("utilisation", UtilisationRow, rows)

    def add_events(self, rows: Iterable[EventRow]) -> None:
        self._insert(
            "events",
            EventRow,
            [(r.t, r.level, r.kind, r.worker, r.message, _json(r.data)) for r in rows],
        )

    def open_group(
        self,
        group_id: int,
        *,
        scheme: Scheme,
        members: Sequence[int],
        weights: Sequence[float],
        formed_at: float,
        started_at: float,
        predicted_s: float | None,
        bound_s: float | None,
        plan_json: str | None,
        member_rows: Iterable[GroupMemberRow],
        formed_by: str | None = None,
    ) -> None:
        """A planned group starts: its row (status open) and its members, in one transaction."""
        row = GroupRow(
            group_id,
            scheme,
            *_json_lists(members, weights),
            formed_at,
            started_at,
            predicted_s=predicted_s,
            bound_s=bound_s,
            plan=plan_json,
            formed_by=formed_by,
        )
        with self._lock, self._conn:
            self._conn.execute(_insert_sql("groups", GroupRow), row)
            self._conn.executemany(_insert_sql("group_members", GroupMemberRow), member_rows)

    def add_closed_group(
        self,
        *,
        group_id: int | None,
        scheme: Scheme,
        members: Sequence[int],
        weights: Sequence[float],
        formed_at: float,
        started_at: float | None,
        ended_at: float,
        status: GroupStatus,
        bytes_moved: int = 0,
        reason: str | None = None,
    ) -> None:
        """A group that is over when first written: abandoned unplanned, or an all-reduce round
        (``group_id`` None: the next id)."""
        row = GroupRow(
            group_id,
            scheme,
            *_json_lists(members, weights),
            formed_at,
            started_at,
            ended_at,
            status,
            bytes_moved,
            reason=reason,
        )
        self._insert("groups", GroupRow, [row])

    def close_group(
        self,
        group_id: int,
        *,
        ended_at: float,
        status: GroupStatus,
        bytes_moved: int,
        reason: str | None,
        members: Sequence[int],
        weights: Sequence[float],
        plan_json: str | None,
        revisions: int,
        verify_err: float | None,
        dropped: Sequence[int] = (),
    ) -> None:
        """An open group ends; members ``dropped`` during its revisions leave ``group_members``."""
        with self._lock, self._conn:
            self._conn.execute(
                "UPDATE groups SET ended_at=?, status=?, bytes=?, reason=?, members=?, weights=?,"
                " plan=?, revisions=?, verify_err=? WHERE id=?",
                (
                    ended_at,
                    status,
                    bytes_moved,
                    reason,
                    *_json_lists(members, weights),
                    plan_json,
                    revisions,
                    verify_err,
                    group_id,
                ),
            )
            if dropped:
                self._conn.execute(
                    f"DELETE FROM group_members WHERE group_id=? AND worker IN"
                    f" ({','.join('?' * len(dropped))})",
                    (group_id, *dropped),
                )

    def abandon_open_groups(self, *, ended_at: float, reason: str) -> list[int]:
        """Mark every open group abandoned (a restarted coordinator); return their ids."""
        with self._lock, self._conn:
            ids = [
                int(r[0])
                for r in self._conn.execute(
                    "SELECT id FROM groups WHERE status=?", (GroupStatus.OPEN.value,)
                )
            ]
            self._conn.executemany(
                "UPDATE groups SET status=?, ended_at=?, reason=? WHERE id=?",
                [(GroupStatus.ABANDONED.value, ended_at, reason, gid) for gid in ids],
            )
        return ids

    def set_worker_statuses(self, rows: Iterable[WorkerStatusRow]) -> None:
        """Overwrite the newest states without a history row (a replayed run's final states)."""
        self._insert("worker_status", WorkerStatusRow, rows, replace=True)  # pid: NULL

    def add_command(self, kind: str, args: Mapping[str, Any], *, t: float | None = None) -> int:
        """Append a pending command; return its id."""
        cur = self.execute(
            "INSERT INTO commands (t, kind, args, status) VALUES (?,?,?,?)",
            (
                time.time() if t is None else t,
                kind,
                json.dumps(dict(args)),
                CommandStatus.PENDING.value,
            ),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def settle_command(
        self, command_id: int, status: CommandStatus, reason: str, *, t: float | None = None
    ) -> None:
        """A command was applied or rejected (``reason``: what was done, or why not)."""
        self.execute(
            "UPDATE commands SET status=?, reason=?, applied_at=? WHERE id=?",
            (status.value, reason, time.time() if t is None else t, command_id),
        )

    def set_meta(self, values: Mapping[str, Any]) -> None:
        rows = [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in values.items()]
        self.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", rows)

    def event(
        self,
        kind: str,
        message: str,
        *,
        level: str = "info",
        worker: int | None = None,
        data: Mapping[str, Any] | None = None,
        t: float | None = None,
    ) -> None:
        self.execute(
            "INSERT INTO events (t, level, kind, worker, message, data) VALUES (?,?,?,?,?,?)",
            (
                time.time() if t is None else t,
                level,
                kind,
                worker,
                message,
                None if data is None else json.dumps(data),
            ),
        )

    def set_worker_status(
        self,
        worker: int,
        state: str,
        *,
        iteration: int | None = None,
        group_id: int | None = None,
        pid: int | None = None,
        t: float | None = None,
    ) -> None:
        """Set a worker's newest state (``worker_status``) and append it to its history
        (``worker_states``), in one transaction; ``iteration`` and ``pid`` keep their previous
        values when not given."""
        now = time.time() if t is None else t
        with self._lock, self._conn:
            self._conn.execute(
                "INSERT INTO worker_status (worker, state, iteration, group_id, updated_at, pid)"
                " VALUES (?, ?, COALESCE(?, 0), ?, ?, ?)"
                " ON CONFLICT(worker) DO UPDATE SET state=excluded.state,"
                " iteration=COALESCE(?, worker_status.iteration), group_id=excluded.group_id,"
                " updated_at=excluded.updated_at, pid=COALESCE(excluded.pid, worker_status.pid)",
                (worker, state, iteration, group_id, now, pid, iteration),
            )
            self._conn.execute(
                "INSERT INTO worker_states (t, worker, state, iteration, group_id)"
                " SELECT updated_at, worker, state, iteration, group_id FROM worker_status"
                " WHERE worker = ?",
                (worker,),
            )
