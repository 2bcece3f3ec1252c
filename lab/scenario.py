"""``python -m lab.scenario``: validate a fault scenario and print its timeline
(lab/spec/scenario.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from crew.cli_options import command_parser
from lab.orchestrate import commands as cmds
from lab.orchestrate.commands import LabLimits
from lab.spec.scenario import ScenarioError, load_scenario
from lab.spec.shipped import default_topology, topology_arg
from lab.spec.topology import TopologyError, load_topology

DEFAULT_TOPOLOGY = default_topology()


def _build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "python -m lab.scenario",
        "Validate a CREW Lab fault scenario and print its expanded timeline. "
        "The format is described in scenarios/README.md.",
        epilog="Exit status: 0 if valid, 2 if not (the error goes to stderr).",
    )
    p.add_argument("path", type=Path, metavar="PATH", help="scenario YAML file")
    p.add_argument(
        "--n", type=int, default=None, help="number of workers (default: the topology's)"
    )
    p.add_argument(
        "--topology",
        type=topology_arg,
        default=None,
        help="topology whose link rates scale_link and chaos 'rate' faults scale (default: "
        "topologies/default.yaml when --n is omitted or matches its worker count)",
    )
    p.add_argument(
        "--impairments",
        default="rate",
        help="comma-separated impairments the lab offers: rate,delay,jitter,loss (default rate)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    n: int | None = args.n
    if n is not None and n < 1:
        print(f"error: --n must be at least 1, got {n}", file=sys.stderr)
        return 2
    rates = None
    topo_path = args.topology if args.topology is not None else DEFAULT_TOPOLOGY
    try:
        topo = load_topology(topo_path)
    except TopologyError as e:
        if args.topology is not None:
            print(f"error: {e}", file=sys.stderr)
            return 2
        topo = None  # the default is a convenience; without it only rate-free scenarios load
    if topo is not None and (n is None or n == topo.n):
        n, rates = topo.n, topo.bw_matrix()
        print(f"(link rates from {topo_path})", file=sys.stderr)
    elif args.topology is not None:
        assert topo is not None
        print(f"error: --n {n} but {args.topology} has {topo.n} workers", file=sys.stderr)
        return 2
    if n is None:
        print("error: give --n or --topology", file=sys.stderr)
        return 2
    imp = frozenset(x.strip() for x in args.impairments.split(",") if x.strip())
    limits = LabLimits(n=n, impairments=imp | cmds.ALWAYS_AVAILABLE)
    try:
        scenario = load_scenario(args.path, n, limits=limits, rates=rates)
    except ScenarioError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(scenario.timeline())
    return 0


if __name__ == "__main__":
    sys.exit(main())
