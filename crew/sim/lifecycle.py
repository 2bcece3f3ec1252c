"""The seam between the simulator and the group life cycle: an adapter over the real one.

The group life cycle is ``crew.control.lifecycle.GroupLifecycle``, the same pure state machine the
lab's coordinator (``crew/runtime/coordinator.py``) wraps in sockets. The simulator drives it with
simulated time through :class:`SimLifecycle`, which only translates:

* simulated events into the protocol messages the coordinator would receive: a worker joins
  (``Register``), finishes an iteration (``Ready``, with the projection of its offered vector),
  holds its group's result (``HaveAll``, one per member, with the projection of the exact
  weighted average, as a correct worker reports it), a link is cut (``LinkFailed``), a worker
  dies (``WorkerDisconnected``); the clock (``tick``) and the end (``shutdown``);
* its outputs into what the engine does: ``SendTo(.., Assign)`` (one per participant) becomes
  one :class:`Assign` (start the routes on the network model), ``SendTo(.., Commit)`` /
  ``SendTo(.., Abandon)`` become one :class:`Commit` / :class:`Abandon` (the members resume
  computing), ``EventRecord`` becomes a :class:`Note`. Every record output is also kept in
  :attr:`SimLifecycle.records` order for a run database (``crew.runtime.coordinator.write_record``).

At large n the planner may be handed a candidate sub-network (``crew.plan.candidates``,
``helpers``): the members and the k non-members best connected to them.

So revisions, failover, deadlines, committed capacity, the group former (FIFO, several groups
in flight, staleness, isolation guard) and the planner calls are all the real code's. The only
knob the simulator sets differently from the lab is the former's heartbeat timeout: simulated
workers never go silent, they die by an explicit fault.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from crew.config import RunConfig, Scheme
from crew.control import lifecycle as lc
from crew.control.grouping import Group, GroupFormer
from crew.plan.candidates import plan_on_candidates
from crew.plan.routelp import DEFAULT_SETTINGS, RouteLPSettings
from crew.plan.schemes import GroupPlan, GroupPlanner
from crew.wire import protocol as proto

PLAN_TIMES_KEPT = 10_000  # planner times a run without history keeps (the latest)
NEVER_SILENT_S = 1e9  # the former's heartbeat timeout: simulated workers never go silent


@dataclass(frozen=True)
class Assign:
    """Start revision ``rev`` of group ``group`` with ``plan`` (replacing any older one)."""

    group: Group
    rev: int
    plan: GroupPlan
    bound_s: float
    deadline: float
    why: str = ""
    plan_s: float = 0.0  # wall time of the real planner call that made ``plan``


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


def offered_proj(worker: int, iteration: int) -> float:
    """The projection a simulated worker offers (any distinct, exactly representable value)."""
    return float(worker * 1000 + iteration % 1000)


def _current(og: lc.OpenGroup) -> Group:
    """The open group as it stands: members lost since formation moved to ``dropped``."""
    g = og.group
    its = dict(zip(g.members, g.iterations, strict=True))
    dropped = tuple(m for m in g.members if m not in og.members)
    return dataclasses.replace(
        g,
        members=og.members,
        weights=og.weights,
        iterations=tuple(its[m] for m in og.members),
        dropped=tuple(sorted(set(g.dropped) | set(dropped))),
    )


class SimLifecycle:
    """``crew.control.lifecycle.GroupLifecycle`` in simulated time; see the module docstring."""

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
        plan_rounds: int | None = None,
        helpers: int | None = None,
        plan_level_tol: float = 0.0,
        goodput: float = RunConfig.default("goodput"),
        history: bool = True,
    ) -> None:
        self.history = history  # False: keep no records and only the last planner times
        self.plan_rounds = plan_rounds
        self.plan_level_tol = plan_level_tol
        # One planner per simulated run: its caches (warm columns) shape capped plans, so a run
        # starts from empty ones and replays the same in any process.
        self.planner = GroupPlanner(
            RouteLPSettings(
                max_rounds=DEFAULT_SETTINGS.max_rounds if plan_rounds is None else plan_rounds,
                level_tolerance=plan_level_tol,
            )
        )
        self.helpers = helpers  # None: plan over every worker; k: crew.plan.candidates
        bw = np.array(bw_mbit, dtype=float)
        np.fill_diagonal(bw, 0.0)
        self.cfg = RunConfig.in_process(
            n,
            p,
            bw,
            run_id="sim",
            scheme=Scheme(scheme),
            seed=seed,
            staleness=staleness,
            committed_capacity=committed_capacity,
            group_timeout_min_s=group_timeout_min_s,
            goodput=goodput,
        )
        self.former = GroupFormer(
            n,
            p,
            heartbeat_timeout=NEVER_SILENT_S,
            staleness=staleness,
            isolation_max_wait=isolation_max_wait,
        )
        # Wall time of each planner call (for scale); without history, of the latest ones.
        self.plan_seconds: deque[float] = deque(maxlen=None if history else PLAN_TIMES_KEPT)
        self._made: list[float] = []  # this call's successful plans' times, in planning order
        self.clock = time.perf_counter  # what times a planner call (a test may set its own)
        self.life = lc.GroupLifecycle(self.cfg, former=self.former, plan=self._timed_plan)
        self.size_elems = int(size_bytes) // 4
        self.records: list[lc.Output] = []  # everything the life cycle recorded, in order
        self._bound: dict[int, float] = {}  # gid -> lower bound recorded when it opened
        self._open: dict[int, lc.OpenGroup] = {}  # gid -> its open group, once assigned

    def _timed_plan(self, *args, **kw) -> GroupPlan:  # noqa: ANN002, ANN003
        t0 = self.clock()
        plan: GroupPlan | None = None
        try:
            if self.helpers is None:
                plan = self.planner(*args, **kw)
            else:
                plan = plan_on_candidates(self.planner, self.helpers, *args, **kw)
            return plan
        finally:
            took = self.clock() - t0
            self.plan_seconds.append(took)
            if plan is not None:
                self._made.append(took)

    # ---- events in ------------------------------------------------------------------------

    def join(self, worker: int, now: float) -> list[Decision]:
        msg = proto.Register(worker=worker, pid=0, iteration=0, vector_len=self.size_elems)
        return self._drive(now, lambda: self.life.handle(msg, now))

    def ready(self, worker: int, iteration: int, now: float) -> list[Decision]:
        msg = proto.Ready(worker, iteration, offered_proj(worker, iteration), -1)
        return self._drive(now, lambda: self.life.handle(msg, now))

    def delivered(self, gid: int, now: float) -> list[Decision]:
        """Every member holds the result of the current revision: each sends HaveAll."""
        og = self.life.open[gid]
        result = sum(
            w * self.life.offered_proj[m] for m, w in zip(og.members, og.weights, strict=True)
        )
        msgs = [proto.HaveAll(m, gid, og.rev, 0, result) for m in og.members]
        return self._drive(now, lambda: [o for msg in msgs for o in self.life.handle(msg, now)])

    def link_failed(self, src: int, dst: int, now: float) -> list[Decision]:
        """Link src -> dst is gone for good (reported by its sender, as a worker does)."""
        msg = proto.LinkFailed(src, src, dst, "cut (simulated)")
        return self._drive(now, lambda: self.life.handle(msg, now))

    def set_link(self, src: int, dst: int, mbit: float, now: float) -> list[Decision]:
        """The planner learns link src -> dst's new rate (the lab's oracle, an admin request)."""
        msg = proto.Admin("set_link", {"src": src, "dst": dst, "rate_mbit": mbit})
        return self._drive(now, lambda: self.life.handle(msg, now))

    def worker_lost(self, worker: int, now: float) -> list[Decision]:
        ev = lc.WorkerDisconnected(worker, "crashed (simulated)")
        return self._drive(now, lambda: self.life.handle(ev, now))

    def tick(self, now: float) -> list[Decision]:
        return self._drive(now, lambda: self.life.tick(now))

    def stop(self, now: float) -> list[Decision]:
        return self._drive(now, lambda: self.life.shutdown(now, "run stopped"))

    # ---- queries --------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        return min((og.deadline for og in self.life.open.values()), default=None)

    def alive(self) -> list[int]:
        return self.life.alive()

    # ---- translation ----------------------------------------------------------------------

    def _drive(self, now: float, call) -> list[Decision]:  # noqa: ANN001
        """Run one life-cycle call at simulated time ``now`` and translate its outputs, in order.

        The life cycle plans a group, then sends its Assign, one group after another; so the
        k-th new Assign of a call carries the k-th successful plan's time of that call."""
        self._made = []
        outs = call()
        decided: list[Decision] = []
        seen: set[tuple[str, int, int]] = set()
        for o in outs:
            if self.history and not isinstance(o, lc.SendTo):
                self.records.append(o)
            if isinstance(o, lc.GroupOpenedRecord):
                self._bound[o.group.id] = o.bound_s
            elif isinstance(o, lc.GroupUnplannedRecord):
                decided.append(Abandon(o.group, 0, o.reason, 0, None))
                seen.add(("end", o.group.id, 0))
            elif isinstance(o, lc.EventRecord):
                decided.append(Note(o.kind, o.message, o.level.value, o.worker))
            elif isinstance(o, lc.SendTo):
                decided += self._message(o.msg, seen)
        return decided

    def _message(self, msg: proto.Message, seen: set[tuple[str, int, int]]) -> list[Decision]:
        if isinstance(msg, proto.Assign):
            key = ("assign", msg.group, msg.rev)
            if key in seen:
                return []
            seen.add(key)
            og = self.life.open[msg.group]
            self._open[msg.group] = og
            why = "" if msg.rev == 0 else "revised"
            bound = self._bound.get(msg.group, 0.0)
            plan_s = self._made.pop(0) if self._made else 0.0
            return [Assign(_current(og), msg.rev, og.plan, bound, og.deadline, why, plan_s)]
        if isinstance(msg, proto.Abandon) and msg.group in self.life.open:
            return []  # a member dropped while its group goes on (the revision tells)
        if isinstance(msg, proto.Commit | proto.Abandon):
            key = ("end", msg.group, 0)
            if key in seen:
                return []
            seen.add(key)
            # The closed group's last state (the life cycle mutates it until it closes).
            og = self._open.pop(msg.group)
            self._bound.pop(msg.group, None)
            if isinstance(msg, proto.Commit):
                return [Commit(_current(og), msg.rev, og.bytes_moved)]
            return [Abandon(_current(og), og.rev, msg.reason, og.bytes_moved, og.plan)]
        return []  # Split, Stop: nothing for a simulated worker to do
