"""``python -m lab.bench``'s command line: the options, their checks, and the benchmark's
run on one network from start to the written results (docs/bench.md)."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from crew.cli_options import (
    add_config_flags,
    add_json_flag,
    add_training_flags,
    command_parser,
    config_flag,
    config_values,
    flag_error,
    training_options,
    write_json,
)
from crew.config import ConfigError
from lab.bench.ops import make_trace, run_ops
from lab.bench.procs import STARTUP_NUMPY_S, STARTUP_TORCH_S, other_labs
from lab.bench.report import (
    build_figures,
    error_lines,
    results_table,
    rounds_table,
    train_figures,
    train_table,
    write_figures,
)
from lab.bench.spec import (
    ALL_SCHEMES,
    BENCH_PACE,
    ENCRYPTED,
    MB,
    SECRET,
    BenchError,
    BenchSpec,
    TrainRun,
    expand_group_sizes,
    parse_schemes,
    parse_train_configs,
)
from lab.bench.train import run_training
from lab.net.mesh import LabNetwork
from lab.net.preflight import PreflightError, add_allow_missing, allowed_missing, check, describe
from lab.orchestrate.runner import free_mgmt_subnet
from lab.report.benchresults import BenchResults, SchemeResults
from lab.report.benchrounds import pool_results, round_orders, round_summary, run_folder
from lab.spec.shipped import topology_arg
from lab.spec.topology import TopologyError, load_topology

log = logging.getLogger(__name__)
# Wide enough for the results table when stderr is a file or a pipe (rich assumes 80 then).
console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

EXIT_OK = 0
EXIT_SCHEME_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_PREFLIGHT = 3


# The RunConfig fields every scheme's run takes from the command line (crew.cli_options),
# besides the group size, the seed and the training ones.
BENCH_FIELDS = ("host_cpu_s_per_gb", "plan_ahead", "hop_backlog_bytes", "part_bytes", "encrypt")


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "python -m lab.bench",
        "Benchmark partial-reduce schemes (and Gloo) on one emulated network: the "
        "same seeded trace of groups for every scheme, with op times, ratios to the "
        "fluid lower bound, result checks and per-link bytes. Needs root.",
        epilog="Writes DIR/results.json, DIR/plots.html, DIR/op-times.png, DIR/link-bytes.png "
        "(when kaleido can drive /usr/bin/chromium), one "
        "run folder per scheme (DIR/<scheme>/lab.db and logs), and with --train "
        "DIR/train.json and DIR/train/<scheme>/. Details: docs/bench.md.",
    )
    p.add_argument(
        "--topology",
        type=topology_arg,
        required=True,
        help="topology YAML to emulate, or a shipped topology's name",
    )
    p.add_argument(
        "--schemes",
        default="all",
        help=f"comma-separated schemes to run, in this order, or 'all' for every one "
        f"including gloo (default all): {', '.join(ALL_SCHEMES)}; NAME{ENCRYPTED} runs a group "
        f"scheme with every connection encrypted, NAME{SECRET} with the secret result check"
        " (crew.control.secretcheck), to compare them in one run",
    )
    add_config_flags(p, ("p",))
    p.add_argument(
        "--size-mb",
        type=float,
        default=8.0,
        help="vector each worker offers, in MB of float32 (1 MB = 10^6 bytes, "
        "rounded down to whole floats; default 8)",
    )
    p.add_argument(
        "--ops",
        type=int,
        default=10,
        help="ops per scheme: groups in the trace, or Gloo all-reduces (default 10; "
        "0 skips the op benchmark, for --train alone)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        metavar="W",
        help="before each scheme's trace, W untimed groups of all n workers with that scheme, "
        "so the timed ops find the data connections open and their TCP windows grown "
        "(measured: a fresh connection was receive-window limited for 64%% of its first op); "
        "not for gloo (default 0)",
    )
    p.add_argument(
        "--raw-tcp",
        action="store_true",
        help="after each scheme's ops, move the bytes its plans put on each link in one op"
        " over the same links at once with plain TCP (sendall, recv_into; no framing, MAC or"
        " aggregation), three times: the table gains the scheme's median op and CPU s/GB"
        " divided by the raw move's (÷ raw, CPU ÷ raw), the kernel's own cost here",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="R",
        help="run the scheme list R times on the same network, each round rotated one place "
        "(round 2 starts with the second scheme), and report per scheme the median of the "
        "rounds' medians with their range and in how many rounds it was the fastest: the "
        "machine's speed drifts, so schemes run one after another are compared fairly only "
        "over rounds. Run folders become OUT/round-K/SCHEME (default 1)",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder for results, plots and the schemes' run folders",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="delete run folders of an earlier benchmark in --out instead of refusing",
    )
    add_config_flags(p, ("seed",))
    p.add_argument(
        "--timeout-per-op",
        type=float,
        default=60.0,
        metavar="S",
        help="a scheme fails when its K ops take longer than S x K seconds plus a "
        f"start-up allowance ({STARTUP_NUMPY_S:.0f} s; gloo {STARTUP_TORCH_S:.0f}"
        " s, it imports torch); default 60",
    )
    p.add_argument(
        "--train",
        action="store_true",
        help="also train a model with each scheme (real torch workers) and report "
        "rounds per worker per minute and time to --target-accuracy",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=60.0,
        metavar="S",
        help="with --train: seconds of training per scheme, counted from the first "
        "reported iteration (default 60)",
    )
    p.add_argument(
        "--target-accuracy",
        type=float,
        default=0.85,
        help="with --train: held-out accuracy whose first reaching (mean of every "
        "worker's latest) is timed (default 0.85)",
    )
    p.add_argument(
        "--pace",
        type=float,
        default=None,
        metavar="F",
        help="pace every data connection at F x its link's configured rate with TCP's own"
        " pacing (the workers' CREW_PACE; no fq needed), so HTB queues stay empty and flows"
        f" share a link as planned; 0 = unpaced (default {BENCH_PACE}, or CREW_PACE if set)."
        " The bench's links keep their rates, so the configured rate is the link's rate",
    )
    add_config_flags(p, BENCH_FIELDS)
    p.add_argument(
        "--target-loss",
        type=float,
        default=2.0,
        help="with --train --workload lm: mean held-out loss (nats per byte) whose first "
        "reaching is timed (default 2.0)",
    )
    p.add_argument(
        "--configs",
        action="append",
        default=[],
        metavar="SCHEMES:SYNCS:COMPRESS",
        help="with --train: a matrix of training runs instead of one per --schemes entry, "
        "e.g. crew,preduce:every-step,diloco:none,int8 (every combination, in order); "
        "repeat for more. local-sgd and diloco take --local-steps, every-step H = 1",
    )
    p.add_argument(
        "--groups",
        metavar="SIZES",
        help="with --train: run every training configuration once per entry, a comma list"
        " of group sizes and 'quorum' (groups that size themselves between 2 and all"
        " workers, crew.control.quorum), e.g. 2,3,4,5,quorum (default: --group-size alone)",
    )
    add_training_flags(p.add_argument_group("training (with --train; docs/training.md)"))
    add_allow_missing(p)
    p.add_argument("--log-level", default="WARNING", help="log level of the benchmark itself")
    p.add_argument("--sim", action="store_true", help="also print simulated / emulated per op")
    add_json_flag(p, "results.json")
    return p


def spec_from_args(args: argparse.Namespace) -> BenchSpec:
    """Validate the command line into a :class:`BenchSpec`; raises BenchError or TopologyError."""
    topo = load_topology(args.topology)
    schemes = parse_schemes(args.schemes)
    if not 2 <= args.p <= topo.n:
        raise BenchError(
            config_flag("p"),
            f"must be between 2 and n={topo.n} (workers in {topo.name!r}), got {args.p}",
        )
    if not (math.isfinite(args.size_mb) and args.size_mb > 0):
        raise BenchError("--size-mb", f"must be positive, got {args.size_mb}")
    size_elems = int(args.size_mb * MB) // 4
    if size_elems < 1:
        raise BenchError("--size-mb", f"must be at least 4 bytes, got {args.size_mb} MB")
    if args.ops < 0 or (args.ops == 0 and not args.train):
        raise BenchError("--ops", f"must be >= 1 (0 only with --train), got {args.ops}")
    if args.warmup < 0:
        raise BenchError("--warmup", f"must be >= 0, got {args.warmup}")
    if args.rounds < 1:
        raise BenchError("--rounds", f"must be >= 1, got {args.rounds}")
    if not (math.isfinite(args.timeout_per_op) and args.timeout_per_op > 0):
        raise BenchError("--timeout-per-op", f"must be positive, got {args.timeout_per_op}")
    if args.train and not (math.isfinite(args.duration) and args.duration > 0):
        raise BenchError("--duration", f"must be positive, got {args.duration}")
    pace = args.pace
    if pace is None:
        pace = float(os.environ.get("CREW_PACE") or BENCH_PACE)
    if not 0 <= pace <= 1:
        raise BenchError("--pace", f"must be a fraction in [0, 1], got {pace}")
    if args.part_bytes < 0 or args.part_bytes % 4:
        raise BenchError(
            config_flag("part_bytes"),
            f"must be 0 or a positive multiple of 4, got {args.part_bytes}",
        )
    if args.hop_backlog_bytes < 0:
        raise BenchError(
            config_flag("hop_backlog_bytes"), f"must be an int >= 0, got {args.hop_backlog_bytes}"
        )
    if not 0 < args.target_accuracy <= 1:
        raise BenchError("--target-accuracy", f"must be in (0, 1], got {args.target_accuracy}")
    training: dict[str, Any] = {}
    runs: tuple[TrainRun, ...] = ()
    if args.configs:
        if not args.train:
            raise BenchError("--configs", "needs --train")
        runs = parse_train_configs(args.configs, args)
    else:
        encrypted = [s for s in schemes if s.endswith((ENCRYPTED, SECRET))]
        if args.train and encrypted:
            raise BenchError(
                "--schemes",
                f"{encrypted[0]}: {ENCRYPTED} and {SECRET} are for op benchmarks; with --train"
                " use --encrypt",
            )
        try:
            for scheme in schemes:
                training = training_options(args, scheme=scheme, nonblocking=False)
        except ConfigError as exc:
            raise BenchError(*flag_error(exc)) from None
        runs = tuple(
            TrainRun(s, s, training_options(args, scheme=s, nonblocking=False)) for s in schemes
        )
    if args.groups is not None and not args.train:
        raise BenchError("--groups", "needs --train")
    runs = expand_group_sizes(runs, args.groups, topo.n)
    return BenchSpec(
        topology=topo,
        schemes=schemes,
        p=args.p,
        size_bytes=size_elems * 4,
        ops=args.ops,
        seed=args.seed,
        timeout_per_op_s=args.timeout_per_op,
        out=args.out,
        train=args.train,
        duration_s=args.duration,
        target_accuracy=args.target_accuracy,
        allow_missing=allowed_missing(args),
        pace=pace,
        **config_values(args, BENCH_FIELDS),
        training=training,
        target_loss=args.target_loss,
        train_runs=runs if args.train else (),
        warmup=args.warmup,
        rounds=args.rounds,
        raw_tcp=args.raw_tcp,
    )


def prepare_out(spec: BenchSpec, overwrite: bool) -> None:
    """Make --out; refuse (or with --overwrite, delete) run folders of an earlier benchmark,
    since a run database is appended to, which would mix two benchmarks' ops."""
    folders = (
        [
            run_folder(spec.out, s, r, spec.rounds)
            for r in range(1, spec.rounds + 1)
            for s in spec.schemes
        ]
        if spec.ops
        else []
    )
    if spec.train:
        folders += [spec.out / "train" / r.name for r in spec.train_runs]
    existing = [f for f in folders if f.exists()]
    if existing and not overwrite:
        raise BenchError(
            "--out",
            f"{existing[0]} exists from an earlier benchmark; choose "
            f"another --out or pass --overwrite",
        )
    for f in existing:
        shutil.rmtree(f)
    spec.out.mkdir(parents=True, exist_ok=True)


