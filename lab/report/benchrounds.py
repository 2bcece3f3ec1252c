"""Repeated rounds of ``lab.bench`` (``--rounds R``): the order of each round, and figures
pooled and summarised over the rounds. Pure: lists and ``results.json`` dicts in, dicts out.

Why rounds: this machine's speed drifts by up to 2x over minutes (the same code on
``bench-hetero`` took 6 to 11 CPU s per GB, and its ops 0.46 to 0.58 s, in runs a minute
apart). A benchmark that runs scheme A's ops and then scheme B's compares A on one machine
with B on another. With R rounds every scheme runs R times on the same network, and round r
(0-based) runs the scheme list rotated by r places, so over S rounds every scheme takes every
position once and a drift during the benchmark favours none of them.

Per scheme the summary gives the median of the R rounds' medians with their minimum and
maximum, the same for measured / planned and measured / bound, and in how many rounds the
scheme was the fastest correct one (``fastest``; a tie, as between two schemes with the same
plan, goes to each of the tied schemes). The pooled result (``results.json`` ``schemes``) has
the fields of one run, computed over the ops of every round together.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from lab.report.benchresults import RoundsSummary, SchemeResults, Spread


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _ratios(times: Sequence[float], refs: Sequence[float | None]) -> list[float]:
    return [t / r for t, r in zip(times, refs, strict=True) if r and math.isfinite(r)]


class OpStats(TypedDict):
    median_s: float | None
    p90_s: float | None
    median_over_bound: float | None
    planned_s: float | None
    median_over_planned: float | None


def op_stats(
    times: Sequence[float], bounds: Sequence[float | None], predicted: Sequence[float | None]
) -> OpStats:
    """The per-op statistics of ``results.json`` (``lab.bench``'s module docstring): median and
    p90 of the op times, the median over ops of time / bound and of time / planned, and the
    median planned time. Ops without a finite bound or plan are left out of those ratios."""
    return {
        "median_s": percentile(times, 50),
        "p90_s": percentile(times, 90),
        "median_over_bound": percentile(_ratios(times, bounds), 50),
        "planned_s": percentile([q for q in predicted if q and math.isfinite(q)], 50),
        "median_over_planned": percentile(_ratios(times, predicted), 50),
    }


def round_orders(schemes: Sequence[str], rounds: int) -> list[tuple[str, ...]]:
    """The scheme order of each round: round r runs ``schemes`` rotated left by r places."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    s = tuple(schemes)
    if not s:
        return [() for _ in range(rounds)]
    return [s[r % len(s) :] + s[: r % len(s)] for r in range(rounds)]


def run_folder(out: Path, scheme: str, round_no: int, rounds: int) -> Path:
    """Where one scheme's run of one round (1-based) keeps its database and logs: ``OUT/scheme``
    for a single round (as before rounds existed), ``OUT/round-K/scheme`` otherwise."""
    return out / scheme if rounds == 1 else out / f"round-{round_no}" / scheme


def _sum_links(dicts: Sequence[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for link, b in d.items():
            out[link] = out.get(link, 0) + int(b)
    return dict(sorted(out.items()))


def pooled_rounds(results: Mapping[str, Any]) -> int:
    """How many rounds a ``results.json``'s pooled ``schemes`` hold, each of its ``trace``'s
    ops in round order: ``round_count``, or 1 for a file written before ``--rounds``."""
    return max(1, int(results.get("round_count") or 1))


def pool_results(results: Sequence[SchemeResults]) -> SchemeResults:
    """One scheme's results of several rounds (``SchemeResult.to_dict()`` each) as one result
    over all their ops: op lists concatenated in round order, statistics over them, counts,
    bytes and CPU seconds summed, correct only if every round was, errors named by round."""
    if not results:
        raise ValueError("no rounds to pool")
    times = [t for r in results for t in r["op_times_s"]]
    bounds = [b for r in results for b in r["bound_s"]]
    predicted = [q for r in results for q in r["predicted_s"]]
    errs = [r["max_verify_err"] for r in results if r["max_verify_err"] is not None]
    cpu = [c for r in results if (c := r["worker_cpu_s"]) is not None]
    planned = _sum_links([r["planned_link_bytes"] for r in results])
    cpu_s = sum(cpu) if len(cpu) == len(results) else None
    moved_gb = sum(planned.values()) / 1e9
    startups = [r["startup_s"] for r in results if r["startup_s"] is not None]
    walls = [r["wall_s"] for r in results if r["wall_s"] is not None]
    errors = [f"round {k}: {r['error']}" for k, r in enumerate(results, 1) if r["error"]]
    plan_ms = [m for r in results for m in r.get("plan_ms", ())]
    return {
        "op_times_s": times,
        "bound_s": bounds,
        **op_stats(times, bounds, predicted),
        "predicted_s": predicted,
        "correct": all(r["correct"] for r in results),
        "completed": sum(r["completed"] for r in results),
        "abandoned": sum(r["abandoned"] for r in results),
        "revisions": sum(r["revisions"] for r in results),
        "max_verify_err": max(errs) if errs else None,
        "link_bytes": _sum_links([r["link_bytes"] for r in results]),
        "planned_link_bytes": planned,
        "startup_s": statistics.median(startups) if startups else None,
        "wall_s": sum(walls) if walls else None,
        "worker_cpu_s": cpu_s,
        "cpu_s_per_gb": cpu_s / moved_gb if cpu_s is not None and moved_gb > 0 else None,
        "plan_ms": plan_ms,
        "plan_ms_median": percentile([m for m in plan_ms if m is not None], 50),
        "planned_ahead": sum(r.get("planned_ahead", 0) for r in results),
        "raw_s": _median_of(r.get("raw_s") for r in results),
        "raw_cpu_s_per_gb": _median_of(r.get("raw_cpu_s_per_gb") for r in results),
        "error": "; ".join(errors) or None,
    }


def _median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values present (the rounds' raw references), None without any."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _spread(values: Sequence[float | None]) -> Spread:
    """Median, min and max of the finite values (None when there are none)."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}


FASTEST_TIE = 1e-9
"""Relative difference under which two rounds' medians count as a tie for the fastest."""


def round_summary(rounds: Sequence[Mapping[str, SchemeResults]]) -> dict[str, RoundsSummary]:
    """Per scheme, over the rounds (each ``{scheme: SchemeResult.to_dict()}``): its median op
    time, measured / planned and measured / bound per round and their median, min and max;
    ``fastest``: the rounds in which its median was the lowest of the correct schemes';
    ``correct``: the rounds it was correct in. Schemes in the order they first ran."""
    names: list[str] = []
    for rnd in rounds:
        names += [s for s in rnd if s not in names]
    fastest = dict.fromkeys(names, 0)
    for rnd in rounds:
        medians = {s: r["median_s"] for s, r in rnd.items() if r["correct"] and r["median_s"]}
        if medians:
            best = min(medians.values())
            for s, m in medians.items():
                if m <= best * (1 + FASTEST_TIE):
                    fastest[s] += 1
    out: dict[str, RoundsSummary] = {}
    for s in names:
        runs = [rnd[s] for rnd in rounds if s in rnd]
        per = {
            "median_s": [r["median_s"] for r in runs],
            "median_over_planned": [r.get("median_over_planned") for r in runs],
            "median_over_bound": [r["median_over_bound"] for r in runs],
            "cpu_s_per_gb": [r.get("cpu_s_per_gb") for r in runs],
        }
        out[s] = {
            "rounds": len(runs),
            "correct": sum(1 for r in runs if r["correct"]),
            "fastest": fastest[s],
            "per_round": per,
            "median_s": _spread(per["median_s"]),
            "median_over_planned": _spread(per["median_over_planned"]),
            "median_over_bound": _spread(per["median_over_bound"]),
            "cpu_s_per_gb": _spread(per["cpu_s_per_gb"]),
        }
    return out
