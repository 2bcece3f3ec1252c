"""Simulated against emulated, per op: a ``lab.bench`` results file replayed in ``crew.sim``.

``lab.bench`` runs one seeded trace of groups, one group at a time, on the emulated network and
writes ``results.json`` (per scheme: the op time of every group of the trace). This module
replays the same trace, the same sizes and the same topology in ``crew.sim``'s network model:
each op is planned by ``crew.plan.schemes.GroupPlanner`` on the idle network (as the benchmark's
coordinator does: one group at a time, all workers active) and timed on fresh FCFS link queues
(``crew.sim.network``), and prints simulated / emulated per op (median and spread) for every
scheme the results hold. Gloo is not planned per group and is skipped.

The executor's costs beyond the links' rates (``crew.sim.network.ExecutorModel``), each taken
from the lab, none fitted to the op times:

* the planner's time: the lab's op time runs from the group's formation, before its plan, so
  each simulated op starts its routes after the real planner call made here returns (its wall
  time on this machine, with the coordinator's arguments: all workers active, the part size);
* the per-hop standing queue: on paced runs (``lab.bench --pace``, on by default)
  ``PACED_HOP_QUEUE_S``, measured from a frame trace; on unpaced ones
  ``lab.net.shaping.QUEUE_EXTRA_S`` (50 ms), which CUBIC fills; for ``--train``
  ``TRAIN_HOP_QUEUE_S``, measured from a lab.run's frame trace (``--hop-queue-ms`` and
  ``--control-ms`` take a setting's own figures from ``lab.studies.grouptime``);
* the shared host: the workers' CPU seconds per link byte that the same results measured for
  the scheme (``cpu_s_per_gb``), on this host's cores (``os.cpu_count()``; the lab runs every
  worker on it). ``--no-host`` leaves it out.

``lab.bench --sim`` calls :func:`bench_report` after the emulated runs.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from crew.config import RunConfig, Scheme
from crew.control.assignment import hop_bytes
from crew.plan.schemes import GROUP_SCHEMES, GroupPlanner
from crew.sim.network import ExecutorModel, LinkQueues, RouteTimer, part_bytes
from lab.net.shaping import MTU_FRAME, QUEUE_EXTRA_S, QUEUE_MIN_PKTS
from lab.report.benchresults import BenchResults
from lab.report.benchrounds import pooled_rounds
from lab.spec.simulated import sim_topology
from lab.spec.topology import load_topology

GOODPUT = RunConfig.default("goodput")  # the payload share the lab's plans count
LAB_CPU_S_PER_GB = 12.2
"""Workers' CPU seconds per GB of link bytes for crew on bench-hetero (``lab.bench``'s CPU s/GB
column on the lab machine): the training comparison's default host cost."""


PACED_HOP_QUEUE_S = 0.014
"""Seconds a part waits per hop beyond its serialisation when connections are paced: from the
frame trace (``CREW_FRAME_TRACE``) of 5 crew groups on bench-hetero (paced at 0.95), 6,159
frames' send start to arrival less their bytes at 0.95 x the link's rate: median 13.6 ms
(p25 3.1, p75 24.5). Pacing keeps HTB's queue near empty; what is left is mostly a frame waiting
behind the unsent bytes already in its socket (``TCP_NOTSENT_LOWAT``, 64 KiB). Taken from the
trace, not fitted to op times."""


TRAIN_HOP_QUEUE_S = 0.019
"""The same wait per hop for ``--train``'s ``lab.run`` folders, whose workers are unpaced by
default (``CREW_PACE`` unset): from the frame trace of a 40 s crew run on default.yaml (p = 3,
seed 1), 43,969 frames' send start to arrival less serialisation at 0.95 x the rate
and the link's delay: median 18.6 ms (p25 4.9, p75 35.9). Training groups are short and many, so
CUBIC rarely fills HTB's 50 ms queue. Measured on crew's traffic only."""


def hop_queue_for(results: BenchResults) -> float:
    """The executor model's standing queue per hop for a ``lab.bench`` results file."""
    return PACED_HOP_QUEUE_S if results.get("pace") else QUEUE_EXTRA_S


LAB_ACK_CLOCK_MBIT = QUEUE_MIN_PKTS * MTU_FRAME * 8 / QUEUE_EXTRA_S / 1e6
"""The rate (15.5 Mbit/s) below which the lab's HTB leaf queue is its floor of
``QUEUE_MIN_PKTS`` frames rather than ``QUEUE_EXTRA_S`` at the rate, so longer than 50 ms: the
reverse links behind which ``crew.sim.network.ExecutorModel.ack_clock_mbit`` holds a
direction's ACKs. It applies to lab runs that queued pure ACKs behind the data: those whose
database has no ``meta.ack_queue`` (``lab.net.shaping.ACK_QUEUE_DIRECT``)."""


def lab_executor(
    cpu_s_per_gb: float | None,
    host: bool = True,
    hop_queue_s: float = QUEUE_EXTRA_S,
    control_s: float = 0.0,
    turnaround_s: float = 0.0,
    ack_clock_mbit: float = 0.0,
    hop_waits: tuple[float, ...] = (),
    hop_wait_seed: int = 0,
) -> ExecutorModel:
    """The executor model of the lab's host: see the module docstring. With ``hop_waits``
    each hop draws its wait from them and ``hop_queue_s`` is not used."""
    cores = float(os.cpu_count() or 1) if host and cpu_s_per_gb else 0.0
    per_byte = (cpu_s_per_gb or 0.0) / 1e9 if host else 0.0
    return ExecutorModel(
        hop_queue_s=0.0 if hop_waits else hop_queue_s,
        cpu_s_per_byte=per_byte,
        host_cores=cores,
        control_s=control_s,
        turnaround_s=turnaround_s,
        ack_clock_mbit=ack_clock_mbit,
        hop_waits=hop_waits,
        hop_wait_seed=hop_wait_seed,
    )


