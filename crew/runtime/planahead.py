"""Planning ahead: make a group's plan on a background thread before the group forms.

The life cycle (``crew.control.lifecycle``) plans a group when it forms, on the event loop,
so the planner's time is on the group's critical path: the Assign goes out only after it
(tens of milliseconds for crew's route LP at n = 8, against ops of a few hundred). When the
next group is known in advance (a ``lab.bench`` trace runs its groups one after another), the
life cycle says so with a :class:`~crew.control.lifecycle.PlanAhead` output, and
:class:`AheadPlanner` makes that call on its one thread while the current group runs.

:class:`AheadPlanner` is also the life cycle's plan function. A call whose key
(``crew.plan.plancall.PlanCall.key``: every input, exact to the bit) matches one made ahead
takes that result, waiting for it if it is still being made; any other call is made at once,
on the caller's thread, as without planning ahead. So a plan never differs from the one the
group would have got: if the rates, the active set or anything else changed meanwhile, the
keys differ and the group is planned as before. A planner error made ahead is raised to the
caller as it would have been. Results not asked for are dropped (at most ``KEEP`` are held).

What each call cost the caller is kept (:meth:`AheadPlanner.drain`): the coordinator records
it per group, and ``lab.bench`` reports the planning time on the critical path.

Cost: the ahead call's CPU, on the coordinator's process. Its thread shares the interpreter
lock with the event loop, so a message that arrives while it plans can wait up to one switch
interval (5 ms) longer; the plan is made at the start of the current group, while the event
loop is idle waiting for that group's members.
"""

from __future__ import annotations

import enum
import json
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from crew.config import Scheme
from crew.plan.plancall import PlanCall
from crew.plan.schemes import GroupPlan

KEEP = 4
"""Calls made ahead and not asked for yet that are kept (the oldest are dropped)."""
PLAN_COSTS_META = "plan_costs"
"""The run database's meta key for each group's planning cost (:func:`costs_json`)."""
PLAN_COSTS_KEEP = 10_000
"""Groups a :class:`CostRecord` keeps."""


class PlanSource(enum.Enum):
    AHEAD = "ahead"  # made ahead and finished when asked for
    WAITED = "waited"  # made ahead, still running when asked for: the caller waited for it
    INLINE = "inline"  # not made ahead (or its inputs changed): planned on the caller's thread

    @property
    def made_ahead(self) -> bool:
        return self is not PlanSource.INLINE


@dataclass(frozen=True)
class PlanCost:
    """One plan the life cycle asked for: its group's members, where it came from, and the
    seconds the caller was blocked (the planning time on the critical path)."""

    members: tuple[int, ...]
    source: PlanSource
    blocked_s: float


class AheadPlanner:
    """A plan function (``plan(scheme, bw, members, size, **keywords)``) that can be fed calls
    ahead; see the module docstring."""

    def __init__(self, plan: Callable[..., GroupPlan]) -> None:
        self._plan = plan
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plan-ahead")
        self._ahead: OrderedDict[Hashable, Future[GroupPlan]] = OrderedDict()
        self._lock = threading.Lock()  # _ahead and _costs: the event loop and tests call in
        self._costs: list[PlanCost] = []
        self._closed = False

    def submit(self, call: PlanCall) -> None:
        """Make ``call`` on the background thread (once per key)."""
        key = call.key()
        with self._lock:
            if self._closed or key in self._ahead:
                return
            self._ahead[key] = self._pool.submit(call.run, self._plan)
            while len(self._ahead) > KEEP:
                _, old = self._ahead.popitem(last=False)
                old.cancel()  # not started yet: never will; running: its result is dropped

    def __call__(
        self, scheme: Scheme, bw: Any, members: Any, size: int, **keywords: Any
    ) -> GroupPlan:
        call = PlanCall.of(scheme, bw, members, size, **keywords)
        key = call.key()
        t0 = time.perf_counter()
        with self._lock:
            fut = self._ahead.pop(key, None)
        if fut is not None:  # only popped futures are ever cancelled
            source = PlanSource.AHEAD if fut.done() else PlanSource.WAITED
            try:
                return fut.result()
            finally:
                self._cost(call.members, source, time.perf_counter() - t0)
        try:
            return call.run(self._plan)
        finally:
            self._cost(call.members, PlanSource.INLINE, time.perf_counter() - t0)

    def _cost(self, members: tuple[int, ...], source: PlanSource, blocked_s: float) -> None:
        with self._lock:
            self._costs.append(PlanCost(members, source, blocked_s))

    def drain(self) -> list[PlanCost]:
        """The calls answered since the last drain, oldest first."""
        with self._lock:
            out, self._costs = self._costs, []
        return out

    def close(self) -> None:
        """Stop taking calls ahead; a plan being made is left to finish (it is bounded by the
        planner's own time budget), queued ones are dropped."""
        with self._lock:
            self._closed = True
            pending = list(self._ahead.values())
            self._ahead.clear()
        for fut in pending:
            fut.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


class CostRecord:
    """Each group's first plan cost, for the newest ``keep`` groups (oldest dropped first): a
    benchmark's trace has tens of groups, and a week-long run must not hold millions."""

    def __init__(self, keep: int = PLAN_COSTS_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self.costs: OrderedDict[int, PlanCost] = OrderedDict()

    def add(self, group_id: int, cost: PlanCost) -> None:
        self.costs[group_id] = cost
        while len(self.costs) > self.keep:
            self.costs.popitem(last=False)


def costs_json(costs: Mapping[int, PlanCost]) -> str:
    """``{group id: {"source": ahead|waited|inline, "blocked_ms": ...}}`` of each group's
    first plan: the coordinator writes it at ``PLAN_COSTS_META`` when it stops."""
    return json.dumps(
        {
            str(gid): {"source": c.source.value, "blocked_ms": round(1e3 * c.blocked_s, 3)}
            for gid, c in sorted(costs.items())
        }
    )


def read_costs(conn: sqlite3.Connection) -> dict[int, tuple[PlanSource, float]]:
    """:func:`costs_json`'s record in a run database: group id -> (where its plan came from,
    ms the event loop waited for it); {} for none (a run from before planning ahead, or whose
    coordinator did not stop cleanly)."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (PLAN_COSTS_META,)).fetchone()
    if row is None or not row[0]:
        return {}
    text = row[0]
    return {
        int(gid): (PlanSource(c["source"]), float(c["blocked_ms"]))
        for gid, c in json.loads(text).items()
    }
