"""The seam between the simulator and the group life cycle: events in, decisions out.

The lab's coordinator (``crew/coordinator.py``) runs a group's life cycle on real sockets.
The simulator needs the same decisions in simulated time, so it talks to one small class,
:class:`SimLifecycle`, and nothing else: the engine feeds it events (a worker ready, a group's
data all delivered, a link cut, a worker lost, a clock tick) and carries out what it returns
(:class:`Assign`, :class:`Commit`, :class:`Abandon`, :class:`Note`).

It is built from the real parts: ``crew.grouping.GroupFormer`` (FIFO queue, several groups in
flight, staleness, isolation guard), ``crew.schemes.plan_group`` (every scheme's routes),
``crew.planner.residual_capacity`` and ``crew.planner.lower_bound``, and the coordinator's own
constants for revisions and deadlines. The glue is kept to what the coordinator does:

* a formed group is planned on the capacity left by the groups in flight (each assumed
  ``elapsed / predicted`` done, as the coordinator estimates), with the failed links at 0;
* a member lost: the survivors get a new revision planned without it (no survivor: abandon);
  an aggregator lost or a used link cut: a new revision on what is left;
* a revision not done by ``max(group_timeout_min_s, DEADLINE_FACTOR x predicted)`` is revised,
  and after ``MAX_REVISIONS`` or when no plan exists the group is abandoned.

When the pure life cycle being split out of the coordinator lands, this class becomes a thin
adapter over it (same events in, same decisions out) and the engine does not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from crew import planner
from crew.grouping import Group, GroupFormer
from crew.lifecycle import DEADLINE_FACTOR, MAX_REVISIONS
from crew.schemes import GroupPlan, plan_group


@dataclass(frozen=True)
class Assign:
    """Start revision ``rev`` of group ``group`` with ``plan`` (replacing any older one)."""

    group: Group
    rev: int
    plan: GroupPlan
    bound_s: float
    deadline: float
    why: str = ""


@dataclass(frozen=True)
class Commit:
    group: Group  # as it stands at the end (dropped members removed)
    rev: int
    bytes_moved: int


@dataclass(frozen=True)
class Abandon:
    group: Group
    rev: int
    reason: str
    bytes_moved: int
    plan: GroupPlan | None


@dataclass(frozen=True)
class Note:
    """An event for the run's log."""

    kind: str
    message: str
    level: str = "info"
    worker: int | None = None


Decision = Assign | Commit | Abandon | Note


@dataclass
class _Open:
    group: Group
    rev: int
    plan: GroupPlan
    started: float
    deadline: float
    bytes_moved: int


