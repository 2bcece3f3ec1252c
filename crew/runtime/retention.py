"""Retention of the run database's time series: recent rows at full resolution, older ones
downsampled, so a run's database grows by a stated rate instead of with every sample.

Three tables grow with a run's length at a fixed rate: ``link_samples`` (one row per directed
link per second), ``iterations`` (one row per worker per training step) and ``utilisation`` (one
row per worker every few seconds). A ``RetentionPolicy``
keeps the newest ``full_s`` seconds of each untouched and folds older rows into buckets: rows
older than ``full_s`` into one row per ``(link or worker, medium_step_s)`` bucket, and rows older
than ``medium_s`` into one per ``coarse_step_s`` bucket.

What a folded row holds, so that every reader's arithmetic stays right:

* ``link_samples``: the bucket's last ``t`` and ``tx_bytes`` (the counter is cumulative, so a
  difference between any two kept rows is still the bytes sent between them) and the bucket's
  mean ``mbit``;
* ``iterations``: the bucket's last ``t`` and ``iteration``, and the mean ``loss`` and
  ``accuracy`` over the rows that have one (``accuracy`` stays NULL when none was evaluated);
* ``utilisation``: the bucket's last row (its times and bytes are cumulative, like
  ``tx_bytes``).

Groups keep every row (the audit reads every group, its members and every state change), but
a group's ``plan`` (a few KB of JSON, most of a long run's bytes) is kept past ``full_s`` only
for the first group formed in each ``coarse_step_s``, so a replay still shows a recent plan at
any moment. Worker states, events and commands are never touched.

Cost model: a compaction pass reads and rewrites only the rows that crossed a tier boundary
since the last pass (progress is kept in ``meta``), so calling it once a minute costs one
minute's rows, not the run's.

Disk per hour of a long run, for ``L`` links (``n (n - 1)``) and the defaults, after the first
day: ``3600 / 60 * L`` link rows instead of ``3600 * L``, and 60 plans instead of one per group.
Rows whose plan is dropped are deleted and written again, so the pages they filled are freed
and reused instead of left holding a few bytes each.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass

from crew.control.grouping import GroupStatus


class RetentionError(ValueError):
    """A retention setting that cannot be honoured."""


@dataclass(frozen=True)
class RetentionPolicy:
    """How long rows stay at full resolution, and the buckets older rows fold into."""

    full_s: float = 3600.0
    """Newest seconds kept as written: the dashboard's live panels read at most this far back."""
    medium_step_s: float = 10.0
    """Bucket width for rows older than ``full_s``: a day's link plot still shows each minute."""
    medium_s: float = 86_400.0
    """Rows older than this fold into ``coarse_step_s`` buckets: a week plots at 1-minute steps."""
    coarse_step_s: float = 60.0
    """Bucket width for the oldest rows."""

    def __post_init__(self) -> None:
        for name in ("full_s", "medium_step_s", "medium_s", "coarse_step_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise RetentionError(f"retention {name} must be a positive number, got {value!r}")
        if self.medium_s <= self.full_s:
            raise RetentionError(
                f"retention medium_s ({self.medium_s:g}) must exceed full_s ({self.full_s:g})"
            )
        if self.coarse_step_s < self.medium_step_s:
            raise RetentionError(
                f"retention coarse_step_s ({self.coarse_step_s:g}) must be at least "
                f"medium_step_s ({self.medium_step_s:g})"
            )

    def tiers(self) -> tuple[tuple[float, float], ...]:
        """(age in seconds beyond which rows fold, bucket width), finest first."""
        return ((self.full_s, self.medium_step_s), (self.medium_s, self.coarse_step_s))


# Per table: the key a bucket is kept per, and the SELECT that folds one bucket's rows. SQLite
# takes a bare column of an aggregate query with a single MAX() from the row holding that max,
# which is how the last counter of each bucket is kept.
_FOLDS = {
    "link_samples": (
        "src, dst",
        "SELECT MAX(t), src, dst, tx_bytes, AVG(mbit) FROM link_samples "
        "WHERE t >= ? AND t < ? GROUP BY src, dst, CAST(t / ? AS INTEGER)",
    ),
    "iterations": (
        "worker",
        "SELECT MAX(t), worker, iteration, AVG(loss), AVG(accuracy) FROM iterations "
        "WHERE t >= ? AND t < ? GROUP BY worker, CAST(t / ? AS INTEGER)",
    ),
    "utilisation": (
        "worker",
        "SELECT MAX(t), worker, compute_s, ready_s, group_s, stalled_s, wan_bytes "
        "FROM utilisation WHERE t >= ? AND t < ? GROUP BY worker, CAST(t / ? AS INTEGER)",
    ),
}
TABLES = (*_FOLDS, "plans")


def _progress_key(table: str, step: float) -> str:
    return f"retention:{table}:{step:g}"


def compact(conn: sqlite3.Connection, policy: RetentionPolicy, now: float) -> dict[str, int]:
    """Fold the rows that crossed a tier boundary since the last call; return rows removed per
    table. Commits; safe to call from one writer while others read (WAL)."""
    removed = dict.fromkeys(TABLES, 0)
    with conn:
        for table, (_, fold_sql) in _FOLDS.items():
            for age, step in policy.tiers():
                key = _progress_key(table, step)
                row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
                done = float(row[0]) if row else None
                # Whole buckets only: a bucket still receiving rows is left for a later pass.
                end = math.floor((now - age) / step) * step
                if done is None:
                    first = conn.execute(f"SELECT MIN(t) FROM {table}").fetchone()[0]
                    if first is None:
                        continue
                    done = math.floor(first / step) * step
                if end <= done:
                    continue
                folded = conn.execute(fold_sql, (done, end, step)).fetchall()
                before = conn.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE t >= ? AND t < ?", (done, end)
                ).fetchone()[0]
                conn.execute(f"DELETE FROM {table} WHERE t >= ? AND t < ?", (done, end))
                if folded:
                    marks = ", ".join("?" * len(folded[0]))
                    conn.executemany(f"INSERT INTO {table} VALUES ({marks})", folded)
                conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, repr(end))
                )
                removed[table] += before - len(folded)
        removed["plans"] = _thin_plans(conn, policy, now)
    return removed


