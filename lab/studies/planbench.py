"""The planner alone, no root, no network: ``python -m lab.studies.planbench sweep|cases|timing``.

* ``sweep`` -- ``--matrices`` seeded random capacity matrices (per directed pair a HotCloud'18
  inter-cloud sample x ``--scale``, the data the shipped topologies use), a random group of
  ``--group-size`` of ``--n`` workers each. Every scheme plans the group; the table gives plan /
  bound (``crew.plan.bound.lower_bound``) per scheme: median, p90, max, and on how many
  matrices the scheme's plan was below crew's (it must be 0: crew's route LP contains every
  baseline's routes or proves that none beats it). Exit status 1 if any baseline beat crew.
* ``cases`` -- the benchmark networks: 4 clouds with one slow pair (20, 40, 60, 80, 100,
  30 Mbit/s, p = n = 4, 16.8 MB), 4 uniform 50 Mbit/s clouds (16.8 MB), and the shipped
  ``bench-hetero`` and ``bench-uniform`` topologies (p = 4 of 8, 8 MB; every one of the 70
  groups, median and max over them).
* ``timing`` -- wall time of ``crew``'s planning per group as the coordinator does it
  (``GroupPlanner``: the route LP ``crew.plan.routelp.plan_routes`` and the star tie check, plus
  ``lower_bound``), with the bytes per hop the coordinator passes (``--part-bytes``: a part and
  the socket backlog ahead of it), at n = 8, 16, 32, 60: *cold* (caches cleared), *warm* (the same
  group re-planned on capacities moved by up to 5%, as when groups in flight change the residual
  capacity) and *cached* (identical inputs again). Median and p90 per n; the route LP's own cold
  median beside. With ``--group-s S`` or ``--db OUT/crew/lab.db`` (a ``lab.bench`` run) it prints
  the planning share of the median group time at n = 8; ``--db`` also replays that run's groups
  through ``GroupLifecycle.plan_for`` (the run's rates, part size, codec) cold and in order with
  caches as the coordinator had them, and prints what the run's coordinator itself recorded: how
  long each op waited for its plan, and how many were planned ahead while the op before ran
  (``crew.runtime.planahead``; runs from before it have no record), ``--replay-passes`` times (a
  group's time: the median of its passes), without the run's warm-up groups. Run it under the CPU
  lock (``flock -x /tmp/crew-cpu.lock python -m lab.studies.planbench timing``): figures from a busy
  machine are worthless.

A plan's time is its scheme's own cost model (``crew.plan.schemes.plan_group``): crew's is the route
LP's (fluid, per-link and shared capacities), the baselines' are those of ``crew.plan.baselines``.
``--json PATH`` writes the results as JSON to PATH (``-``: to standard output, instead of the
tables).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from crew.cli_options import (
    add_config_flags,
    add_json_flag,
    command_parser,
    config_flag,
    write_json,
)
from crew.config import RunConfig, Scheme
from crew.control.assignment import MIN_ROUTE_PART_ELEMS, hop_bytes
from crew.plan.bound import BOUNDS, lower_bound
from crew.plan.inputs import PlanError
from crew.plan.routelp import DEFAULT_SETTINGS, RouteLPSettings, plan_routes
from crew.plan.schemes import GROUP_SCHEMES, GroupPlanner
from crew.runtime.planahead import PlanSource, read_costs
from crew.runtime.rundb import GroupStatus
from crew.wire import protocol as proto

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "crew" / "data" / "inter-cloud-bandwidth-samples.json"
MB16 = 16_777_216
MB8 = 8 * 1024 * 1024
SLOWER_TOLERANCE = 1e-6
"""Relative margin for whole-element rounding when checking crew <= every baseline."""
COORDINATOR_HOP_BYTES = hop_bytes(MIN_ROUTE_PART_ELEMS, RunConfig.default("hop_backlog_bytes"))
"""``timing``'s default ``--hop-bytes``: what the coordinator passes for a vector whose parts
are at least ``MIN_ROUTE_PART_ELEMS`` (8 MB and up)."""


def samples() -> list[float]:
    return [float(v) for v in json.loads(SAMPLES.read_text())["values"]]


def random_matrix(rng: random.Random, n: int, scale: float, values: Sequence[float]) -> np.ndarray:
    bw = np.full((n, n), np.inf)
    for i in range(n):
        for j in range(n):
            if i != j:
                bw[i, j] = round(values[rng.randrange(len(values))] * scale, 1)
    return bw


def pctl(values: Sequence[float], q: float) -> float:
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return math.nan
    k = min(len(finite) - 1, max(0, math.ceil(q / 100 * len(finite)) - 1))
    return finite[k]


def plan_all(
    bw: np.ndarray,
    members: Sequence[int],
    size: int,
    schemes: Sequence[str],
    seed: int,
    planner: GroupPlanner | None = None,
) -> dict[str, float]:
    """Predicted seconds per scheme (nan where the scheme has no plan on these inputs), by
    ``planner`` (None: a fresh one)."""
    planner = planner or GroupPlanner()
    out = {}
    for scheme in schemes:
        try:
            out[scheme] = planner(scheme, bw, members, size, seed=seed).predicted_s
        except PlanError:
            out[scheme] = math.nan
    return out


def crew_beaten(times: dict[str, float]) -> list[str]:
    crew = times[Scheme.CREW]
    return [
        s
        for s, t in times.items()
        if s != Scheme.CREW and math.isfinite(t) and t < crew * (1 - SLOWER_TOLERANCE)
    ]


# --------------------------------------------------------------------------- sweep


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    values = samples()
    ratios: dict[str, list[float]] = {s: [] for s in args.schemes}
    beaten: dict[str, int] = dict.fromkeys(args.schemes, 0)
    planner = GroupPlanner()  # one for the sweep, as a coordinator keeps one
    for k in range(args.matrices):
        bw = random_matrix(rng, args.n, args.scale, values)
        members = sorted(rng.sample(range(args.n), args.p))
        bound = lower_bound(bw, members, args.size)
        times = plan_all(bw, members, args.size, args.schemes, seed=k, planner=planner)
        for s, t in times.items():
            ratios[s].append(t / bound)
        for s in crew_beaten(times):
            beaten[s] += 1
    rows = {
        s: {
            "median": statistics.median(v) if v else math.nan,
            "p90": pctl(v, 90),
            "max": pctl(v, 100),
            "planned": sum(math.isfinite(x) for x in v),
            "below_crew": beaten[s],
        }
        for s, v in ratios.items()
    }
    return {
        "matrices": args.matrices,
        "n": args.n,
        "p": args.p,
        "size": args.size,
        "seed": args.seed,
        "schemes": rows,
    }


def sweep_table(res: dict[str, Any]) -> Table:
    return scheme_table(
        f"plan / bound over {res['matrices']} random matrices (n={res['n']}, p={res['p']},"
        f" {res['size'] / 1e6:.1f} MB, seed {res['seed']})",
        ("median", "p90", "max", "planned", "plans below crew"),
        res["schemes"],
        "median",
        lambda r: (
            f"{r['median']:.3f}",
            f"{r['p90']:.3f}",
            f"{r['max']:.3f}",
            str(r["planned"]),
            str(r["below_crew"]),
        ),
    )


def scheme_table(
    title: str,
    columns: Sequence[str],
    schemes: dict[str, dict[str, Any]],
    order_by: str,
    cells: Callable[[dict[str, Any]], Sequence[str]],
) -> Table:
    """One row per scheme, best ``order_by`` first (NaN last): the scheme, then ``cells``."""
    t = Table(title=title)
    t.add_column("scheme", justify="left")
    for col in columns:
        t.add_column(col, justify="right")
    for s, r in sorted(schemes.items(), key=lambda kv: _nan_last(kv[1][order_by])):
        t.add_row(s, *cells(r))
    return t


def _nan_last(x: float) -> float:
    return math.inf if math.isnan(x) else x


# --------------------------------------------------------------------------- named cases


def sym4(rates: Sequence[float]) -> np.ndarray:
    bw = np.full((4, 4), np.inf)
    for (i, j), r in zip(itertools.combinations(range(4), 2), rates, strict=True):
        bw[i, j] = bw[j, i] = r
    return bw


def topology_matrix(name: str) -> np.ndarray:
    from lab.spec.shipped import Shipped, shipped_file
    from lab.spec.topology import load_topology

    return load_topology(shipped_file(Shipped.TOPOLOGIES, name)).bw_matrix()


def cases(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    named = [
        ("one slow pair (p=n=4, 16.8 MB)", sym4([20, 40, 60, 80, 100, 30]), [(0, 1, 2, 3)], MB16),
        ("4 uniform 50 Mbit/s clouds (16.8 MB)", sym4([50] * 6), [(0, 1, 2, 3)], MB16),
    ]
    for topo in ("bench-hetero", "bench-uniform"):
        bw = topology_matrix(topo)
        groups = list(itertools.combinations(range(bw.shape[0]), 4))
        named.append((f"{topo} (p=4 of 8, 8 MB, all {len(groups)} groups)", bw, groups, MB8))
    planner = GroupPlanner()  # one for every case, as a coordinator keeps one
    for label, bw, groups, size in named:
        per: dict[str, list[float]] = {s: [] for s in args.schemes}
        secs: dict[str, list[float]] = {s: [] for s in args.schemes}
        bounds = []
        beaten = 0
        for k, g in enumerate(groups):
            bound = lower_bound(bw, g, size)
            bounds.append(bound)
            times = plan_all(bw, g, size, args.schemes, seed=k, planner=planner)
            beaten += bool(crew_beaten(times))
            for s, t in times.items():
                per[s].append(t / bound)
                secs[s].append(t)
        out[label] = {
            "groups": len(groups),
            "bound_s": statistics.median(bounds),
            "crew_beaten_in": beaten,
            "schemes": {
                s: {
                    "plan_s": statistics.median(secs[s]),
                    "plan_over_bound": statistics.median(per[s]),
                    "max_plan_over_bound": pctl(per[s], 100),
                }
                for s in args.schemes
            },
        }
    return out


def cases_tables(res: dict[str, Any]) -> list[Table]:
    tables = []
    for label, r in res.items():
        t = scheme_table(
            f"{label}: bound {r['bound_s']:.3f} s (median over groups);"
            f" groups where a baseline beat crew: {r['crew_beaten_in']}",
            ("plan (s)", "plan / bound", "max plan / bound"),
            r["schemes"],
            "plan_s",
            lambda v: (
                f"{v['plan_s']:.3f}",
                f"{v['plan_over_bound']:.3f}",
                f"{v['max_plan_over_bound']:.3f}",
            ),
        )
        tables.append(t)
    return tables


# --------------------------------------------------------------------------- timing


def _ms(values: Sequence[float]) -> dict[str, float]:
    return {"median_ms": 1e3 * statistics.median(values), "p90_ms": 1e3 * pctl(values, 90)}


def _cold(planner: GroupPlanner) -> None:
    """Forget everything ``planner`` and the lower bound's memo hold."""
    planner.clear()
    BOUNDS.clear()


