"""Pace: how many groups a run completes per 10 s window, against its rate before the faults.

``pace_of(ends, fault_at, repaired_at, start, end)`` is pure; ``read_pace(db)`` feeds it from a
run database. Definitions (``WINDOW_S`` = 10 s):

* *baseline*: completed groups per window before the first fault, counted from the first
  completed group (warm-up excluded) to the first fault; None with less than ``WINDOW_S`` of
  it;
* *windows*: completed groups in consecutive windows from the first fault to the run's end
  (the last partial window is dropped); the *worst window* is the smallest, as a share of the
  baseline;
* *back to 80%*: the smallest ``d`` (in ``STEP_S`` steps) such that the window starting ``d``
  after the last repair completes at least ``RECOVERED`` of the baseline; None if no window
  that fits in the run does.

Faults and repairs are the applied lab commands: a *fault* is a command that takes something
away (:func:`is_fault_start`: a kill, a cut, a contention flow, a slowdown, a rate below the
configured one); every other applied command after the first fault (a restore, a restart, p or
the scheme set back, ...) is a *repair*, and the last repair is the latest of them.

Cost: ``O(groups * windows)``, with bisection on the sorted end times.
"""

from __future__ import annotations

import bisect
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from crew.runtime.rundb import GROUP_LOOKBACK_S, CommandStatus, GroupStatus

WINDOW_S = 10.0
STEP_S = 0.5
RECOVERED = 0.8
FAULT_KINDS = frozenset({"kill_worker", "cut_link", "start_contention", "kill_coordinator"})


def is_fault_start(kind: str, args: dict[str, Any], rates: dict[tuple[int, int], float]) -> bool:
    """Whether an applied lab command takes something away (see the module doc)."""
    if kind in FAULT_KINDS:
        return True
    if kind == "slow_worker":
        return float(args.get("factor", 1.0)) != 1.0
    if kind == "set_link":
        rate = args.get("rate_mbit")
        return rate is not None and float(rate) < rates.get((args["src"], args["dst"]), 0.0)
    return False


@dataclass(frozen=True)
class Pace:
    baseline: float | None  # completed groups per window before the first fault
    windows: tuple[int, ...]  # completed groups per window from the first fault
    first_fault_s: float | None  # since the run's start
    last_repair_s: float | None
    worst: int | None  # fewest completed groups in a window
    worst_at_s: float | None  # start of that window, since the run's start
    recovered_after_s: float | None  # back to RECOVERED x baseline, after the last repair

    @property
    def worst_share(self) -> float | None:
        if self.baseline is None or self.worst is None or self.baseline <= 0:
            return None
        return self.worst / self.baseline

    def describe(self) -> str:
        if self.first_fault_s is None:
            return "no faults injected"
        if self.baseline is None:
            return f"first fault at {self.first_fault_s:.0f} s: too early for a baseline"
        # A fault still in force (no repair yet) or no full window yet leaves fields None:
        # the dashboard renders this while a cut is live, so every optional part says so.
        share = self.worst_share
        rec = self.recovered_after_s
        worst = (
            "no full window yet"
            if self.worst is None or self.worst_at_s is None
            else f"{self.worst} ({'–' if share is None else f'{share:.0%}'})"
            f" at t={self.worst_at_s:.0f} s"
        )
        if self.last_repair_s is None:
            after = "no repair yet"
        else:
            back = "never" if rec is None else f"{rec:.1f} s"
            after = (
                f"back to {RECOVERED:.0%} {back} after the last repair"
                f" (t={self.last_repair_s:.0f} s)"
            )
        return (
            f"baseline {self.baseline:.1f} groups/{WINDOW_S:g} s before the first fault"
            f" (t={self.first_fault_s:.0f} s); windows {list(self.windows)}; worst {worst};"
            f" {after}"
        )


def _count(ends: Sequence[float], a: float, b: float) -> int:
    return bisect.bisect_right(ends, b) - bisect.bisect_right(ends, a)