def simulate_op(
    scheme: str,
    rate: np.ndarray,
    delay_s: np.ndarray,
    members: Sequence[int],
    size: int,
    seed: int,
    executor: ExecutorModel | None = None,
    plan_time: bool = False,
    hop_backlog_bytes: int = RunConfig.default("hop_backlog_bytes"),
    planner: GroupPlanner | None = None,
) -> float:
    """Seconds one group takes alone on the network, in the simulator's model: its transfer,
    plus (``plan_time``) the real planner call's wall time, as the lab's op time includes it.
    ``hop_backlog_bytes``: the socket backlog per hop the run's coordinator planned with.
    ``planner``: the run's planner, whose caches the earlier ops filled, as the coordinator's
    were (None: a fresh one, a cold plan)."""
    n = rate.shape[0]
    bw = rate.copy()
    np.fill_diagonal(bw, np.inf)
    part = part_bytes(size, n)
    t0 = time.perf_counter()
    plan = (planner or GroupPlanner())(
        Scheme(scheme),
        bw,
        members,
        size,
        active=list(range(n)),
        seed=seed,
        part_bytes=hop_bytes(part // 4, hop_backlog_bytes),  # as the coordinator plans
        delay_s=delay_s if np.any(delay_s > 0) else None,
    )
    start = time.perf_counter() - t0 if plan_time else 0.0
    links = LinkQueues(rate, GOODPUT, delay_s, executor)
    timer = RouteTimer(links, plan.routes, plan.pipelined, part)
    end = timer.start(start)
    wake = timer.take_wakeups()
    for _ in range(10 * n * n * len(plan.routes) + 10):  # each release queues >= 1 edge
        if end is not None or not wake:
            break
        wake.sort()
        at, i, node, phase = wake.pop(0)
        timer.release(at, i, node, phase)
        wake += timer.take_wakeups()
        if timer.finished and not wake:
            end = timer.end
    if end is None:
        raise RuntimeError(f"{scheme}: the simulated op did not finish")
    return end


def compare(
    results: BenchResults,
    topology: Path,
    host: bool = True,
    plan_time: bool = True,
    hop_queue_s: float | None = None,
) -> dict[str, dict[str, float]]:
    """``hop_queue_s`` None: :func:`hop_queue_for` the results."""
    if hop_queue_s is None:
        hop_queue_s = hop_queue_for(results)
    topo = sim_topology(load_topology(topology))
    # With lab.bench --rounds, each scheme's ops are every round's, pooled in round order.
    trace = list(results["trace"]) * pooled_rounds(results)
    out: dict[str, dict[str, float]] = {}
    for scheme, r in results["schemes"].items():
        if scheme not in GROUP_SCHEMES or not r.get("op_times_s"):
            continue
        emulated = r["op_times_s"]
        executor = lab_executor(r.get("cpu_s_per_gb"), host, hop_queue_s)
        planner = GroupPlanner()  # one per run, as the run's coordinator had
        simulated = [
            simulate_op(
                scheme,
                topo.rate_mbit,
                topo.delay_ms / 1000.0,
                members,
                int(results["size_bytes"]),
                int(results.get("seed", 0)),
                executor,
                plan_time,
                # results from before the backlog was planned have no key: they counted none
                int(results.get("hop_backlog_bytes", 0)),
                planner,
            )
            for members in trace[: len(emulated)]
        ]
        ratios = [s / e for s, e in zip(simulated, emulated, strict=True) if e > 0]
        out[scheme] = {
            "sim_median_s": statistics.median(simulated),
            "emu_median_s": statistics.median(emulated),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "cpu_s_per_gb": executor.cpu_s_per_byte * 1e9,
        }
    return out


def report(cmp: dict[str, dict[str, float]]) -> str:
    lines = [f"{'scheme':11s} {'sim s':>7s} {'emu s':>7s}  sim/emu median [min, max]"]
    for scheme, c in cmp.items():
        flag = "" if 0.85 <= c["ratio_median"] <= 1.15 else "   (outside 0.85-1.15)"
        lines.append(
            f"{scheme:11s} {c['sim_median_s']:7.3f} {c['emu_median_s']:7.3f}  "
            f"{c['ratio_median']:.2f} [{c['ratio_min']:.2f}, {c['ratio_max']:.2f}]{flag}"
        )
    return "\n".join(lines)


def bench_report(
    results: BenchResults,
    topology: Path,
    host: bool = True,
    plan_time: bool = True,
    hop_queue_s: float | None = None,
) -> str:
    """What ``lab.bench --sim`` prints: every scheme of the results, simulated or why not."""
    if hop_queue_s is None:
        hop_queue_s = hop_queue_for(results)
    cmp = compare(results, topology, host, plan_time, hop_queue_s)
    skipped = [s for s in results["schemes"] if s not in cmp]
    model = lab_executor(1.0, host, hop_queue_s)
    lines = [
        f"simulated with: per-hop queue {model.hop_queue_s * 1e3:g} ms,"
        + (f" host CPU per scheme's cpu_s_per_gb on {model.host_cores:g} cores" if host else "")
        + (", the planner's wall time" if plan_time else ""),
        report(cmp),
    ]
    lines += [f"{s:11s} not simulated (no per-group plan, or no op time)" for s in skipped]
    return "\n".join(lines)