def _time_group(
    planner: GroupPlanner, bw: np.ndarray, members: Sequence[int], size: int, part_bytes: int
) -> tuple[float, float]:
    """(seconds of crew's whole per-group planning as the coordinator does it: its planner
    and the lower bound, seconds of the planner alone)."""
    t0 = time.perf_counter()
    planner(Scheme.CREW, bw, members, size, part_bytes=part_bytes)
    t1 = time.perf_counter()
    lower_bound(bw, members, size)
    return time.perf_counter() - t0, t1 - t0


def timing(args: argparse.Namespace) -> dict[str, Any]:
    """Per n: cold (caches cleared), warm (same group, capacities moved by up to 5%) and
    cached (same inputs again) planning, as the coordinator plans a group."""
    rng = random.Random(args.seed)
    values = samples()
    out: dict[str, Any] = {}
    settings = DEFAULT_SETTINGS
    if args.max_rounds is not None:
        settings = RouteLPSettings(max_rounds=args.max_rounds)
    planner = GroupPlanner(settings)
    for n in args.sizes:
        p = n if args.p_timing == "n" else min(int(args.p_timing), n)
        reps = max(3, args.reps if n <= 32 else args.reps // (4 if n <= 60 else 10))
        lp, cold, warm, cached, rounds, optimal, gaps = [], [], [], [], [], 0, []
        t_end = time.monotonic() + args.max_seconds
        for _ in range(reps):
            if time.monotonic() > t_end:
                break
            bw = random_matrix(rng, n, args.scale, values)
            members = sorted(rng.sample(range(n), p))
            _cold(planner)
            t0 = time.perf_counter()
            rp = plan_routes(
                bw, members, args.size, part_bytes=args.hop_bytes,
                settings=settings, cache=planner.route_cache,
            )  # fmt: skip
            lp.append(time.perf_counter() - t0)
            rounds.append(rp.rounds)
            optimal += rp.optimal
            gaps.append(rp.gap)
            # the route LP's result is cached now: what the rest of the planner and the bound add
            rest, _ = _time_group(planner, bw, members, args.size, args.hop_bytes)
            cold.append(lp[-1] + rest)
            cached.append(_time_group(planner, bw, members, args.size, args.hop_bytes)[0])
            jitter = np.array([[1 + 0.05 * (rng.random() - 0.5) * 2 for _ in range(n)]] * n)
            warm.append(_time_group(planner, bw * jitter, members, args.size, args.hop_bytes)[0])
        out[str(n)] = {
            "p": p,
            "plans": len(cold),
            "lp_cold": _ms(lp),
            "cold": _ms(cold),
            "warm": _ms(warm),
            "cached": _ms(cached),
            "rounds_median": statistics.median(rounds),
            "proved_optimal": optimal,
            "gap_median": statistics.median(gaps),
            "gap_max": max(gaps),
        }
    _cold(planner)
    return out


def run_groups(
    db: Path,
) -> tuple[RunConfig, list[tuple[int, ...]], list[float], list[tuple[PlanSource, float] | None]]:
    """A run's config, its groups in order, their op times and what their plans cost the
    coordinator's event loop as the run recorded it (``crew.runtime.planahead``; None where it
    has no record). Completed groups only, without a ``lab.bench`` run's untimed warm-up
    groups (ids 1 .. ``extra.warmup``)."""
    cfg = RunConfig.load(db.parent / "config.json")
    warmup = int(cfg.extra.get("warmup") or 0)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT id, members, ended_at - started_at FROM groups WHERE status = ? AND id > ?"
            " ORDER BY id",
            (GroupStatus.COMPLETED.value, warmup),
        ).fetchall()
        costs = read_costs(conn)
    finally:
        conn.close()
    return (
        cfg,
        [tuple(json.loads(m)) for _, m, _ in rows],
        [float(t) for _, _, t in rows],
        [costs.get(int(gid)) for gid, _, _ in rows],
    )


