"""What the group life cycle asks of a group former, and which former a run gets.

A former decides who averages with whom and keeps the workers' liveness; the life cycle
(``crew.control.lifecycle``) plans, runs and records the groups it forms. Two kinds:

* :class:`~crew.control.grouping.GroupFormer`: groups form from the workers' readiness (FIFO,
  isolation guard, deferral, staleness weights);
* :class:`~crew.control.traceformer.TraceFormer`: a benchmark's fixed trace of groups, one at a
  time (a :class:`FixedFormer`: its next group is known in advance).

Both satisfy :class:`Former`. :func:`former_for` builds the one a run's config asks for: the
trace's former when ``cfg.extra["trace"]`` holds one (``lab.bench``), else a ``GroupFormer``
(with the quorum rule of ``crew.control.quorum`` when ``cfg.quorum_min`` is set).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from crew.config import RunConfig
from crew.control.grouping import Group, GroupFormer, WorkerState
from crew.control.quorum import QuorumRule
from crew.control.traceformer import TraceFormer


class Former(Protocol):
    """The calls the life cycle makes on a former (``GroupFormer``'s interface); each has
    ``GroupFormer``'s contract."""

    defer_max_wait: float

    @property
    def deferred(self) -> frozenset[int]: ...

    def set_deferred(self, workers: Iterable[int]) -> None: ...

    def set_p(self, p: int) -> None: ...

    def continue_ids_after(self, last_id: int) -> None: ...

    def join(self, worker: int, now: float) -> None: ...

    def ready(self, worker: int, iteration: int, now: float) -> list[Group]: ...

    def heartbeat(self, worker: int, now: float) -> None: ...

    def expire(self, now: float) -> list[int]: ...

    def excuse(self, seconds: float, now: float) -> None: ...

    def mark_dead(self, worker: int, now: float) -> None: ...

    def form(self, now: float) -> list[Group]: ...

    def complete(self, group_id: int, now: float) -> Group: ...

    def abandon(self, group_id: int, now: float) -> Group: ...

    def drop_member(self, group_id: int, worker: int) -> Group: ...

    def state(self, worker: int) -> WorkerState: ...

    def alive(self) -> set[int]: ...


@runtime_checkable
class FixedFormer(Former, Protocol):
    """A former whose groups are given in advance (a benchmark's trace): a ``Ready`` is the
    offer of a fixed vector, not readiness for a group, and the group after the open one is
    known before it forms."""

    def upcoming(self) -> tuple[int, ...] | None:
        """The members of the group that forms once the open one has ended; None if none."""
        ...


def former_for(cfg: RunConfig) -> Former:
    """The former ``cfg`` asks for: its trace's (``cfg.extra["trace"]``, a list of groups of
    worker ids) or a readiness-driven ``GroupFormer``; either keeps liveness with
    ``cfg.heartbeat_timeout_s``."""
    quorum = None
    if cfg.quorum_min:
        quorum = QuorumRule(cfg.quorum_min, cfg.quorum_max or cfg.n)
    live = GroupFormer(
        cfg.n,
        cfg.p,
        heartbeat_timeout=cfg.heartbeat_timeout_s,
        staleness=cfg.staleness,
        quorum=quorum,
    )
    trace = cfg.extra.get("trace")
    return live if trace is None else TraceFormer(trace, live)
