"""The CREW paper's studies, in simulation: ``python -m lab.studies.simpaper
{table,failures,scale}``.

* ``table``: rounds per worker in 50 simulated seconds, for n in {20, 60}, p in {5, 10} and
  bandwidth diversity bwd in {1, 2, 3} (``crew.sim.topogen``), for crew, crew-paper, preduce
  at p and the full exchange (``a2a`` with p = n: every worker sends its model to every other,
  the paper's "all-to-all direct"), and the ratios of crew to each. The paper reports up to 9x
  over the original partial reduce and up to 15x over all-to-all.
* ``failures``: the same metric with 0, 5, 10 and 20 links failing for good during the run,
  drawn by the lab's own ``fail_random_links`` scenario macro (``lab.scenario``; each cut keeps
  every pair joined directly or through one relay), between t = 5 s and t = 45 s.
* ``scale``: the planner's time per group and the simulator's wall time at n = 20 ... 256.

Above ``crew.plan.candidates.CANDIDATES_FROM_N`` workers every group is planned over its members
and the 16 best-connected others (``crew.plan.candidates``); ``scale`` prints it per row.

Every cell is one ``crew.sim`` run on a topology generated with the cell's seed; ``--seeds``
repeats cells and reports the median. Writes ``results.json``, ``plots.html`` and PNGs
(through ``lab.bench.report.write_figures``) to ``--out``. Heavy: run under the CPU lock.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crew.cli_options import command_parser
from crew.config import Scheme
from crew.plan.candidates import default_helpers
from crew.sim.engine import (
    Fault,
    SimConfig,
    SimResult,
    Simulation,
    default_plan_rounds,
)
from crew.sim.topogen import generate
from lab.bench.report import write_figures
from lab.spec.scenario import parse_scenario
from lab.spec.simulated import scenario_faults

PAPER_SCHEMES = (Scheme.CREW, Scheme.CREW_PAPER, Scheme.PREDUCE)
FULL = "a2a (p=n)"


def one(
    n: int,
    p: int,
    bwd: int,
    scheme: Scheme,
    seed: int,
    duration: float,
    faults: Sequence[Fault] = (),
) -> SimResult:
    topo = generate(n, bwd, seed)
    return Simulation(
        topo,
        SimConfig(
            scheme=scheme,
            p=p,
            duration_s=duration,
            seed=seed,
            plan_rounds=default_plan_rounds(n),
            helpers=default_helpers(n),
        ),
        faults,
    ).run()


def link_failures(n: int, k: int, seed: int, start: float, until: float) -> list[Fault]:
    if k == 0:
        return []
    doc = {
        "name": f"paper-failures-{k}",
        "seed": seed,
        "steps": [{"at": start, "do": "fail_random_links", "args": {"k": k, "until": until}}],
    }
    faults, skipped = scenario_faults(parse_scenario(doc, n))
    if skipped:
        raise RuntimeError(f"unexpected scenario steps: {skipped}")
    return faults


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def table(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for n in args.ns:
        for bwd in args.bwds:
            full = [
                one(n, n, bwd, Scheme.A2A, s, args.duration).rounds_per_worker for s in args.seeds
            ]
            for p in args.ps:
                cell: dict[str, Any] = {"n": n, "p": p, "bwd": bwd}
                for scheme in PAPER_SCHEMES:
                    runs = [one(n, p, bwd, scheme, s, args.duration) for s in args.seeds]
                    cell[scheme] = _median([r.rounds_per_worker for r in runs])
                    cell[f"{scheme} wall_s"] = _median([r.wall_s for r in runs])
                cell[FULL] = _median(full)
                rows.append(cell)
                print(_row_text(cell), flush=True)
    return {"kind": "table", "duration_s": args.duration, "seeds": args.seeds, "rows": rows}


def _ratio(a: float, b: float) -> str:
    return f"{a / b:6.1f}x" if b > 0 else "   inf"


def _row_text(c: dict[str, Any]) -> str:
    return (
        f"n={c['n']:3d} p={c['p']:2d} bwd={c['bwd']}  crew {c['crew']:6.2f}  crew-paper"
        f" {c['crew-paper']:6.2f}  preduce {c['preduce']:6.2f}  full {c[FULL]:6.2f}  |"
        f"  crew/preduce {_ratio(c['crew'], c['preduce'])}  crew/crew-paper"
        f" {_ratio(c['crew'], c['crew-paper'])}  crew/full {_ratio(c['crew'], c[FULL])}"
    )


def failures(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for k in args.links:
        cell: dict[str, Any] = {"failed_links": k}
        for scheme in args.schemes:
            runs = [
                one(
                    args.n,
                    args.p,
                    args.bwd,
                    scheme,
                    s,
                    args.duration,
                    link_failures(args.n, k, s, 5.0, args.duration - 5.0),
                )
                for s in args.seeds
            ]
            cell[scheme] = _median([r.rounds_per_worker for r in runs])
            cell[f"{scheme} revisions"] = _median([r.revisions for r in runs])
            cell[f"{scheme} abandoned"] = _median([r.abandoned for r in runs])
        rows.append(cell)
        print(
            f"{k:2d} failed links: "
            + "  ".join(
                f"{s} {cell[s]:6.2f} rounds ({cell[f'{s} revisions']:.0f} revisions)"
                for s in args.schemes
            ),
            flush=True,
        )
    return {
        "kind": "failures",
        "n": args.n,
        "p": args.p,
        "bwd": args.bwd,
        "duration_s": args.duration,
        "seeds": args.seeds,
        "rows": rows,
    }


def scale(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for n in args.ns:
        t0 = time.perf_counter()
        res = one(n, args.p, args.bwd, Scheme.CREW, args.seeds[0], args.duration)
        wall = time.perf_counter() - t0
        plan_ms = np.asarray(res.plan_seconds) * 1e3
        row = {
            "n": n,
            "groups": res.completed + res.abandoned,
            "rounds_per_worker": res.rounds_per_worker,
            "plan_ms_median": float(np.median(plan_ms)),
            "plan_ms_p90": float(np.percentile(plan_ms, 90)),
            "plan_s_total": float(plan_ms.sum() / 1e3),
            "sim_wall_s": wall,
            "link_jobs": res.jobs,
            "helpers": default_helpers(n),
        }
        rows.append(row)
        print(
            f"n={n:3d}: {row['groups']} groups, {row['rounds_per_worker']:.2f} rounds/worker;"
            f" planner median {row['plan_ms_median']:.1f} ms (p90 {row['plan_ms_p90']:.1f}),"
            f" total {row['plan_s_total']:.1f} s; simulator wall {wall:.1f} s"
            f" ({res.jobs} link jobs; planner over "
            + ("every worker)" if row["helpers"] is None else f"members + {row['helpers']})"),
            flush=True,
        )
    return {"kind": "scale", "p": args.p, "bwd": args.bwd, "duration_s": args.duration,
            "rows": rows}  # fmt: skip


def figures(result: dict[str, Any]) -> dict[str, Any]:
    import plotly.graph_objects as go

    rows = result["rows"]
    out: dict[str, Any] = {}
    if result["kind"] == "table":
        labels = [f"n={r['n']} p={r['p']} bwd={r['bwd']}" for r in rows]
        fig = go.Figure()
        for scheme in (*PAPER_SCHEMES, FULL):
            fig.add_bar(name=scheme, x=labels, y=[r[scheme] for r in rows])
        fig.update_layout(
            title=f"Rounds per worker in {result['duration_s']:g} simulated seconds (crew.sim)",
            barmode="group",
            yaxis_title="rounds per worker",
            template="plotly_white",
        )
        out["sim-paper-rounds"] = fig
    elif result["kind"] == "failures":
        fig = go.Figure()
        schemes = [k for k in rows[0] if k != "failed_links" and " " not in k]
        for scheme in schemes:
            fig.add_scatter(
                name=scheme,
                x=[r["failed_links"] for r in rows],
                y=[r[scheme] for r in rows],
                mode="lines+markers",
            )
        fig.update_layout(
            title=f"Rounds per worker with permanent link failures (n={result['n']},"
            f" p={result['p']}, bwd={result['bwd']}, simulated)",
            xaxis_title="links failed during the run",
            yaxis_title="rounds per worker",
            template="plotly_white",
        )
        out["sim-paper-failures"] = fig
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("python -m lab.studies.simpaper", __doc__)
    sub = parser.add_subparsers(dest="study", required=True)
    for name in ("table", "failures", "scale"):
        s = sub.add_parser(name)
        s.add_argument("--duration", type=float, default=50.0)
        s.add_argument("--seeds", type=int, nargs="+", default=[1])
        s.add_argument("--out", type=Path, help="write results.json and figures here")
        if name == "table":
            s.add_argument("--ns", type=int, nargs="+", default=[20, 60])
            s.add_argument("--ps", type=int, nargs="+", default=[5, 10])
            s.add_argument("--bwds", type=int, nargs="+", default=[1, 2, 3])
        elif name == "failures":
            s.add_argument("--n", type=int, default=60)
            s.add_argument("--p", type=int, default=5)
            s.add_argument("--bwd", type=int, default=2)
            s.add_argument("--links", type=int, nargs="+", default=[0, 5, 10, 20])
            s.add_argument(
                "--schemes",
                nargs="+",
                type=Scheme,
                choices=PAPER_SCHEMES,
                default=list(PAPER_SCHEMES),
            )
        else:
            s.add_argument("--ns", type=int, nargs="+", default=[20, 60, 128, 256])
            s.add_argument("--p", type=int, default=5)
            s.add_argument("--bwd", type=int, default=2)
    args = parser.parse_args(argv)
    result = {"table": table, "failures": failures, "scale": scale}[args.study](args)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"sim-{args.study}.json").write_text(json.dumps(result, indent=1))
        figs = figures(result)
        if figs:
            for note in write_figures(figs, args.out):
                print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
