"""Benchmark every scheme on one emulated network: ``sudo python -m lab.bench ...``.

What is measured
----------------
One seeded **trace** of K groups (each p distinct workers drawn with
``random.Random(seed).sample``) is replayed by every partial-reduce scheme on the *same*
``LabNetwork``: the coordinator runs the trace's groups one at a time, each as soon as the
previous one ended, among numpy-only workers that offer a fixed random vector of M bytes
(``crew.runtime.worker`` benchmark mode). One op = one group's reduce; its time is
``ended_at - started_at`` of its ``groups`` row, i.e. from the coordinator's Assign to the last
member's HaveAll, as the coordinator saw it (control messages travel the unshaped management
network, so this adds a few milliseconds at most).

Per scheme (``results.json`` → ``schemes.<name>``):

``op_times_s``
    the times of the completed ops, in trace order;
``bound_s``
    the fluid lower bound of each completed op (``crew.plan.planner.lower_bound`` on the topology's
    capacity matrix with every worker active): no scheme can beat it;
``median_s``, ``p90_s``
    median and 90th percentile of ``op_times_s`` (linear interpolation between order statistics,
    as ``numpy.percentile``);
``median_over_bound``
    the median over ops of ``op_time / bound`` (per op, because groups differ, so bounds differ);
``planned_s``, ``median_over_planned``
    the median of the ops' planned times (``predicted_s``, the plan's own estimate of the op
    on the capacities it planned with: the payload share ``RunConfig.goodput``, 0.95, of each
    link's rate, docs/architecture.md §4) and the median over ops of ``op_time / predicted``:
    how close the executor comes to its plan (1.0 = exactly as planned; Gloo has no plan);
``worker_cpu_s``, ``cpu_s_per_gb``
    CPU seconds (user + system) all workers spent from the first op's start to the last op's
    end (``/proc/<pid>/stat``, sampled at the benchmark's 0.5 s poll), and that over the GB
    (10^9 bytes) the plans moved across links (``planned_link_bytes``): the data path's CPU
    cost, which bounds ops on fast links;
``plan_ms``, ``plan_ms_median``, ``planned_ahead``
    per op, the milliseconds the coordinator's event loop spent getting the op's plan before
    its Assign (inside the op time: the op starts when the group forms), their median, and how
    many ops had their plan made ahead, while the op before ran (``crew.runtime.planahead``;
    ``--no-plan-ahead`` plans each op when it starts). From the coordinator's ``plan_costs``
    meta row; None where it has none;
``correct``
    all K ops completed, none abandoned, and each result passed the coordinator's projection
    check (``verify_err`` < ``crew.control.verify.CHECK_TOLERANCE``, i.e. the members ended with the
    weighted average of what they offered);
``link_bytes``
    bytes each directed link "i->j" carried during the scheme's ops, **measured**: the
    difference of the sender interface's cumulative tx counter (``link_samples``, 1 Hz) between
    the last sample at or before the first op started and the first sample at or after the last
    op ended. It counts frames as HTB let them out (TCP/IP headers and ACKs included, ~5% over
    payload) and, at 1 Hz, up to a second of whatever else moved around the ops (for Gloo: its
    rendezvous and barriers);
``planned_link_bytes``
    the same, as the plans say: the sum over completed ops of ``crew.plan.routes.link_load`` of the
    final plan (payload only; empty for Gloo, which has no plan).

**Gloo** (``gloo``) is not a partial reduce: its workers run K timed
``torch.distributed.all_reduce`` ops among *all* n workers (``crew.runtime.gloo``), the trace is not
used, and worker 0 reports each op as a ``groups`` row. Its ``bound_s`` is
``lower_bound(bw, all n workers, M)`` and ``correct`` means only that every op completed: its
result is torch's and is verified separately by ``tests/test_gloo.py``. Compare it with the
partial-reduce schemes knowing that it averages n vectors, not p.

Rounds (``--rounds R``)
-----------------------
The scheme list runs R times on the same network, round r rotated r - 1 places, so over as many
rounds as schemes every scheme takes every position once (``lab.report.benchrounds``; this machine's
speed drifts by up to 2x over minutes, and a scheme that always runs first or last would carry
the drift). Each round's results are kept in ``rounds`` (a list of ``{scheme: ...}`` as above)
and summarised per scheme in ``repeat``: the median, min and max over the rounds of the round's
median, measured / planned, measured / bound and CPU s/GB, ``fastest`` (rounds in which its
median was the lowest of the correct schemes', ties counting for each) and ``correct``.
``schemes`` then holds each scheme's ops of all rounds pooled (same fields as one run). Run
folders become ``DIR/round-K/<scheme>/``; ``round_count`` is R.

Training (``--train``)
----------------------
Per scheme, a normal lab run (real torch workers training on the digits set) on the same
network for ``--duration`` seconds after the first worker reports an iteration. Reported in
``train.json``: rounds per worker per minute (completed groups a worker was a member of, per
minute of training, averaged over workers), and the time from the first reported iteration
until the mean of every worker's latest held-out accuracy first reaches ``--target-accuracy``
(``--workload lm``: until the mean held-out loss first falls to ``--target-loss``). The training
options of ``lab.run`` (``--workload``, ``--sync``, ``--local-steps``, ``--outer-lr``,
``--outer-momentum``, ``--compress``, ``--lr``, ``--batch-size``) apply to every scheme of one
invocation; ``train.json`` also gives the final held-out loss (lm), the bytes the link counters
saw, those bytes per worker-round (total / sum over workers of rounds), the bytes until the
target was reached (first 1 Hz sample at or after it) and the quality curve.

A matrix in one call: ``--configs SCHEMES:SYNCS:COMPRESS`` (repeatable; each field a comma
list, every combination runs in the order given), e.g. ``--configs
crew,preduce:every-step,diloco:none,int8 --configs gloo:every-step:none --local-steps 8``.
Each run is named ``<scheme>-<sync>[H]-<fp32|fp16|int8>`` (its folder ``DIR/train/<name>/`` and
its key in ``train.json``); local-sgd and diloco take ``--local-steps``, every-step H = 1; the
other training options are shared. The table gives per run: time to target, final quality,
rounds per worker, link MB per worker, MB per worker-round (with its ratio to the same scheme
and sync in fp32 when that ran too) and link MB until the target; ``DIR/train-plots.html`` (and
``train-curves.png``, ``train-bytes.png``) plot every run's curve and its WAN MB.

Outputs
-------
``DIR/results.json`` (rewritten after every scheme, so a crash keeps what was measured), a
terminal table, ``DIR/plots.html`` (op-time box plots with each scheme's median bound; measured
MB per op on every link as heat maps; plotly.js embedded, opens offline), the same figures as
PNG when kaleido can drive a Chromium (``BROWSER_PATH``, default ``/usr/bin/chromium``), and
one run folder per scheme, ``DIR/<scheme>/`` (``lab.db``, config, logs) to dig into; with
``--rounds``, a rounds table above the pooled one.

Wall-clock figures from this 2-core machine are distorted when other labs run at the same
time; the benchmark lists the ones it saw (``other_labs_seen``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from crew.config import ConfigError, RunConfig, Scheme
from crew.control.verify import CHECK_TOLERANCE
from crew.plan import planner
from crew.plan.routes import Route, link_load
from crew.plan.schemes import GROUP_SCHEMES
from crew.runtime.planahead import read_costs
from crew.runtime.rundb import GroupStatus, connect
from lab.net.cleanup import ROOT_NAME_PREFIX, root_link_names
from lab.net.mesh import LabNetwork
from lab.net.preflight import (
    Capabilities,
    PreflightError,
    add_allow_missing,
    allowed_missing,
    check,
    describe,
)
from lab.orchestrate.runner import (
    LabRun,
    RunOptions,
    add_training_args,
    free_mgmt_subnet,
    training_options,
)
from lab.report.benchrounds import (
    op_stats,
    percentile,
    pool_results,
    pooled_rounds,
    round_orders,
    round_summary,
    run_folder,
)
from lab.spec.shipped import topology_arg
from lab.spec.topology import Impairment, TopologyError, TopologySpec, load_topology

log = logging.getLogger(__name__)
# Wide enough for the results table when stderr is a file or a pipe (rich assumes 80 then).
console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

GLOO = Scheme.GLOO
ALL_SCHEMES: tuple[Scheme, ...] = (*GROUP_SCHEMES, GLOO)
# Start-up allowance before the first op: n numpy-only workers import and register in well
# under a minute on 2 cores; Gloo workers import torch (about 20 s for eight) and rendezvous.
STARTUP_NUMPY_S = 60.0
STARTUP_TORCH_S = 180.0
POLL_S = 0.5
FIRST_OP_STARTED_SQL = "SELECT COUNT(*) FROM groups WHERE started_at IS NOT NULL"
# After the last op, wait for the link monitor's next 1 Hz sample, so the ops are bracketed.
LAST_SAMPLE_WAIT_S = 3.0
REAP_TIMEOUT_S = 10.0
MB = 1_000_000
# Pace data connections at 0.95 x the link's rate (crew.runtime.node.pace_fraction). Measured on
# bench-hetero (p = 4, 8 MB, 6 ops, one run each): crew 0.654-0.677 s paced at 0.93-0.97
# against 0.709-0.750 s unpaced, crew-star 0.662-0.700 against 0.831-0.852; preduce and ring
# unchanged. Only the bench turns it on: its links keep their configured rates, while lab.run's
# can change at run time and workers pace at the rate they started with.
BENCH_PACE = 0.95

EXIT_OK = 0
EXIT_SCHEME_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_PREFLIGHT = 3


class BenchError(ValueError):
    """A benchmark option is invalid; ``field`` names the command-line flag."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class SchemeFailed(RuntimeError):
    """A scheme's lab run failed or timed out; the message says which process and why."""


