"""A RunConfig for one process's workers on loopback, for tests that build a Worker without a
coordinator (it is never contacted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crew.config import RunConfig


def loopback_config(tmp_path: Path, n: int, **fields: Any) -> RunConfig:
    """n workers at 127.0.0.1 with 1 Mbit/s between each pair, p = 2, crew; ``fields`` add to
    or replace these."""
    settings: dict[str, Any] = {
        "run_id": "test",
        "run_num": 1,
        "run_dir": str(tmp_path),
        "secret_path": str(tmp_path / "secret"),
        "n": n,
        "p": 2,
        "scheme": "crew",
        "coordinator_host": "127.0.0.1",
        "coordinator_port": 1,
        "data_port": 1,
        "identities": ("127.0.0.1",) * n,
        "bw_mbit": tuple(tuple(0.0 if i == j else 1.0 for j in range(n)) for i in range(n)),
    }
    return RunConfig(**(settings | fields))
