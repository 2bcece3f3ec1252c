"""A torch worker's iteration: its padding spread over its local steps, and the hook between
them where an overlapped round's result is applied (no sockets, no root)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from config_kit import loopback_config

pytest.importorskip("torch")
from crew.runtime.worker import Worker  # noqa: E402  (after the importorskip guard)


def _worker(tmp_path: Path, *, local_steps: int, floor_s: float) -> Worker:
    cfg = loopback_config(
        tmp_path,
        2,
        workload="mlp",
        sync="local-sgd",
        local_steps=local_steps,
        min_iteration_s=floor_s,
    )
    return Worker(cfg, 0)


def test_an_iterations_steps_are_paced_and_the_hook_runs_between_them(tmp_path: Path) -> None:
    worker = _worker(tmp_path, local_steps=4, floor_s=0.8)
    calls: list[float] = []
    started = time.perf_counter()
    worker._local_iteration(0.0, lambda: calls.append(time.perf_counter() - started))
    took = time.perf_counter() - started
    assert len(calls) == 4
    # Step k ends no sooner than k/4 of the 0.8 s: the hook after step k runs after the sleep
    # of step k - 1, so at least (k - 1) * 0.2 s in. Padded only at the end, every call would
    # come in the first few milliseconds.
    for k, at in enumerate(calls, start=1):
        assert at >= (k - 1) * 0.2 - 0.01, calls
    assert took >= 0.8 - 0.01
    assert worker.trainer is not None and worker.trainer.iteration == 1
