"""A lab topology and scenario as the simulator (``crew.sim``) takes them."""

from __future__ import annotations

import logging

import numpy as np

from crew.sim.engine import Fault, FaultKind
from crew.sim.topogen import SimTopology
from lab.orchestrate import commands as cmds
from lab.spec.scenario import Scenario, TriggerKind
from lab.spec.topology import TopologySpec

log = logging.getLogger(__name__)


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
