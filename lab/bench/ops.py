"""The op benchmark: one seeded trace of groups replayed by a scheme on the shared network,
and its results read back from the scheme's run database (docs/bench.md)."""

from __future__ import annotations

import json
import logging
import random
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
from rich.progress import Progress

from crew.cli_options import config_flag
from crew.control.verify import CHECK_TOLERANCE
from crew.plan import planner
from crew.plan.routes import Route, link_load
from crew.runtime.planahead import read_costs
from crew.runtime.rundb import GroupStatus, reading
from lab.bench.procs import (
    POLL_S,
    STARTUP_NUMPY_S,
    STARTUP_TORCH_S,
    SchemeFailed,
    check_alive,
    db_scalar,
    reap,
    workers_cpu_s,
)
from lab.bench.rawtcp import RawMoveError, per_op_link_bytes, raw_reference
from lab.bench.spec import GLOO, BenchError, BenchSpec, scheme_arm, secret_arm
from lab.net.mesh import LabNetwork
from lab.net.preflight import Capabilities
from lab.orchestrate.runner import LabRun, RunOptions
from lab.report.benchresults import SchemeResults
from lab.report.benchrounds import op_stats, percentile, run_folder

log = logging.getLogger(__name__)

FIRST_OP_STARTED_SQL = "SELECT COUNT(*) FROM groups WHERE started_at IS NOT NULL"
# After the last op, wait for the link monitor's next 1 Hz sample, so the ops are bracketed.
LAST_SAMPLE_WAIT_S = 3.0


def make_trace(n: int, p: int, ops: int, seed: int) -> list[list[int]]:
    """K = ``ops`` groups of ``p`` distinct workers of ``range(n)``, each sorted; deterministic."""
    if not 2 <= p <= n:
        raise BenchError(config_flag("p"), f"must be between 2 and n={n}, got {p}")
    if ops < 0:
        raise BenchError("--ops", f"must be >= 0, got {ops}")
    rng = random.Random(seed)
    return [sorted(rng.sample(range(n), p)) for _ in range(ops)]


@dataclass(frozen=True)
class SchemeResult:
    """One scheme's op benchmark: ``results.json``'s :class:`SchemeResults` (docs/bench.md)."""

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
    raw_s: float | None = None  # --raw-tcp: median time of one op's planned bytes, plain TCP
    raw_cpu_s_per_gb: float | None = None  # --raw-tcp: the raw move's CPU s per GB
    error: str | None = None

    def to_dict(self) -> SchemeResults:
        return cast(SchemeResults, asdict(self))

    @property
    def moved_link_bytes(self) -> dict[str, int]:
        """The bytes the scheme put on each link over its ops: its plans', or, for Gloo, which
        plans nothing, what the link counters saw while its ops ran."""
        return self.planned_link_bytes or self.link_bytes


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
    with reading(db_path) as conn:
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


def ops_options(spec: BenchSpec, label: str, replay: list[list[int]], warm: int) -> RunOptions:
    """The lab run that replays ``replay`` (``warm`` untimed groups first) for the scheme
    ``label`` names, encrypted when the label or the benchmark asks, with the secret result
    check when the label asks."""
    base, encrypted = scheme_arm(label)
    return RunOptions(
        scheme=base,
        p=spec.p,
        seed=spec.seed,
        dashboard=False,
        log_level="WARNING",
        part_bytes=spec.part_bytes,
        host_cpu_s_per_gb=spec.host_cpu_s_per_gb,
        host_cores=spec.host_cores,
        plan_ahead=spec.plan_ahead,
        hop_backlog_bytes=spec.hop_backlog_bytes,
        encrypt=spec.encrypt or encrypted,
        check="secret" if secret_arm(label) else "public",
        extra={
            "bench": True,
            "size_elems": spec.size_elems,
            "trace": replay,
            "ops": len(replay),
            # groups 1..warm are untimed (lab.studies.planbench's replay skips them)
            "warmup": warm,
        },
    )


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
    gloo = scheme_arm(scheme)[0] == GLOO
    run_dir = run_folder(spec.out, scheme, round_no, spec.rounds)
    k = spec.ops
    warm = 0 if gloo else spec.warmup
    replay = [list(range(spec.topology.n))] * warm + trace
    label = f"{index}/{len(spec.schemes)} {scheme}"
    if spec.rounds > 1:
        label = f"round {round_no}/{spec.rounds}: {label}"
    task = progress.add_task(label, total=k, status="starting")
    opts = ops_options(spec, scheme, replay, warm)
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
                check_alive(lab)
                ended = int(
                    db_scalar(
                        lab,
                        "SELECT COUNT(*) FROM groups WHERE status IN"
                        f" ('{GroupStatus.COMPLETED}', '{GroupStatus.ABANDONED}')",
                    )
                    or 0
                )
                progress.update(task, completed=max(0, ended - warm))
                if cpu_first is None and db_scalar(lab, f"{FIRST_OP_STARTED_SQL} AND id > {warm}"):
                    cpu_first = workers_cpu_s(lab)
                if ended < k + warm:
                    time.sleep(POLL_S)
            if cpu_first is not None:
                cpu_used = workers_cpu_s(lab) - cpu_first
            last_end = float(db_scalar(lab, "SELECT MAX(ended_at) FROM groups") or 0.0)
            wait_until = time.monotonic() + LAST_SAMPLE_WAIT_S
            while time.monotonic() < wait_until:
                if float(db_scalar(lab, "SELECT MAX(t) FROM link_samples") or 0.0) >= last_end:
                    break
                time.sleep(0.2)
            progress.update(task, status="stopping")
    except SchemeFailed as exc:
        error = str(exc)
    except Exception as exc:  # a scheme that cannot even start must not stop the benchmark
        log.exception("scheme %s failed", scheme)
        error = f"{type(exc).__name__}: {exc}"
    finally:
        reap(lab)
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
    if cpu_used is not None and result.completed > int(gloo):
        moved_gb = sum(result.moved_link_bytes.values()) / 1e9
        if gloo:
            # Gloo's rank 0 records an op when it ends, so its CPU is counted from the end of
            # the first op (after torch's import): the bytes of the others.
            moved_gb *= (result.completed - 1) / result.completed
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
    if spec.raw_tcp and result.moved_link_bytes and result.completed:
        progress.update(task, status="raw TCP")
        try:
            raw_s, raw_cpu = raw_reference(
                net, per_op_link_bytes(result.moved_link_bytes, result.completed)
            )
            result = replace(result, raw_s=raw_s, raw_cpu_s_per_gb=raw_cpu)
        except (RawMoveError, OSError, subprocess.TimeoutExpired) as exc:
            log.warning("%s: raw TCP reference failed: %s", scheme, exc)
    progress.update(task, status="[green]ok" if result.correct else "[red]FAILED")
    return result
