"""Simulate a run on a lab topology YAML, with a lab scenario: ``python -m lab.simrun``.

The glue between the lab's inputs and ``crew.sim`` (``crew`` never imports ``lab``):

* the topology YAML is parsed by ``lab.topology.load_topology``: rates, one-way delays,
  clouds, per-worker straggler specs (jitter and loss are not simulated; a warning says so);
* a scenario is expanded by ``lab.scenario.load_scenario`` (macros such as
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

import numpy as np

from crew.sim.__main__ import add_run_options, config_from, faults_from, run, summary
from crew.sim.engine import Fault, FaultKind
from crew.sim.topogen import SimTopology
from lab.orchestrate import commands as cmds
from lab.scenario import Scenario, TriggerKind, load_scenario
from lab.topology import TopologySpec, load_topology

log = logging.getLogger("lab.simrun")


def sim_topology(spec: TopologySpec) -> SimTopology:
    """The simulator's view of a lab topology."""
    bw = spec.bw_matrix()
    n = spec.n
    delay = np.zeros((n, n))
    for lk in spec.links:
        delay[lk.src, lk.dst] = lk.delay_ms
        if lk.jitter_ms or lk.loss_pct:
            log.warning("link %d->%d: jitter and loss are not simulated", lk.src, lk.dst)
    for i in range(n):
        bw[i, i] = 0.0
        delay[i, i] = 0.0
    return SimTopology(
        name=spec.name,
        names=tuple(w.name for w in spec.workers),
        clouds=tuple(w.cloud for w in spec.workers),
        rate_mbit=bw,
        delay_ms=delay,
        stragglers=tuple(w.straggler for w in spec.workers),
        description=spec.description,
    )


def scenario_faults(scenario: Scenario) -> tuple[list[Fault], list[str]]:
    """Simulator faults for a scenario's timed link cuts and kills; the rest, described."""
    faults: list[Fault] = []
    skipped: list[str] = []
    for step in scenario.steps:
        c = step.command
        if step.trigger.kind is not TriggerKind.AT:
            skipped.append(f"{step.trigger.describe()}: {c}")
        elif isinstance(c, cmds.CutLink):
            faults.append(Fault(step.trigger.value, FaultKind.CUT_LINK, c.src, c.dst))
            if c.both:
                faults.append(Fault(step.trigger.value, FaultKind.CUT_LINK, c.dst, c.src))
        elif isinstance(c, cmds.KillWorker):
            faults.append(Fault(step.trigger.value, FaultKind.KILL_WORKER, c.worker))
        else:
            skipped.append(f"{step.trigger.describe()}: {c}")
    return faults, skipped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.simrun",
        description="Simulate a run (crew.sim) on a lab topology YAML and scenario.",
    )
    parser.add_argument("--topology", type=Path, required=True)
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
