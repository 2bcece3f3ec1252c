"""How the group life cycle asks the planners for a group's plan. Pure: no clock, no I/O.

Every plan is made on payload rates: ``RunConfig.goodput`` x the planning rates of the
:class:`~crew.control.capacity.CapacityView` (TCP/IP headers take about 5% of what a shaper
counts), less what the groups in flight still send when ``cfg.committed_capacity``
(``CapacityView.residual``). A compressed run sends fewer bytes per element than the planners'
4 (``crew.plan.wiresize``), so it plans on rates scaled by ``4 / wire bytes``: the same routes,
the seconds and bytes of the real payload. The lab's one host CPU (``cfg.host_cpu_s_per_gb``)
is a shared capacity of every plan (``crew.plan.hostcpu``), not of the lower bound, which stays
the network's, on the frame rates of ``capacity.planning``.

Three kinds of plan:

* a group's whole vector (:meth:`GroupPlanning.plan`, with its lower bound);
* for a non-blocking group, the vector re-split with what its members have presumably
  pre-scattered already (:meth:`GroupPlanning.nonblocking`);
* for a revision after an aggregator, relay or link was lost, only the lost ranges
  (:meth:`GroupPlanning.lost`): the routes still whole are kept.

Each is one planner call (:class:`~crew.plan.plancall.PlanCall`), so the shell may make a call
ahead of time and answer the identical one from it. Cost: that of the planner call; the rest is
``O(n^2)`` per open group (the residual capacity).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from crew.config import RunConfig, Scheme
from crew.control.assignment import (
    hop_bytes,
    keepable_routes,
    lost_ranges,
    place_routes,
    revision_routes,
)
from crew.control.capacity import CapacityView, InFlight
from crew.control.opengroup import OpenGroup
from crew.plan import planner, wiresize
from crew.plan.hostcpu import host_cpu_link
from crew.plan.plancall import PlanCall
from crew.plan.schemes import GroupPlan

log = logging.getLogger("crew.control.groupplanning")

PlanFn = Callable[..., GroupPlan]  # plan_group(scheme, bw, members, size, active=, seed=, ...)
PlanNonblockingFn = Callable[..., GroupPlan]  # plan_group_nonblocking(..., sent, a2a, active=)
BoundFn = Callable[..., float]  # planner.lower_bound(bw, members, size, active=)


class GroupPlanning:
    """The planner calls of one run: its config, its links and the planners to call; see the
    module doc. ``size`` arguments are the vector's length in elements."""

    def __init__(
        self,
        cfg: RunConfig,
        capacity: CapacityView,
        *,
        plan: PlanFn,
        plan_nonblocking: PlanNonblockingFn,
        lower_bound: BoundFn,
    ):
        self.cfg = cfg
        self.capacity = capacity
        self._plan_fn = plan
        self._plan_nonblocking_fn = plan_nonblocking
        self._lower_bound = lower_bound
        # The lab's one host: its CPU is a capacity of crew's plans, built once here.
        self._host_cpu = (
            host_cpu_link(cfg.n, cfg.host_cpu_s_per_gb, cfg.host_cores)
            if cfg.host_cpu_s_per_gb > 0
            else None
        )

    def payload_bw(self, in_flight: Iterable[OpenGroup], now: float) -> np.ndarray:
        """The payload rates a new plan gets: ``RunConfig.goodput`` x the planning rates, less
        what the groups ``in_flight`` still send when ``committed_capacity``."""
        share = self.cfg.goodput
        groups = list(in_flight)
        if not self.cfg.committed_capacity or not groups:
            return self.capacity.planning * share
        return self.capacity.residual(
            (InFlight(og.plan.link_bytes(), og.plan.predicted_s, og.rev_started) for og in groups),
            now,
            share,
        )

    def wire_bytes(self, size: int) -> float:
        """Bytes per element on the wire (4 unless the run compresses its parts)."""
        return wiresize.elem_bytes(self.cfg.compress, self.cfg.part_elems_for(size))

    def call(
        self,
        scheme: Scheme,
        members: tuple[int, ...],
        elems: int,
        active: Sequence[int],
        in_flight: Iterable[OpenGroup],
        now: float,
        size: int,
    ) -> PlanCall:
        """The planner call for ``elems`` elements of the group on the capacity the groups
        ``in_flight`` leave (:meth:`payload_bw`), scaled to the wire format: the whole vector
        or, for a revision that keeps routes, only the lost ranges (:meth:`lost`). With no
        group in flight it is the call of a group that forms once the open ones have ended."""
        scale = 4.0 / self.wire_bytes(size)
        part_bytes = hop_bytes(self.cfg.part_elems_for(size), self.cfg.hop_backlog_bytes, scale)
        extra = self._extra(scale * self.cfg.goodput)  # shared links carry frames too
        if self._host_cpu is not None:  # only the planner gets it (see __init__)
            # CPU seconds per GB were measured per payload GB: no goodput
            cpu = replace(self._host_cpu, mbit=self._host_cpu.mbit * scale)
            extra["shared"] = (*extra.get("shared", ()), cpu)
        return PlanCall.of(
            scheme,
            self.payload_bw(in_flight, now) * scale,
            members,
            elems * 4,
            active=tuple(active),
            seed=self.cfg.seed,
            part_bytes=part_bytes,
            **extra,
        )

    def solve(self, call: PlanCall, size: int) -> GroupPlan:
        """Make a planner call of :meth:`call`: its plan, in the wire format's bytes."""
        plan = call.run(self._plan_fn)
        wire = self.wire_bytes(size)
        return replace(plan, elem_bytes=wire) if wire != 4.0 else plan

    def plan(
        self,
        scheme: Scheme,
        members: tuple[int, ...],
        active: Sequence[int],
        in_flight: Iterable[OpenGroup],
        now: float,
        size: int,
    ) -> tuple[GroupPlan, float]:
        """The plan of the whole vector for ``members`` on the workers ``active``, and its lower
        bound (on the frame rates, without the groups in flight)."""
        plan = self.solve(self.call(scheme, members, size, active, in_flight, now, size), size)
        scale = 4.0 / self.wire_bytes(size)
        planning = self.capacity.planning * scale
        bound = self._lower_bound(planning, members, size * 4, active=active, **self._extra(scale))
        return plan, bound

    def nonblocking(
        self,
        scheme: Scheme,
        members: tuple[int, ...],
        active: Sequence[int],
        split: planner.Plan,
        ready_since: Mapping[int, float],
        now: float,
        size: int,
    ) -> tuple[GroupPlan, float]:
        """Re-solve a non-blocking group with what its members have presumably sent already
        of the a2a ``split`` since they became ready (``ready_since``).

        The coordinator does not see the bytes; it estimates them from the time since each
        member became ready and the link's rate. The estimate only steers the split: which
        parts are really reused is decided from the plan alone
        (``crew.control.assignment.covered_parts``).
        See docs/architecture.md §4 "The life of a group".
        """
        nbytes = size * 4
        bw = self.capacity.planning
        payload = bw * self.cfg.goodput
        a2a_bytes = np.array(split.elems, dtype=float) * 4
        sent = np.zeros_like(bw)
        for g in members:
            elapsed = max(0.0, now - ready_since[g])
            rate = np.where(np.isfinite(payload[g]), payload[g], 0.0) * 1e6 / 8
            sent[g] = np.minimum(a2a_bytes, elapsed * rate)
        plan = self._plan_nonblocking_fn(
            scheme, payload, members, nbytes, sent, split, active=active
        )
        return plan, self._lower_bound(bw, members, nbytes, active=active)

    def lost(
        self,
        og: OpenGroup,
        active: Sequence[int],
        in_flight: Iterable[OpenGroup],
        now: float,
        size: int,
    ) -> tuple[GroupPlan, list[list[int]]] | None:
        """The next revision of ``og`` that keeps every route whose nodes are ``active`` and
        whose links are usable, and plans only the ranges of the others; with its
        ``Assign.kept``.

        The lost ranges (possibly several) are planned as one vector of their total length on
        the residual capacity (what the groups ``in_flight`` still use) with the group's scheme,
        and laid back onto the ranges (``assignment.place_routes``). None when nothing can be
        kept (or nothing was lost), when the lost part finds no plan, or for a non-blocking
        group's first revision (its parts were cut by the pre-scatter split): then the caller
        plans everything again.

        Cost: one planner call on the lost bytes only; the kept routes' remaining time is not
        re-estimated but bounds the prediction from below (what was left of the old one)."""
        if og.rev == 0 and og.prescatter:
            return None
        old = list(og.plan.routes)
        bw = self.capacity.planning
        kept = keepable_routes(old, set(active), lambda s, d: bool(bw[s, d] > 0.0))
        if not kept or len(kept) == len(old):
            return None
        lost = lost_ranges(old, kept, size)
        lost_elems = sum(b - a for a, b in lost)
        call = self.call(og.scheme, og.members, lost_elems, active, in_flight, now, size)
        try:
            part = self.solve(call, size)
        except planner.PlanError as exc:
            log.info("group %d: no plan for the lost part alone (%s)", og.group.id, exc)
            return None
        if part.pipelined != og.plan.pipelined:
            return None  # one Assign carries one mode for all its routes
        placed = place_routes(list(part.routes), lost)
        routes, kept_list = revision_routes(old, kept, placed)
        left = og.plan.predicted_s - (now - og.rev_started)
        plan = GroupPlan(
            og.scheme,
            og.members,
            tuple(routes),
            og.plan.pipelined,
            max(part.predicted_s, left),
            og.plan.n,
            og.plan.total,
            og.plan.elem_bytes,
        )
        return plan, kept_list

    def _extra(self, scale: float) -> dict[str, Any]:
        """Shared capacities (cloud uplinks) and delays go only where there are some, so
        planners and test doubles without the keywords keep working on plain topologies."""
        extra: dict[str, Any] = {}
        if self.cfg.shared:
            extra["shared"] = (
                self.cfg.shared
                if scale == 1.0
                else tuple(replace(s, mbit=s.mbit * scale) for s in self.cfg.shared)
            )
        if self.capacity.delay_s is not None:
            extra["delay_s"] = self.capacity.delay_s
        return extra
