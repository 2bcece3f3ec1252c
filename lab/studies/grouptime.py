"""Where a run's group time goes, from the workers' frame traces and the run database.

Run a lab with ``CREW_FRAME_TRACE=DIR`` (``crew.wire.transport.FrameTrace``), then

    python -m lab.studies.grouptime DIR RUN/lab.db

prints, over the run's completed groups, the mean, median, p75 and p90 of:

* **recorded**: the group's time in the database (formed -> ended: plan, control messages and
  data), next to **planned**, the planner's prediction for its data;
* **data span**: from the group's first queued data frame to its last received one, and
  **outside data**: recorded less data span (planning, Assign, the members' have-all, Commit),
  split into **plan**, the coordinator's time blocked in the group's first plan (the run's
  ``plan_costs``), and **control**, the rest: ``crew.sim``'s ``--control-ms`` takes its mean;
* per hop, for every frame: **relay wait**, from a relay's receipt of a part to its queueing
  of the same part onward; **socket queue**, from queueing to the start of its send (behind the
  connection's earlier frames); **beyond serialisation**, from the start of its send to its
  arrival less its bytes at ``goodput`` x the link's configured rate. Its median is how
  ``crew.sim``'s per-hop ``hop_queue_s`` is measured; its mean also holds the waits behind the
  same link's earlier frames, which the simulator's FCFS link queues model themselves. It is
  below zero where a shaped link lets a frame through faster than its rate (HTB's burst, at a
  few Mbit/s).

With ``--hop-waits FILE`` it also writes every traced frame's **hop wait**: its wait beyond
serialisation counted from when its link was free (not behind the link's earlier frames, which
the simulator queues itself), plus its sender's relay wait where the sender relayed it (0 where
the sender held the data itself). ``crew.sim`` draws each hop's wait from that sample
(``ExecutorModel.hop_waits``; ``lab.studies.simcompare --hop-waits``) instead of taking one
constant per hop.

The trace directory must hold one run's traces: group ids restart in every run. Trace times
are the host's monotonic clock and database times are wall-clock; only durations are compared.
"""

from __future__ import annotations

import bisect
import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crew.cli_options import command_parser
from crew.config import RunConfig
from crew.runtime.planahead import PLAN_COSTS_META
from crew.runtime.rundb import GroupStatus, reading
from lab.studies.frametrace import DATA_KINDS, Event, read_traced_run

GOODPUT = RunConfig.default("goodput")
Groups = dict[int, tuple[float, float, float]]  # id -> recorded, planned and plan seconds


@dataclass(frozen=True)
class Spread:
    """Mean, median, p75 and p90 of a sample, in seconds."""

    count: int
    mean: float
    median: float
    p75: float
    p90: float

    @classmethod
    def of(cls, xs: Sequence[float]) -> Spread:
        if not xs:
            return cls(0, *[float("nan")] * 4)
        x = np.asarray(xs, dtype=float)
        q = np.percentile(x, [50, 75, 90])
        return cls(len(xs), float(x.mean()), float(q[0]), float(q[1]), float(q[2]))

    def describe(self) -> str:
        return (
            f"mean {self.mean * 1e3:7.1f} ms  median {self.median * 1e3:7.1f}"
            f"  p75 {self.p75 * 1e3:7.1f}  p90 {self.p90 * 1e3:7.1f}  ({self.count})"
        )


@dataclass(frozen=True)
class GroupTimes:
    """The spreads the module docstring names, in its order."""

    recorded: Spread
    planned: Spread
    data_span: Spread
    outside_data: Spread
    plan: Spread
    control: Spread
    relay_wait: Spread
    socket_queue: Spread
    beyond_serialisation: Spread

    def lines(self) -> list[str]:
        return [f"{name.replace('_', ' '):>21}: {getattr(self, name).describe()}" for name in NAMES]


NAMES = tuple(GroupTimes.__dataclass_fields__)


FrameKey = tuple[int, int, str, int, int]  # src, dst, kind, block, offset


def _frame(e: Event) -> FrameKey:
    """One frame's identity on one link: (src, dst, kind, block, offset)."""
    src, dst = e.link
    return (src, dst, e.kind, e.block, e.offset)