# -- pure parts: schemes, trace, statistics, results from a run database ----------------------


def parse_schemes(text: str) -> tuple[str, ...]:
    """``"all"`` or a comma-separated list of scheme names, in the given order, no repeats."""
    if text.strip() == "all":
        return ALL_SCHEMES
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise BenchError("--schemes", "empty; give scheme names or 'all'")
    unknown = [s for s in names if s not in ALL_SCHEMES]
    if unknown:
        raise BenchError(
            "--schemes", f"unknown {', '.join(unknown)}; known: {', '.join(ALL_SCHEMES)} or 'all'"
        )
    dup = sorted({s for s in names if names.count(s) > 1})
    if dup:
        raise BenchError("--schemes", f"repeated {', '.join(dup)}")
    return tuple(names)


def make_trace(n: int, p: int, ops: int, seed: int) -> list[list[int]]:
    """K = ``ops`` groups of ``p`` distinct workers of ``range(n)``, each sorted; deterministic."""
    if not 2 <= p <= n:
        raise BenchError("--p", f"must be between 2 and n={n}, got {p}")
    if ops < 0:
        raise BenchError("--ops", f"must be >= 0, got {ops}")
    rng = random.Random(seed)
    return [sorted(rng.sample(range(n), p)) for _ in range(ops)]


@dataclass(frozen=True)
class SchemeResult:
    """One scheme's op benchmark; the fields are ``results.json``'s (module docstring)."""

    op_times_s: tuple[float, ...] = ()
    bound_s: tuple[float | None, ...] = ()
    median_s: float | None = None
    p90_s: float | None = None
    median_over_bound: float | None = None
    predicted_s: tuple[float | None, ...] = ()
    planned_s: float | None = None
    median_over_planned: float | None = None
    correct: bool = False
    completed: int = 0
    abandoned: int = 0
    revisions: int = 0
    max_verify_err: float | None = None
    link_bytes: dict[str, int] = field(default_factory=dict)
    planned_link_bytes: dict[str, int] = field(default_factory=dict)
    startup_s: float | None = None  # lab entered -> first op started
    wall_s: float | None = None  # lab entered -> lab left
    worker_cpu_s: float | None = None
    cpu_s_per_gb: float | None = None
    plan_ms: tuple[float | None, ...] = ()  # per op: planning on its critical path (None: unknown)
    plan_ms_median: float | None = None
    planned_ahead: int = 0  # ops whose plan was made while the op before ran
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _counter(conn: Any, src: int, dst: int, t: float, *, at_or_before: bool) -> int:
    """The link's tx counter at the last sample <= t (or first >= t); falls back to the
    earliest (latest) sample when there is none on that side of t."""
    cond, order = ("t<=?", "DESC") if at_or_before else ("t>=?", "ASC")
    fallback = "ASC" if at_or_before else "DESC"
    base = "SELECT tx_bytes FROM link_samples WHERE src=? AND dst=?"
    row = conn.execute(f"{base} AND {cond} ORDER BY t {order} LIMIT 1", (src, dst, t)).fetchone()
    if row is None:
        row = conn.execute(f"{base} ORDER BY t {fallback} LIMIT 1", (src, dst)).fetchone()
    return int(row["tx_bytes"])


def measured_link_bytes(conn: Any, start: float, end: float) -> dict[str, int]:
    """Bytes per link "i->j" from ``link_samples``: the counter at the first sample >= ``end``
    minus the counter at the last sample <= ``start``. Links with no samples are absent."""
    out: dict[str, int] = {}
    links = conn.execute("SELECT DISTINCT src, dst FROM link_samples ORDER BY src, dst").fetchall()
    for row in links:
        src, dst = int(row["src"]), int(row["dst"])
        moved = _counter(conn, src, dst, end, at_or_before=False) - _counter(
            conn, src, dst, start, at_or_before=True
        )
        out[f"{src}->{dst}"] = max(0, moved)
    return out


def planned_link_bytes(plans: Sequence[str], n: int) -> dict[str, int]:
    """Sum of ``link_load`` over the plans (JSON as in ``groups.plan``); only links used. Each
    plan's ``elem_bytes`` (its codec's wire bytes per element, 4 for float32 and for plans
    written before the field existed) sizes its elements."""
    total = np.zeros((n, n))
    for raw in plans:
        data = json.loads(raw)
        routes = [Route.from_list(r) for r in data["routes"]]
        total += link_load(routes, n, float(data.get("elem_bytes", 4.0)))
    return {
        f"{i}->{j}": int(total[i, j])
        for i in range(n)
        for j in range(n)
        if i != j and total[i, j] > 0
    }


def op_results(
    db_path: Path,
    *,
    ops: int,
    gloo: bool,
    bw: np.ndarray,
    size_bytes: int,
    entered_at: float | None = None,
    left_at: float | None = None,
    warmup: int = 0,
) -> SchemeResult:
    """A scheme's :class:`SchemeResult` from its run database alone (read-only).

    Group schemes: the rows of the trace's groups. Gloo: the op rows worker 0 reported, with the
    bound of an all-reduce among all n workers. ``correct`` is False unless exactly ``ops`` ops
    completed (see the module docstring for the rest). ``warmup``: the first groups (ids 1 ..
    warmup, ``--warmup``) are not ops and are left out.
    """
    n = bw.shape[0]
    conn = connect(db_path, readonly=True)
    try:
        rows = conn.execute(
            "SELECT id, status, started_at, ended_at, bound_s, predicted_s, verify_err,"
            " revisions, plan FROM groups WHERE id > ? ORDER BY started_at, id",
            (0 if gloo else warmup,),
        ).fetchall()
        done = [
            r for r in rows if r["status"] == GroupStatus.COMPLETED and r["started_at"] is not None
        ]
        times = [float(r["ended_at"] - r["started_at"]) for r in done]
        if gloo:
            bound = planner.lower_bound(bw, list(range(n)), size_bytes)
            bounds: list[float | None] = [bound] * len(done)
        else:
            bounds = [r["bound_s"] for r in done]
        predicted = [r["predicted_s"] for r in done]
        errs = [r["verify_err"] for r in done]
        abandoned = sum(1 for r in rows if r["status"] == GroupStatus.ABANDONED)
        if gloo:
            correct = len(done) == ops and abandoned == 0
        else:
            # A NULL check (none made) or NaN fails, as does any error at the tolerance.
            correct = (
                len(done) == ops
                and abandoned == 0
                and all(e is not None and e < CHECK_TOLERANCE for e in errs)
            )
        if done:
            first = min(r["started_at"] for r in done)
            last = max(r["ended_at"] for r in done)
            measured = measured_link_bytes(conn, first, last)
        else:
            first, measured = None, {}
        plans = [r["plan"] for r in done if r["plan"]]
        costs = read_costs(conn)
        op_costs = [costs.get(int(r["id"])) for r in done]
        plan_ms = tuple(None if c is None else c[1] for c in op_costs)
        return SchemeResult(
            op_times_s=tuple(times),
            bound_s=tuple(bounds),
            predicted_s=tuple(predicted),
            **op_stats(times, bounds, predicted),
            correct=correct,
            completed=len(done),
            abandoned=abandoned,
            revisions=sum(int(r["revisions"] or 0) for r in rows),
            max_verify_err=max((e for e in errs if e is not None), default=None),
            link_bytes=measured,
            planned_link_bytes=planned_link_bytes(plans, n),
            startup_s=(first - entered_at) if first is not None and entered_at else None,
            wall_s=(left_at - entered_at) if entered_at and left_at else None,
            plan_ms=plan_ms,
            plan_ms_median=percentile([m for m in plan_ms if m is not None], 50),
            planned_ahead=sum(1 for c in op_costs if c is not None and c[0].made_ahead),
        )
    finally:
        conn.close()