REPLAY_PASSES = 5
"""Passes over a run's groups per replay mode: one cold plan of 8 groups moved by 30-60% from
one invocation to the next on the lab machine (23-37 ms), so each group's time is the median of
its passes."""


def replay(db: Path, passes: int = REPLAY_PASSES) -> dict[str, Any]:
    """Replay a run's groups through the coordinator's own planning (``GroupLifecycle.plan_for``,
    the run's config: rates, delays, shared links, part size, codec) and time it: *cold*
    (caches cleared before each group) and *as run* (in order, caches kept, as the coordinator
    process had them), ``passes`` times each; a group's time is the median of its passes.
    A group's op time starts before it is planned (``groups.started_at`` is the time the group
    formed); ``recorded`` is what the run's coordinator waited for each plan (its
    ``plan_costs`` meta row), None for a run without it."""
    from crew.control.lifecycle import GroupLifecycle

    cfg, groups, op_s, recorded = run_groups(db)
    if not groups:
        raise SystemExit(f"{db}: no completed groups")
    size_elems = int(cfg.extra.get("size_elems") or 0)
    if size_elems <= 0:
        raise SystemExit(f"{db}: config.json has no extra.size_elems (not a lab.bench run)")
    planner = GroupPlanner()  # the coordinator's: caches kept across its groups
    life = GroupLifecycle(cfg, plan=planner)
    for w in range(cfg.n):
        life.handle(proto.Register(w, 0, 0, size_elems), 0.0)
    if passes < 1:
        raise SystemExit(f"--replay-passes: must be >= 1, got {passes}")
    out: dict[str, list[float]] = {}
    for mode in ("cold", "as_run"):
        seen: list[list[float]] = [[] for _ in groups]
        for _ in range(passes):
            _cold(planner)
            for k, g in enumerate(groups):
                if mode == "cold":
                    _cold(planner)
                t0 = time.perf_counter()
                life.plan_for(g, 0.0)
                seen[k].append(time.perf_counter() - t0)
        out[mode] = [statistics.median(v) for v in seen]
    _cold(planner)
    return {
        "db": str(db),
        "scheme": str(cfg.scheme),
        "n": cfg.n,
        "groups": len(groups),
        "passes": passes,
        "group_median_s": statistics.median(op_s),
        "cold": _ms(out["cold"]),
        "as_run": _ms(out["as_run"]),
        # what the run's coordinator itself waited for each group's plan (None: not recorded)
        "recorded": _recorded(recorded),
    }


