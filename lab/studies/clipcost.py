"""What clipped aggregation costs, and what it buys against a member that poisons its own vector.

``sudo python -m lab.studies.clipcost [--topology default] [--duration 60] [--scheme crew-star]``
runs whole lab runs (``lab.run``'s, torch MLP workers, the secret check on every group), one
arm after another on the same topology, seed and duration:

* ``mean`` and ``clip`` -- honest workers, ``--aggregate mean`` against ``--aggregate clip``
  (``crew.control.clipping``): what clipping costs in time and quality;
* ``mean+poison`` and ``clip+poison`` -- worker ``--poisoner`` offers ``--scale`` times its
  model to every group (``lab.orchestrate.selfpoison``); no result check can tell, so only
  the aggregation rule decides what it does to the others.

Per arm it prints the groups committed and abandoned, the median group time (formed to
ended, committed groups), training steps per worker per minute, the honest workers' final
held-out accuracy (mean of each one's latest) and the first time it reached ``--target``;
the group time and the steps also as ratios to the ``mean`` arm of the same run.

It is a benchmark, not a test: it needs root and takes the machine's two cores for about
``arms x (duration + 30 s)``, and prints figures rather than judging them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from crew.cli_options import add_json_flag, command_parser, write_json
from crew.config import RunConfig, Scheme
from crew.runtime import rundb
from crew.runtime.rundb import GroupStatus
from lab.bench.procs import check_alive, reap
from lab.net.preflight import Capabilities, PreflightError, check
from lab.orchestrate.runner import LabRun, RunOptions
from lab.orchestrate.selfpoison import DEFAULT_SCALE
from lab.spec.topology import TopologySpec, load_topology

ARMS = ("mean", "clip", "mean+poison", "clip+poison")
SELFPOISON = "lab.orchestrate.selfpoison"
START_WAIT_S = 300.0
POLL_S = 1.0


@dataclass(frozen=True)
class ArmFigures:
    arm: str
    committed: int
    abandoned: int
    median_group_s: float | None
    steps_per_worker_per_min: float
    honest_accuracy: float | None
    time_to_target_s: float | None
    error: str | None = None


def figures(arm: str, db_path: Path, poisoner: int | None, target: float) -> ArmFigures:
    """An arm's figures from its run database; the clock starts at the first iteration."""
    with rundb.reading(db_path) as conn:
        groups = conn.execute("SELECT status, formed_at, ended_at FROM groups").fetchall()
        its = conn.execute("SELECT t, worker, iteration, accuracy FROM iterations ORDER BY t")
        its = its.fetchall()
    done = [g for g in groups if g["status"] == GroupStatus.COMPLETED.value]
    abandoned = sum(1 for g in groups if g["status"] == GroupStatus.ABANDONED.value)
    times = [g["ended_at"] - g["formed_at"] for g in done if g["ended_at"] is not None]
    t0, t1 = (its[0]["t"], its[-1]["t"]) if its else (0.0, 0.0)
    steps: dict[int, int] = {}
    latest: dict[int, float] = {}
    reached = None
    for r in its:
        steps[r["worker"]] = max(steps.get(r["worker"], 0), r["iteration"])
        if r["accuracy"] is None or r["worker"] == poisoner:
            continue
        latest[r["worker"]] = r["accuracy"]
        if reached is None and statistics.fmean(latest.values()) >= target:
            reached = r["t"] - t0
    minutes = max(t1 - t0, 1e-9) / 60
    return ArmFigures(
        arm,
        len(done),
        abandoned,
        statistics.median(times) if times else None,
        statistics.fmean(steps.values()) / minutes if steps else 0.0,
        statistics.fmean(latest.values()) if latest else None,
        reached,
    )