def _thin_plans(conn: sqlite3.Connection, policy: RetentionPolicy, now: float) -> int:
    """Drop the plans of closed groups older than ``full_s``, but the first of each coarse
    bucket; return how many were dropped."""
    step, key = policy.coarse_step_s, _progress_key("plans", policy.coarse_step_s)
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    end = math.floor((now - policy.full_s) / step) * step
    if row is not None:
        done = float(row[0])
    else:
        first = conn.execute("SELECT MIN(formed_at) FROM groups").fetchone()[0]
        if first is None:
            return 0
        done = math.floor(first / step) * step
    if end <= done:
        return 0
    cur = conn.execute(
        "SELECT * FROM groups WHERE formed_at >= ? AND formed_at < ? AND plan IS NOT NULL"
        " AND status != ? AND id NOT IN (SELECT MIN(id) FROM groups WHERE formed_at >= ?"
        " AND formed_at < ? AND plan IS NOT NULL GROUP BY CAST(formed_at / ? AS INTEGER))",
        (done, end, GroupStatus.OPEN.value, done, end, step),
    )
    cols = [d[0] for d in cur.description]
    at = cols.index("plan")
    rows = [tuple(None if i == at else v for i, v in enumerate(r)) for r in cur.fetchall()]
    conn.executemany("DELETE FROM groups WHERE id = ?", [(r[0],) for r in rows])
    marks = ", ".join("?" * len(cols))
    conn.executemany(f"INSERT INTO groups ({', '.join(cols)}) VALUES ({marks})", rows)
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, repr(end)))
    return len(rows)