def write_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON so that a reader sees the old file or the new one, never half."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
    )


def record_rounds(
    results: BenchResults,
    schemes: Sequence[str],
    rounds: list[dict[str, SchemeResults]],
    total: int,
) -> None:
    """Put the rounds run so far (of ``total``) into ``results``: a single round as ever
    (``schemes``); several: each round's results (``rounds``), their summary (``repeat``) and
    ``schemes`` pooled over them (``lab.report.benchrounds``)."""
    if total == 1:
        results["schemes"] = {s: rounds[0][s] for s in schemes if s in rounds[0]}
        return
    results["rounds"] = rounds
    results["repeat"] = round_summary(rounds)
    results["schemes"] = {
        s: pool_results([rnd[s] for rnd in rounds if s in rnd])
        for s in schemes
        if any(s in rnd for rnd in rounds)
    }


def results_header(
    spec: BenchSpec, trace: list[list[int]], tag: str, seen: list[str], started: float
) -> BenchResults:
    """``results.json`` before the first scheme has run: the benchmark's inputs, no schemes."""
    topo = spec.topology
    return {
        "topology": topo.name,
        "n": topo.n,
        "p": spec.p,
        "size_bytes": spec.size_bytes,
        "ops": spec.ops,
        "warmup": spec.warmup,
        "round_count": spec.rounds,
        "seed": spec.seed,
        "trace": trace,
        "started_at": started,
        "wall_s": None,
        "lab_tag": tag,
        "pace": spec.pace,
        "host_cpu_s_per_gb": spec.host_cpu_s_per_gb,
        "host_cores": spec.host_cores,
        "hop_backlog_bytes": spec.hop_backlog_bytes,
        "other_labs_seen": seen,
        "schemes": {},
    }