def _recorded(costs: Sequence[tuple[PlanSource, float] | None]) -> dict[str, float] | None:
    """Median and p90 of the recorded waits and how many plans were made ahead; None unless
    every group has a record."""
    known = [c for c in costs if c is not None]
    if not known or len(known) < len(costs):
        return None
    ahead = sum(1 for source, _ in known if source.made_ahead)
    return {**_ms([ms / 1e3 for _, ms in known]), "ahead": ahead}


def timing_table(res: dict[str, Any]) -> Table:
    t = Table(
        title="crew's planning per group (route LP + star tie check + lower bound, as the"
        " coordinator plans); warm: same group, rates moved <= 5%; cached: same inputs"
    )
    cols = ("n", "p", "plans", "LP cold med", "cold med", "cold p90", "warm med", "warm p90")
    for col in (*cols, "cached med", "CG rounds", "proved opt.", "gap med", "gap max"):
        t.add_column(col, justify="right")
    for n, r in res.items():
        t.add_row(
            n,
            str(r["p"]),
            str(r["plans"]),
            f"{r['lp_cold']['median_ms']:.1f} ms",
            f"{r['cold']['median_ms']:.1f} ms",
            f"{r['cold']['p90_ms']:.1f} ms",
            f"{r['warm']['median_ms']:.1f} ms",
            f"{r['warm']['p90_ms']:.1f} ms",
            f"{r['cached']['median_ms']:.1f} ms",
            f"{r['rounds_median']:g}",
            f"{r['proved_optimal']}/{r['plans']}",
            f"{100 * r['gap_median']:.2f}%",
            f"{100 * r['gap_max']:.2f}%",
        )
    return t