def pace_of(
    ends: Sequence[float],
    fault_at: Sequence[float],
    repaired_at: Sequence[float],
    start: float,
    end: float,
) -> Pace:
    """The pace of a run (see the module doc); times in seconds on any one clock."""
    ends = sorted(ends)
    if not fault_at:
        return Pace(None, (), None, None, None, None, None)
    first = min(fault_at)
    repairs = [t for t in repaired_at if t >= first]
    last = max(repairs, default=max(fault_at))
    before = [e for e in ends if e < first]
    baseline = None
    if before and first - before[0] >= WINDOW_S:
        baseline = (len(before) - 1) / (first - before[0]) * WINDOW_S
    windows = []
    t = first
    while t + WINDOW_S <= end:
        windows.append(_count(ends, t, t + WINDOW_S))
        t += WINDOW_S
    worst = min(windows, default=None)
    worst_at = None if worst is None else first + windows.index(worst) * WINDOW_S - start
    recovered = None
    if baseline is not None:
        d = 0.0
        while last + d + WINDOW_S <= end:
            if _count(ends, last + d, last + d + WINDOW_S) >= RECOVERED * baseline:
                recovered = d
                break
            d += STEP_S
    return Pace(baseline, tuple(windows), first - start, last - start, worst, worst_at, recovered)


@dataclass(frozen=True)
class PaceInputs:
    """What :func:`pace_of` needs, read from a run database; marks are (time, command kind)."""

    ends: tuple[float, ...]  # completed groups' end times
    faults: tuple[tuple[float, str], ...]
    repairs: tuple[tuple[float, str], ...]


def read_pace_inputs(
    conn: sqlite3.Connection, end: float | None = None, since: float | None = None
) -> PaceInputs:
    """Completed groups and applied commands (split into faults and repairs) up to ``end``;
    with ``since``, only those after it (the dashboard's window on a long run, read through
    the groups' formation index instead of every group the run completed)."""
    upto = float("inf") if end is None else end
    rates = {
        (int(r[0]), int(r[1])): float(r[2])
        for r in conn.execute("SELECT src, dst, rate_mbit FROM links")
    }
    if since is None:
        rows = conn.execute(
            "SELECT ended_at FROM groups WHERE status=? AND ended_at IS NOT NULL",
            (GroupStatus.COMPLETED.value,),
        )
    else:
        rows = conn.execute(
            "SELECT ended_at FROM groups WHERE formed_at > ? AND formed_at <= ?"
            " AND +status = ? AND ended_at > ?",
            (since - GROUP_LOOKBACK_S, upto, GroupStatus.COMPLETED.value, since),
        )
    ends = [float(r[0]) for r in rows if float(r[0]) <= upto]
    faults: list[tuple[float, str]] = []
    repairs: list[tuple[float, str]] = []
    # Applied in (since, upto]: a week of faults is tens of thousands of commands.
    for kind, args, applied in conn.execute(
        "SELECT kind, args, applied_at FROM commands WHERE status=? AND applied_at > ?"
        " AND applied_at <= ? ORDER BY applied_at",
        (CommandStatus.APPLIED.value, float("-inf") if since is None else since, upto),
    ):
        try:
            parsed = json.loads(args) if args else {}
        except json.JSONDecodeError:
            parsed = {}
        mark = (float(applied), str(kind))
        (faults if is_fault_start(kind, parsed, rates) else repairs).append(mark)
    return PaceInputs(tuple(sorted(ends)), tuple(faults), tuple(repairs))


def read_pace(conn: sqlite3.Connection, start: float, end: float) -> Pace:
    """The pace of the run in ``conn`` (a run database), from ``start`` to ``end``."""
    inputs = read_pace_inputs(conn)
    return pace_of(
        inputs.ends,
        [t for t, _ in inputs.faults],
        [t for t, _ in inputs.repairs],
        start,
        end,
    )