def run_arm(
    args: argparse.Namespace, caps: Capabilities, topo: TopologySpec, arm: str, out: Path
) -> ArmFigures:
    aggregate, _, poison = arm.partition("+")
    opts = RunOptions(
        scheme=Scheme(args.scheme),
        p=args.group_size,
        seed=args.seed,
        check="secret",
        aggregate=aggregate,
        clip_radius=args.clip_radius,
        clip_factor=args.clip_factor,
        dashboard=False,
        log_level="WARNING",
    )
    modules = {args.poisoner: (SELFPOISON, "--scale", f"{args.scale:g}")} if poison else {}
    run_dir = out / arm.replace("+", "-")
    lab = LabRun(topo, caps, opts, run_dir, worker_modules=modules)
    error = None
    try:
        with lab:
            deadline = time.monotonic() + START_WAIT_S
            while not lab.db or not lab.db.query("SELECT COUNT(*) FROM iterations")[0][0]:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no iteration within {START_WAIT_S:.0f} s")
                check_alive(lab)
                time.sleep(POLL_S)
            started = time.monotonic()
            while time.monotonic() - started < args.duration:
                check_alive(lab)
                time.sleep(POLL_S)
    except Exception as exc:  # reported with what the run left
        error = f"{type(exc).__name__}: {exc}"
    finally:
        reap(lab)
    got = figures(arm, run_dir / "lab.db", args.poisoner if poison else None, args.target)
    return got if error is None else ArmFigures(**(asdict(got) | {"error": error}))


def _ratio(value: float | None, base: float | None) -> str:
    """``value ÷ base`` of the mean arm from the same run, or "-" where either is missing."""
    return "-" if value is None or not base else f"{value / base:.2f}x"


def main(argv: list[str] | None = None) -> int:
    p = command_parser("python -m lab.studies.clipcost", __doc__)
    p.add_argument("--topology", default="topologies/default.yaml")
    p.add_argument("--scheme", default=Scheme.CREW_STAR.value)
    p.add_argument("--group-size", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--duration", type=float, default=60.0, help="training seconds per arm")
    p.add_argument(
        "--clip-radius", type=float, default=RunConfig.default("clip_radius"), help="its ceiling"
    )
    p.add_argument(
        "--clip-factor",
        type=float,
        default=RunConfig.default("clip_factor"),
        help="the radius learned: K times the members' spread (0: --clip-radius throughout)",
    )
    p.add_argument("--poisoner", type=int, default=3, help="the worker that poisons its vector")
    p.add_argument("--scale", type=float, default=DEFAULT_SCALE, help="the poisoner's factor")
    p.add_argument("--target", type=float, default=0.85, help="honest held-out accuracy")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma list of {', '.join(ARMS)}")
    p.add_argument("--out", type=Path, default=None, help="run folders (default: a temp dir)")
    add_json_flag(p, "the arms' figures")
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if any(a not in ARMS for a in arms):
        p.error(f"--arms: want a comma list of {', '.join(ARMS)}")
    topo = load_topology(args.topology)
    try:
        caps = check(topo)
    except PreflightError as exc:
        print(exc, file=sys.stderr)
        return 3
    out = args.out or Path(tempfile.mkdtemp(prefix="clipcost-"))
    results = []
    for arm in arms:
        got = run_arm(args, caps, topo, arm, out)
        results.append(got)
        print(json.dumps(asdict(got)), flush=True)
    base = next((r for r in results if r.arm == ARMS[0]), None)
    print(
        f"{'arm':<12} {'commit':>6} {'aband':>5} {'group s':>8} {'÷ mean':>7}"
        f" {'steps/min':>10} {'÷ mean':>7} {'acc':>6}"
    )
    for r in results:
        group_s = "-" if r.median_group_s is None else f"{r.median_group_s:.3f}"
        acc = "-" if r.honest_accuracy is None else f"{r.honest_accuracy:.3f}"
        print(
            f"{r.arm:<12} {r.committed:>6} {r.abandoned:>5} {group_s:>8}"
            f" {_ratio(r.median_group_s, base and base.median_group_s):>7}"
            f" {r.steps_per_worker_per_min:>10.1f}"
            f" {_ratio(r.steps_per_worker_per_min, base and base.steps_per_worker_per_min):>7}"
            f" {acc:>6}  to {args.target:g}: {r.time_to_target_s}  {r.error or ''}"
        )
    write_json(args.json, {"arms": [asdict(r) for r in results], "out": str(out)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
