"""Simulated against emulated per-op times: ``python -m lab.simcompare RESULTS.json --topology Y``.

``lab.bench`` runs one seeded trace of groups, one group at a time, on the emulated network and
writes ``results.json`` (per scheme: the op time of every group of the trace). This module
replays the same trace, the same sizes and the same topology in ``crew.sim``'s network model:
each op is planned by ``crew.plan.schemes.plan_group`` on the idle network (as the benchmark's
coordinator does: one group at a time, all workers active) and timed on fresh FCFS link queues
(``crew.sim.network``), and prints simulated / emulated per op (median and spread) for every
scheme the results hold. Gloo is not planned per group and is skipped.

``lab.bench --sim`` calls :func:`bench_report` after the emulated runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crew.plan.schemes import GROUP_SCHEMES, plan_group
from crew.sim.network import LinkQueues, RouteTimer, part_bytes
from lab.simrun import sim_topology
from lab.topology import load_topology

GOODPUT = 0.95


def simulate_op(
    scheme: str, rate: np.ndarray, delay_s: np.ndarray, members: Sequence[int], size: int, seed: int
) -> float:
    """Seconds one group takes alone on the network, in the simulator's link model."""
    n = rate.shape[0]
    bw = rate.copy()
    np.fill_diagonal(bw, np.inf)
    plan = plan_group(scheme, bw, members, size, active=list(range(n)), seed=seed)
    links = LinkQueues(rate, GOODPUT, delay_s)
    timer = RouteTimer(links, plan.routes, plan.pipelined, part_bytes(size, n))
    end = timer.start(0.0)
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


def compare(results: dict[str, Any], topology: Path) -> dict[str, dict[str, float]]:
    topo = sim_topology(load_topology(topology))
    out: dict[str, dict[str, float]] = {}
    for scheme, r in results["schemes"].items():
        if scheme not in GROUP_SCHEMES or not r.get("op_times_s"):
            continue
        emulated = r["op_times_s"]
        simulated = [
            simulate_op(
                scheme,
                topo.rate_mbit,
                topo.delay_ms / 1000.0,
                members,
                int(results["size_bytes"]),
                int(results.get("seed", 0)),
            )
            for members in results["trace"][: len(emulated)]
        ]
        ratios = [s / e for s, e in zip(simulated, emulated, strict=True) if e > 0]
        out[scheme] = {
            "sim_median_s": statistics.median(simulated),
            "emu_median_s": statistics.median(emulated),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
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


def bench_report(results: dict[str, Any], topology: Path) -> str:
    """What ``lab.bench --sim`` prints: every scheme of the results, simulated or why not."""
    cmp = compare(results, topology)
    skipped = [s for s in results["schemes"] if s not in cmp]
    lines = [report(cmp)]
    lines += [f"{s:11s} not simulated (no per-group plan, or no op time)" for s in skipped]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.simcompare", description=__doc__)
    parser.add_argument("results", type=Path, help="a lab.bench results.json")
    parser.add_argument("--topology", type=Path, required=True, help="the topology it ran on")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    print(bench_report(results, args.topology))
    return 0


if __name__ == "__main__":
    sys.exit(main())