@dataclass(frozen=True)
class _GroupFrames:
    """One group's traced data frames: when each was queued and started (its first of each),
    when each part reached each node, and every receipt in time order."""

    queued: dict[FrameKey, float]
    started: dict[FrameKey, float]
    arrived: dict[tuple[int, str, int, int], list[float]]
    got: list[Event]

    @classmethod
    def of(cls, evs: Sequence[Event]) -> _GroupFrames:
        queued: dict[FrameKey, float] = {}
        started: dict[FrameKey, float] = {}
        arrived: dict[tuple[int, str, int, int], list[float]] = defaultdict(list)
        for e in evs:  # events are in time order: keep each frame's first of each kind
            if e.what == "q":
                queued.setdefault(_frame(e), e.t)
            elif e.what == "s":
                started.setdefault(_frame(e), e.t)
            elif e.what == "r":
                arrived[(e.me, e.kind, e.block, e.offset)].append(e.t)
        return cls(queued, started, arrived, [e for e in evs if e.what == "r"])

    def relay_wait(self, key: FrameKey) -> float | None:
        """From the sender's receipt of the part (the last input it waited for) to its queueing
        onward; None where the sender did not receive it first (its own data)."""
        src, _dst, kind, block, offset = key
        t = self.queued[key]
        before = [a for a in self.arrived.get((src, kind, block, offset), ()) if a <= t]
        return t - max(before) if before else None

    def sent(
        self, rates_mbit: dict[tuple[int, int], float], goodput: float
    ) -> list[tuple[FrameKey, float, float, float]]:
        """Every received frame: its identity, when its send started, when it arrived, and its
        serialisation at ``goodput`` x its link's configured rate (frames without a traced
        start, or on a link without a rate: none)."""
        out = []
        for e in self.got:
            key = _frame(e)
            rate = rates_mbit.get(key[:2])
            if key in self.started and rate:
                out.append((key, self.started[key], e.t, e.nbytes * 8 / (rate * 1e6 * goodput)))
        return out


def _by_group(events: Sequence[Event], groups: Groups) -> dict[int, _GroupFrames]:
    """The data frames of each of ``groups`` that has both a queued and a received one."""
    by_group: dict[int, list[Event]] = defaultdict(list)
    for e in events:
        if e.kind in DATA_KINDS and e.group in groups:
            by_group[e.group].append(e)
    frames = {g: _GroupFrames.of(evs) for g, evs in by_group.items()}
    return {g: f for g, f in frames.items() if f.queued and f.got}


def group_times(
    events: Sequence[Event],
    groups: Groups,
    rates_mbit: dict[tuple[int, int], float],
    goodput: float = GOODPUT,
) -> GroupTimes:
    """``groups``: completed group id -> (recorded, planned and plan seconds); ``rates_mbit``:
    each directed link's configured rate. Groups without data frames in ``events`` are left out.
    """
    recorded, planned, span, outside, plans, control = [], [], [], [], [], []
    relay, queue, wire = [], [], []
    for g, f in _by_group(events, groups).items():
        rec, predicted, plan = groups[g]
        recorded.append(rec)
        planned.append(predicted)
        span.append(f.got[-1].t - min(f.queued.values()))
        outside.append(rec - span[-1])
        plans.append(plan)
        control.append(outside[-1] - plan)
        relay += [w for w in map(f.relay_wait, f.queued) if w is not None]
        queue += [t - f.queued[key] for key, t in f.started.items() if key in f.queued]
        wire += [t - start - serial for _key, start, t, serial in f.sent(rates_mbit, goodput)]
    samples = (recorded, planned, span, outside, plans, control, relay, queue, wire)
    return GroupTimes(*(Spread.of(x) for x in samples))


def hop_waits(
    events: Sequence[Event],
    groups: Groups,
    rates_mbit: dict[tuple[int, int], float],
    goodput: float = GOODPUT,
) -> list[float]:
    """Every received data frame's hop wait, in seconds (module docstring): its time beyond
    serialisation, counted from when its link was free (its send's start, or the arrival of the
    link's frame before it, of any group), plus its sender's relay wait, 0 where the sender did
    not relay it. Beyond serialisation alone also holds the wait behind the link's earlier
    frames, which the simulator's FCFS link queues make themselves: at n = 32 it is 0.55 s at
    the median for preduce, whose members' links carry every byte, against 20 ms below zero
    net of it."""
    arrivals: dict[tuple[int, int], list[float]] = defaultdict(list)
    for e in events:
        if e.kind in DATA_KINDS and e.what == "r":
            arrivals[e.link].append(e.t)
    for times in arrivals.values():
        times.sort()
    out: list[float] = []
    for f in _by_group(events, groups).values():
        for key, start, t, serial in f.sent(rates_mbit, goodput):
            on_link = arrivals[key[:2]]
            before = bisect.bisect_left(on_link, t)
            free = max(start, on_link[before - 1]) if before else start
            relay = f.relay_wait(key) if key in f.queued else None
            out.append(t - free - serial + (relay or 0.0))
    return out