def run_benchmark(spec: BenchSpec) -> tuple[BenchResults, dict[str, Any] | None]:
    """Build one network, run every scheme on it (and train, if asked); write the JSON files.

    Returns (results, train results or None). The network is torn down whatever happens.
    """
    caps = check(spec.topology, spec.allow_missing)
    console.print(describe(caps, spec.topology))
    # The workers read it at start (crew.runtime.node.pace_fraction); they inherit this env.
    os.environ["CREW_PACE"] = repr(spec.pace)
    console.print(f"pacing: {f'{spec.pace:g} x each link rate' if spec.pace else 'off'}")
    if spec.host_cpu_s_per_gb:
        console.print(
            f"crew plans with the host CPU as a capacity: {spec.host_cpu_s_per_gb:g} CPU s/GB"
            f" on {spec.host_cores:g} cores"
        )
    topo = spec.topology
    trace = make_trace(topo.n, spec.p, spec.ops, spec.seed)
    tag = secrets.token_hex(2)
    seen = set(other_labs(tag))
    started = time.time()
    results = results_header(spec, trace, tag, sorted(seen), started)
    train: dict[str, Any] | None = None
    with LabNetwork(topo, tag=tag, capabilities=caps, mgmt_subnet=free_mgmt_subnet()) as net:
        with progress_bar() as progress:
            if spec.ops:
                rounds: list[dict[str, SchemeResults]] = []
                for r, order in enumerate(round_orders(spec.schemes, spec.rounds), 1):
                    rounds.append({})
                    for i, scheme in enumerate(order, 1):
                        res = run_ops(net, caps, spec, scheme, trace, progress, i, r)
                        seen |= set(other_labs(tag))
                        rounds[-1][scheme] = res.to_dict()
                        results["other_labs_seen"] = sorted(seen)
                        results["wall_s"] = time.time() - started
                        record_rounds(results, spec.schemes, rounds, spec.rounds)
                        write_atomic(spec.out / "results.json", results)
            if spec.train:
                train = {
                    "topology": topo.name,
                    "p": spec.p,
                    "seed": spec.seed,
                    "duration_s": spec.duration_s,
                    "target_accuracy": spec.target_accuracy,
                    "target_loss": spec.target_loss,
                    "schemes": {},
                }
                for i, run in enumerate(spec.train_runs, 1):
                    tr = run_training(net, caps, spec, run, progress, i)
                    seen |= set(other_labs(tag))
                    sch, sync, codec = run.label
                    train["schemes"][run.name] = tr.to_dict() | {
                        "config": {"scheme": sch, "sync_label": sync, "codec": codec}
                        | run.training
                        | {"p": spec.p if run.p is None else run.p}
                    }
                    train["other_labs_seen"] = sorted(seen)
                    write_atomic(spec.out / "train.json", train)
    results["wall_s"] = time.time() - started
    results["other_labs_seen"] = sorted(seen)
    if spec.ops:
        write_atomic(spec.out / "results.json", results)
    return results, train


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    try:
        spec = spec_from_args(args)
        prepare_out(spec, args.overwrite)
    except (BenchError, TopologyError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return EXIT_BAD_INPUT
    # SIGTERM ends the benchmark as Ctrl-C does: through the context managers' cleanup.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        results, train = run_benchmark(spec)
    except PreflightError as exc:
        console.print(f"[red]{exc}[/red]")
        return EXIT_PREFLIGHT
    failed = False
    if spec.ops:
        title = (
            f"{results['topology']}: p={spec.p}, {spec.size_bytes / MB:g} MB, "
            f"{spec.ops} ops, seed {spec.seed} (wall {results['wall_s']:.0f} s)"
        )
        if spec.rounds > 1:
            title = f"{title}, pooled over {spec.rounds} rounds"
            console.print(rounds_table(results["repeat"], results["topology"], spec.rounds))
        console.print(results_table(results["schemes"], title, spec.ops * spec.rounds))
        for line in error_lines(results["schemes"]):
            console.print(f"[red]failed[/red] {line}", highlight=False)
        failed |= not all(r["correct"] for r in results["schemes"].values())
        for note in write_figures(build_figures(results), spec.out):
            console.print(note)
        console.print(f"results: {spec.out / 'results.json'}")
        write_json(args.json, results)
        if args.sim:  # the same trace, sizes and topology in crew.sim's network model
            from lab.report.simagree import bench_report

            console.print(bench_report(results, args.topology), highlight=False)
    if train is not None:
        console.print(train_table(train["schemes"], spec.target_accuracy))
        failed |= any(r["error"] for r in train["schemes"].values())
        console.print(f"training results: {spec.out / 'train.json'}")
        for note in write_figures(train_figures(train), spec.out, "train-plots.html"):
            console.print(note)
    if results["other_labs_seen"]:
        console.print(
            f"[yellow]note:[/yellow] other labs ran on this machine meanwhile "
            f"({', '.join(results['other_labs_seen'])}): timings are distorted"
        )
    return EXIT_SCHEME_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