class SimLifecycle:
    """Group life cycle for the simulator; see the module docstring."""

    def __init__(
        self,
        n: int,
        p: int,
        scheme: str,
        size_bytes: int,
        bw_mbit: np.ndarray,
        *,
        seed: int = 0,
        staleness: bool = False,
        committed_capacity: bool = True,
        group_timeout_min_s: float = 30.0,
        isolation_max_wait: float = 10.0,
    ) -> None:
        self.former = GroupFormer(n, p, staleness=staleness, isolation_max_wait=isolation_max_wait)
        self.scheme = scheme
        self.size = int(size_bytes)
        bw = np.array(bw_mbit, dtype=float)
        np.fill_diagonal(bw, np.inf)
        self.bw = bw  # what the planner knows: configured rates, failed links at 0
        self.seed = seed
        self.committed_capacity = committed_capacity
        self.group_timeout_min_s = group_timeout_min_s
        self.open: dict[int, _Open] = {}
        self.plan_seconds: list[float] = []  # wall time of each plan_group call (for scale)

    # ---- events in ------------------------------------------------------------------------

    def join(self, worker: int, now: float) -> None:
        self.former.join(worker, now)

    def ready(self, worker: int, iteration: int, now: float) -> list[Decision]:
        out: list[Decision] = []
        for g in self.former.ready(worker, iteration, now):
            out += self._start(g, now)
        return out

    def delivered(self, gid: int, now: float) -> list[Decision]:
        """Every member holds the result of the current revision (all HaveAll in)."""
        og = self.open.pop(gid)
        g = self.former.complete(gid, now)
        return [Commit(g, og.rev, og.bytes_moved)]

    def link_failed(self, src: int, dst: int, now: float, uses) -> list[Decision]:  # noqa: ANN001
        """Link src -> dst is gone for good; ``uses(gid, src, dst)`` says whether an open
        group's transfer still needs it."""
        out: list[Decision] = []
        if self.bw[src, dst] > 0:
            self.bw[src, dst] = 0.0
            out.append(Note("fault", f"link {src}->{dst} failed", "warning"))
        for gid in sorted(self.open):
            if uses(gid, src, dst):
                out += self._revise(self.open[gid], now, f"link {src}->{dst} failed")
        return out

    def worker_lost(self, worker: int, now: float) -> list[Decision]:
        self.former.mark_dead(worker, now)
        out: list[Decision] = [Note("fault", f"worker {worker} lost", "warning", worker)]
        for gid in sorted(self.open):
            og = self.open[gid]
            if worker in og.group.members:
                if og.group.size == 1:
                    out.append(self._abandon(og, now, f"worker {worker} lost"))
                    continue
                og.group = self.former.drop_member(gid, worker)
                out += self._revise(og, now, f"member {worker} lost")
            elif worker in og.plan.participants():
                out += self._revise(og, now, f"aggregator {worker} lost")
        for g in self.former.form(now):  # fewer live workers may lower p_eff
            out += self._start(g, now)
        return out

    def tick(self, now: float) -> list[Decision]:
        """Deadlines, and groups the isolation guard held back."""
        out: list[Decision] = []
        for gid in sorted(self.open):
            og = self.open.get(gid)
            if og is not None and now > og.deadline:
                out += self._revise(og, now, f"revision {og.rev} missed its deadline")
        for g in self.former.form(now):
            out += self._start(g, now)
        return out

    def stop(self, now: float) -> list[Decision]:
        return [self._abandon(og, now, "run stopped") for og in list(self.open.values())]

    # ---- queries --------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        return min((og.deadline for og in self.open.values()), default=None)

    def alive(self) -> list[int]:
        return sorted(self.former.alive())

    # ---- internals ------------------------------------------------------------------------

    def _planning_bw(self, now: float) -> np.ndarray:
        """The coordinator's estimate of what groups in flight still send (see
        ``Coordinator._planning_bw``): each is ``elapsed / predicted`` done."""
        if not self.committed_capacity or not self.open:
            return self.bw
        committed = np.zeros_like(self.bw)
        horizon = 0.0
        for og in self.open.values():
            predicted = max(og.plan.predicted_s, 1e-3)
            left = max(0.0, 1.0 - (now - og.started) / predicted)
            committed += og.plan.link_bytes() * left
            horizon = max(horizon, predicted * left)
        if horizon <= 0.0:
            return self.bw
        return planner.residual_capacity(self.bw, committed, horizon)

    def _plan(self, members: Sequence[int], now: float) -> tuple[GroupPlan, float]:
        import time

        active = self.alive()
        bw = self._planning_bw(now)
        t0 = time.perf_counter()
        plan = plan_group(self.scheme, bw, members, self.size, active=active, seed=self.seed)
        self.plan_seconds.append(time.perf_counter() - t0)
        bound = planner.lower_bound(self.bw, members, self.size, active=active)
        return plan, bound

    def _deadline(self, plan: GroupPlan, now: float) -> float:
        return now + max(self.group_timeout_min_s, DEADLINE_FACTOR * plan.predicted_s)

    def _start(self, g: Group, now: float) -> list[Decision]:
        try:
            plan, bound = self._plan(g.members, now)
        except planner.PlanError as exc:
            self.former.abandon(g.id, now)
            return [Abandon(g, 0, f"no plan: {exc}", 0, None)]
        og = _Open(g, 0, plan, now, self._deadline(plan, now), int(plan.link_bytes().sum()))
        self.open[g.id] = og
        return [Assign(g, 0, plan, bound, og.deadline)]

    def _revise(self, og: _Open, now: float, why: str) -> list[Decision]:
        if og.rev + 1 >= MAX_REVISIONS:
            return [self._abandon(og, now, f"too many revisions ({why})")]
        try:
            plan, bound = self._plan(og.group.members, now)
        except planner.PlanError as exc:
            return [self._abandon(og, now, f"no plan after {why}: {exc}")]
        og.rev += 1
        og.plan = plan
        og.started = now
        og.deadline = self._deadline(plan, now)
        og.bytes_moved += int(plan.link_bytes().sum())
        return [
            Note("recovery", f"group {og.group.id} revision {og.rev}: {why}"),
            Assign(og.group, og.rev, plan, bound, og.deadline, why),
        ]

    def _abandon(self, og: _Open, now: float, reason: str) -> Abandon:
        self.open.pop(og.group.id, None)
        g = self.former.abandon(og.group.id, now)
        return Abandon(g, og.rev, reason, og.bytes_moved, og.plan)
