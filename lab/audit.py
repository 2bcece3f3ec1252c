"""The run audit: what a finished run's database says about correctness.

``audit(path)`` reads ``runs/<run-id>/lab.db`` (and the workers' final checkpoints beside it)
and checks invariants that must hold however many faults were injected. ``python -m lab.audit
runs/<run-id>`` prints them as a table and exits 1 on any violation.

Terms. A group's *members* are the JSON list in ``groups.members`` (the coordinator rewrites
it when a member is dropped); its *interval* is ``[formed_at, ended_at]``, with the run's end
for a group that never ended. The *run's end* is ``meta.ended_at``, else the newest time
recorded anywhere in the database. A *crash* of worker w is an event of kind ``fault`` that
says w was killed, exited with a non-zero code, or was lost (``kill worker w``, ``worker w
exited with code c`` for c ≠ 0, ``worker w lost``, ``worker w killed``/``crashed``).

Checks (violations make ``ok`` false):

``groups ended``
    Every group has status ``completed`` or ``abandoned`` (none ``open`` or anything else),
    has an ``ended_at``, and ``ended_at >= formed_at``.
``group membership``
    Every completed group has a non-empty list of distinct integer members; its
    ``group_members`` rows name exactly those workers, once each; ``groups.weights`` is a list
    of finite non-negative numbers, one per member, summing to 1 (within 1e-6).
``no overlapping groups``
    For every worker, the intervals of the groups it belongs to (as a member, or by a
    ``group_members`` row) are pairwise disjoint; touching end to start is allowed.
``no hung groups``
    Every group's interval is at most ``max_group_s`` long (default 600 s), and every
    abandoned group has a non-empty ``reason``.
``no lost updates``
    Every reported iteration (a row ``(t, worker w, iteration k)`` of ``iterations``) must be
    accounted for. Let c be w's first crash at or after t (∞ if none). The update is
    *averaged* if a completed group with w as a member at a ``group_members.iteration`` ≥ k was
    formed in ``[t − clock_slack_s, c)``: w's model at iteration k' ≥ k contains update k, and a
    group formed after the crash belongs to the restarted process, which may have re-reached
    k' without it. Otherwise it is *held* if w never crashed after t and its final checkpoint
    ``<run dir>/checkpoints/w{w}.pt`` (an ``.npz``) has ``iteration`` ≥ k. Otherwise it is
    *lost to crash* if c is finite (reported, not a violation); otherwise it is a violation.

Information only (never violations): ``groups`` (counts by status), ``rounds per worker``
(completed groups each worker was a member of), ``lost to crash`` (per worker) and ``pace``
(completed groups per 10 s against the rate before the first fault, ``lab.report.pace``).

Cost: one pass over each table and a sort per worker; each reported iteration bisects its
worker's groups and scans forward to the first that averaged it (usually the next one).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import re
import sqlite3
import sys
import time
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from crew.cli_options import add_json_flag, command_parser, write_json
from crew.runtime import rundb
from crew.runtime.rundb import GroupStatus
from lab.report.pace import Pace, read_pace

log = logging.getLogger(__name__)

DEFAULT_MAX_GROUP_S = 600.0
DEFAULT_CLOCK_SLACK_S = 0.5  # Metrics and group formation are stamped by different processes
WEIGHT_TOLERANCE = 1e-6
MAX_EXAMPLES = 8  # problems listed per check; the count is always exact

GROUPS_ENDED = "groups ended"
GROUP_MEMBERSHIP = "group membership"
NO_OVERLAP = "no overlapping groups"
NO_HUNG = "no hung groups"
NO_LOST_UPDATES = "no lost updates"
INFO_GROUPS = "groups"
INFO_ROUNDS = "rounds per worker"
INFO_LOST_TO_CRASH = "lost to crash"
INFO_PACE = "pace"

_CRASH_PATTERNS = (
    re.compile(r"\bkill worker (\d+)\b"),
    re.compile(r"\bworker (\d+) (?:lost|killed|crashed)\b"),
    re.compile(r"\bworker (\d+) exited with code (-?\d+)\b"),
)


@dataclass(frozen=True)
class Check:
    """One row of the audit: ``ok`` false is a violation, unless ``info`` (then always ok)."""

    name: str
    ok: bool
    detail: str
    info: bool = False


@dataclass(frozen=True)
class AuditReport:
    ok: bool
    checks: tuple[Check, ...]
    db_path: Path

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def violations(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "db_path": str(self.db_path),
            "checks": [asdict(c) for c in self.checks],
        }


@dataclass(frozen=True)
class _Group:
    id: int
    status: str
    members: tuple[int, ...] | None  # None when groups.members is not a list of ints
    weights: Any
    formed_at: float
    ended_at: float | None
    reason: str | None
    rows: dict[int, int]  # group_members: worker -> iteration (duplicates counted separately)
    duplicate_rows: tuple[int, ...]


def resolve_db(path: str | Path) -> Path:
    """Accept a run directory or its ``lab.db``; raise FileNotFoundError if neither."""
    p = Path(path)
    db = p / "lab.db" if p.is_dir() else p
    if not db.is_file():
        raise FileNotFoundError(f"no run database at {db}")
    return db


def audit(
    path: str | Path,
    *,
    max_group_s: float = DEFAULT_MAX_GROUP_S,
    clock_slack_s: float = DEFAULT_CLOCK_SLACK_S,
    checkpoint_dir: str | Path | None = None,
) -> AuditReport:
    """Audit a run; ``path`` is the run directory or its database.

    ``checkpoint_dir`` defaults to ``<run dir>/checkpoints``.
    """
    db = resolve_db(path)
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else db.parent / "checkpoints"
    with rundb.reading(db) as conn:
        groups = _read_groups(conn)
        workers = [int(r[0]) for r in conn.execute("SELECT id FROM workers ORDER BY id")]
        iterations = [
            (float(r[0]), int(r[1]), int(r[2]))
            for r in conn.execute("SELECT t, worker, iteration FROM iterations ORDER BY t")
        ]
        crashes = _read_crashes(conn)
        run_end = _run_end(conn)
        pace = _read_pace(conn, run_end)
    workers = sorted(set(workers) | {w for _, w, _ in iterations})
    held = {w: _checkpoint_iteration(ckpt_dir / f"w{w}.pt") for w in workers}

    lost_check, crash_check = _check_updates(
        groups, iterations, crashes, held, workers, clock_slack_s
    )
    checks = (
        _check_ended(groups),
        _check_membership(groups),
        _check_overlap(groups, run_end),
        _check_hung(groups, run_end, max_group_s),
        lost_check,
        _info_groups(groups),
        _info_rounds(groups, workers),
        crash_check,
        Check(INFO_PACE, True, pace.describe(), info=True),
    )
    return AuditReport(ok=all(c.ok for c in checks), checks=checks, db_path=db)


# -- reading -----------------------------------------------------------------------------------


def _parse_members(text: str | None) -> tuple[int, ...] | None:
    try:
        value = json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        return None
    if not isinstance(value, list) or not all(
        isinstance(m, int) and not isinstance(m, bool) for m in value
    ):
        return None
    return tuple(value)


def _read_groups(conn: sqlite3.Connection) -> list[_Group]:
    rows: dict[int, dict[int, int]] = defaultdict(dict)
    dups: dict[int, list[int]] = defaultdict(list)
    for r in conn.execute("SELECT group_id, worker, iteration FROM group_members"):
        gid, w = int(r[0]), int(r[1])
        if w in rows[gid]:
            dups[gid].append(w)
        rows[gid][w] = int(r[2])
    out = []
    for r in conn.execute(
        "SELECT id, status, members, weights, formed_at, ended_at, reason FROM groups ORDER BY id"
    ):
        gid = int(r[0])
        try:
            weights = json.loads(r[3])
        except (TypeError, json.JSONDecodeError):
            weights = None
        out.append(
            _Group(
                id=gid,
                status=str(r[1]),
                members=_parse_members(r[2]),
                weights=weights,
                formed_at=float(r[4]),
                ended_at=None if r[5] is None else float(r[5]),
                reason=r[6],
                rows=dict(rows.get(gid, {})),
                duplicate_rows=tuple(dups.get(gid, ())),
            )
        )
    return out


def _read_crashes(conn: sqlite3.Connection) -> dict[int, list[float]]:
    """Crash times per worker, sorted (see the module docstring for what counts)."""
    out: dict[int, list[float]] = defaultdict(list)
    for r in conn.execute("SELECT t, message FROM events WHERE kind = 'fault' ORDER BY t"):
        t, message = float(r[0]), str(r[1])
        for pattern in _CRASH_PATTERNS:
            m = pattern.search(message)
            if m is None:
                continue
            # A clean exit (code 0) saved its checkpoint: the next process resumes from it.
            if m.lastindex == 2 and int(m.group(2)) == 0:
                continue
            out[int(m.group(1))].append(t)
            break
    return {w: sorted(ts) for w, ts in out.items()}


def _run_end(conn: sqlite3.Connection) -> float:
    row = conn.execute("SELECT value FROM meta WHERE key = 'ended_at'").fetchone()
    if row is not None:
        try:
            return float(row[0])
        except ValueError:
            log.warning("meta.ended_at is not a number: %r", row[0])
    newest = conn.execute(
        "SELECT MAX(x) FROM (SELECT MAX(t) AS x FROM events UNION ALL"
        " SELECT MAX(t) FROM iterations UNION ALL SELECT MAX(ended_at) FROM groups"
        " UNION ALL SELECT MAX(formed_at) FROM groups UNION ALL SELECT MAX(t) FROM commands)"
    ).fetchone()[0]
    return float(newest) if newest is not None else time.time()


def _read_pace(conn: sqlite3.Connection, run_end: float) -> Pace:
    row = conn.execute("SELECT value FROM meta WHERE key = 'started_at'").fetchone()
    try:
        start = float(row[0]) if row is not None else None
    except ValueError:
        start = None
    if start is None:
        first = conn.execute("SELECT MIN(formed_at) FROM groups").fetchone()[0]
        start = float(first) if first is not None else run_end
    return read_pace(conn, start, run_end)


def _checkpoint_iteration(path: Path) -> int | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return int(data["iteration"])
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        log.warning("unreadable checkpoint %s: %s", path, exc)
        return None


# -- checks ------------------------------------------------------------------------------------


def _summary(problems: Sequence[str], what: str) -> str:
    if not problems:
        return f"no {what}"
    shown = "; ".join(problems[:MAX_EXAMPLES])
    more = f"; … and {len(problems) - MAX_EXAMPLES} more" if len(problems) > MAX_EXAMPLES else ""
    return f"{len(problems)} {what}: {shown}{more}"


def _verdict(name: str, problems: Sequence[str], ok_detail: str) -> Check:
    """The check ``name``: passed with ``ok_detail``, or failed, listing ``problems``."""
    return Check(name, not problems, _summary(problems, "problems") if problems else ok_detail)


def _check_ended(groups: list[_Group]) -> Check:
    problems = []
    for g in groups:
        if g.status not in (GroupStatus.COMPLETED, GroupStatus.ABANDONED):
            problems.append(f"group {g.id} is {g.status}")
        elif g.ended_at is None:
            problems.append(f"group {g.id} ({g.status}) has no ended_at")
        elif g.ended_at < g.formed_at:
            problems.append(f"group {g.id} ended {g.formed_at - g.ended_at:.3f} s before it formed")
    return _verdict(GROUPS_ENDED, problems, f"all {len(groups)} groups ended")


def _check_membership(groups: list[_Group]) -> Check:
    problems = []
    completed = [g for g in groups if g.status == GroupStatus.COMPLETED]
    for g in completed:
        if g.members is None:
            problems.append(f"group {g.id}: members is not a list of worker ids")
            continue
        if not g.members:
            problems.append(f"group {g.id}: no members")
            continue
        if len(set(g.members)) != len(g.members):
            dup = sorted(w for w, c in Counter(g.members).items() if c > 1)
            problems.append(f"group {g.id}: members repeated {dup}")
        if g.duplicate_rows:
            problems.append(f"group {g.id}: group_members repeats {sorted(g.duplicate_rows)}")
        if set(g.rows) != set(g.members):
            missing = sorted(set(g.members) - set(g.rows))
            extra = sorted(set(g.rows) - set(g.members))
            problems.append(
                f"group {g.id}: group_members disagree with members {list(g.members)}"
                f" (missing {missing}, extra {extra})"
            )
        w = g.weights
        if not isinstance(w, list) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in w
        ):
            problems.append(f"group {g.id}: weights is not a list of numbers")
        elif len(w) != len(g.members):
            problems.append(f"group {g.id}: {len(w)} weights for {len(g.members)} members")
        elif not all(math.isfinite(x) and x >= 0 for x in w):
            problems.append(f"group {g.id}: weights {w} not all finite and >= 0")
        elif abs(sum(w) - 1.0) > WEIGHT_TOLERANCE:
            problems.append(f"group {g.id}: weights sum to {sum(w):.9g}, not 1")
    return _verdict(GROUP_MEMBERSHIP, problems, f"all {len(completed)} completed groups consistent")


def _check_overlap(groups: list[_Group], run_end: float) -> Check:
    spans: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for g in groups:
        end = g.ended_at if g.ended_at is not None else max(run_end, g.formed_at)
        for w in set(g.members or ()) | set(g.rows):
            spans[w].append((g.formed_at, end, g.id))
    problems = []
    for w in sorted(spans):
        ordered = sorted(spans[w])
        latest_end, latest_id = -math.inf, -1
        for start, end, gid in ordered:
            if start < latest_end:
                problems.append(
                    f"worker {w} in groups {latest_id} and {gid} at once"
                    f" ({latest_end - start:.3f} s overlap)"
                )
            if end > latest_end:
                latest_end, latest_id = end, gid
    return Check(NO_OVERLAP, not problems, _summary(problems, "overlaps"))


def _check_hung(groups: list[_Group], run_end: float, max_group_s: float) -> Check:
    problems = []
    for g in groups:
        end = g.ended_at if g.ended_at is not None else run_end
        if end - g.formed_at > max_group_s:
            still = "" if g.ended_at is not None else ", never ended"
            problems.append(f"group {g.id} took {end - g.formed_at:.1f} s{still}")
        if g.status == GroupStatus.ABANDONED and not (g.reason or "").strip():
            problems.append(f"group {g.id} abandoned without a reason")
    ok = f"every group ended within {max_group_s:g} s; every abandon has a reason"
    return _verdict(NO_HUNG, problems, ok)


def _ranges(values: Iterable[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1..3, 7"``."""
    vs = sorted(set(values))
    parts: list[str] = []
    i = 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        parts.append(str(vs[i]) if i == j else f"{vs[i]}..{vs[j]}")
        i = j + 1
    return ", ".join(parts)