def share_lines(
    res: dict[str, Any], group_s: float | None, rep: dict[str, Any] | None
) -> list[str]:
    """The planning share of the median group time (the target: <= 5% at n = 8)."""
    lines = []
    if rep is not None:
        g = rep["group_median_s"]
        for mode in ("cold", "as_run"):
            ms = rep[mode]["median_ms"]
            lines.append(
                f"replay of {rep['db']} ({rep['scheme']}, n={rep['n']}, {rep['groups']} groups"
                f" x {rep['passes']} passes, median op {g:.3f} s):"
                f" {mode.replace('_', ' ')} planning median {ms:.1f} ms"
                f" (p90 {rep[mode]['p90_ms']:.1f}) = {100 * ms / 1e3 / g:.1f}% of the median op"
            )
        rec = rep["recorded"]
        if rec is None:
            lines.append("the run recorded no planning costs (a run before planning ahead)")
        else:
            ms = rec["median_ms"]
            lines.append(
                f"recorded by the run's coordinator: the ops waited a median {ms:.2f} ms for"
                f" their plans (p90 {rec['p90_ms']:.2f}) = {100 * ms / 1e3 / g:.2f}% of the"
                f" median op; {rec['ahead']} of {rep['groups']} planned ahead"
                " (crew.runtime.planahead)"
            )
        group_s = group_s or g
    if group_s and "8" in res:
        for mode in ("cold", "warm", "cached"):
            ms = res["8"][mode]["median_ms"]
            lines.append(
                f"n=8 random matrices, {mode} planning median {ms:.1f} ms ="
                f" {100 * ms / 1e3 / group_s:.1f}% of a {group_s:.3f} s group"
            )
    return lines


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser(
        "python -m lab.studies.planbench",
        "Benchmark the planners without root or network (see the module docstring).",
    )
    ap.add_argument(
        "command",
        choices=("sweep", "cases", "timing"),
        help="sweep: random matrices; cases: the named networks; timing: planning wall time",
    )
    add_config_flags(ap, ("seed",))
    add_json_flag(ap, "the results")
    ap.add_argument(
        "--schemes",
        default=",".join(GROUP_SCHEMES),
        help="comma-separated schemes for sweep and cases (default: every per-group scheme)",
    )
    ap.add_argument("--matrices", type=int, default=100, help="sweep: random matrices (100)")
    ap.add_argument("--n", type=int, default=8, help="sweep: workers per matrix (8)")
    add_config_flags(ap, ("p",))
    ap.add_argument("--size", type=int, default=MB8, help=f"sweep/timing: bytes per vector ({MB8})")
    ap.add_argument(
        "--scale", type=float, default=0.6, help="rate scale of the HotCloud samples (0.6)"
    )
    ap.add_argument(
        "--sizes",
        default="8,16,32,60",
        help="timing: worker counts (8,16,32,60)",
    )
    ap.add_argument("--p-timing", default="4", help="timing: group size, or 'n' for p = n (4)")
    ap.add_argument("--reps", type=int, default=40, help="timing: plans per n up to 32 (40)")
    ap.add_argument(
        "--max-rounds",
        type=int,
        default=None,
        help="timing: column-generation rounds per plan at most (default: the planner's)",
    )
    ap.add_argument(
        "--hop-bytes",
        type=int,
        default=COORDINATOR_HOP_BYTES,
        help=f"timing: bytes per hop the route LP counts ({COORDINATOR_HOP_BYTES}: what the"
        " coordinator passes for 8 MB vectors, 4 x min(part elements,"
        f" {MIN_ROUTE_PART_ELEMS // 1024} Ki) plus the socket backlog a part waits behind,"
        " RunConfig.hop_backlog_bytes)",
    )
    ap.add_argument(
        "--group-s",
        type=float,
        default=None,
        help="timing: median group (op) time in seconds, for the planning share at n = 8",
    )
    ap.add_argument(
        "--db",
        type=Path,
        default=None,
        help="timing: a lab.bench run's lab.db (e.g. OUT/crew/lab.db): replay its groups through"
        " the coordinator's planning, and take the median group time from it",
    )
    ap.add_argument(
        "--replay-passes",
        type=int,
        default=REPLAY_PASSES,
        help=f"timing --db: passes over the run's groups per mode; a group's time is the median"
        f" of its passes ({REPLAY_PASSES})",
    )
    ap.add_argument(
        "--max-seconds", type=float, default=60.0, help="timing: wall time cap per n (60 s)"
    )
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    unknown = [s for s in args.schemes if s not in GROUP_SCHEMES]
    if unknown or Scheme.CREW not in args.schemes:
        print(f"--schemes: need crew and known schemes ({', '.join(GROUP_SCHEMES)})")
        return 2
    try:
        args.sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        print(f"--sizes: not a list of ints: {args.sizes!r}")
        return 2
    if not 2 <= args.p <= args.n or args.matrices < 1 or args.size % 4 or args.size <= 0:
        print(
            f"need 2 <= {config_flag('p')} <= --n, --matrices >= 1, --size a positive multiple of 4"
        )
        return 2
    if args.p_timing != "n" and not (args.p_timing.isdigit() and int(args.p_timing) >= 2):
        print("--p-timing: an int >= 2 or 'n'")
        return 2
    console = Console(width=max(Console().width, 150))
    if args.command == "sweep":
        res = sweep(args)
        bad = sum(r["below_crew"] for s, r in res["schemes"].items() if s != Scheme.CREW)
        if write_json(args.json, res, allow_nan=True):
            console.print(sweep_table(res))
            verdict = "yes" if not bad else "NO"
            console.print(f"crew's plan <= every baseline's plan on every matrix: {verdict}")
        return 1 if bad else 0
    if args.command == "cases":
        res = cases(args)
        if write_json(args.json, res, allow_nan=True):
            for t in cases_tables(res):
                console.print(t)
        return 1 if any(r["crew_beaten_in"] for r in res.values()) else 0
    res = timing(args)
    rep = replay(args.db, args.replay_passes) if args.db is not None else None
    lines = share_lines(res, args.group_s, rep)
    if write_json(args.json, {"timing": res, "replay": rep, "share": lines}):
        console.print(timing_table(res))
        for line in lines:
            console.print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
