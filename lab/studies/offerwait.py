"""How long each offer waited for its group's result: from a member's Ready to its group's end.

``python -m lab.studies.offerwait RUN [RUN ...]`` reads each run's database (a ``lab.run``
folder, or a ``lab.bench --out`` folder, whose training runs are under ``train/``) and prints,
over every member of every completed group:

* the wait from the member's Ready for that iteration (the coordinator's first
  ``worker_states`` row of it) to the group's end: median, mean and p90;
* the share of offers that waited a *long* time: longer than half the workers' pace (the median
  gap between one worker's consecutive Readys). Where the reduce takes less than half an
  iteration, those waited for members who became ready in a later round of arrivals;
* the groups' sizes and why they closed (``groups.formed_by``, for ``--quorum-min``).

A blocking worker's compute share counts all of its wait. This splits it into what every offer
pays (the group's plan and reduce, the short waits) and what some pay for want of members (the
long ones). Workers that run at one pace in lock step (``--min-iteration-s`` at the same S for
all) become ready in bursts, so where n is not a multiple of p the members left over by one
burst wait for the next.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from crew.cli_options import command_parser
from crew.runtime.rundb import GroupStatus, WorkerState, reading
from lab.report.benchrounds import percentile

__all__ = ["OfferWaits", "OfferWaitError", "offer_waits", "run_dirs"]


class OfferWaitError(ValueError):
    """A folder holds no run database, a file is not one, or a run has no completed group."""


@dataclass(frozen=True)
class OfferWaits:
    """One run's offers, each from its member's Ready to its group's end (seconds)."""

    offers: int
    median_s: float
    mean_s: float
    p90_s: float
    pace_s: float  # median gap between one worker's consecutive Readys
    long_share: float  # offers that waited more than half the pace
    sizes: dict[int, int]  # members per completed group -> groups
    formed_by: dict[str, int]  # close reason -> groups (fixed p: "fixed p")


def offer_waits(db: Path) -> OfferWaits:
    """Every completed group's members' waits in the run database ``db``."""
    try:
        return _offer_waits(db)
    except sqlite3.DatabaseError as exc:  # not a database, or not a run's
        raise OfferWaitError(f"{db}: cannot read it as a run database: {exc}") from exc


def _offer_waits(db: Path) -> OfferWaits:
    ready: dict[tuple[int, int], float] = {}  # (worker, iteration) -> its first Ready
    readies: dict[int, list[float]] = defaultdict(list)
    with reading(db) as conn:
        for r in conn.execute(
            "SELECT t, worker, iteration FROM worker_states WHERE state = ? ORDER BY t",
            (WorkerState.READY.value,),
        ):
            key = (r["worker"], r["iteration"])
            if key not in ready:
                ready[key] = r["t"]
                readies[r["worker"]].append(r["t"])
        groups = conn.execute(
            "SELECT id, members, ended_at, formed_by FROM groups WHERE status = ?"
            " AND ended_at IS NOT NULL",
            (GroupStatus.COMPLETED.value,),
        ).fetchall()
        ended = {g["id"]: g["ended_at"] for g in groups}
        waits = [
            ended[m["group_id"]] - ready[(m["worker"], m["iteration"])]
            for m in conn.execute("SELECT group_id, worker, iteration FROM group_members")
            if m["group_id"] in ended and (m["worker"], m["iteration"]) in ready
        ]
    if not waits:
        raise OfferWaitError(f"{db}: no completed group with its members' Ready times")
    gaps = [b - a for times in readies.values() for a, b in zip(times, times[1:], strict=False)]
    pace = statistics.median(gaps) if gaps else float("nan")
    sizes = Counter(len(json.loads(g["members"])) for g in groups)
    formed_by = Counter(g["formed_by"] or "fixed p" for g in groups)
    return OfferWaits(
        offers=len(waits),
        median_s=statistics.median(waits),
        mean_s=statistics.fmean(waits),
        p90_s=percentile(waits, 90) or 0.0,  # waits is not empty, so never None
        pace_s=pace,
        long_share=sum(w > pace / 2 for w in waits) / len(waits) if gaps else float("nan"),
        sizes=dict(sorted(sizes.items())),
        formed_by=dict(formed_by.most_common()),
    )


def run_dirs(folder: Path) -> list[Path]:
    """The run folders in ``folder``: itself if it holds ``lab.db``, else every
    ``train/*/lab.db`` of a ``lab.bench --out`` folder, by name."""
    if (folder / "lab.db").is_file():
        return [folder]
    found = sorted(p.parent for p in (folder / "train").glob("*/lab.db"))
    if not found:
        raise OfferWaitError(f"{folder}: no lab.db here or under train/*/")
    return found


def report(name: str, w: OfferWaits) -> str:
    sizes = ", ".join(f"{k}: {v}" for k, v in w.sizes.items())
    reasons = ", ".join(f"{k}: {v}" for k, v in w.formed_by.items())
    return (
        f"{name}: {w.offers} offers, wait median {w.median_s:.2f} s, mean {w.mean_s:.2f} s,"
        f" p90 {w.p90_s:.2f} s; pace {w.pace_s:.2f} s, {w.long_share:.0%} waited over half"
        f" of it; groups by size {{{sizes}}}, closed by {{{reasons}}}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("python -m lab.studies.offerwait", __doc__)
    parser.add_argument(
        "runs", nargs="+", type=Path, help="run folders, or lab.bench --out folders"
    )
    args = parser.parse_args(argv)
    try:
        runs = [run for folder in args.runs for run in run_dirs(folder)]
        for run in runs:
            print(report(run.name, offer_waits(run / "lab.db")))
    except OfferWaitError as exc:
        print(f"offerwait: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
