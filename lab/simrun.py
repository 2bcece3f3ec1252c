"""Simulate a run on a lab topology YAML, with a lab scenario: ``python -m lab.simrun``.

The glue between the lab's inputs and ``crew.sim`` (``crew`` never imports ``lab``):

* the topology YAML is parsed by ``lab.spec.topology.load_topology``: rates, one-way delays,
  clouds, per-worker straggler specs (jitter and loss are not simulated; a warning says so);
* links that follow a rate trace (``lab.spec.ratetraces``) step as the lab would step them,
  each second (``crew.drift.DriftSchedule.steps``), as ``SET_RATE`` faults; ``--capacity
  oracle`` tells the planner each step;
* a scenario is expanded by ``lab.spec.scenario.load_scenario`` (macros such as
  ``fail_random_links`` included, with the same seed, so the simulated failures are the
  ones the lab would inject). Time steps map to simulator faults: ``cut_link`` (``both``
  cuts the reverse too) and ``kill_worker``; other commands, and ``after_groups`` triggers,
  are listed as not simulated.

Example::

    python -m lab.simrun --topology topologies/default.yaml --scenario \
        scenarios/random-link-failures.yaml --group-size 3 --scheme crew --duration 120 \
        --out runs/s1
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from crew.cli_options import add_config_flags, command_parser
from crew.ratetrace import RateTrace
from crew.sim.__main__ import (
    add_run_options,
    check_run_options,
    config_from,
    faults_from,
    report,
    run,
)
from crew.sim.engine import Fault, FaultKind
from lab.orchestrate.drift import lab_schedule
from lab.spec.ratetraces import TraceRefError, load_link_traces
from lab.spec.scenario import load_scenario
from lab.spec.shipped import topology_arg
from lab.spec.simulated import scenario_faults, sim_topology
from lab.spec.topology import TopologyError

log = logging.getLogger("lab.simrun")


def trace_faults(traces: Mapping[tuple[int, int], RateTrace], duration_s: float) -> list[Fault]:
    """The rate steps a lab run applies for ``traces`` (each second, changes over 2%, clamped
    to what the lab can shape), as simulator faults."""
    return [
        Fault(t, FaultKind.SET_RATE, c.src, c.dst, mbit=c.mbit)
        for t, c in lab_schedule(traces).steps(duration_s)
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "python -m lab.simrun", "Simulate a run (crew.sim) on a lab topology YAML and scenario."
    )
    parser.add_argument(
        "--topology",
        type=topology_arg,
        required=True,
        help="the lab topology YAML to simulate, or a shipped topology's name",
    )
    parser.add_argument(
        "--scenario",
        type=Path,
        help="a lab scenario YAML: its link cuts and worker kills become simulator faults",
    )
    # configured, or oracle: the planner told each traced link's step; the simulator does not
    # model measuring rates.
    add_config_flags(parser, ("capacity",))
    add_run_options(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.INFO if args.progress else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        spec, traces = load_link_traces(args.topology)
    except (TopologyError, TraceRefError) as exc:
        parser.error(str(exc))
    topo = sim_topology(spec)
    check_run_options(parser, args, topo.n)
    if args.capacity == "measured":
        parser.error(
            "--capacity measured: the simulator does not model measuring rates; traced links"
            " step as the lab steps them, and oracle tells the planner each step"
        )
    faults = faults_from(args) + trace_faults(traces, args.duration)
    if args.scenario is not None:
        extra, skipped = scenario_faults(
            load_scenario(args.scenario, topo.n, rates=spec.bw_matrix())
        )
        faults += extra
        for s in skipped:  # beside a JSON report on standard output, on standard error
            print(f"not simulated: {s}", file=sys.stderr if args.json == "-" else sys.stdout)
    cfg = replace(config_from(args, topo.n), oracle=args.capacity == "oracle")
    res = run(topo, cfg, faults, args.out)
    report(res, args, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
