"""``python -m crew.sim``: simulate one run on a generated topology (see ``crew.sim``)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from crew.config import RunConfig, Scheme
from crew.plan.schemes import GROUP_SCHEMES
from crew.sim.candidates import CANDIDATES_FROM_N, DEFAULT_HELPERS, default_helpers
from crew.sim.engine import (
    LARGE_PLAN_ROUNDS,
    PLAN_ROUNDS_FROM_N,
    Fault,
    FaultKind,
    PlanDelay,
    SimConfig,
    SimResult,
    Simulation,
    default_plan_rounds,
)
from crew.sim.network import ExecutorModel
from crew.sim.record import Recorder
from crew.sim.topogen import BWD_SETTINGS, SimTopology, generate

SAMPLE_1HZ_MAX_N = 64  # above this, link samples every LARGE_SAMPLE_S (the dashboard's horizon
LARGE_SAMPLE_S = 4.0  # for "now" is 5 s, so links still read as busy between samples)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared with ``lab.simrun`` (everything but the topology)."""
    parser.add_argument("--p", type=int, default=5, help="group size (default 5)")
    parser.add_argument("--scheme", type=Scheme, default=Scheme.CREW, choices=GROUP_SCHEMES)
    parser.add_argument("--duration", type=float, default=50.0, help="simulated seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--size-mb", type=float, default=180.0, help="model size in MB (default 180, the paper's)"
    )
    goodput = RunConfig.default("goodput")
    parser.add_argument(
        "--goodput",
        type=float,
        default=goodput,
        help="payload share of a link's rate: what the simulated links deliver and the plans"
        f" count ({goodput:g})",
    )
    parser.add_argument(
        "--compute-s", type=float, default=0.0, help="real step time a straggler sample pads up to"
    )
    parser.add_argument("--staleness", action="store_true", help="staleness-aware weights")
    parser.add_argument(
        "--kill", action="append", default=[], metavar="T:W", help="kill worker W at time T"
    )
    parser.add_argument(
        "--cut", action="append", default=[], metavar="T:SRC:DST", help="cut link SRC->DST at T"
    )
    parser.add_argument("--run-dir", type=Path, help="write the run database to DIR/lab.db")
    parser.add_argument(
        "--progress", action="store_true", help="log progress to stderr every 5 simulated s"
    )
    parser.add_argument(
        "--plan-rounds",
        type=int,
        default=None,
        help="column-generation rounds per crew plan at most (default: the planner's own"
        f" bound up to n = {PLAN_ROUNDS_FROM_N} workers, {LARGE_PLAN_ROUNDS} above)",
    )
    parser.add_argument(
        "--plan-level-tol",
        type=float,
        default=0.0,
        metavar="TOL",
        help="relative tolerance of crew's latency-level search: levels that could improve a"
        " plan's modelled time by at most this share are skipped (default 0: exact)",
    )
    parser.add_argument(
        "--helpers",
        type=int,
        default=None,
        help="plan each group over its members and the K best-connected other workers"
        f" (crew.sim.candidates; default: every worker up to n = {CANDIDATES_FROM_N},"
        f" {DEFAULT_HELPERS} above; -1: every worker)",
    )
    parser.add_argument(
        "--plan-delay",
        type=PlanDelay,
        default=PlanDelay.NONE,
        choices=list(PlanDelay),
        metavar="{" + ",".join(d.value for d in PlanDelay) + "}",
        help="none: routes start when a group forms (deterministic); measured: after the real"
        " planner call's wall time, plans made one after another (as in the lab)",
    )
    parser.add_argument(
        "--hop-queue-ms",
        type=float,
        default=0.0,
        help="standing queue per hop in ms (the lab's shaped links: 50; default 0)",
    )
    parser.add_argument(
        "--host-cpu",
        default=None,
        metavar="CPU_S_PER_GB:CORES",
        help="a shared host running every worker: CPU seconds per GB of link bytes and its cores"
        " (the lab's: e.g. 11.3:2, lab.bench's cpu_s_per_gb); default: none",
    )


def executor_from(args: argparse.Namespace) -> ExecutorModel:
    per_gb, cores = 0.0, 0.0
    if args.host_cpu:
        try:
            a, b = args.host_cpu.split(":")
            per_gb, cores = float(a), float(b)
        except ValueError:
            what = f"--host-cpu CPU_S_PER_GB:CORES: cannot read {args.host_cpu!r}"
            raise SystemExit(what) from None
    return ExecutorModel(args.hop_queue_ms / 1e3, per_gb / 1e9, cores)


