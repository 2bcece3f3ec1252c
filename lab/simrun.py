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
        scenarios/random-link-failures.yaml --p 3 --scheme crew --duration 120 --run-dir runs/s1
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from crew.sim.__main__ import add_run_options, config_from, faults_from, run, summary
from lab.spec.scenario import load_scenario
from lab.spec.shipped import topology_arg
from lab.spec.simulated import scenario_faults, sim_topology
from lab.spec.topology import load_topology

log = logging.getLogger("lab.simrun")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.simrun",
        description="Simulate a run (crew.sim) on a lab topology YAML and scenario.",
    )
    parser.add_argument("--topology", type=topology_arg, required=True)
    parser.add_argument("--scenario", type=Path)
    add_run_options(parser)
    args = parser.parse_args(argv)
    level = logging.INFO if args.progress else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    spec = load_topology(args.topology)
    topo = sim_topology(spec)
    if not 1 <= args.p <= topo.n:
        parser.error(f"--p: must be between 1 and {topo.n}")
    faults = faults_from(args)
    if args.scenario is not None:
        extra, skipped = scenario_faults(
            load_scenario(args.scenario, topo.n, rates=spec.bw_matrix())
        )
        faults += extra
        for s in skipped:
            print(f"not simulated: {s}")
    cfg = config_from(args, topo.n)
    res = run(topo, cfg, faults, args.run_dir)
    print(summary(res, args.run_dir, cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