def _check_updates(
    groups: list[_Group],
    iterations: list[tuple[float, int, int]],
    crashes: dict[int, list[float]],
    held: dict[int, int | None],
    workers: list[int],
    slack: float,
) -> tuple[Check, Check]:
    # Per worker: completed groups it was a member of, as (formed_at, iteration), by time.
    joined: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for g in groups:
        if g.status != GroupStatus.COMPLETED or g.members is None:
            continue
        for w in g.members:
            if w in g.rows:
                joined[w].append((g.formed_at, g.rows[w]))
    times: dict[int, list[float]] = {}
    for w, js in joined.items():
        js.sort()
        times[w] = [t for t, _ in js]
    lost: dict[int, list[int]] = defaultdict(list)
    to_crash: dict[int, list[int]] = defaultdict(list)
    averaged = kept = 0
    for t, w, k in iterations:
        ts = crashes.get(w, [])
        ci = bisect.bisect_left(ts, t)
        crash = ts[ci] if ci < len(ts) else math.inf
        js = joined.get(w, [])
        lo = bisect.bisect_left(times.get(w, []), t - slack)
        hi = bisect.bisect_left(times.get(w, []), crash)
        # In a healthy run the first group after t already qualifies, so the scan is short.
        final = held.get(w)
        if any(js[i][1] >= k for i in range(lo, hi)):
            averaged += 1
        elif crash == math.inf and final is not None and final >= k:
            kept += 1
        elif crash != math.inf:
            to_crash[w].append(k)
        else:
            lost[w].append(k)
    problems = [
        f"worker {w}: iterations {_ranges(ks)} neither averaged nor held"
        f" (final checkpoint: {'none' if held.get(w) is None else held[w]})"
        for w, ks in sorted(lost.items())
    ]
    total = len(iterations)
    if problems:
        detail = _summary(problems, "workers lost updates")
    else:
        detail = f"all {total} reported updates: {averaged} averaged, {kept} held at the end"
        if to_crash:
            detail += f", {sum(len(v) for v in to_crash.values())} lost to crash"
    lost_check = Check(NO_LOST_UPDATES, not problems, detail)
    crash_detail = (
        ", ".join(f"w{w}: {len(ks)} ({_ranges(ks)})" for w, ks in sorted(to_crash.items()))
        if to_crash
        else "none"
    )
    crashed = sorted(w for w in workers if crashes.get(w))
    if crashed:
        crash_detail += f"; crashes recorded for workers {crashed}"
    return lost_check, Check(INFO_LOST_TO_CRASH, True, crash_detail, info=True)


