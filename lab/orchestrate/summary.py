"""A finished (or running) lab run's headline figures, read from its database alone: what
``lab.run`` prints at the end and writes with ``--json``, and what the soak and the tests read.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crew.runtime.rundb import GroupStatus, UtilisationRow, WorkerState, latest_utilisation
from lab.orchestrate.hostbusy import training_load
from lab.orchestrate.runner import TRAINING_FIELDS


def utilisation_summary(shares: Mapping[int, UtilisationRow]) -> dict[str, Any]:
    """Compute utilisation in a summary: the mean over workers of compute ÷ wall time, each
    worker's split (``crew.control.utilisation``) and its WAN bytes per second of compute."""
    per_worker = {}
    for w, r in shares.items():
        split = r.split
        per_worker[str(w)] = {
            "utilisation": round(split.utilisation, 4),
            "compute_s": round(r.compute_s, 3),
            "ready_s": round(r.ready_s, 3),
            "group_s": round(r.group_s, 3),
            "stalled_s": round(r.stalled_s, 3),
            "wan_bytes_per_compute_s": round(r.wan_bytes / r.compute_s) if r.compute_s else None,
        }
    values = [v["utilisation"] for v in per_worker.values()]
    return {
        "compute_utilisation": round(sum(values) / len(values), 4) if values else None,
        "utilisation_per_worker": per_worker,
    }


def cpu_share(meta: Mapping[str, str]) -> float | None:
    """The lab's CPU seconds over the run ÷ (its wall time × the host's cores), from the run's
    ``meta``; None for a run that has not ended (no ``lab_cpu_s`` yet)."""
    if "lab_cpu_s" not in meta:
        return None
    started = float(meta.get("started_at", "0"))
    ended = float(meta.get("ended_at", str(time.time())))
    cores = int(meta.get("cores", "1"))
    return round(float(meta["lab_cpu_s"]) / (max(ended - started, 1e-9) * cores), 3)


def summarize(db_path: Path) -> dict[str, Any]:
    """The run's headline figures, from its database alone."""
    from crew.runtime.rundb import reading

    with reading(db_path) as conn:
        meta = {r["key"]: r["value"] for r in conn.execute("SELECT key, value FROM meta")}
        n = int(meta.get("n", "0"))
        groups = conn.execute(
            "SELECT id, members, status, started_at, ended_at, predicted_s, bound_s FROM groups"
        ).fetchall()
        completed = [g for g in groups if g["status"] == GroupStatus.COMPLETED]
        rounds = {str(i): 0 for i in range(n)}
        for g in completed:
            for m in json.loads(g["members"]):
                rounds[str(m)] = rounds.get(str(m), 0) + 1
        durations = sorted(g["ended_at"] - g["started_at"] for g in completed if g["started_at"])
        ratios = sorted(
            (g["ended_at"] - g["started_at"]) / g["bound_s"] for g in completed if g["bound_s"]
        )
        acc = {}
        eval_loss = {}  # lm: evaluation rows carry the held-out loss (crew.runtime.worker)
        for r in conn.execute(
            "SELECT worker, accuracy, loss FROM iterations i1 WHERE accuracy IS NOT NULL AND t = ("
            " SELECT MAX(t) FROM iterations i2 WHERE i2.worker = i1.worker"
            " AND i2.accuracy IS NOT NULL)"
        ):
            acc[str(r["worker"])] = r["accuracy"]
            eval_loss[str(r["worker"])] = r["loss"]
        options = json.loads(meta.get("options", "{}"))
        training = {k: options[k] for k in TRAINING_FIELDS if k in options}
        verify = conn.execute(
            "SELECT MAX(verify_err) AS worst FROM groups WHERE status = ?",
            (GroupStatus.COMPLETED,),
        ).fetchone()
        link_bytes = {}
        for r in conn.execute(
            "SELECT src, dst, MAX(tx_bytes) - MIN(tx_bytes) AS b FROM link_samples"
            " GROUP BY src, dst"
        ):
            link_bytes[f"{r['src']}->{r['dst']}"] = int(r["b"] or 0)
        started = float(meta.get("started_at", "0"))
        ended = float(meta.get("ended_at", str(time.time())))
        minutes = max((ended - started) / 60.0, 1e-9)
        shares = latest_utilisation(conn)
        # The last worker's first "ready": the network built, every worker started, its data
        # loaded and its first step taken.
        ready_workers, first_ready = conn.execute(
            "SELECT COUNT(*), MAX(t) FROM (SELECT MIN(t) AS t FROM worker_states"
            " WHERE state = ? GROUP BY worker)",
            (WorkerState.READY.value,),
        ).fetchone()
        cpu_s = float(meta["lab_cpu_s"]) if "lab_cpu_s" in meta else None
        load = training_load(conn)
        per_gb = None if load is None else load.cpu_s_per_link_gb
        formed_by: dict[str, int] = {}  # the quorum rule's reasons (crew.control.quorum)
        with contextlib.suppress(sqlite3.OperationalError):  # older databases lack the column
            for r in conn.execute(
                "SELECT formed_by, COUNT(*) FROM groups WHERE formed_by IS NOT NULL"
                " GROUP BY formed_by"
            ):
                formed_by[r[0]] = r[1]
        return {
            "run_id": meta.get("run_id"),
            "scheme": meta.get("scheme"),
            "p": int(meta.get("p", "0")),
            "duration_s": round(ended - started, 1),
            "groups_completed": len(completed),
            "groups_abandoned": sum(1 for g in groups if g["status"] == GroupStatus.ABANDONED),
            "group_sizes": [len(json.loads(g["members"])) for g in completed],
            "groups_formed_by": formed_by,
            "rounds_per_worker": rounds,
            "rounds_per_worker_per_min": {k: round(v / minutes, 2) for k, v in rounds.items()},
            "median_group_s": durations[len(durations) // 2] if durations else None,
            "median_over_bound": ratios[len(ratios) // 2] if ratios else None,
            "final_accuracy": (sum(acc.values()) / len(acc)) if acc else None,
            "accuracy_per_worker": acc,
            **training,
            "final_heldout_loss": (
                sum(eval_loss.values()) / len(eval_loss)
                if eval_loss and training.get("workload") == "lm"
                else None
            ),
            "max_verify_err": verify["worst"] if verify else None,
            **utilisation_summary(shares),
            "startup_s": (
                round(first_ready - started, 2) if first_ready and ready_workers == n else None
            ),
            "lab_cpu_s": cpu_s,
            "cpu_share": cpu_share(meta),
            # The whole host, kernel included, from every worker's first Ready to the stop.
            "host_busy_share": None if load is None else round(load.busy.share, 3),
            "host_cpu_s_per_link_gb": None if per_gb is None else round(per_gb, 1),
            "link_bytes_total": sum(link_bytes.values()),
            "link_bytes": link_bytes,
            "db": str(db_path),
        }