@dataclass(frozen=True)
class TrainResult:
    """One scheme's training run (``train.json``; module docstring)."""

    training_s: float | None = None  # first reported iteration -> end of the run
    rounds_per_worker_per_min: float | None = None
    rounds_per_worker: dict[str, int] = field(default_factory=dict)
    final_accuracy: float | None = None
    time_to_target_s: float | None = None
    target_accuracy: float = 0.85
    groups_completed: int = 0
    groups_abandoned: int = 0
    error: str | None = None
    final_heldout_loss: float | None = None  # lm: mean of the workers' latest held-out loss
    target_loss: float | None = None
    link_bytes: int | None = None  # all links, from the link counters
    link_bytes_per_round: float | None = None  # link_bytes / sum of the workers' rounds
    link_bytes_to_target: int | None = None  # all links, until the target was first reached
    # (seconds since the first iteration, mean of every worker's latest accuracy, or held-out
    # loss for lm), once all n workers have reported one: the training curve of the plots.
    curve: list[tuple[float, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def train_results(
    db_path: Path,
    *,
    n: int,
    target: float,
    ended_at: float | None = None,
    target_loss: float | None = None,
) -> TrainResult:
    """Training figures from a run database (read-only).

    The clock starts at the first ``iterations`` row (so torch's import time does not count) and
    ends at ``ended_at`` (default: the run's ``meta.ended_at``, else the last iteration).
    Time to target: the first iteration row after which every one of the n workers has
    reported an accuracy and the mean of their latest accuracies is >= ``target`` (with
    ``target_loss``, the lm's: the mean of their latest held-out losses is <= it; evaluation
    rows carry the held-out loss for lm, see ``crew.runtime.worker``).
    """
    conn = connect(db_path, readonly=True)
    try:
        its = conn.execute("SELECT t, worker, accuracy, loss FROM iterations ORDER BY t").fetchall()
        if not its:
            return TrainResult(target_accuracy=target, error="no worker reported an iteration")
        t0 = float(its[0]["t"])
        meta = {r["key"]: r["value"] for r in conn.execute("SELECT key, value FROM meta")}
        end = ended_at or float(meta.get("ended_at", its[-1]["t"]))
        latest: dict[int, float] = {}
        latest_loss: dict[int, float] = {}
        reached: float | None = None
        curve: list[tuple[float, float]] = []
        for r in its:
            if r["accuracy"] is None:
                continue
            latest[r["worker"]] = float(r["accuracy"])
            if r["loss"] is not None:
                latest_loss[r["worker"]] = float(r["loss"])
            hit = (
                sum(latest.values()) / n >= target
                if target_loss is None
                else len(latest_loss) == n and sum(latest_loss.values()) / n <= target_loss
            )
            if reached is None and len(latest) == n and hit:
                reached = float(r["t"]) - t0
            quality = latest if target_loss is None else latest_loss
            if len(quality) == n and float(r["t"]) <= end:
                curve.append((round(float(r["t"]) - t0, 2), sum(quality.values()) / n))
        # Groups that completed while the lab was stopping fall outside the window.
        groups = conn.execute(
            "SELECT members, status FROM groups WHERE ended_at IS NULL OR ended_at <= ?", (end,)
        ).fetchall()
        rounds = {str(i): 0 for i in range(n)}
        for g in groups:
            if g["status"] == GroupStatus.COMPLETED:
                for m in json.loads(g["members"]):
                    rounds[str(m)] = rounds.get(str(m), 0) + 1
        minutes = max(end - t0, 1e-9) / 60.0
        link = conn.execute(
            "SELECT SUM(b) AS total FROM (SELECT MAX(tx_bytes) - MIN(tx_bytes) AS b"
            " FROM link_samples GROUP BY src, dst)"
        ).fetchone()
        link_bytes = int(link["total"]) if link and link["total"] is not None else None
        to_target = None
        if reached is not None:
            # The first 1 Hz sample at or after the moment the target was reached, per link.
            row = conn.execute(
                "SELECT SUM(b) AS total FROM (SELECT (SELECT MIN(s2.tx_bytes) FROM link_samples"
                " s2 WHERE s2.src = s.src AND s2.dst = s.dst AND s2.t >= ?) - MIN(s.tx_bytes)"
                " AS b FROM link_samples s GROUP BY s.src, s.dst)",
                (t0 + reached,),
            ).fetchone()
            to_target = int(row["total"]) if row and row["total"] is not None else None
        worker_rounds = sum(rounds.values())
        return TrainResult(
            training_s=end - t0,
            rounds_per_worker_per_min=sum(rounds.values()) / n / minutes,
            rounds_per_worker=rounds,
            final_accuracy=(sum(latest.values()) / len(latest)) if latest else None,
            time_to_target_s=reached,
            target_accuracy=target,
            groups_completed=sum(1 for g in groups if g["status"] == GroupStatus.COMPLETED),
            groups_abandoned=sum(1 for g in groups if g["status"] == GroupStatus.ABANDONED),
            final_heldout_loss=(
                sum(latest_loss.values()) / len(latest_loss)
                if latest_loss and target_loss is not None
                else None
            ),
            target_loss=target_loss,
            link_bytes=link_bytes,
            link_bytes_per_round=(
                link_bytes / worker_rounds if link_bytes is not None and worker_rounds else None
            ),
            link_bytes_to_target=to_target,
            curve=curve,
        )
    finally:
        conn.close()


# -- the lab side -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainRun:
    """One training run of the benchmark: a scheme with its training options (RunOptions
    fields). ``name`` is its folder (``DIR/train/<name>``) and its key in ``train.json``."""

    name: str
    scheme: str
    training: dict[str, Any]

    @property
    def label(self) -> tuple[str, str, str]:
        """(scheme, sync with its H, compress) for the table."""
        t = self.training
        sync = t["sync"] if t["sync"] == "every-step" else f"{t['sync']} H={t['local_steps']}"
        return self.scheme, sync, "fp32" if t["compress"] == "none" else t["compress"]


def parse_train_configs(items: Sequence[str], args: argparse.Namespace) -> tuple[TrainRun, ...]:
    """``--configs SCHEMES:SYNCS:COMPRESS`` (each field a comma list; every combination runs,
    in the order given) into training runs. every-step runs take H = 1, local-sgd and diloco
    ``--local-steps``; the other training options are the command line's. Raises BenchError
    naming the bad item, or a combination that cannot run (e.g. gloo with int8)."""
    runs: list[TrainRun] = []
    for item in items:
        fields = item.split(":")
        if len(fields) != 3 or not all(f.strip() for f in fields):
            raise BenchError("--configs", f"{item!r}: want SCHEMES:SYNCS:COMPRESS")
        schemes = parse_schemes(fields[0])
        syncs = [x.strip() for x in fields[1].split(",") if x.strip()]
        codecs = [x.strip() for x in fields[2].split(",") if x.strip()]
        for scheme in schemes:
            for sync in syncs:
                for compress in codecs:
                    h = 1 if sync == "every-step" else args.local_steps
                    one = argparse.Namespace(
                        **(vars(args) | {"sync": sync, "compress": compress, "local_steps": h})
                    )
                    try:
                        training = training_options(one, scheme=scheme, nonblocking=False)
                    except ConfigError as exc:
                        raise BenchError(
                            "--configs", f"{scheme}:{sync}:{compress}: {exc}"
                        ) from None
                    tag = sync if h == 1 else f"{sync}{h}"
                    name = f"{scheme}-{tag}-{'fp32' if compress == 'none' else compress}"
                    if any(r.name == name for r in runs):
                        raise BenchError("--configs", f"{name} is listed twice")
                    runs.append(TrainRun(name, scheme, training))
    return tuple(runs)


@dataclass(frozen=True)
class BenchSpec:
    """The benchmark's options, validated (see ``build_parser`` for each)."""

    topology: TopologySpec
    schemes: tuple[str, ...]
    p: int
    size_bytes: int
    ops: int
    seed: int
    timeout_per_op_s: float
    out: Path
    train: bool = False
    duration_s: float = 60.0
    target_accuracy: float = 0.85
    allow_missing: frozenset[Impairment] = frozenset()
    part_bytes: int = 0  # 0: the run's automatic part size (RunConfig.part_elems_for)
    # fraction of each link's configured rate its data connections are paced at (0: unpaced)
    pace: float = BENCH_PACE
    # the host's CPU s per GB of link bytes, a capacity in crew's route LP (0: none)
    host_cpu_s_per_gb: float = 0.0
    # plan each trace group while the one before runs (crew.runtime.planahead)
    plan_ahead: bool = True
    # bytes crew's route LP counts a part to wait behind at each hop (RunConfig)
    hop_backlog_bytes: int = RunConfig.default("hop_backlog_bytes")
    training: dict[str, Any] = field(default_factory=dict)  # RunOptions training fields
    target_loss: float = 2.0  # lm: held-out loss (nats per byte) whose reaching is timed
    # with --train: the runs, in order (one per scheme with ``training``, or --configs)
    train_runs: tuple[TrainRun, ...] = ()
    # untimed groups of all n workers each scheme runs before the trace (see --warmup)
    warmup: int = 0
    rounds: int = 1  # the scheme list runs this many times, rotated (lab.report.benchrounds)

    @property
    def size_elems(self) -> int:
        return self.size_bytes // 4


def other_labs(own_tag: str | None = None) -> list[str]:
    """Tags of the labs whose management bridge (``crw<tag>br``) is in the root namespace."""
    try:
        names = root_link_names()
    except (OSError, subprocess.CalledProcessError):
        return []
    tags = {
        n[len(ROOT_NAME_PREFIX) : -2]
        for n in names
        if n.startswith(ROOT_NAME_PREFIX) and n.endswith("br")
    }
    return sorted(tags - {own_tag})


def _log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def _check_alive(lab: LabRun) -> None:
    """Raise SchemeFailed when the coordinator or a worker has exited: none may before stop."""
    lab.poll()
    if lab.coordinator is not None and lab.coordinator.poll() is not None:
        tail = _log_tail(lab.run_dir / "logs" / "coordinator.log")
        raise SchemeFailed(f"coordinator exited with code {lab.coordinator.returncode}: {tail}")
    for i, code in sorted(lab.exit_codes.items()):
        tail = _log_tail(lab.run_dir / "logs" / f"w{i}.log")
        raise SchemeFailed(f"worker {i} exited with code {code}: {tail}")


def _reap(lab: LabRun) -> None:
    """Stop what the LabRun left running on the shared network, so the next scheme starts clean.

    ``LabRun`` waits for its processes but, when the network is the caller's, does not kill
    those that outlive the wait (an owned network's teardown would). We hold their handles, so
    we end them by pid.
    """
    net = lab.net
    for i, proc in lab.workers.items():
        if net is not None:
            try:
                net.stop_process(proc, timeout=REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.error("worker %d (pid %d) survived SIGKILL", i, proc.pid)
    coord = lab.coordinator
    if coord is not None and coord.poll() is None:
        log.warning("coordinator pid %d still runs after the lab stopped; killing it", coord.pid)
        try:
            os.killpg(coord.pid, signal.SIGKILL)  # its own session (start_new_session)
            coord.wait(REAP_TIMEOUT_S)
        except (ProcessLookupError, subprocess.TimeoutExpired) as exc:
            log.error("could not end coordinator pid %d: %s", coord.pid, exc)


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is the state (field 3 of proc(5)); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _workers_cpu_s(lab: LabRun) -> float:
    return sum(process_cpu_s(p.pid) or 0.0 for p in lab.workers.values())


def _db_scalar(lab: LabRun, sql: str) -> Any:
    assert lab.db is not None
    return lab.db.query(sql)[0][0]


def run_ops(
    net: LabNetwork,
    caps: Capabilities,
    spec: BenchSpec,
    scheme: str,
    trace: list[list[int]],
    progress: Progress,
    index: int,
    round_no: int = 1,
) -> SchemeResult:
    """Replay the trace (or K Gloo ops) with one scheme; never raises for a scheme's failure.
    ``round_no``: which of ``spec.rounds`` rounds this is (1-based; it names the run folder)."""
    gloo = scheme == GLOO
    run_dir = run_folder(spec.out, scheme, round_no, spec.rounds)
    k = spec.ops
    warm = 0 if gloo else spec.warmup
    replay = [list(range(spec.topology.n))] * warm + trace
    label = f"{index}/{len(spec.schemes)} {scheme}"
    if spec.rounds > 1:
        label = f"round {round_no}/{spec.rounds}: {label}"
    task = progress.add_task(label, total=k, status="starting")
    opts = RunOptions(
        scheme=scheme,
        p=spec.p,
        seed=spec.seed,
        dashboard=False,
        log_level="WARNING",
        part_bytes=spec.part_bytes,
        host_cpu_s_per_gb=spec.host_cpu_s_per_gb,
        plan_ahead=spec.plan_ahead,
        hop_backlog_bytes=spec.hop_backlog_bytes,
        extra={
            "bench": True,
            "size_elems": spec.size_elems,
            "trace": replay,
            "ops": k + warm,
            # groups 1..warm are untimed (lab.studies.planbench's replay skips them)
            "warmup": warm,
        },
    )
    startup = STARTUP_TORCH_S if gloo else STARTUP_NUMPY_S
    budget = startup + spec.timeout_per_op_s * (k + warm)
    error: str | None = None
    cpu_used: float | None = None
    entered = time.time()
    lab = LabRun(spec.topology, caps, opts, run_dir, net=net)
    try:
        with lab:
            progress.update(task, status="running")
            deadline = time.monotonic() + budget
            ended = 0
            cpu_first: float | None = None
            while ended < k + warm:
                if time.monotonic() > deadline:
                    raise SchemeFailed(
                        f"timed out after {budget:.0f} s ({startup:.0f} s start-up + "
                        f"{spec.timeout_per_op_s:g} s x {k + warm} ops) with"
                        f" {max(0, ended - warm)}/{k} ops ended"
                    )
                _check_alive(lab)
                ended = int(
                    _db_scalar(
                        lab,
                        "SELECT COUNT(*) FROM groups WHERE status IN"
                        f" ('{GroupStatus.COMPLETED}', '{GroupStatus.ABANDONED}')",
                    )
                    or 0
                )
                progress.update(task, completed=max(0, ended - warm))
                if (
                    cpu_first is None
                    and not gloo
                    and _db_scalar(lab, f"{FIRST_OP_STARTED_SQL} AND id > {warm}")
                ):
                    cpu_first = _workers_cpu_s(lab)
                if ended < k + warm:
                    time.sleep(POLL_S)
            if cpu_first is not None:
                cpu_used = _workers_cpu_s(lab) - cpu_first
            last_end = float(_db_scalar(lab, "SELECT MAX(ended_at) FROM groups") or 0.0)
            wait_until = time.monotonic() + LAST_SAMPLE_WAIT_S
            while time.monotonic() < wait_until:
                if float(_db_scalar(lab, "SELECT MAX(t) FROM link_samples") or 0.0) >= last_end:
                    break
                time.sleep(0.2)
            progress.update(task, status="stopping")
    except SchemeFailed as exc:
        error = str(exc)
    except Exception as exc:  # a scheme that cannot even start must not stop the benchmark
        log.exception("scheme %s failed", scheme)
        error = f"{type(exc).__name__}: {exc}"
    finally:
        _reap(lab)
    left = time.time()
    try:
        result = op_results(
            run_dir / "lab.db",
            ops=k,
            gloo=gloo,
            bw=spec.topology.bw_matrix(),
            size_bytes=spec.size_elems * 4,
            entered_at=entered,
            left_at=left,
            warmup=warm,
        )
    except Exception as exc:  # no database (the lab never started): report what we know
        result = SchemeResult(
            wall_s=left - entered, error=f"no results: {type(exc).__name__}: {exc}"
        )
    if cpu_used is not None:
        moved_gb = sum(result.planned_link_bytes.values()) / 1e9
        result = replace(
            result,
            worker_cpu_s=cpu_used,
            cpu_s_per_gb=cpu_used / moved_gb if moved_gb > 0 else None,
        )
    if error is not None:
        result = replace(
            result,
            correct=False,
            error=error if result.error is None else f"{error}; {result.error}",
        )
    elif not result.correct:
        result = replace(
            result,
            error=(
                f"{result.completed}/{k} ops completed, {result.abandoned} abandoned, largest "
                f"check error {result.max_verify_err}"
            ),
        )
    progress.update(task, status="[green]ok" if result.correct else "[red]FAILED")
    return result


def run_training(
    net: LabNetwork,
    caps: Capabilities,
    spec: BenchSpec,
    run: TrainRun,
    progress: Progress,
    index: int,
) -> TrainResult:
    """A normal (training) lab run of one configuration for ``spec.duration_s`` of training."""
    scheme = run.name
    run_dir = spec.out / "train" / run.name
    total = int(math.ceil(spec.duration_s))
    task = progress.add_task(
        f"train {index}/{len(spec.train_runs)} {run.name}", total=total, status="starting"
    )
    opts = RunOptions(
        scheme=Scheme(run.scheme),
        p=spec.p,
        seed=spec.seed,
        dashboard=False,
        log_level="WARNING",
        **run.training,
    )
    error: str | None = None
    ended_at: float | None = None
    lab = LabRun(spec.topology, caps, opts, run_dir, net=net)
    try:
        with lab:
            deadline = time.monotonic() + STARTUP_TORCH_S
            while not _db_scalar(lab, "SELECT COUNT(*) FROM iterations"):
                if time.monotonic() > deadline:
                    raise SchemeFailed(f"no iteration within {STARTUP_TORCH_S:.0f} s of start")
                _check_alive(lab)
                time.sleep(POLL_S)
            progress.update(task, status="training")
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < spec.duration_s:
                _check_alive(lab)
                progress.update(task, completed=min(total, int(elapsed)))
                time.sleep(POLL_S)
            ended_at = time.time()
            progress.update(task, completed=total, status="stopping")
    except SchemeFailed as exc:
        error = str(exc)
    except Exception as exc:
        log.exception("training with %s failed", scheme)
        error = f"{type(exc).__name__}: {exc}"
    finally:
        _reap(lab)
    try:
        lm = run.training.get("workload") == "lm"
        result = train_results(
            run_dir / "lab.db",
            n=spec.topology.n,
            target=spec.target_accuracy,
            ended_at=ended_at,
            target_loss=spec.target_loss if lm else None,
        )
    except Exception as exc:
        result = TrainResult(
            target_accuracy=spec.target_accuracy, error=f"no results: {type(exc).__name__}: {exc}"
        )
    if error is not None:
        result = replace(result, error=error)
    progress.update(task, status="[green]ok" if result.error is None else "[red]FAILED")
    return result


# -- reporting --------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def results_table(schemes: dict[str, dict[str, Any]], title: str, ops: int) -> Table:
    """Scheme, median, p90, planned, measured/planned, median/bound, median relative to the
    best correct scheme, CPU per GB moved, ops, correct."""
    medians = [r["median_s"] for r in schemes.values() if r["correct"] and r["median_s"]]
    best = min(medians) if medians else None
    t = Table(
        title=title,
        caption="planned: median of the plans' predicted op times; meas/plan: median over ops"
        " of measured/planned; /bound: median over ops of measured/fluid lower bound;"
        " /best: median over the fastest correct scheme's median; CPU: worker CPU s per GB"
        " moved; plan ms: median over ops of the planning the coordinator waited for before"
        " the op's Assign (ahead: ops planned while the op before ran)",
    )
    cols = (
        "scheme",
        "median s",
        "p90 s",
        "planned s",
        "meas/plan",
        "/bound",
        "/best",
        "CPU s/GB",
        "plan ms",
        "ahead",
        "ops",
        "correct",
    )
    for col in cols:
        t.add_column(col, justify="left" if col == "scheme" else "right")
    for name, r in schemes.items():
        vs = r["median_s"] / best if best and r["median_s"] is not None else None
        ok = "[green]yes" if r["correct"] else "[red]no"
        t.add_row(
            name,
            _fmt(r["median_s"]),
            _fmt(r["p90_s"]),
            _fmt(r.get("planned_s")),
            _fmt(r.get("median_over_planned"), ".2f"),
            _fmt(r["median_over_bound"], ".2f"),
            _fmt(vs, ".2f"),
            _fmt(r.get("cpu_s_per_gb"), ".1f"),
            _fmt(r.get("plan_ms_median"), ".1f"),
            f"{r.get('planned_ahead', 0)}/{r['completed']}",
            f"{r['completed']}/{ops}",
            ok,
        )
    return t


def _fmt_spread(s: dict[str, float | None], spec: str = ".3f") -> str:
    if s["median"] is None:
        return "-"
    return f"{s['median']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"


def rounds_table(summary: dict[str, dict[str, Any]], topology: str, rounds: int) -> Table:
    """Per scheme over the rounds (``lab.report.benchrounds.round_summary``): the median of the
    rounds' medians, measured / planned and measured / bound, each with its range, the rounds
    it was the fastest correct scheme in, and the rounds it was correct in."""
    t = Table(
        title=f"{topology}: {rounds} rounds, each scheme list rotated one place per round",
        caption="median (min-max) over the rounds of each round's median; fastest: rounds in"
        " which the scheme's median was the lowest of the correct schemes' (ties count for"
        " each)",
    )
    for col in ("scheme", "median s", "meas/plan", "/bound", "CPU s/GB", "fastest", "correct"):
        t.add_column(col, justify="left" if col == "scheme" else "right")
    for name, r in summary.items():
        t.add_row(
            name,
            _fmt_spread(r["median_s"]),
            _fmt_spread(r["median_over_planned"], ".2f"),
            _fmt_spread(r["median_over_bound"], ".2f"),
            _fmt_spread(r["cpu_s_per_gb"], ".1f"),
            f"{r['fastest']}/{r['rounds']}",
            ("[green]" if r["correct"] == r["rounds"] else "[red]")
            + f"{r['correct']}/{r['rounds']}",
        )
    return t


def error_lines(schemes: dict[str, dict[str, Any]], limit: int = 400) -> list[str]:
    """One line per scheme that failed: its name and (the start of) its error."""
    out = []
    for name, r in schemes.items():
        if r["error"]:
            err = " ".join(str(r["error"]).split())
            out.append(f"{name}: {err[:limit]}{'...' if len(err) > limit else ''}")
    return out


def _fp32_twin(name: str, r: dict[str, Any], results: dict[str, dict[str, Any]]) -> str | None:
    """The run with the same scheme and sync in fp32, for the bytes ratio (None: not run)."""
    c = r.get("config")
    if not c:
        return None
    for other, o in results.items():
        oc = o.get("config") or {}
        if (
            other != name
            and oc.get("compress") == "none"
            and (oc.get("scheme"), oc.get("sync"), oc.get("local_steps"))
            == (c["scheme"], c["sync"], c["local_steps"])
        ):
            return other
    return None


def train_table(results: dict[str, dict[str, Any]], target: float) -> Table:
    """One row per training run: time to target, final quality, rounds and link bytes per
    worker, bytes per worker-round (and its ratio to the same scheme and sync in fp32), and
    the link bytes until the target was reached."""
    lm = any(r.get("target_loss") is not None for r in results.values())
    if lm:
        target = next(r["target_loss"] for r in results.values() if r.get("target_loss"))
    t = Table(title="training")
    cols = (
        "run",
        "training s",
        f"time to {target:g} s",
        "final held-out loss" if lm else "final accuracy",
        "rounds per worker",
        "link MB per worker",
        "MB per worker-round",
        "x fp32",
        "link MB to target",
        "error",
    )
    left = ("run", "error")
    for col in cols:
        t.add_column(col, justify="left" if col in left else "right", no_wrap=col == "run")
    for name, r in results.items():
        per_round = r.get("link_bytes_per_round")
        twin = _fp32_twin(name, r, results)
        twin_round = results[twin].get("link_bytes_per_round") if twin else None
        ratio = per_round / twin_round if per_round and twin_round else None
        rounds = r.get("rounds_per_worker") or {}
        n = max(1, len(rounds))
        link = r.get("link_bytes")
        to_target = r.get("link_bytes_to_target")
        t.add_row(
            name,
            _fmt(r.get("training_s"), ".0f"),
            _fmt(r["time_to_target_s"], ".1f"),
            _fmt(r.get("final_heldout_loss") if lm else r["final_accuracy"]),
            _fmt(sum(rounds.values()) / n if rounds else None, ".1f"),
            _fmt(None if link is None else link / n / 1e6, ".1f"),
            _fmt(None if per_round is None else per_round / 1e6, ".2f"),
            _fmt(ratio),
            _fmt(None if to_target is None else to_target / 1e6, ".0f"),
            r["error"] or "",
        )
    return t


def train_figures(train: dict[str, Any]) -> dict[str, Any]:
    """Plotly figures of a training matrix: the quality curve of every run against time (with
    the target), and each run's link MB in all and until the target."""
    import plotly.graph_objects as go

    runs = train["schemes"]
    lm = any(r.get("target_loss") is not None for r in runs.values())
    target = train.get("target_loss") if lm else train.get("target_accuracy")
    what = "mean held-out loss (nats/byte)" if lm else "mean held-out accuracy"
    curves = go.Figure()
    for name, r in runs.items():
        pts = r.get("curve") or []
        curves.add_trace(
            go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines", name=name)
        )
    if target is not None:
        curves.add_hline(y=target, line_dash="dash", annotation_text=f"target {target:g}")
    curves.update_layout(
        title=f"training on {train['topology']}, p={train['p']}, seed {train['seed']}: "
        f"{what} of all workers",
        xaxis_title="seconds since the first iteration",
        yaxis_title=what,
        template="plotly_white",
        width=1000,
        height=550,
    )
    names = list(runs)
    mb = go.Figure()
    mb.add_trace(
        go.Bar(
            x=names,
            y=[(runs[k].get("link_bytes") or 0) / 1e6 for k in names],
            name="whole run",
        )
    )
    mb.add_trace(
        go.Bar(
            x=names,
            y=[(runs[k].get("link_bytes_to_target") or 0) / 1e6 for k in names],
            name="until the target",
        )
    )
    mb.update_layout(
        title="WAN traffic: MB on all links (link counters)",
        yaxis_title="MB",
        barmode="group",
        template="plotly_white",
        width=max(700, 90 * len(names) + 200),
        height=500,
    )
    return {"train-curves": curves, "train-bytes": mb}


def build_figures(results: dict[str, Any]) -> dict[str, Any]:
    """Plotly figures: op-time distribution per scheme, and per-link bytes per scheme (MB)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    schemes = results["schemes"]
    n = results["n"]
    times = go.Figure()
    for name, r in schemes.items():
        if r["op_times_s"]:
            times.add_trace(
                go.Box(
                    y=r["op_times_s"],
                    name=name,
                    boxpoints="all",
                    jitter=0.4,
                    pointpos=0,
                    hovertext=[f"op {i}" for i in range(len(r["op_times_s"]))],
                )
            )
    # Each scheme's own median bound (Gloo's is for all n workers, the others' for p).
    marked = [
        (s, percentile([b for b in r["bound_s"] if b is not None], 50))
        for s, r in schemes.items()
        if r["op_times_s"]
    ]
    marked = [(s, b) for s, b in marked if b is not None]
    if marked:
        times.add_trace(
            go.Scatter(
                x=[s for s, _ in marked],
                y=[b for _, b in marked],
                mode="markers",
                name="lower bound (median)",
                marker={
                    "symbol": "line-ew-open",
                    "size": max(12, min(40, 300 // max(1, len(marked)))),
                    "color": "black",
                    "line": {"width": 2},
                },
                hovertemplate="%{x}: median lower bound %{y:.3f} s<extra></extra>",
            )
        )
    times.update_layout(
        title=f"op time per scheme: {results['topology']}, p={results['p']}, "
        f"{results['size_bytes'] / MB:g} MB, {results['ops']} ops (black bar: median lower "
        "bound)",
        yaxis_title="op time (s)",
        yaxis_rangemode="tozero",
        width=max(700, 120 * len(schemes) + 200),
        height=600,
        showlegend=False,
        template="plotly_white",
    )

    names = [s for s, r in schemes.items() if r["link_bytes"]]
    cols = min(4, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / cols))
    links = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=names or ["no data"],
        horizontal_spacing=0.04,
        vertical_spacing=0.1,
    )
    # MB per op on a log colour scale: Gloo moves tens of times more than a p-member group,
    # and a linear scale would flatten every other scheme. Links that moved under 1 kB per op
    # get the floor colour.
    ops = max(1, int(results["ops"]) * pooled_rounds(results))
    floor = -3.0
    ticks = list(range(-3, 4))
    for k, name in enumerate(names):
        mb = np.full((n, n), np.nan)
        for key, b in schemes[name]["link_bytes"].items():
            src, dst = (int(x) for x in key.split("->"))
            mb[src, dst] = b / MB / ops
        with np.errstate(divide="ignore"):
            z = np.where(np.isnan(mb), np.nan, np.maximum(np.log10(mb), floor))
        links.add_trace(
            go.Heatmap(
                z=z,
                customdata=mb,
                x=[f"w{j}" for j in range(n)],
                y=[f"w{i}" for i in range(n)],
                coloraxis="coloraxis",
                hovertemplate="%{y} → %{x}: %{customdata:.3f} MB per op<extra>" + name + "</extra>",
            ),
            row=k // cols + 1,
            col=k % cols + 1,
        )
    links.update_yaxes(autorange="reversed")
    links.update_layout(
        title="measured MB per op on each directed link (row = sender, column = receiver; "
        "log colour scale)",
        coloraxis={
            "colorscale": "Viridis",
            "cmin": floor,
            "colorbar": {
                "title": "MB/op",
                "tickvals": ticks,
                "ticktext": [f"{10.0**t:g}" for t in ticks],
            },
        },
        height=320 * rows + 80,
        width=max(600, 300 * cols + 120),
        template="plotly_white",
    )
    return {"op-times": times, "link-bytes": links}


def write_figures(figures: dict[str, Any], out: Path, html_name: str = "plots.html") -> list[str]:
    """Write all figures into ``plots.html``, and each as ``<name>.png`` when kaleido and a
    Chromium work.

    Returns notes for the user (what was written, or why no PNG). The HTML embeds plotly.js
    once, so it opens offline.
    """
    notes: list[str] = []
    parts = [
        fig.to_html(full_html=False, include_plotlyjs=(k == 0))
        for k, fig in enumerate(figures.values())
    ]
    html = out / html_name
    html.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>lab.bench</title>"
        "</head><body>" + "\n".join(parts) + "</body></html>"
    )
    notes.append(f"plots: {html}")
    # kaleido 1.x drives a Chromium through choreographer; point it at Debian's.
    if "BROWSER_PATH" not in os.environ and Path("/usr/bin/chromium").exists():
        os.environ["BROWSER_PATH"] = "/usr/bin/chromium"
    try:
        for name, fig in figures.items():
            fig.write_image(out / f"{name}.png", scale=2)
        notes.append(f"PNG: {', '.join(str(out / f'{n}.png') for n in figures)}")
    except Exception as exc:  # kaleido missing, or no browser it can start: HTML only
        notes.append(f"no PNG (HTML only): {type(exc).__name__}: {str(exc)[:200]}")
    return notes


# -- command line -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lab.bench",
        description="Benchmark partial-reduce schemes (and Gloo) on one emulated network: the "
        "same seeded trace of groups for every scheme, with op times, ratios to the "
        "fluid lower bound, result checks and per-link bytes. Needs root.",
        epilog="Writes DIR/results.json, DIR/plots.html, DIR/op-times.png, DIR/link-bytes.png "
        "(when kaleido can drive /usr/bin/chromium), one "
        "run folder per scheme (DIR/<scheme>/lab.db and logs), and with --train "
        "DIR/train.json and DIR/train/<scheme>/. Details: the docstring of lab/bench.py.",
    )
    p.add_argument(
        "--topology",
        type=topology_arg,
        required=True,
        help="topology YAML to emulate, or a shipped topology's name",
    )
    p.add_argument(
        "--schemes",
        default="all",
        help=f"comma-separated schemes to run, in this order, or 'all' for every one "
        f"including gloo (default all): {', '.join(ALL_SCHEMES)}",
    )
    p.add_argument(
        "--p",
        type=int,
        default=4,
        help="group size: workers per trace group, 2..n (default 4); gloo always averages all n",
    )
    p.add_argument(
        "--size-mb",
        type=float,
        default=8.0,
        help="vector each worker offers, in MB of float32 (1 MB = 10^6 bytes, "
        "rounded down to whole floats; default 8)",
    )
    p.add_argument(
        "--ops",
        type=int,
        default=10,
        help="ops per scheme: groups in the trace, or Gloo all-reduces (default 10; "
        "0 skips the op benchmark, for --train alone)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        metavar="W",
        help="before each scheme's trace, W untimed groups of all n workers with that scheme, "
        "so the timed ops find the data connections open and their TCP windows grown "
        "(measured: a fresh connection was receive-window limited for 64%% of its first op); "
        "not for gloo (default 0)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="R",
        help="run the scheme list R times on the same network, each round rotated one place "
        "(round 2 starts with the second scheme), and report per scheme the median of the "
        "rounds' medians with their range and in how many rounds it was the fastest: the "
        "machine's speed drifts, so schemes run one after another are compared fairly only "
        "over rounds. Run folders become OUT/round-K/SCHEME (default 1)",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder for results, plots and the schemes' run folders",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="delete run folders of an earlier benchmark in --out instead of refusing",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the trace and of the workers' vectors and training (default 0)",
    )
    p.add_argument(
        "--timeout-per-op",
        type=float,
        default=60.0,
        metavar="S",
        help="a scheme fails when its K ops take longer than S x K seconds plus a "
        f"start-up allowance ({STARTUP_NUMPY_S:.0f} s; gloo {STARTUP_TORCH_S:.0f}"
        " s, it imports torch); default 60",
    )
    p.add_argument(
        "--train",
        action="store_true",
        help="also train a model with each scheme (real torch workers) and report "
        "rounds per worker per minute and time to --target-accuracy",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=60.0,
        metavar="S",
        help="with --train: seconds of training per scheme, counted from the first "
        "reported iteration (default 60)",
    )
    p.add_argument(
        "--target-accuracy",
        type=float,
        default=0.85,
        help="with --train: held-out accuracy whose first reaching (mean of every "
        "worker's latest) is timed (default 0.85)",
    )
    p.add_argument(
        "--pace",
        type=float,
        default=None,
        metavar="F",
        help="pace every data connection at F x its link's configured rate with TCP's own"
        " pacing (the workers' CREW_PACE; no fq needed), so HTB queues stay empty and flows"
        f" share a link as planned; 0 = unpaced (default {BENCH_PACE}, or CREW_PACE if set)."
        " The bench's links keep their rates, so the configured rate is the link's rate",
    )
    p.add_argument(
        "--host-cpu",
        type=float,
        default=0.0,
        metavar="S_PER_GB",
        help="give crew's route LP the host's CPU as one more capacity: S_PER_GB CPU seconds"
        " per GB of link bytes (a scheme's cpu_s_per_gb column; 12.2 for crew on"
        " bench-hetero) on all of this machine's cores (crew.plan.hostcpu). 0 = none"
        " (default)",
    )
    p.add_argument(
        "--no-plan-ahead",
        action="store_true",
        help="plan each trace group when it starts, on the coordinator's event loop, instead"
        " of on a background thread while the group before it runs (crew.runtime.planahead;"
        " the plans are the same, only the planning time moves onto the ops' critical path)",
    )
    p.add_argument(
        "--hop-backlog-bytes",
        type=int,
        default=RunConfig.default("hop_backlog_bytes"),
        metavar="B",
        help="bytes crew's route LP counts a part to wait behind at each hop, beside its own:"
        " the unsent bytes a busy connection holds (TCP_NOTSENT_LOWAT; default %(default)s)."
        " 0 counts the part alone, the model before it (for A/B runs)",
    )
    p.add_argument(
        "--part-bytes",
        type=int,
        default=0,
        metavar="B",
        help="bytes per part (frame payload), a multiple of 4; 0 (default): automatic",
    )
    p.add_argument(
        "--target-loss",
        type=float,
        default=2.0,
        help="with --train --workload lm: mean held-out loss (nats per byte) whose first "
        "reaching is timed (default 2.0)",
    )
    p.add_argument(
        "--configs",
        action="append",
        default=[],
        metavar="SCHEMES:SYNCS:COMPRESS",
        help="with --train: a matrix of training runs instead of one per --schemes entry, "
        "e.g. crew,preduce:every-step,diloco:none,int8 (every combination, in order); "
        "repeat for more. local-sgd and diloco take --local-steps, every-step H = 1",
    )
    add_training_args(p)
    add_allow_missing(p)
    p.add_argument("--log-level", default="WARNING", help="log level of the benchmark itself")
    p.add_argument("--sim", action="store_true", help="also print simulated / emulated per op")
    return p


def spec_from_args(args: argparse.Namespace) -> BenchSpec:
    """Validate the command line into a :class:`BenchSpec`; raises BenchError or TopologyError."""
    topo = load_topology(args.topology)
    schemes = parse_schemes(args.schemes)
    if not 2 <= args.p <= topo.n:
        raise BenchError(
            "--p", f"must be between 2 and n={topo.n} (workers in {topo.name!r}), got {args.p}"
        )
    if not (math.isfinite(args.size_mb) and args.size_mb > 0):
        raise BenchError("--size-mb", f"must be positive, got {args.size_mb}")
    size_elems = int(args.size_mb * MB) // 4
    if size_elems < 1:
        raise BenchError("--size-mb", f"must be at least 4 bytes, got {args.size_mb} MB")
    if args.ops < 0 or (args.ops == 0 and not args.train):
        raise BenchError("--ops", f"must be >= 1 (0 only with --train), got {args.ops}")
    if args.warmup < 0:
        raise BenchError("--warmup", f"must be >= 0, got {args.warmup}")
    if args.rounds < 1:
        raise BenchError("--rounds", f"must be >= 1, got {args.rounds}")
    if not (math.isfinite(args.timeout_per_op) and args.timeout_per_op > 0):
        raise BenchError("--timeout-per-op", f"must be positive, got {args.timeout_per_op}")
    if args.train and not (math.isfinite(args.duration) and args.duration > 0):
        raise BenchError("--duration", f"must be positive, got {args.duration}")
    pace = args.pace
    if pace is None:
        pace = float(os.environ.get("CREW_PACE") or BENCH_PACE)
    if not 0 <= pace <= 1:
        raise BenchError("--pace", f"must be a fraction in [0, 1], got {pace}")
    if not (math.isfinite(args.host_cpu) and args.host_cpu >= 0):
        raise BenchError("--host-cpu", f"must be a finite number >= 0, got {args.host_cpu}")
    if args.part_bytes < 0 or args.part_bytes % 4:
        raise BenchError(
            "--part-bytes", f"must be 0 or a positive multiple of 4, got {args.part_bytes}"
        )
    if args.hop_backlog_bytes < 0:
        raise BenchError(
            "--hop-backlog-bytes", f"must be an int >= 0, got {args.hop_backlog_bytes}"
        )
    if not 0 < args.target_accuracy <= 1:
        raise BenchError("--target-accuracy", f"must be in (0, 1], got {args.target_accuracy}")
    training: dict[str, Any] = {}
    runs: tuple[TrainRun, ...] = ()
    if args.configs:
        if not args.train:
            raise BenchError("--configs", "needs --train")
        runs = parse_train_configs(args.configs, args)
    else:
        try:
            for scheme in schemes:
                training = training_options(args, scheme=scheme, nonblocking=False)
        except ConfigError as exc:
            field_name, _, why = str(exc).partition(":")
            raise BenchError(f"--{field_name.replace('_', '-')}", why.strip()) from None
        runs = tuple(
            TrainRun(s, s, training_options(args, scheme=s, nonblocking=False)) for s in schemes
        )
    return BenchSpec(
        topology=topo,
        schemes=schemes,
        p=args.p,
        size_bytes=size_elems * 4,
        ops=args.ops,
        seed=args.seed,
        timeout_per_op_s=args.timeout_per_op,
        out=args.out,
        train=args.train,
        duration_s=args.duration,
        target_accuracy=args.target_accuracy,
        allow_missing=allowed_missing(args),
        part_bytes=args.part_bytes,
        pace=pace,
        host_cpu_s_per_gb=args.host_cpu,
        plan_ahead=not args.no_plan_ahead,
        hop_backlog_bytes=args.hop_backlog_bytes,
        training=training,
        target_loss=args.target_loss,
        train_runs=runs if args.train else (),
        warmup=args.warmup,
        rounds=args.rounds,
    )


def _prepare_out(spec: BenchSpec, overwrite: bool) -> None:
    """Make --out; refuse (or with --overwrite, delete) run folders of an earlier benchmark,
    since a run database is appended to, which would mix two benchmarks' ops."""
    folders = (
        [
            run_folder(spec.out, s, r, spec.rounds)
            for r in range(1, spec.rounds + 1)
            for s in spec.schemes
        ]
        if spec.ops
        else []
    )
    if spec.train:
        folders += [spec.out / "train" / r.name for r in spec.train_runs]
    existing = [f for f in folders if f.exists()]
    if existing and not overwrite:
        raise BenchError(
            "--out",
            f"{existing[0]} exists from an earlier benchmark; choose "
            f"another --out or pass --overwrite",
        )
    for f in existing:
        shutil.rmtree(f)
    spec.out.mkdir(parents=True, exist_ok=True)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
    )


def _record_rounds(
    results: dict[str, Any], schemes: Sequence[str], rounds: list[dict[str, Any]], total: int
) -> None:
    """Put the rounds run so far (of ``total``) into ``results``: a single round as ever
    (``schemes``); several: each round's results (``rounds``), their summary (``repeat``) and
    ``schemes`` pooled over them (``lab.report.benchrounds``)."""
    if total == 1:
        results["schemes"] = {s: rounds[0][s] for s in schemes if s in rounds[0]}
        return
    results["rounds"] = rounds
    results["repeat"] = round_summary(rounds)
    results["schemes"] = {
        s: pool_results([rnd[s] for rnd in rounds if s in rnd])
        for s in schemes
        if any(s in rnd for rnd in rounds)
    }


def run_benchmark(spec: BenchSpec) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Build one network, run every scheme on it (and train, if asked); write the JSON files.

    Returns (results, train results or None). The network is torn down whatever happens.
    """
    caps = check(spec.topology, spec.allow_missing)
    console.print(describe(caps, spec.topology))
    # The workers read it at start (crew.runtime.node.pace_fraction); they inherit this env.
    os.environ["CREW_PACE"] = repr(spec.pace)
    console.print(f"pacing: {f'{spec.pace:g} x each link rate' if spec.pace else 'off'}")
    if spec.host_cpu_s_per_gb:
        console.print(
            f"crew plans with the host CPU as a capacity: {spec.host_cpu_s_per_gb:g} CPU s/GB"
            f" on {os.cpu_count()} cores"
        )
    topo = spec.topology
    trace = make_trace(topo.n, spec.p, spec.ops, spec.seed)
    tag = secrets.token_hex(2)
    seen = set(other_labs(tag))
    started = time.time()
    results: dict[str, Any] = {
        "topology": topo.name,
        "n": topo.n,
        "p": spec.p,
        "size_bytes": spec.size_bytes,
        "ops": spec.ops,
        "warmup": spec.warmup,
        "round_count": spec.rounds,
        "seed": spec.seed,
        "trace": trace,
        "started_at": started,
        "wall_s": None,
        "lab_tag": tag,
        "pace": spec.pace,
        "host_cpu_s_per_gb": spec.host_cpu_s_per_gb,
        "hop_backlog_bytes": spec.hop_backlog_bytes,
        "other_labs_seen": sorted(seen),
        "schemes": {},
    }
    train: dict[str, Any] | None = None
    with LabNetwork(topo, tag=tag, capabilities=caps, mgmt_subnet=free_mgmt_subnet()) as net:
        with _progress() as progress:
            if spec.ops:
                rounds: list[dict[str, Any]] = []
                for r, order in enumerate(round_orders(spec.schemes, spec.rounds), 1):
                    rounds.append({})
                    for i, scheme in enumerate(order, 1):
                        res = run_ops(net, caps, spec, scheme, trace, progress, i, r)
                        seen |= set(other_labs(tag))
                        rounds[-1][scheme] = res.to_dict()
                        results["other_labs_seen"] = sorted(seen)
                        results["wall_s"] = time.time() - started
                        _record_rounds(results, spec.schemes, rounds, spec.rounds)
                        _write_json(spec.out / "results.json", results)
            if spec.train:
                train = {
                    "topology": topo.name,
                    "p": spec.p,
                    "seed": spec.seed,
                    "duration_s": spec.duration_s,
                    "target_accuracy": spec.target_accuracy,
                    "target_loss": spec.target_loss,
                    "schemes": {},
                }
                for i, run in enumerate(spec.train_runs, 1):
                    tr = run_training(net, caps, spec, run, progress, i)
                    seen |= set(other_labs(tag))
                    sch, sync, codec = run.label
                    train["schemes"][run.name] = tr.to_dict() | {
                        "config": {"scheme": sch, "sync_label": sync, "codec": codec} | run.training
                    }
                    train["other_labs_seen"] = sorted(seen)
                    _write_json(spec.out / "train.json", train)
    results["wall_s"] = time.time() - started
    results["other_labs_seen"] = sorted(seen)
    if spec.ops:
        _write_json(spec.out / "results.json", results)
    return results, train


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    try:
        spec = spec_from_args(args)
        _prepare_out(spec, args.overwrite)
    except (BenchError, TopologyError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return EXIT_BAD_INPUT
    # SIGTERM ends the benchmark as Ctrl-C does: through the context managers' cleanup.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        results, train = run_benchmark(spec)
    except PreflightError as exc:
        console.print(f"[red]{exc}[/red]")
        return EXIT_PREFLIGHT
    failed = False
    if spec.ops:
        title = (
            f"{results['topology']}: p={spec.p}, {spec.size_bytes / MB:g} MB, "
            f"{spec.ops} ops, seed {spec.seed} (wall {results['wall_s']:.0f} s)"
        )
        if spec.rounds > 1:
            title = f"{title}, pooled over {spec.rounds} rounds"
            console.print(rounds_table(results["repeat"], results["topology"], spec.rounds))
        console.print(results_table(results["schemes"], title, spec.ops * spec.rounds))
        for line in error_lines(results["schemes"]):
            console.print(f"[red]failed[/red] {line}", highlight=False)
        failed |= not all(r["correct"] for r in results["schemes"].values())
        for note in write_figures(build_figures(results), spec.out):
            console.print(note)
        console.print(f"results: {spec.out / 'results.json'}")
        if args.sim:  # the same trace, sizes and topology in crew.sim's network model
            from lab.report.simagree import bench_report

            console.print(bench_report(results, args.topology), highlight=False)
    if train is not None:
        console.print(train_table(train["schemes"], spec.target_accuracy))
        failed |= any(r["error"] for r in train["schemes"].values())
        console.print(f"training results: {spec.out / 'train.json'}")
        for note in write_figures(train_figures(train), spec.out, "train-plots.html"):
            console.print(note)
    if results["other_labs_seen"]:
        console.print(
            f"[yellow]note:[/yellow] other labs ran on this machine meanwhile "
            f"({', '.join(results['other_labs_seen'])}): timings are distorted"
        )
    return EXIT_SCHEME_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
