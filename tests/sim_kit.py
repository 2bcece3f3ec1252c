"""Topologies the simulator's tests share (imported as ``sim_kit``; not collected)."""

from __future__ import annotations

import numpy as np

from crew.sim.topogen import SimTopology

ONE_SECOND = "4@1:1"  # profile 4 squeezed onto [1, 1]: every iteration takes exactly 1 s


def uniform(n: int, mbit: float = 8.0) -> SimTopology:
    """``n`` workers, every directed link at ``mbit``, no delay, every step exactly 1 s."""
    rate = np.full((n, n), mbit)
    np.fill_diagonal(rate, 0.0)
    return SimTopology(
        name=f"uniform-{n}",
        names=tuple(f"w{i}" for i in range(n)),
        clouds=tuple(f"c{i}" for i in range(n)),
        rate_mbit=rate,
        delay_ms=np.zeros((n, n)),
        stragglers=(ONE_SECOND,) * n,
    )
