"""The training benchmark (``--train``): a normal lab run per configuration on the shared
network, and its figures read back from the run database (docs/bench.md)."""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.progress import Progress

from crew.config import Scheme
from crew.runtime.rundb import GroupStatus, latest_utilisation, reading
from lab.bench.procs import (
    POLL_S,
    STARTUP_TORCH_S,
    SchemeFailed,
    check_alive,
    db_scalar,
    reap,
)
from lab.bench.spec import BenchSpec, TrainRun
from lab.net.mesh import LabNetwork
from lab.net.preflight import Capabilities
from lab.orchestrate.runner import LabRun, RunOptions
from lab.orchestrate.summary import cpu_share

log = logging.getLogger(__name__)


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
    # mean over workers of compute ÷ wall time (crew.control.utilisation), at the run's end
    compute_utilisation: float | None = None
    # the lab's CPU seconds ÷ (wall time × cores) over the whole run (lab.orchestrate.summary)
    cpu_share: float | None = None
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
    with reading(db_path) as conn:
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
        shares = [r.split.utilisation for r in latest_utilisation(conn, end).values()]
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
            compute_utilisation=sum(shares) / len(shares) if shares else None,
            cpu_share=cpu_share(meta),
            curve=curve,
        )


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
        p=spec.p if run.p is None else run.p,
        seed=spec.seed,
        dashboard=False,
        log_level="WARNING",
        encrypt=spec.encrypt,
        **run.training,
    )
    error: str | None = None
    ended_at: float | None = None
    lab = LabRun(spec.topology, caps, opts, run_dir, net=net)
    try:
        with lab:
            deadline = time.monotonic() + STARTUP_TORCH_S
            while not db_scalar(lab, "SELECT COUNT(*) FROM iterations"):
                if time.monotonic() > deadline:
                    raise SchemeFailed(f"no iteration within {STARTUP_TORCH_S:.0f} s of start")
                check_alive(lab)
                time.sleep(POLL_S)
            progress.update(task, status="training")
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < spec.duration_s:
                check_alive(lab)
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
        reap(lab)
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
