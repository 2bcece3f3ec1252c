"""The paper's n = 20, bwd = 2 setting against the CREW authors' simulator: ``python -m
lab.studies.simgaps``.

The authors' published simulator code gives, at n = 20, bwd = 2, in 50 s, rounds per worker:
CREW (the p2a LP: every worker may aggregate a share, phases back to back; ours: ``crew-paper``)
28.0 at p = 5 and 26.2 at p = 10; a members-only variant of that code (only members aggregate;
ours: ``preduce``) 7.5 and 13.3. ``crew.sim`` at the paper's setting gives far fewer. This study
changes one modelling choice at a time, then several together, and prints rounds per worker
for crew-paper, preduce, crew (the route LP) and crew-star (the p2a split with parts streamed,
so the two phases overlap), with crew-paper and preduce over the authors' figures.

Variants (each a ``crew.sim`` run on ``crew.sim.topogen.generate(n, 2, seed)``, 50 s):

* ``ours``: the table's setting (directed draws, links shared by concurrent groups, mixed
  stragglers, goodput 0.95, 180 MB);
* ``private links``: every group has the links to itself (``SimConfig.shared_links``);
* ``symmetric pairs``: one rate per unordered pair (``generate(..., symmetric=True)``);
* ``no stragglers``: every worker profile 2;
* ``goodput 1``: links deliver their whole rate;
* ``45 MB``: a quarter of the model (the same as four times every rate);
* ``45 MB, private links``, the same without stragglers, and ``45 MB, all of the above``;
* two fits of the last two free quantities, the bytes per unit rate and the step time, to the
  authors' four figures: ``45 MB, private links, 0.3 s steps`` (every worker's iteration 0.3
  s) and ``54 MB, private links, no stragglers``.

Writes ``sim-gaps.json`` to ``--out``. Light: about a minute on two cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crew.cli_options import command_parser
from crew.config import Scheme
from crew.plan.candidates import default_helpers
from crew.sim.engine import SimConfig, Simulation, default_plan_rounds
from crew.sim.topogen import generate

PAPER_MB = 180.0
SCHEMES = (Scheme.CREW_PAPER, Scheme.PREDUCE, Scheme.CREW, Scheme.CREW_STAR)

AUTHORS: dict[tuple[int, Scheme], float] = {
    (5, Scheme.CREW_PAPER): 28.0,
    (10, Scheme.CREW_PAPER): 26.2,
    (5, Scheme.PREDUCE): 7.5,
    (10, Scheme.PREDUCE): 13.3,
}
"""Rounds per worker of the authors' simulator at n = 20, bwd = 2, 50 s: CREW (ours:
crew-paper) and its members-only variant (ours: preduce)."""


@dataclass(frozen=True)
class Variant:
    name: str
    size_mb: float = PAPER_MB
    shared_links: bool = True
    symmetric: bool = False
    stragglers: str = "mixed"
    goodput: float = SimConfig.goodput
    compute_s: float = 0.0  # every iteration lasts at least this long (SimConfig.compute_s)


VARIANTS = (
    Variant("ours"),
    Variant("private links", shared_links=False),
    Variant("symmetric pairs", symmetric=True),
    Variant("no stragglers", stragglers="none"),
    Variant("goodput 1", goodput=1.0),
    Variant("45 MB", size_mb=45.0),
    Variant("45 MB, private links", size_mb=45.0, shared_links=False),
    Variant(
        "45 MB, private links, no stragglers", size_mb=45.0, shared_links=False, stragglers="none"
    ),
    Variant(
        "45 MB, all of the above",
        size_mb=45.0,
        shared_links=False,
        symmetric=True,
        stragglers="none",
        goodput=1.0,
    ),
    Variant(
        "45 MB, private links, 0.3 s steps",
        size_mb=45.0,
        shared_links=False,
        stragglers="none",
        compute_s=0.3,
    ),
    Variant(
        "54 MB, private links, no stragglers", size_mb=54.0, shared_links=False, stragglers="none"
    ),
)


def sim_config(v: Variant, n: int, p: int, scheme: Scheme, seed: int, duration: float) -> SimConfig:
    """The ``crew.sim`` settings of one cell of variant ``v``."""
    return SimConfig(
        scheme=scheme,
        p=p,
        duration_s=duration,
        seed=seed,
        size_bytes=int(v.size_mb * 1e6) // 4 * 4,
        goodput=v.goodput,
        compute_s=v.compute_s,
        shared_links=v.shared_links,
        plan_rounds=default_plan_rounds(n),
        helpers=default_helpers(n),
    )


def rounds(v: Variant, n: int, p: int, scheme: Scheme, seed: int, duration: float) -> float:
    topo = generate(n, 2, seed, v.stragglers, v.symmetric)
    return Simulation(topo, sim_config(v, n, p, scheme, seed, duration)).run().rounds_per_worker


def study(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for v in VARIANTS:
        for p in args.ps:
            cell: dict[str, Any] = {"variant": v.name, "p": p}
            for scheme in args.schemes:
                runs = [rounds(v, args.n, p, scheme, s, args.duration) for s in args.seeds]
                cell[scheme.value] = float(statistics.median(runs))
                theirs = AUTHORS.get((p, scheme)) if args.n == 20 else None
                if theirs is not None:
                    cell[f"{scheme.value} / authors"] = cell[scheme.value] / theirs
            rows.append(cell)
            print(row_text(cell, args.schemes), flush=True)
    return {
        "kind": "gaps",
        "n": args.n,
        "bwd": 2,
        "duration_s": args.duration,
        "seeds": args.seeds,
        "authors": {f"p={p} {s.value}": r for (p, s), r in AUTHORS.items()},
        "rows": rows,
    }


def row_text(cell: dict[str, Any], schemes: Sequence[Scheme]) -> str:
    parts = []
    for s in schemes:
        text = f"{s.value} {cell[s.value]:6.2f}"
        ratio = cell.get(f"{s.value} / authors")
        if ratio is not None:
            text += f" ({ratio:4.2f}x authors')"
        parts.append(text)
    return f"{cell['variant']:36s} p={cell['p']:2d}  " + "  ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("python -m lab.studies.simgaps", __doc__)
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--ps", type=int, nargs="+", default=[5, 10])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--duration", type=float, default=50.0)
    parser.add_argument("--schemes", nargs="+", type=Scheme, choices=SCHEMES, default=list(SCHEMES))
    parser.add_argument("--out", type=Path, help="write sim-gaps.json here")
    args = parser.parse_args(argv)
    if any(not 2 <= p <= args.n for p in args.ps):
        parser.error(f"--ps: every p must be between 2 and --n ({args.n})")
    result = study(args)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sim-gaps.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