def _info_groups(groups: list[_Group]) -> Check:
    by = Counter(g.status for g in groups)
    parts = [
        f"{by.get(s, 0)} {s}"
        for s in (GroupStatus.COMPLETED, GroupStatus.ABANDONED, GroupStatus.OPEN)
    ]
    parts += [
        f"{c} {s}"
        for s, c in sorted(by.items())
        if s not in (GroupStatus.COMPLETED, GroupStatus.ABANDONED, GroupStatus.OPEN)
    ]
    return Check(INFO_GROUPS, True, f"{len(groups)} groups: " + ", ".join(parts), info=True)


def _info_rounds(groups: list[_Group], workers: list[int]) -> Check:
    rounds = Counter(
        w
        for g in groups
        if g.status == GroupStatus.COMPLETED and g.members is not None
        for w in g.members
    )
    ws = sorted(set(workers) | set(rounds))
    detail = ", ".join(f"w{w}: {rounds.get(w, 0)}" for w in ws) if ws else "no workers"
    return Check(INFO_ROUNDS, True, detail, info=True)


# -- command line ------------------------------------------------------------------------------


def _print_report(report: AuditReport) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"audit of {report.db_path}", show_lines=False)
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for c in report.checks:
        if c.info:
            result = "[cyan]info[/]"
        else:
            result = "[green]pass[/]" if c.ok else "[bold red]FAIL[/]"
        table.add_row(c.name, result, c.detail)
    console = Console()
    console.print(table)
    verdict = (
        "[green]no violations[/]"
        if report.ok
        else (f"[bold red]{len(report.violations)} check(s) failed[/]")
    )
    console.print(verdict)


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser(
        "python -m lab.audit",
        "Check a finished CREW Lab run for lost updates, hung or overlapping groups"
        " and inconsistent group records. The checks are defined in lab/audit.py.",
        epilog="Exit status: 0 if every check passes, 1 on any violation, 2 if the run"
        " database cannot be read.",
    )
    parser.add_argument("run", type=Path, help="the run directory (runs/<id>) or its lab.db")
    parser.add_argument(
        "--max-group-s",
        type=float,
        default=DEFAULT_MAX_GROUP_S,
        help=f"longest a group may take before it counts as hung (default {DEFAULT_MAX_GROUP_S:g})",
    )
    add_json_flag(parser, "the report")
    args = parser.parse_args(argv)
    try:
        report = audit(args.run, max_group_s=args.max_group_s)
    except (FileNotFoundError, sqlite3.Error) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if write_json(args.json, report.to_dict()):
        _print_report(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
