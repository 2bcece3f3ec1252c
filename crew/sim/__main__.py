"""``python -m crew.sim``: simulate one run on a generated topology (see ``crew.sim``)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from crew.cli_options import (
    add_config_flags,
    add_json_flag,
    add_out_flag,
    command_parser,
    config_flag,
    config_values,
    write_json,
)
from crew.plan.candidates import helpers_for
from crew.plan.schemes import GROUP_SCHEMES
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


# The RunConfig fields a simulated run takes from the command line (crew.cli_options).
SIM_FIELDS = ("p", "scheme", "seed", "goodput", "staleness", "host_cpu_s_per_gb", "helpers")


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared with ``lab.simrun`` (everything but the topology)."""
    add_config_flags(parser, SIM_FIELDS)
    parser.add_argument(
        "--duration",
        type=float,
        default=50.0,
        metavar="SECONDS",
        help="simulated seconds to run (default 50)",
    )
    parser.add_argument(
        "--size-mb",
        type=float,
        default=180.0,
        help="model size: the vector each worker offers, in MB (10^6 bytes; default 180, the"
        " paper's)",
    )
    parser.add_argument(
        "--compute-s",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="real step time a straggler sample pads up to (default 0: the samples alone)",
    )
    parser.add_argument(
        "--kill",
        action="append",
        default=[],
        metavar="T:W",
        help="kill worker W at simulated time T seconds; repeatable",
    )
    parser.add_argument(
        "--cut",
        action="append",
        default=[],
        metavar="T:SRC:DST",
        help="cut link SRC->DST at simulated time T seconds; repeatable",
    )
    add_out_flag(
        parser,
        "write the run database to DIR/lab.db, for the dashboard to replay (default: none)",
        old=("--run-dir",),
    )
    add_json_flag(parser, "the run's figures")
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
        metavar="MS",
        help="standing queue per hop in ms (the lab's shaped links: 50; default 0)",
    )
    parser.add_argument(
        "--control-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="control-plane latency per group revision beyond its plan, in ms (Assign, have-all,"
        " Commit; lab.studies.grouptime measures it from a frame trace; default 0)",
    )
    parser.add_argument(
        "--turnaround-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="control latency per round outside the group, in ms (a member's Commit in and its"
        " next Ready out; lab.studies.simcompare --train measures it in a lab run; default 0)",
    )
    parser.add_argument(
        "--ack-clock-mbit",
        type=float,
        default=0.0,
        metavar="MBIT",
        help="a link whose reverse runs at or below MBIT and is busy runs at the reverse's rate"
        " (TCP's ACKs wait behind the reverse's data; the lab's links below 15.5 Mbit/s;"
        " default 0: links independent)",
    )


def add_private_links_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--private-links",
        action="store_true",
        help="every group has the links to itself and plans on their full capacity, so"
        " concurrent groups never slow each other (SimConfig.shared_links; not the lab's"
        " network, where groups share each pair's connection)",
    )


def check_run_options(parser: argparse.ArgumentParser, args: argparse.Namespace, n: int) -> None:
    """Refuse, through ``parser.error``, what a simulated run of n workers cannot take."""
    for flag in ("hop_queue_ms", "control_ms", "turnaround_ms", "ack_clock_mbit"):
        value = getattr(args, flag)
        if not 0 <= value < float("inf"):
            parser.error(f"--{flag.replace('_', '-')}: must be finite and >= 0, got {value}")
    if not 1 <= args.p <= n:
        parser.error(f"{config_flag('p')}: must be between 1 and {n}, got {args.p}")
    if args.scheme not in GROUP_SCHEMES:
        parser.error(
            f"--scheme: the simulator runs the partial-reduce schemes ({', '.join(GROUP_SCHEMES)}),"
            f" not {args.scheme}"
        )


def executor_from(args: argparse.Namespace) -> ExecutorModel:
    host = config_values(args, ("host_cpu_s_per_gb",))
    return ExecutorModel(
        args.hop_queue_ms / 1e3,
        host["host_cpu_s_per_gb"] / 1e9,
        host["host_cores"],
        control_s=args.control_ms / 1e3,
        turnaround_s=args.turnaround_ms / 1e3,
        ack_clock_mbit=args.ack_clock_mbit,
    )


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
        helpers=helpers_for(args.helpers, n),
        shared_links=not getattr(args, "private_links", False),
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
        raise SystemExit(f"--out: {run_dir} already holds a run")
    rec = Recorder(run_dir) if run_dir is not None else None
    return Simulation(topo, cfg, faults, rec).run()


def model_line(cfg: SimConfig, n: int) -> str:
    """What the run's planner and executor were given: never silent about a shortcut."""
    who = (
        "every worker"
        if cfg.helpers is None
        else f"members + {cfg.helpers} best-connected others (crew.plan.candidates)"
    )
    rounds = "planner's own bound" if cfg.plan_rounds is None else f"<= {cfg.plan_rounds}"
    levels = "exact" if not cfg.plan_level_tol else f"within {cfg.plan_level_tol:.2%}"
    links = "" if cfg.shared_links else "; links private to each group (not shared)"
    return (
        f"planner over {who}; route-LP rounds {rounds}; latency levels {levels};"
        f" plan delay {cfg.plan_delay.value};"
        f" executor: {cfg.executor.describe()}{links}"
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


def report(res: SimResult, args: argparse.Namespace, cfg: SimConfig) -> None:
    """The run's summary on standard output, and its figures to ``--json``."""
    if args.json != "-":
        print(summary(res, args.out, cfg))
    write_json(args.json, dataclasses.asdict(res) | {"rounds_per_worker": res.rounds_per_worker})


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "python -m crew.sim",
        "Simulate a CREW run on a generated paper-like topology (no sockets): the"
        " coordinator's group former and planner in simulated time, links as fluid queues"
        " (docs/simulator.md).",
    )
    parser.add_argument(
        "--n", type=int, default=60, help="workers, one per cloud (default 60, the paper's)"
    )
    parser.add_argument(
        "--bwd",
        type=int,
        default=2,
        choices=BWD_SETTINGS,
        help="bandwidth distribution of the generated network, the paper's settings"
        " (crew.sim.topogen; default 2)",
    )
    parser.add_argument(
        "--stragglers",
        default="mixed",
        choices=("mixed", "none"),
        help="mixed: per-worker step times drawn from the paper's straggler mix; none: every"
        " worker as fast (default mixed)",
    )
    parser.add_argument(
        "--symmetric",
        action="store_true",
        help="one rate per unordered pair, both directions alike (default: each direction"
        " drawn on its own)",
    )
    add_run_options(parser)
    add_private_links_flag(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.n < 2:
        parser.error("--n: need at least 2 workers")
    check_run_options(parser, args, args.n)
    topo = generate(args.n, args.bwd, args.seed, args.stragglers, args.symmetric)
    cfg = config_from(args, args.n)
    if args.progress:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.plan_rounds is None:
        cfg = dataclasses.replace(cfg, plan_rounds=default_plan_rounds(args.n))
    if args.n > SAMPLE_1HZ_MAX_N:  # n(n-1) links x 1 Hz would dwarf the rest of the database
        cfg = dataclasses.replace(cfg, sample_s=LARGE_SAMPLE_S)
    res = run(topo, cfg, faults_from(args), args.out)
    report(res, args, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
