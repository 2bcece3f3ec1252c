"""The generated tables of ``docs/results.md``, made from the result files committed beside it.

    python -m lab.studies.results            # print every generated table
    python -m lab.studies.results --write    # replace the tables in docs/results.md
    python -m lab.studies.results --check    # exit 1 if docs/results.md differs from its files

A generated table sits in ``docs/results.md`` between two marker lines::

    <!-- generated: NAME -->
    ...
    <!-- end generated -->

and ``TABLES`` maps each NAME to the function that renders it from its files under ``docs/``.
So re-running a measurement is two steps: the command that writes its result file (the stamp
above each table names it), then ``--write``. The text around a table (its stamp, what it
shows) is written by hand and left alone. A marker naming no table, or a table without its end
marker, is an error naming the marker.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from crew.cli_options import command_parser
from crew.config import Scheme
from lab.report.markdown import md_table

REPO = Path(__file__).resolve().parents[2]
RESULTS_MD = Path("docs/results.md")
START = re.compile(r"<!-- generated: (?P<name>[\w.-]+) -->")
END = "<!-- end generated -->"

FULL = "a2a (p=n)"  # lab.studies.simpaper's key for the full exchange (a2a with p = n)


class ResultsError(Exception):
    """A generated block that cannot be rendered: unknown name, missing end, unreadable file."""


def _load(repo: Path, rel: str) -> dict[str, Any]:
    path = repo / rel
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ResultsError(f"{rel}: {e}") from e
    if not isinstance(data, dict):
        raise ResultsError(f"{rel}: not a JSON object")
    return data


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    return md_table(header, rows) + "\n"


def _num(x: float | None, fmt: str, unit: str = "") -> str:
    return "–" if x is None else f"{x:{fmt}}{unit}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}×" if b > 0 else "unbounded"


# -- lab.bench ---------------------------------------------------------------------------------


def bench_table(result: Mapping[str, Any]) -> str:
    """One ``lab.bench`` results.json: a row per scheme, fastest median first."""
    schemes = result["schemes"]
    order = sorted(schemes, key=lambda s: schemes[s]["median_s"] or float("inf"))
    rows = []
    for i, name in enumerate(order):
        r = schemes[name]
        exact = "yes" if r["correct"] else "no"
        median = _num(r["median_s"], ".3f", " s")
        rows.append(
            (
                f"**{name}**" if i == 0 else name,
                f"**{median}**" if i == 0 else median,
                _num(r["p90_s"], ".3f", " s"),
                _num(r["planned_s"], ".3f", " s"),
                _num(r["median_over_planned"], ".2f"),
                _num(r["median_over_bound"], ".2f"),
                _num(r["cpu_s_per_gb"], ".1f"),
                f"{r['completed']}/{result['ops']} {exact}",
            )
        )
    header = ("scheme", "median", "p90", "planned", "meas ÷ plan", "÷ bound", "CPU s/GB", "exact")
    return _table(header, rows)


def clouds_4x2(repo: Path) -> str:
    return bench_table(_load(repo, "docs/bench/clouds-4x2-results.json"))


# -- lab.studies.simpaper ----------------------------------------------------------------------

SIM_TABLES = (
    "docs/sim/table-n20.json",
    "docs/sim/table-n60-bwd13.json",
    "docs/sim/table-n60-p5-bwd2.json",
    "docs/sim/table-n60-p10-bwd2.json",
)


def sim_paper(repo: Path) -> str:
    """``simpaper table`` cells from several files, one table sorted by n, p and bandwidth."""
    cells = [row for rel in SIM_TABLES for row in _load(repo, rel)["rows"]]
    cells.sort(key=lambda c: (c["n"], c["p"], c["bwd"]))
    rows = [
        (
            str(c["n"]),
            str(c["p"]),
            str(c["bwd"]),
            f"{c['crew']:.2f}",
            f"{c['crew-paper']:.2f}",
            f"{c['preduce']:.2f}",
            f"{c[FULL]:.2f}",
            _ratio(c["crew"], c["preduce"]),
            _ratio(c["crew"], c["crew-paper"]),
            _ratio(c["crew"], c[FULL]),
        )
        for c in cells
    ]
    crew, paper, preduce = Scheme.CREW, Scheme.CREW_PAPER, Scheme.PREDUCE
    header = ("n", "p", "bwd", crew, paper, preduce, "full exchange")
    header += (f"{crew} ÷ {preduce}", f"{crew} ÷ {paper}", f"{crew} ÷ full")
    return _table(header, rows)


def sim_failures(repo: Path) -> str:
    """``simpaper failures``: rounds per worker against links failed for good."""
    result = _load(repo, "docs/sim/failures.json")
    rows = result["rows"]
    base = next((r["crew"] for r in rows if r["failed_links"] == 0), None)
    out = []
    for r in rows:
        kept = _num(None if not base else 100 * r["crew"] / base, ".0f", "%")
        out.append(
            (
                str(r["failed_links"]),
                f"{r['crew']:.2f}",
                f"{r['crew revisions']:.0f}",
                kept,
                f"{r['preduce']:.2f}",
            )
        )
    crew, preduce = Scheme.CREW, Scheme.PREDUCE
    header = ("failed links", crew, f"{crew} revisions", f"{crew} kept", preduce)
    return _table(header, out)


def sim_scale(repo: Path) -> str:
    """``simpaper scale``: the planner's and the simulator's time as n grows."""
    result = _load(repo, "docs/sim/scale.json")
    rows = [
        (
            str(r["n"]),
            str(r["groups"]),
            f"{r['rounds_per_worker']:.2f}",
            f"{r['plan_ms_median']:.1f} ms ({r['plan_ms_p90']:.1f})",
            f"{r['plan_s_total']:.1f} s",
            f"{r['sim_wall_s']:.1f} s",
            "every worker" if r["helpers"] is None else f"members + {r['helpers']}",
        )
        for r in result["rows"]
    ]
    header = ("n", "groups", "rounds per worker", "planner median (p90) per group")
    header += ("planning in all", "simulator wall time", "planned over")
    return _table(header, rows)


TABLES: dict[str, Callable[[Path], str]] = {
    "clouds-4x2": clouds_4x2,
    "sim-paper": sim_paper,
    "sim-failures": sim_failures,
    "sim-scale": sim_scale,
}


# -- the document ------------------------------------------------------------------------------


def render(text: str, repo: Path = REPO) -> str:
    """``text`` with every generated block rendered again from ``repo``'s files."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        start = START.match(lines[i].rstrip("\n"))
        out.append(lines[i])
        i += 1
        if start is None:
            continue
        name = start.group("name")
        if name not in TABLES:
            raise ResultsError(f"{RESULTS_MD}: unknown generated block {name!r}")
        while i < len(lines) and lines[i].rstrip("\n") != END:
            if START.match(lines[i].rstrip("\n")):
                break
            i += 1
        if i == len(lines) or lines[i].rstrip("\n") != END:
            raise ResultsError(f"{RESULTS_MD}: block {name!r} has no {END!r} line")
        out.append(TABLES[name](repo))
    return "".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("python -m lab.studies.results", __doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"update {RESULTS_MD} in place")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {RESULTS_MD} is stale")
    args = parser.parse_args(argv)
    path = REPO / RESULTS_MD
    try:
        text = path.read_text(encoding="utf-8")
        fresh = render(text)
    except (OSError, ResultsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        if fresh != text:
            hint = "python -m lab.studies.results --write"
            print(f"{RESULTS_MD} differs from its result files: {hint}", file=sys.stderr)
            return 1
        return 0
    if args.write:
        path.write_text(fresh, encoding="utf-8")
        return 0
    for name, table in TABLES.items():
        print(f"## {name}\n\n{table(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