def helpers_for(args: argparse.Namespace, n: int) -> int | None:
    if args.helpers is None:
        return default_helpers(n)
    return None if args.helpers < 0 else int(args.helpers)


def config_from(args: argparse.Namespace, n: int) -> SimConfig:
    size = int(args.size_mb * 1e6) // 4 * 4
    return SimConfig(
        scheme=args.scheme,
        p=args.p,
        duration_s=args.duration,
        seed=args.seed,
        size_bytes=size,
        goodput=args.goodput,
        compute_s=args.compute_s,
        staleness=args.staleness,
        plan_rounds=args.plan_rounds,
        plan_level_tol=args.plan_level_tol,
        executor=executor_from(args),
        plan_delay=args.plan_delay,
        helpers=helpers_for(args, n),
    )


def faults_from(args: argparse.Namespace) -> list[Fault]:
    out = []
    try:
        for text in args.kill:
            t, w = text.split(":")
            out.append(Fault(float(t), FaultKind.KILL_WORKER, int(w)))
        for text in args.cut:
            t, a, b = text.split(":")
            out.append(Fault(float(t), FaultKind.CUT_LINK, int(a), int(b)))
    except ValueError:
        raise SystemExit(f"--kill T:W / --cut T:SRC:DST: cannot read {text!r}") from None
    return out


def run(topo: SimTopology, cfg: SimConfig, faults: list[Fault], run_dir: Path | None) -> SimResult:
    if run_dir is not None and (run_dir / "lab.db").exists():
        raise SystemExit(f"--run-dir: {run_dir} already holds a run")
    rec = Recorder(run_dir) if run_dir is not None else None
    return Simulation(topo, cfg, faults, rec).run()


def model_line(cfg: SimConfig, n: int) -> str:
    """What the run's planner and executor were given: never silent about a shortcut."""
    who = (
        "every worker"
        if cfg.helpers is None
        else f"members + {cfg.helpers} best-connected others (crew.sim.candidates)"
    )
    rounds = "planner's own bound" if cfg.plan_rounds is None else f"<= {cfg.plan_rounds}"
    levels = "exact" if not cfg.plan_level_tol else f"within {cfg.plan_level_tol:.2%}"
    return (
        f"planner over {who}; route-LP rounds {rounds}; latency levels {levels};"
        f" plan delay {cfg.plan_delay.value};"
        f" executor: {cfg.executor.describe()}"
    )


def summary(res: SimResult, run_dir: Path | None, cfg: SimConfig | None = None) -> str:
    plan = np.asarray(res.plan_seconds) * 1e3
    lines = [
        f"simulated {res.duration_s:g} s: n={res.n} p={res.p} scheme={res.scheme}",
        *([model_line(cfg, res.n)] if cfg is not None else []),
        f"rounds per worker: mean {res.rounds_per_worker:.2f}, min {min(res.rounds)},"
        f" max {max(res.rounds)}",
        f"groups: {res.completed} completed, {res.abandoned} abandoned, {res.revisions} revisions",
        f"wall time {res.wall_s:.2f} s; planner {plan.size} calls, median"
        f" {np.median(plan) if plan.size else 0:.1f} ms, total {plan.sum() / 1e3:.2f} s",
    ]
    if run_dir is not None:
        lines.append(f"run database: {run_dir / 'lab.db'} (python -m dashboard {run_dir})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crew.sim",
        description="Simulate a CREW run on a generated paper-like topology (no sockets).",
    )
    parser.add_argument("--n", type=int, default=60, help="workers, one per cloud")
    parser.add_argument("--bwd", type=int, default=2, choices=BWD_SETTINGS)
    parser.add_argument("--stragglers", default="mixed", choices=("mixed", "none"))
    add_run_options(parser)
    args = parser.parse_args(argv)
    if args.n < 2:
        parser.error("--n: need at least 2 workers")
    if not 1 <= args.p <= args.n:
        parser.error(f"--p: must be between 1 and {args.n}")
    topo = generate(args.n, args.bwd, args.seed, args.stragglers)
    cfg = config_from(args, args.n)
    if args.progress:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.plan_rounds is None:
        cfg = dataclasses.replace(cfg, plan_rounds=default_plan_rounds(args.n))
    if args.n > SAMPLE_1HZ_MAX_N:  # n(n-1) links x 1 Hz would dwarf the rest of the database
        cfg = dataclasses.replace(cfg, sample_s=LARGE_SAMPLE_S)
    res = run(topo, cfg, faults_from(args), args.run_dir)
    print(summary(res, args.run_dir, cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
