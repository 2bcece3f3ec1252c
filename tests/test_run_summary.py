"""lab.orchestrate.summary: a run's start-up time and CPU share, read from its database."""

from __future__ import annotations

from pathlib import Path

from crew.runtime import rundb
from lab.orchestrate.runner import lab_cpu_s
from lab.orchestrate.summary import summarize

START = 1_000.0


def _run(path: Path, *, ready_at: dict[int, list[float]], n: int, meta: dict) -> None:
    db = rundb.RunDB(path)
    try:
        db.set_meta({"n": str(n), "started_at": str(START), **meta})
        for worker, times in ready_at.items():
            for t in times:
                db.set_worker_status(worker, rundb.WorkerState.TRAINING.value, t=t - 0.5)
                db.set_worker_status(worker, rundb.WorkerState.READY.value, t=t)
    finally:
        db.close()


def test_start_up_is_the_last_workers_first_ready_and_cpu_share_counts_every_core(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lab.db"
    # Worker 1 is the last to be ready the first time (at +7.5 s); later readies do not count.
    _run(
        path,
        ready_at={0: [START + 3.0, START + 20.0], 1: [START + 7.5, START + 9.0]},
        n=2,
        meta={"ended_at": str(START + 100.0), "lab_cpu_s": "150.0", "cores": "2"},
    )
    summary = summarize(path)
    assert summary["startup_s"] == 7.5
    assert summary["lab_cpu_s"] == 150.0
    assert summary["cpu_share"] == 0.75  # 150 CPU s over 100 s on 2 cores


def test_a_worker_never_ready_leaves_start_up_unknown(tmp_path: Path) -> None:
    path = tmp_path / "lab.db"
    _run(path, ready_at={0: [START + 3.0]}, n=2, meta={"ended_at": str(START + 10.0)})
    summary = summarize(path)
    assert summary["startup_s"] is None
    assert summary["cpu_share"] is None  # a run still going, or from before CPU was recorded


def test_lab_cpu_counts_this_process_and_its_waited_children() -> None:
    import subprocess
    import sys

    before = lab_cpu_s()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert lab_cpu_s() - before >= 0.3
