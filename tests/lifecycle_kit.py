"""Shared helpers for driving crew.control.lifecycle in unit tests."""

from __future__ import annotations

from typing import Any

from crew.config import RunConfig
from crew.control import lifecycle as lc
from crew.wire import protocol as proto

SIZE = 1 << 20  # elements of every worker's vector: 4 MB, so that parts are small against it


def make_cfg(n: int = 4, p: int = 2, bw: list[list[float]] | None = None, **kw: Any) -> RunConfig:
    if bw is None:
        bw = [[0.0 if i == j else 100.0 for j in range(n)] for i in range(n)]
    kw.setdefault("scheme", "crew")
    return RunConfig.in_process(n, p, bw, run_id="t", run_num=7, **kw)


def report_all(life: lc.GroupLifecycle, gid: int, now: float) -> list[lc.Output]:
    """Every member reports the exact weighted average of the offered projections."""
    og = life.open[gid]
    expected = sum(w * life.offered_proj[m] for m, w in zip(og.members, og.weights, strict=True))
    outs: list[lc.Output] = []
    for m in og.members:
        outs += life.handle(proto.HaveAll(m, gid, og.rev, 0, expected), now)
    return outs


def started(cfg: RunConfig | None = None, **kw: Any) -> lc.GroupLifecycle:
    """A life cycle with every worker of ``cfg`` registered at t = 0."""
    cfg = cfg or make_cfg()
    life = lc.GroupLifecycle(cfg, **kw)
    for w in range(cfg.n):
        life.handle(proto.Register(w, 100 + w, 0, SIZE), 0.0)
    return life
