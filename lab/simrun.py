"""Simulate a run on a lab topology YAML, with a lab scenario: ``python -m lab.simrun``.

The glue between the lab's inputs and ``crew.sim`` (``crew`` never imports ``lab``):

* the topology YAML is parsed by ``lab.spec.topology.load_topology``: rates, one-way delays,
  clouds, per-worker straggler specs (jitter and loss are not simulated; a warning says so);
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
from collections.abc import Sequence
from pathlib import Path

from crew.cli_options import command_parser
from crew.sim.__main__ import (
    add_run_options,
    check_run_options,
    config_from,
    faults_from,
    report,
    run,
)
from lab.spec.scenario import load_scenario
from lab.spec.shipped import topology_arg
from lab.spec.simulated import scenario_faults, sim_topology
from lab.spec.topology import load_topology

log = logging.getLogger("lab.simrun")


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
    add_run_options(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.INFO if args.progress else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    spec = load_topology(args.topology)
    topo = sim_topology(spec)
    check_run_options(parser, args, topo.n)
    faults = faults_from(args)
    if args.scenario is not None:
        extra, skipped = scenario_faults(
            load_scenario(args.scenario, topo.n, rates=spec.bw_matrix())
        )
        faults += extra
        for s in skipped:  # beside a JSON report on standard output, on standard error
            print(f"not simulated: {s}", file=sys.stderr if args.json == "-" else sys.stdout)
    cfg = config_from(args, topo.n)
    res = run(topo, cfg, faults, args.out)
    report(res, args, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