HOP_WAITS_KEY = "hop_waits_s"


class HopWaitsError(ValueError):
    """A hop-waits file cannot be used; the message names the file and what is wrong."""


def write_hop_waits(path: Path, waits: Sequence[float], source: str) -> None:
    """Write a sample of hop waits (seconds) for :func:`read_hop_waits`."""
    path.write_text(json.dumps({"source": source, HOP_WAITS_KEY: [round(w, 6) for w in waits]}))


def read_hop_waits(path: Path) -> tuple[float, ...]:
    """The hop waits :func:`write_hop_waits` wrote: a non-empty list of finite seconds."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HopWaitsError(f"{path}: not a readable JSON file ({exc})") from None
    waits = doc.get(HOP_WAITS_KEY) if isinstance(doc, dict) else None
    if not isinstance(waits, list) or not waits:
        raise HopWaitsError(
            f"{path}: needs a non-empty list {HOP_WAITS_KEY!r} (lab.studies.grouptime --hop-waits)"
        )
    if not all(
        isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(w) for w in waits
    ):
        raise HopWaitsError(f"{path}: every value of {HOP_WAITS_KEY!r} must be finite seconds")
    return tuple(float(w) for w in waits)


def read_run(db_path: Path) -> tuple[Groups, dict[tuple[int, int], float]]:
    """A run database's completed groups (recorded, planned and plan seconds; a group whose plan
    cost the run did not record counts 0) and its links' configured rates."""
    with reading(db_path) as conn:
        meta = conn.execute("SELECT value FROM meta WHERE key = ?", (PLAN_COSTS_META,)).fetchone()
        costs = json.loads(meta["value"]) if meta is not None else {}
        groups = {
            int(r["id"]): (
                float(r["ended_at"]) - float(r["formed_at"]),
                float(r["predicted_s"]),
                float(costs.get(str(r["id"]), {}).get("blocked_ms", 0.0)) / 1e3,
            )
            for r in conn.execute(
                "SELECT id, formed_at, ended_at, predicted_s FROM groups WHERE status = ?"
                " AND predicted_s IS NOT NULL",
                (GroupStatus.COMPLETED.value,),
            )
        }
        rates = {
            (int(r["src"]), int(r["dst"])): float(r["rate_mbit"])
            for r in conn.execute("SELECT src, dst, rate_mbit FROM links")
        }
    return groups, rates


def main(argv: Sequence[str] | None = None) -> int:
    p = command_parser("python -m lab.studies.grouptime", __doc__)
    p.add_argument("directory", type=Path, help="the run's CREW_FRAME_TRACE directory")
    p.add_argument("db", type=Path, help="the run's database (RUN/lab.db)")
    p.add_argument("--json", type=Path, help="also write the spreads here")
    p.add_argument(
        "--hop-waits",
        type=Path,
        metavar="FILE",
        help="also write every frame's hop wait here (JSON), for lab.studies.simcompare"
        " --hop-waits",
    )
    args = p.parse_args(argv)
    events = read_traced_run(p, args.directory, args.db)
    if events is None:
        return 2
    groups, rates = read_run(args.db)
    times = group_times(events, groups, rates)
    if times.recorded.count == 0:
        print(f"{args.directory}: no frames of {args.db}'s completed groups", file=sys.stderr)
        return 2
    print(f"{args.db}: {times.recorded.count} completed groups with traced frames")
    print("\n".join(times.lines()))
    if args.json is not None:
        spreads = {name: getattr(times, name).__dict__ for name in NAMES}
        args.json.write_text(json.dumps(spreads, indent=1) + "\n")
    if args.hop_waits is not None:
        waits = hop_waits(events, groups, rates)
        write_hop_waits(args.hop_waits, waits, str(args.db))
        print(
            f"hop waits of {len(waits)} frames: {Spread.of(waits).describe()} -> {args.hop_waits}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
