"""Long-run memory benchmark: does the controller's memory stop growing?

``python -m lab.studies.longrun --groups 1000000`` runs the simulator (``crew.sim``) until that
many groups have completed. The simulator drives the coordinator's own group former, life cycle
and planner (``crew.sim.lifecycle``) in simulated time, without history (``SimConfig.history``:
the simulator itself keeps only open groups), so what grows is what the controller keeps.
Python's ``tracemalloc`` traces every allocation from the start; every ``--every`` groups it
prints:

* **controller**: bytes still held that were allocated in ``crew/control/``, ``crew/plan/``,
  ``crew/sim/lifecycle.py`` or ``crew/wire/`` (the former, the life cycle, the planner and its
  caches, the messages), by the line that allocated them;
* **all**: every byte still held by the process's Python allocations;
* the peak so far, groups per wall second, and the three allocation sites that grew most since
  the first checkpoint.

The verdict compares the last checkpoint with the first (by default 1M against 100k groups):
growth within ``--tolerance-mb`` (10) passes. Tracing slows the run about twofold; the
figures are bytes, not times, so a busy machine changes only how long it takes.

The lab's own long run, with every process's RSS over time, is ``sudo python -m lab.soak
--minutes 60``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from crew.cli_options import add_json_flag, command_parser, write_json
from crew.sim.engine import SimConfig, Simulation
from crew.sim.topogen import generate

log = logging.getLogger(__name__)

MIB = 1 << 20
# Where the controller's allocations are made (tracemalloc attributes a block to the line
# that allocated it, wherever it is held).
CONTROLLER_FILES = ("*/crew/control/*", "*/crew/plan/*", "*/crew/sim/lifecycle.py", "*/crew/wire/*")
TOP_SITES = 3


@dataclass(frozen=True)
class Checkpoint:
    groups: int
    wall_s: float
    simulated_s: float
    controller_mb: float
    all_mb: float
    peak_mb: float
    grown_sites: tuple[str, ...]  # allocation sites that grew most since the first checkpoint


@dataclass
class LongRunReport:
    command: str
    n: int
    p: int
    scheme: str
    seed: int
    checkpoints: list[Checkpoint] = field(default_factory=list)
    tolerance_mb: float = 10.0

    @property
    def controller_growth_mb(self) -> float:
        if len(self.checkpoints) < 2:
            return 0.0
        return self.checkpoints[-1].controller_mb - self.checkpoints[0].controller_mb

    @property
    def ok(self) -> bool:
        return len(self.checkpoints) >= 2 and self.controller_growth_mb <= self.tolerance_mb


def controller_filter() -> list[tracemalloc.Filter]:
    return [tracemalloc.Filter(True, pattern) for pattern in CONTROLLER_FILES]


class Meter:
    """Takes a checkpoint every ``every`` completed groups (``Simulation.on_commit``)."""

    def __init__(self, every: int, report: LongRunReport, progress: bool) -> None:
        self.every = every
        self.report = report
        self.progress = progress
        self.next_at = every
        self.t0 = time.perf_counter()
        self.first: tracemalloc.Snapshot | None = None

    def __call__(self, sim: Simulation) -> None:
        if sim.completed < self.next_at:
            return
        self.next_at += self.every
        snap = tracemalloc.take_snapshot()
        controller = snap.filter_traces(controller_filter())
        held, peak = tracemalloc.get_traced_memory()
        grown: tuple[str, ...] = ()
        if self.first is None:
            self.first = controller
        else:
            diff = controller.compare_to(self.first, "lineno")
            grown = tuple(
                f"{d.traceback[0].filename.rsplit('/crew/', 1)[-1]}:{d.traceback[0].lineno}"
                f" {d.size_diff / 1024:+.0f} KiB"
                for d in sorted(diff, key=lambda d: -d.size_diff)[:TOP_SITES]
            )
        cp = Checkpoint(
            groups=sim.completed,
            wall_s=round(time.perf_counter() - self.t0, 1),
            simulated_s=round(sim.now, 1),
            controller_mb=round(sum(s.size for s in controller.statistics("filename")) / MIB, 3),
            all_mb=round(held / MIB, 3),
            peak_mb=round(peak / MIB, 3),
            grown_sites=grown,
        )
        self.report.checkpoints.append(cp)
        if self.progress:
            print(format_checkpoint(cp), flush=True)


def format_checkpoint(cp: Checkpoint) -> str:
    rate = cp.groups / cp.wall_s if cp.wall_s > 0 else 0.0
    line = (
        f"{cp.groups:>9,} groups  controller {cp.controller_mb:7.2f} MB  all {cp.all_mb:7.2f} MB"
        f"  peak {cp.peak_mb:7.2f} MB  ({cp.simulated_s:,.0f} s simulated, {cp.wall_s:,.0f} s"
        f" wall, {rate:,.0f} groups/s)"
    )
    if cp.grown_sites:
        line += "\n           grew most: " + "; ".join(cp.grown_sites)
    return line


def run(args: argparse.Namespace) -> LongRunReport:
    topo = generate(args.n, args.bwd, args.seed, args.stragglers)
    cfg = SimConfig(
        scheme=args.scheme,
        p=args.p,
        duration_s=1e12,  # stop_after_groups ends the run
        seed=args.seed,
        size_bytes=int(args.size_mb * 1e6) // 4 * 4,
        history=False,
        stop_after_groups=args.groups,
    )
    report = LongRunReport(
        command=" ".join(["python -m lab.studies.longrun", *sys.argv[1:]]),
        n=args.n,
        p=args.p,
        scheme=args.scheme,
        seed=args.seed,
        tolerance_mb=args.tolerance_mb,
    )
    sim = Simulation(topo, cfg)
    sim.on_commit = Meter(args.every, report, progress=not args.quiet and args.json != "-")
    tracemalloc.start(1)
    try:
        sim.run()
    finally:
        tracemalloc.stop()
    return report


def render(report: LongRunReport) -> str:
    first, last = report.checkpoints[0], report.checkpoints[-1]
    return (
        f"controller memory: {first.controller_mb:.2f} MB at {first.groups:,} groups,"
        f" {last.controller_mb:.2f} MB at {last.groups:,} ({report.controller_growth_mb:+.2f} MB;"
        f" within {report.tolerance_mb:g} MB: {'yes' if report.ok else 'NO'})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("python -m lab.studies.longrun", __doc__)
    parser.add_argument("--groups", type=int, default=1_000_000, help="groups to complete (1M)")
    parser.add_argument(
        "--every", type=int, default=100_000, help="groups between checkpoints (100k)"
    )
    parser.add_argument("--n", type=int, default=8, help="workers (8, as the default lab)")
    parser.add_argument("--p", type=int, default=3, help="group size (3)")
    parser.add_argument("--bwd", type=int, choices=(1, 2, 3), default=2, help="bandwidths (2)")
    parser.add_argument("--scheme", default="crew", help="how groups average (crew)")
    parser.add_argument(
        "--stragglers",
        choices=("mixed", "none"),
        default="mixed",
        help="step times: the paper's straggler mix, or every worker alike (mixed)",
    )
    parser.add_argument("--seed", type=int, default=0, help="topology and stragglers (0)")
    parser.add_argument(
        "--size-mb", type=float, default=0.1, help="model size in MB: small, so groups are many"
    )
    parser.add_argument(
        "--tolerance-mb", type=float, default=10.0, help="growth allowed, first to last (10)"
    )
    parser.add_argument("--quiet", action="store_true", help="no line per checkpoint")
    parser.set_defaults(quiet=False)
    add_json_flag(parser, "the checkpoints")
    args = parser.parse_args(argv)
    if args.groups < 2 * args.every or args.every < 1:
        parser.error("--groups must be at least twice --every, and --every at least 1")
    logging.basicConfig(level=logging.WARNING)
    report = run(args)
    if len(report.checkpoints) < 2:
        print("error: the run ended before two checkpoints", file=sys.stderr)
        return 1
    data = {**asdict(report), "controller_growth_mb": report.controller_growth_mb, "ok": report.ok}
    if write_json(args.json, data):
        print(render(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
