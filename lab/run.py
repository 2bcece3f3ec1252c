"""Run the lab: ``sudo python -m lab.run [options]``.

Builds the emulated cross-cloud network of a topology, starts the coordinator, one training
worker per emulated host, the link monitor and the dashboard, shows progress until the
duration is up (or Ctrl-C), then stops everything, removes the network, and prints a summary.
Everything the run did is in ``runs/<run-id>/lab.db``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

import crew.cli_options as flags
from crew.cli_options import command_parser, write_json
from crew.config import ConfigError
from crew.config_checks import check_aggregate, check_helpers
from crew.runtime.rundb import GroupStatus
from lab.net.preflight import PreflightError, add_allow_missing, allowed_missing, check, describe
from lab.orchestrate.runner import REPO, LabRun, RunOptions, lab_limits, new_run_id
from lab.orchestrate.summary import summarize
from lab.spec.ratetraces import TraceRefError, load_link_traces
from lab.spec.scenario import ScenarioError, load_scenario
from lab.spec.shipped import add_topology_flag
from lab.spec.topology import Impairment, TopologyError

log = logging.getLogger("lab.run")
console = Console(stderr=True)

EXIT_OK = 0
EXIT_WORKER_CRASHED = 1
EXIT_BAD_INPUT = 2
EXIT_PREFLIGHT = 3

DEFAULTS = RunOptions()  # the dashboard's and the log's defaults; the rest are RunConfig's

# The RunConfig fields lab.run sets from its flags (crew.cli_options), besides the training ones.
RUN_FIELDS = (
    "p",
    "scheme",
    "seed",
    "width",
    "depth",
    "partition",
    "staleness",
    "part_bytes",
    "nonblocking",
    "quorum_min",
    "quorum_max",
    "helpers",
    "capacity",
    "encrypt",
    "check",
    "aggregate",
    "clip_radius",
    "clip_factor",
    "host_cpu_s_per_gb",
    "committed_capacity",
    "flow_order",
    "hop_backlog_bytes",
    "stall_timeout_s",
    "heartbeat_timeout_s",
)


def build_parser() -> argparse.ArgumentParser:
    d = DEFAULTS
    p = command_parser(
        "python -m lab.run",
        __doc__,
        epilog="exit status: 0 when the run ended as asked; 1 when a worker crashed (ended by\n"
        "itself with an error, not stopped by the lab or a fault command); 2 on bad options;\n"
        "3 when the machine lacks what the topology needs",
    )
    add_topology_flag(p, "topology YAML, or a shipped topology's name (default: default)")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this many seconds (default: run until Ctrl-C)",
    )
    flags.add_out_flag(
        p,
        "folder for this run's database, config and logs, not used by an earlier run"
        " (default: runs/<run-id>)",
        old=("--run-dir",),
    )
    flags.add_json_flag(p, "the end-of-run summary", old=("--summary-json",))
    flags.add_config_flags(p.add_argument_group("the run"), RUN_FIELDS)
    flags.add_training_flags(p.add_argument_group("training (docs/training.md)"))
    add_allow_missing(p)
    lab = p.add_argument_group("the lab")
    lab.add_argument(
        "--scenario",
        type=Path,
        default=None,
        help="play a fault scenario (YAML timeline, see scenarios/) during the run",
    )
    lab.add_argument(
        "--scenario-time-scale",
        type=float,
        default=1.0,
        help="multiply every 'at' time of --scenario by this (e.g. 0.25 for a short "
        "run); group-count triggers are unchanged",
    )
    lab.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where the lab records what it creates, so that a lab that died can be "
        "cleaned up by the next (default /run/crew-lab)",
    )
    lab.add_argument(
        "--no-dashboard",
        action="store_true",
        default=not d.dashboard,
        help="do not start the dashboard",
    )
    lab.add_argument(
        "--dashboard-host",
        default=os.environ.get("CREW_LAB_DASHBOARD_HOST", d.dashboard_host),
        help=f"address the dashboard binds (default {d.dashboard_host}, or "
        "$CREW_LAB_DASHBOARD_HOST, which the Vagrant VM sets to 0.0.0.0 for its "
        "port forward; beyond loopback the page's controls need the token in the address "
        "lab.run prints, ...?token=...)",
    )
    lab.add_argument(
        "--dashboard-port",
        type=int,
        default=d.dashboard_port,
        help=f"dashboard port ({d.dashboard_port})",
    )
    lab.add_argument(
        "--log-level", default=d.log_level, help="log level of lab, coordinator, workers"
    )
    return p


DASHBOARD_WAIT_S = 20.0


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    """Whether something accepts connections on host:port within ``timeout`` seconds."""
    target = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((target, port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.25)
    return False


def progress_table(lab: LabRun, started: float, duration: float | None) -> Table:
    assert lab.db is not None
    rows = lab.db.query(
        "SELECT COUNT(*) AS c, SUM(status=?) AS done, SUM(status=?) AS ab,"
        " SUM(status=?) AS open FROM groups",
        (GroupStatus.COMPLETED.value, GroupStatus.ABANDONED.value, GroupStatus.OPEN.value),
    )
    g = rows[0]
    acc = lab.db.query(
        "SELECT worker, accuracy, loss, iteration FROM iterations WHERE accuracy IS NOT NULL"
        " AND t > ? ORDER BY t DESC LIMIT ?",
        (time.time() - 30, lab.topo.n * 4),
    )
    latest: dict[int, float] = {}
    latest_loss: dict[int, float] = {}
    for r in acc:
        latest.setdefault(r["worker"], r["accuracy"])
        latest_loss.setdefault(r["worker"], r["loss"])
    elapsed = time.time() - started
    table = Table(title=f"CREW Lab run {lab.run_id}", show_header=False, box=None)
    when = f"{elapsed:.0f} s" + (f" / {duration:.0f} s" if duration else " (Ctrl-C stops)")
    table.add_row("elapsed", when)
    table.add_row("scheme, p", f"{lab.opts.scheme}, p={lab.opts.p}")
    table.add_row(
        "groups", f"{g['done'] or 0} completed, {g['open'] or 0} open, {g['ab'] or 0} abandoned"
    )
    if latest:
        mean = sum(latest.values()) / len(latest)
        # The synthetic workload's "accuracy" is the share of its averages that verified.
        label = "averages verified" if lab.opts.workload == "synthetic" else "held-out accuracy"
        table.add_row(label, f"{mean:.3f} (mean of {len(latest)} workers)")
    if latest_loss and lab.opts.workload == "lm":
        loss = sum(latest_loss.values()) / len(latest_loss)
        table.add_row("held-out loss", f"{loss:.3f} nats/byte, perplexity {math.exp(loss):.2f}")
    if lab.dashboard is not None:
        table.add_row("dashboard", lab.dashboard_url)
    table.add_row("database", str(lab.db_path))
    return table


def print_summary(summary: dict) -> None:
    t = Table(title="summary")
    t.add_column("what")
    t.add_column("value")
    for key in (
        "run_id",
        "scheme",
        "p",
        "duration_s",
        "groups_completed",
        "groups_abandoned",
        "median_group_s",
        "median_over_bound",
        "final_accuracy",
        "workload",
        "sync",
        "local_steps",
        "overlap",
        "min_iteration_s",
        "compress",
        "final_heldout_loss",
        "max_verify_err",
        "compute_utilisation",
        "startup_s",
        "cpu_share",
        "host_busy_share",
        "host_cpu_s_per_link_gb",
        "link_bytes_total",
        "db",
    ):
        v = summary.get(key)
        t.add_row(key, f"{v:.3f}" if isinstance(v, float) else str(v))
    t.add_row(
        "rounds per worker", " ".join(f"w{k}:{v}" for k, v in summary["rounds_per_worker"].items())
    )
    if summary.get("workers_crashed"):
        t.add_row(
            "workers crashed",
            " ".join(f"w{k}:exit {v}" for k, v in summary["workers_crashed"].items()),
        )
    busiest = sorted(summary["link_bytes"].items(), key=lambda kv: -kv[1])[:5]
    t.add_row("busiest links", ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in busiest))
    console.print(t)


def options_from_args(
    args: argparse.Namespace,
    allow: frozenset[Impairment] = frozenset(),
    training: dict[str, Any] | None = None,
) -> RunOptions:
    """The run's options from ``build_parser()``'s arguments; ``training`` is
    :func:`~crew.cli_options.training_options` of them (checked)."""
    return RunOptions(
        **flags.config_values(args, RUN_FIELDS),
        dashboard=not args.no_dashboard,
        dashboard_host=args.dashboard_host,
        dashboard_port=args.dashboard_port,
        allow_missing=allow,
        log_level=args.log_level,
        **(training or {}),
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        topo, traces = load_link_traces(args.topology)
    except (TopologyError, TraceRefError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return EXIT_BAD_INPUT
    if args.capacity == "oracle" and not traces:
        console.print(
            f"[red]error:[/red] {flags.config_flag('capacity')}: oracle tells the planner the"
            " rates of links that follow a rate trace, and this topology has none"
        )
        return EXIT_BAD_INPUT
    if not 1 <= args.p <= topo.n:
        console.print(
            f"[red]error:[/red] {flags.config_flag('p')}: must be between 1 and {topo.n} "
            f"(the topology has {topo.n} workers), got {args.p}"
        )
        return EXIT_BAD_INPUT
    top = args.quorum_max or topo.n
    if (args.quorum_min or args.quorum_max) and not 1 <= args.quorum_min <= top <= topo.n:
        console.print(
            f"[red]error:[/red] {flags.config_flag('quorum_min')}: need 1 <= --quorum-min"
            f" ({args.quorum_min}) <= --quorum-max ({top}) <= {topo.n} workers"
        )
        return EXIT_BAD_INPUT
    if args.duration is not None and args.duration <= 0:
        console.print("[red]error:[/red] --duration: must be positive")
        return EXIT_BAD_INPUT
    if args.out is not None and (args.out / "lab.db").exists():
        console.print(f"[red]error:[/red] --out: {args.out} already holds a run; give a new folder")
        return EXIT_BAD_INPUT
    try:
        training = flags.training_options(args, scheme=args.scheme, nonblocking=args.nonblocking)
        check_aggregate(
            args.aggregate,
            args.clip_radius,
            args.clip_factor,
            args.check,
            args.compress,
            args.scheme,
            args.nonblocking,
        )
        if args.helpers is not None:  # left out: the planner's default for this many workers
            shared = bool(topo.shared_uplinks()) or args.host_cpu_s_per_gb.s_per_gb > 0
            check_helpers(args.helpers, shared=shared)
    except ConfigError as exc:
        flag, why = flags.flag_error(exc)
        console.print(f"[red]error:[/red] {flag}: {why}")
        return EXIT_BAD_INPUT
    allow = allowed_missing(args)
    try:
        caps = check(topo, allow)
    except PreflightError as exc:
        console.print(f"[red]{exc}[/red]")
        return EXIT_PREFLIGHT
    console.print(describe(caps, topo))
    scenario = None
    if args.scenario is not None:
        try:
            scenario = load_scenario(
                args.scenario,
                topo.n,
                limits=lab_limits(topo, caps),
                rates=topo.bw_matrix(),
                time_scale=args.scenario_time_scale,
            )
        except ScenarioError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return EXIT_BAD_INPUT
        console.print(scenario.timeline())
    opts = replace(options_from_args(args, allow, training), rate_traces=traces)
    run_dir = args.out or (REPO / "runs" / new_run_id())
    # SIGTERM ends the run as Ctrl-C does: through the context manager's cleanup.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    started = time.time()
    lab = LabRun(topo, caps, opts, run_dir, state_dir=args.state_dir, scenario=scenario)
    try:
        with lab:
            if lab.dashboard is not None:
                if wait_for_port(args.dashboard_host, args.dashboard_port, DASHBOARD_WAIT_S):
                    console.print(f"dashboard: [bold]{lab.dashboard_url}[/bold]")
                else:
                    console.print(
                        f"[yellow]the dashboard does not answer on {lab.dashboard_url}"
                        f" yet; see {lab.run_dir / 'logs' / 'dashboard.log'}[/yellow]"
                    )
            with Live(
                progress_table(lab, started, args.duration),
                console=console,
                refresh_per_second=2,
                transient=False,
            ) as live:
                while args.duration is None or time.time() - started < args.duration:
                    lab.poll()
                    live.update(progress_table(lab, started, args.duration))
                    time.sleep(0.5)
            lab.poll()  # a worker that crashed since the last poll
    except KeyboardInterrupt:
        console.print("stopping (Ctrl-C) ...")
    console.print()
    summary = summarize(run_dir / "lab.db") | {
        "workers_crashed": {str(w): code for w, code in sorted(lab.crashed.items())}
    }
    print_summary(summary)
    write_json(args.json, summary)
    if lab.crashed:
        crashed = ", ".join(f"w{w} (exit code {code})" for w, code in sorted(lab.crashed.items()))
        console.print(
            f"[red]workers crashed:[/red] {crashed}; see {run_dir / 'logs'}", highlight=False
        )
        return EXIT_WORKER_CRASHED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
