"""The life of every partial-reduce group, as a pure state machine.

No sockets, threads, clock or database: every call takes the events and ``now`` (seconds, any
epoch, non-decreasing) and returns the outputs, in the order they were decided: messages to
send (:class:`SendTo`) and rows to record (the ``*Record`` classes). The coordinator
(``crew.runtime.coordinator``) is the socket shell around it; a simulator can drive it with
simulated time. See docs/architecture.md §4 "The life of a group".

A group's life::

    Ready x p ──► form (crew.control.grouping) ──► plan (crew.plan.schemes) ──► Assign rev 0 to
    every worker with a role ──► HaveAll from every member ──► Commit ──► completed

and when something breaks while it is open:

* a member dies: the survivors get a new revision, planned without it, and average among
  themselves; with no survivor left the group is abandoned;
* an aggregator that is no member dies, or a link the plan uses fails: a new revision is
  planned on what is left, and only for what was lost (:meth:`GroupLifecycle._plan_lost`):
  the routes whose nodes and links are all still alive are kept as they are
  (``Assign.kept``; the workers keep their partial sums, contributors and delivered results),
  and the planner's LP places the other routes' ranges on the residual capacity, with backup
  aggregators and relays. A member's loss re-plans everything (the weights change);
* a revision stops moving data (the workers' ``LinkHealth`` progress reports show no new bytes
  for ``stall_after``, see :meth:`GroupLifecycle.stall_after`): a new revision is planned at
  once; a revision that keeps moving bytes is left alone up to its hard deadline
  (:meth:`GroupLifecycle.deadline_for`, a generous multiple of the prediction);
* no revision completes within its deadline, or revisions run out (``MAX_REVISIONS``): the
  group is abandoned, its members keep their own models and train on. Every outcome is
  recorded: no group is left hanging.

Links: the receivers' probes (``crew.wire.probes``, reported in ``LinkHealth``) take dead links out
of plans at once and put them back when they pass again; a link a sender reports failed with
data returns only after its probes pass (``crew.control.capacity``). A group whose plan uses a link
that just died is revised at once.

Suspects (staggered cuts): a worker whose links to ``SUSPECT_PEERS`` different peers failed
within ``SUSPECT_S`` is *suspect* until ``SUSPECT_S`` after the last of them: cuts often come in
bursts at one worker (its uplink, its host), and the probes find each within about
``crew.wire.probes.DEAD_AFTER_S``, one after another, so its other links may be cut already
without anyone knowing. (One failed link names no culprit: both ends stay in use.) It is set
aside once, when it becomes suspect, in every open group at the same time
(:meth:`GroupLifecycle._after_link_faults`): a group that has it as a member drops it like a
lost member (if at least two members remain), and one that uses it only as an aggregator or
relay gets one revision that re-plans its routes on the others. While suspect it is in no
plan of a group it is no member of (new groups, revisions), and new groups leave it out while
enough others are ready (with the deferred, below), so a group is not revised once per cut.

Members: a worker the live links reach poorly (``capacity.poorly_reached``: most of its links
dead, the rest contended) is kept out of groups while enough others are ready, for at most
``grouping.DEFER_MAX_WAIT_S`` (``GroupFormer.set_deferred``): with p close to the live workers,
groups run one at a time, and one such member would gate every one of them.

Plans are made on payload rates, ``cfg.goodput`` x the planning rates (TCP/IP headers take
about 5% of what a shaper counts), less the committed capacity of the groups in flight
(``capacity.residual``, when ``cfg.committed_capacity``); the recorded lower bound is on the
frame rates of ``capacity.planning``, a bound for any transport (see ``crew.control.capacity``).

Liveness: a worker silent for ``cfg.heartbeat_timeout_s`` is lost (its groups are revised
without it). Silence is counted only while the coordinator watches: when no event or tick has
reached the life cycle for more than ``AWAY_FRACTION`` of that timeout (a frozen host, a blocked
database write, a long plan), the time it was away is excused (``GroupFormer.excuse``) rather than
blamed on every worker at once. A worker lost to silence whose control connection is still open
and that speaks again (a heartbeat, a Ready, a report) is taken back (``_heard_again``): it was
late, not dead, and without this it would stay out of every group for the rest of the run while
``p_eff`` shrank around it.

Events in: the workers' and the lab's :mod:`crew.wire.protocol` messages (``Register``, ``Ready``,
``HaveAll``, ``Admin``, ...) and :class:`WorkerDisconnected`, via :meth:`GroupLifecycle.handle`;
the passage of time via :meth:`GroupLifecycle.tick`; the end via :meth:`GroupLifecycle.shutdown`.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
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
from crew.control.capacity import (
    CapacityView,
    InFlight,
    LinkChange,
    LinkUpdate,
    poorly_reached,
)
from crew.control.grouping import Group, GroupFormer, GroupingError, GroupOutcome, WorkerState
from crew.control.rejections import RejectionLimiter, SecurityNote
from crew.control.verify import CHECK_TOLERANCE, relative_error
from crew.plan import planner, wiresize
from crew.plan.hostcpu import host_cpu_link
from crew.plan.plancall import PlanCall
from crew.plan.routes import link_load
from crew.plan.schemes import GROUP_SCHEMES, GroupPlan, plan_group, plan_group_nonblocking
from crew.wire import protocol as proto

log = logging.getLogger("crew.control.lifecycle")

MAX_REVISIONS = 8
# The coordinator ticks every quarter second; a gap above this share of the heartbeat timeout
# means it was not running, and the workers' silence over the gap is not theirs.
AWAY_FRACTION = 0.5
DEADLINE_FACTOR = 10.0  # a revision may take this many times its predicted time
STALL_MIN_S = 3.0  # a revision that received no data for this long (at least) has stalled
STALL_FACTOR = 3.0  # ... or for this many times its predicted time, if longer
SUSPECT_S = 3.0  # how long a failed link counts towards its ends' suspicion (module doc)
SUSPECT_PEERS = 2  # failed links to this many peers within SUSPECT_S make a worker suspect

PlanFn = Callable[..., GroupPlan]  # plan_group(scheme, bw, members, size, active=, seed=, ...)
PlanNonblockingFn = Callable[..., GroupPlan]  # plan_group_nonblocking(..., sent, a2a, active=)
BoundFn = Callable[..., float]  # planner.lower_bound(bw, members, size, active=)


# -- events in ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerDisconnected:
    """The worker's control connection ended (or was replaced): it counts as lost."""

    worker: int
    why: str


Event = proto.Message | WorkerDisconnected


# -- outputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SendTo:
    """Send ``msg`` to ``worker`` (dropped by the shell if it has no connection)."""

    worker: int
    msg: proto.Message


class Level(enum.Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class EventRecord:
    """A row of the run database's event log."""

    t: float
    kind: str
    message: str
    level: Level = Level.INFO
    worker: int | None = None
    data: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class WorkerStatusRecord:
    worker: int
    state: WorkerState
    iteration: int | None = None
    group_id: int | None = None
    pid: int | None = None


@dataclass(frozen=True)
class GroupOpenedRecord:
    """A group was formed and planned: its ``groups`` row and its ``group_members`` rows."""

    group: Group
    scheme: Scheme
    started_at: float
    predicted_s: float
    bound_s: float
    plan_json: str


@dataclass(frozen=True)
class GroupUnplannedRecord:
    """A group was formed but no plan was found: recorded as abandoned at once."""

    group: Group
    scheme: Scheme
    ended_at: float
    reason: str


@dataclass(frozen=True)
class GroupClosedRecord:
    """An open group ended; ``dropped`` are the members whose ``group_members`` rows go."""

    group_id: int
    ended_at: float
    outcome: GroupOutcome
    bytes_moved: int
    reason: str
    members: tuple[int, ...]
    weights: tuple[float, ...]
    plan_json: str
    revisions: int
    verify_err: float | None
    dropped: tuple[int, ...]


@dataclass(frozen=True)
class MetaRecord:
    values: Mapping[str, str]


@dataclass(frozen=True)
class IterationRecord:
    t: float
    worker: int
    iteration: int
    loss: float
    accuracy: float | None


@dataclass(frozen=True)
class AllReduceRecord:
    """A Gloo all-reduce among all workers, recorded as a completed group of everyone."""

    scheme: Scheme
    n: int
    started: float
    ended: float
    bytes_moved: int


@dataclass(frozen=True)
class PlanAhead:
    """A group that is about to form (a trace's next group) will be planned with ``call`` if
    nothing changes first: the shell may make it now, off the critical path, and answer the
    identical call from it when the group forms (``crew.runtime.planahead``). Ignoring it
    changes nothing but when the plan is computed."""

    call: PlanCall


@dataclass(frozen=True)
class StopRequested:
    """The lab asked the run to stop: the shell ends its loop and calls ``shutdown``."""


Output = (
    SendTo
    | EventRecord
    | WorkerStatusRecord
    | GroupOpenedRecord
    | GroupUnplannedRecord
    | GroupClosedRecord
    | MetaRecord
    | IterationRecord
    | AllReduceRecord
    | PlanAhead
    | StopRequested
)


# -- state -------------------------------------------------------------------------------------


@dataclass
class OpenGroup:
    """A group between its formation and its commit or abandonment."""

    group: Group
    scheme: Scheme
    rev: int
    members: tuple[int, ...]
    weights: tuple[float, ...]
    plan: GroupPlan
    participants: set[int]
    deadline: float
    have_all: set[int] = field(default_factory=set)
    result_projs: dict[int, float] = field(default_factory=dict)
    bytes_moved: int = 0  # what the plans of all its revisions put on the links
    prescatter: list[list[int]] = field(default_factory=list)  # rev 0 of a non-blocking group
    split_epoch: int = -1
    rev_started: float = 0.0
    received: dict[int, int] = field(default_factory=dict)  # worker -> bytes of this revision
    moved_at: float = 0.0  # when this revision last received data (or was assigned)
    kept: list[list[int]] = field(default_factory=list)  # Assign.kept of this revision


@dataclass(frozen=True)
class OpenGroupState:
    """A frozen copy of an :class:`OpenGroup`, for snapshots."""

    group: Group
    scheme: Scheme
    rev: int
    members: tuple[int, ...]
    weights: tuple[float, ...]
    plan: GroupPlan
    participants: frozenset[int]
    deadline: float
    have_all: frozenset[int]
    result_projs: tuple[tuple[int, float], ...]
    bytes_moved: int
    prescatter: tuple[tuple[int, ...], ...]
    split_epoch: int
    rev_started: float
    received: tuple[tuple[int, int], ...] = ()
    moved_at: float = 0.0


@dataclass(frozen=True)
class LifecycleSnapshot:
    """The life cycle's own state (open groups and run-wide settings).

    The ``GroupFormer`` (ready queue, workers' states) is not part of it: a restart rebuilds
    that from the workers' re-registrations."""

    open_groups: tuple[OpenGroupState, ...]
    scheme: Scheme
    size_elems: int | None
    connected: frozenset[int]
    offered_proj: tuple[tuple[int, float], ...]
    trace_next: int


class GroupLifecycle:
    """Forms, plans, revises, commits or abandons groups; see the module doc.

    ``plan``, ``plan_nonblocking`` and ``lower_bound`` default to the real planners; tests and
    simulators may pass others with the same signatures."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        capacity: CapacityView | None = None,
        former: GroupFormer | None = None,
        plan: PlanFn = plan_group,
        plan_nonblocking: PlanNonblockingFn = plan_group_nonblocking,
        lower_bound: BoundFn = planner.lower_bound,
    ):
        self.cfg = cfg
        self.capacity = capacity or CapacityView(
            cfg.bw_mbit, measured=cfg.capacity == "measured", delay_ms=cfg.delay_ms
        )
        self.former = former or GroupFormer(
            cfg.n, cfg.p, heartbeat_timeout=cfg.heartbeat_timeout_s, staleness=cfg.staleness
        )
        self._plan_fn = plan
        self._plan_nonblocking_fn = plan_nonblocking
        self._lower_bound = lower_bound
        # The lab's one host: its CPU is a capacity of crew's plans (crew.plan.hostcpu), built
        # once here; the lower bound stays the network's.
        self._host_cpu = (
            host_cpu_link(cfg.n, cfg.host_cpu_s_per_gb, cfg.host_cores)
            if cfg.host_cpu_s_per_gb > 0
            else None
        )
        self.scheme = cfg.scheme
        self.size_elems: int | None = None
        self.connected: set[int] = set()  # workers with a live control connection
        self.open: dict[int, OpenGroup] = {}
        self.offered_proj: dict[int, float] = {}  # worker -> projection of its offered vector
        # Benchmark mode: groups come from a fixed trace, one at a time, not from readiness.
        trace = cfg.extra.get("trace")
        self.trace: list[tuple[int, ...]] | None = (
            [tuple(int(m) for m in g) for g in trace] if trace is not None else None
        )
        self.trace_next = 0
        # Non-blocking mode: the a2a split ready workers scatter with before their group forms.
        self.split: planner.Plan | None = None
        self.split_epoch = -1
        self.ready_at: dict[int, tuple[float, int]] = {}  # worker -> (time, split epoch used)
        self.rejections = RejectionLimiter()
        # Whether the workers report their groups' progress (LinkHealth): only then can a
        # revision be judged stalled before its hard deadline.
        self.progress_reported = False
        self.failed_at: dict[int, dict[int, float]] = {}  # worker -> peer -> last link failure
        self.suspect_until: dict[int, float] = {}  # worker -> end of its suspect time
        self._looked_at: float | None = None  # the last event or tick: when it last watched
        self._out: list[Output] = []

    # -- the public calls --------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Output]:
        """One event; a refused one (bad worker id, impossible transition) is recorded as a
        warning, with what was decided before the refusal kept."""
        self._out = []
        kind = "closed" if isinstance(event, WorkerDisconnected) else "msg"
        try:
            self._watch(now)
            if isinstance(event, WorkerDisconnected):
                self.connected.discard(event.worker)
                self._worker_lost(event.worker, now, event.why)
            else:
                self._message(event, now)
        except (GroupingError, planner.PlanError, proto.ProtocolError) as exc:
            log.warning("event %s refused: %s", kind, exc)
            self._event(now, "warning", f"refused {kind}: {exc}", level=Level.WARNING)
        return self._take()

    def tick(self, now: float) -> list[Output]:
        """Time passes: rejection summaries, link retries, silent workers, deadlines, holds."""
        self._out = []
        self._watch(now)
        for note in self.rejections.expire(now):
            self._security_event(note, now)
        retried = self.capacity.retry_due(now)
        for u in retried:
            self._link_event(u, now)
        if retried:
            self._update_split()
        for worker in self.former.expire(now):
            if worker in self.connected:
                self._worker_lost(worker, now, "no heartbeat")
        self._update_deferred(now)
        for og in list(self.open.values()):
            if now > og.deadline:
                self._revise(og, now, f"revision {og.rev} missed its deadline")
            elif self.progress_reported and now - og.moved_at > self.stall_after(og.plan):
                self._revise(
                    og, now, f"revision {og.rev} received no data for {now - og.moved_at:.1f} s"
                )
        if self.trace is not None:
            self._next_trace_group(now)
        else:
            # The isolation guard may hold a group back for a while; only a later call forms it.
            for group in self.former.form(now):
                self._start_group(group, now)
        return self._take()

    def shutdown(self, now: float, reason: str) -> list[Output]:
        """The run ends: open groups are abandoned, every worker is told to stop."""
        self._out = []
        for note in self.rejections.flush_all():
            self._security_event(note, now)
        for og in list(self.open.values()):
            self._finish(og, now, committed=False, reason="run stopped")
        for w in sorted(self.connected):
            self._send(w, proto.Stop(reason))
        return self._take()

    def deadline_for(self, plan: GroupPlan, now: float) -> float:
        """When a revision assigned at ``now`` with ``plan`` is given up, however it moves.

        A safety net only: a revision that stops moving data is revised after
        :meth:`stall_after` (when the workers report progress); one that moves at its planned
        rate ends near its predicted time, far before this."""
        return now + max(self.cfg.group_timeout_min_s, DEADLINE_FACTOR * plan.predicted_s)

    def stall_after(self, plan: GroupPlan) -> float:
        """How long a revision may receive no data before it counts as stalled.

        A few progress reports (every ``crew.runtime.worker.HEALTH_S``) and a few times its
        predicted time, so a revision queued behind another group's parts on a link is not
        taken for a stalled one."""
        return max(STALL_MIN_S, STALL_FACTOR * plan.predicted_s)

    def alive(self) -> list[int]:
        return sorted(w for w in self.former.alive() if w in self.connected)

    def snapshot(self) -> LifecycleSnapshot:
        return LifecycleSnapshot(
            open_groups=tuple(
                OpenGroupState(
                    group=og.group,
                    scheme=og.scheme,
                    rev=og.rev,
                    members=og.members,
                    weights=og.weights,
                    plan=og.plan,
                    participants=frozenset(og.participants),
                    deadline=og.deadline,
                    have_all=frozenset(og.have_all),
                    result_projs=tuple(sorted(og.result_projs.items())),
                    bytes_moved=og.bytes_moved,
                    prescatter=tuple(tuple(s) for s in og.prescatter),
                    split_epoch=og.split_epoch,
                    rev_started=og.rev_started,
                    received=tuple(sorted(og.received.items())),
                    moved_at=og.moved_at,
                )
                for og in self.open.values()
            ),
            scheme=self.scheme,
            size_elems=self.size_elems,
            connected=frozenset(self.connected),
            offered_proj=tuple(sorted(self.offered_proj.items())),
            trace_next=self.trace_next,
        )

    def restore(self, snap: LifecycleSnapshot) -> None:
        """Take over the state of ``snap`` (the ``GroupFormer`` is the caller's to rebuild)."""
        self.open = {
            s.group.id: OpenGroup(
                group=s.group,
                scheme=s.scheme,
                rev=s.rev,
                members=s.members,
                weights=s.weights,
                plan=s.plan,
                participants=set(s.participants),
                deadline=s.deadline,
                have_all=set(s.have_all),
                result_projs=dict(s.result_projs),
                bytes_moved=s.bytes_moved,
                prescatter=[list(p) for p in s.prescatter],
                split_epoch=s.split_epoch,
                rev_started=s.rev_started,
                received=dict(s.received),
                moved_at=s.moved_at,
            )
            for s in snap.open_groups
        }
        self.scheme = snap.scheme
        self.size_elems = snap.size_elems
        self.connected = set(snap.connected)
        self.offered_proj = dict(snap.offered_proj)
        self.trace_next = snap.trace_next

    # -- liveness ----------------------------------------------------------------------------

    def _watch(self, now: float) -> None:
        """Excuse the workers' silence over a gap in the coordinator's own attention."""
        last, self._looked_at = self._looked_at, now
        if last is None or now - last <= AWAY_FRACTION * self.cfg.heartbeat_timeout_s:
            return
        self.former.excuse(now - last, now)
        self._event(
            now,
            "coordinator",
            f"the coordinator was away {now - last:.1f} s (no event or tick reached it):"
            " the workers' silence in that time is not counted",
            level=Level.WARNING,
        )

    def _heard_again(self, worker: int, now: float) -> None:
        """A worker lost to silence spoke on its open connection: it is back (module doc)."""
        self.former.join(worker, now)
        self._status(worker, WorkerState.TRAINING)
        self._event(
            now,
            "recovery",
            f"worker {worker} heard again after it was lost to silence: back in groups",
            worker=worker,
        )
        self._update_split()

    # -- outputs -----------------------------------------------------------------------------

    def _take(self) -> list[Output]:
        out, self._out = self._out, []
        return out

    def _send(self, worker: int, msg: proto.Message) -> None:
        self._out.append(SendTo(worker, msg))

    def _event(
        self,
        now: float,
        kind: str,
        message: str,
        *,
        level: Level = Level.INFO,
        worker: int | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self._out.append(EventRecord(now, kind, message, level, worker, data))

    def _status(self, worker: int, state: WorkerState, **kw: Any) -> None:
        self._out.append(WorkerStatusRecord(worker, state, **kw))

    # -- messages ----------------------------------------------------------------------------

    def _message(self, msg: proto.Message, now: float) -> None:
        if isinstance(msg, proto.Admin):
            self._admin(msg, now)
            return
        worker = getattr(msg, "worker", None)
        if not isinstance(worker, int) or not 0 <= worker < self.cfg.n:
            raise proto.ProtocolError(f"worker: {worker!r} is not a worker of this run")
        if isinstance(msg, proto.Register):
            self._register(msg, now)
            return
        if worker in self.connected and self.former.state(worker) is WorkerState.DEAD:
            self._heard_again(worker, now)
        if isinstance(msg, proto.Heartbeat):
            self.former.heartbeat(worker, now)
        elif isinstance(msg, proto.Ready) and self.trace is not None:
            self.offered_proj[worker] = msg.proj  # benchmark: the fixed vector it offers
        elif isinstance(msg, proto.Ready):
            self.former.heartbeat(worker, now)
            self.offered_proj[worker] = msg.proj
            self.ready_at[worker] = (now, msg.split_epoch)
            self._status(worker, WorkerState.READY, iteration=msg.iteration)
            self._update_deferred(now)
            for group in self.former.ready(worker, msg.iteration, now):
                self._start_group(group, now)
        elif isinstance(msg, proto.Metrics):
            self._out.append(IterationRecord(msg.t, worker, msg.iteration, msg.loss, msg.accuracy))
        elif isinstance(msg, proto.HaveAll):
            self._have_all(msg, now)
        elif isinstance(msg, proto.LinkFailed):
            self._link_failed(msg.src, msg.dst, msg.reason, now)
        elif isinstance(msg, proto.LinkRates):
            self._link_rates(msg, now)
        elif isinstance(msg, proto.LinkHealth):
            self._link_health(msg, now)
        elif isinstance(msg, proto.Rejected):
            for note in self.rejections.rejected(worker, msg.reason, msg.peer, now):
                self._security_event(note, now)
        elif isinstance(msg, proto.OpTime):
            n = self.cfg.n
            # Gloo's ring all-reduce: each of n ranks sends 2(n-1)/n of the vector
            self._out.append(
                AllReduceRecord(self.scheme, n, msg.started, msg.ended, 2 * (n - 1) * msg.nbytes)
            )
        else:
            raise proto.ProtocolError(f"type: {msg.TYPE!r} is not for the coordinator")

    def _register(self, msg: proto.Register, now: float) -> None:
        if self.size_elems is None:
            self.size_elems = msg.vector_len
        elif msg.vector_len != self.size_elems:
            raise proto.ProtocolError(
                f"register.vector_len: {msg.vector_len} differs from the run's {self.size_elems}"
            )
        self.connected.add(msg.worker)
        self.capacity.forget_worker(msg.worker)
        self.former.join(msg.worker, now)
        self._status(msg.worker, WorkerState.TRAINING, iteration=msg.iteration, pid=msg.pid)
        self._event(
            now, "worker", f"worker {msg.worker} registered (pid {msg.pid})", worker=msg.worker
        )
        self._update_split()

    def _update_split(self) -> None:
        """Non-blocking mode: re-solve the a2a split when the workers or links change."""
        if not self.cfg.nonblocking or self.size_elems is None or self.trace is not None:
            return
        try:
            split = planner.solve_a2a(
                self.capacity.planning, self.size_elems * 4, active=self.alive()
            )
        except planner.PlanError as exc:
            log.warning("no a2a split (%s): groups will not pre-scatter", exc)
            split = None
        self.split = split
        self.split_epoch += 1
        segments = [] if split is None else [[s.worker, s.start, s.stop] for s in split.segments]
        part_elems = self.cfg.part_elems_for(self.size_elems)
        for w in sorted(self.connected):
            self._send(w, proto.Split(self.split_epoch, segments, part_elems))

    # -- planning ----------------------------------------------------------------------------

    def _planning_bw(self, now: float, *, in_flight: bool = True) -> np.ndarray:
        """The payload rates a new plan gets: ``RunConfig.goodput`` x the planning rates, less
        what the groups in flight still send when ``committed_capacity`` (and ``in_flight``)."""
        share = self.cfg.goodput
        if not self.cfg.committed_capacity or not self.open or not in_flight:
            return self.capacity.planning * share
        return self.capacity.residual(
            (
                InFlight(og.plan.link_bytes(), og.plan.predicted_s, og.rev_started)
                for og in self.open.values()
            ),
            now,
            share,
        )

    def plan_for(self, members: tuple[int, ...], now: float) -> tuple[GroupPlan, float]:
        """The plan and bound a group of ``members`` would get now, exactly as ``_plan`` makes
        them (``lab.studies.planbench timing --db`` replays a run's groups through it)."""
        return self._plan(tuple(members), self.scheme, now)

    def _plan(
        self, members: tuple[int, ...], scheme: Scheme, now: float
    ) -> tuple[GroupPlan, float]:
        assert self.size_elems is not None
        active = self._active_for(members, now)
        plan = self._solve(self._plan_call(scheme, members, self.size_elems, active, now))
        extra = self._plan_extra(self._wire_scale())
        planning = self.capacity.planning * self._wire_scale()
        bound = self._lower_bound(planning, members, self.size_elems * 4, active=active, **extra)
        return plan, bound

    def _active_for(self, members: Sequence[int], now: float) -> list[int]:
        """The workers a plan for ``members`` may use: the live ones, without the suspects
        that are no members (a suspect aggregates or relays for no one while suspect)."""
        aside = self._suspects(now) - set(members)
        return [w for w in self.alive() if w not in aside]

    def _wire_scale(self) -> float:
        """4 / wire bytes per element. The planners count 4 bytes per element; a compressed
        run sends fewer (crew.plan.wiresize), so it plans on rates scaled by this: the same
        routes, the seconds and bytes of the real payload."""
        assert self.size_elems is not None
        return 4.0 / self._wire_bytes()

    def _wire_bytes(self) -> float:
        assert self.size_elems is not None
        return wiresize.elem_bytes(self.cfg.compress, self.cfg.part_elems_for(self.size_elems))

    def _plan_extra(self, scale: float) -> dict[str, Any]:
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

    def _solve(self, call: PlanCall) -> GroupPlan:
        """Make a planner call of ``_plan_call``: its plan, in the wire format's bytes."""
        plan = call.run(self._plan_fn)
        wire = self._wire_bytes()
        return replace(plan, elem_bytes=wire) if wire != 4.0 else plan

    def _plan_call(
        self,
        scheme: Scheme,
        members: tuple[int, ...],
        elems: int,
        active: Sequence[int],
        now: float,
        *,
        in_flight: bool = True,
    ) -> PlanCall:
        """The planner call for ``elems`` elements of the group on the residual capacity
        (``_planning_bw``), scaled to the wire format: the whole vector or, for a revision that
        keeps routes, only the lost ranges (``_plan_lost``). With ``in_flight=False``, as if no
        group were open (the call of a group that forms once the open ones have ended)."""
        scale = 4.0 / self._wire_bytes()
        assert self.size_elems is not None
        part_bytes = hop_bytes(
            self.cfg.part_elems_for(self.size_elems), self.cfg.hop_backlog_bytes, scale
        )
        extra = self._plan_extra(scale * self.cfg.goodput)  # shared links carry frames too
        if self._host_cpu is not None:  # only the planner gets it (see __init__)
            # CPU seconds per GB were measured per payload GB: no goodput
            cpu = replace(self._host_cpu, mbit=self._host_cpu.mbit * scale)
            extra["shared"] = (*extra.get("shared", ()), cpu)
        return PlanCall.of(
            scheme,
            self._planning_bw(now, in_flight=in_flight) * scale,
            members,
            elems * 4,
            active=tuple(active),
            seed=self.cfg.seed,
            part_bytes=part_bytes,
            **extra,
        )

    def _plan_nonblocking(
        self, members: tuple[int, ...], now: float
    ) -> tuple[GroupPlan, float] | None:
        """Re-solve with what the members have presumably sent already.

        The coordinator does not see the bytes; it estimates them from the time since each
        member became ready and the link's rate. The estimate only steers the split: which
        parts are really reused is decided from the plan alone
        (``crew.control.assignment.covered_parts``).
        See docs/architecture.md §4 "The life of a group".
        """
        if (
            not self.cfg.nonblocking
            or self.split is None
            or self.trace is not None
            or self.scheme not in (Scheme.CREW, Scheme.CREW_PAPER)
        ):
            return None
        if any(self.ready_at.get(m, (0.0, -1))[1] != self.split_epoch for m in members):
            return None  # someone scattered with an older split: plan normally
        assert self.size_elems is not None
        size = self.size_elems * 4
        bw = self.capacity.planning
        payload = bw * self.cfg.goodput
        a2a_bytes = np.array(self.split.elems, dtype=float) * 4
        sent = np.zeros_like(bw)
        for g in members:
            elapsed = max(0.0, now - self.ready_at[g][0])
            rate = np.where(np.isfinite(payload[g]), payload[g], 0.0) * 1e6 / 8
            sent[g] = np.minimum(a2a_bytes, elapsed * rate)
        active = self._active_for(members, now)
        plan = self._plan_nonblocking_fn(
            self.scheme, payload, members, size, sent, self.split, active=active
        )
        return plan, self._lower_bound(bw, members, size, active=active)

    # -- groups ------------------------------------------------------------------------------

    def _start_group(self, group: Group, now: float) -> None:
        try:
            nonblocking = self._plan_nonblocking(group.members, now)
            plan, bound = nonblocking or self._plan(group.members, self.scheme, now)
        except planner.PlanError as exc:
            reason = f"no plan: {exc}"
            self._out.append(GroupUnplannedRecord(group, self.scheme, now, reason))
            if self.trace is None:
                self.former.abandon(group.id, now)
            for m in group.members:
                self._send(m, proto.Abandon(group.id, reason, list(group.members)))
            return
        og = OpenGroup(
            group=group,
            scheme=self.scheme,
            rev=0,
            members=group.members,
            weights=group.weights,
            plan=plan,
            participants=set(),
            deadline=0.0,
        )
        if nonblocking is not None:
            assert self.split is not None
            og.prescatter = [[s.worker, s.start, s.stop] for s in self.split.segments]
            og.split_epoch = self.split_epoch
        self.open[group.id] = og
        self._out.append(
            GroupOpenedRecord(group, self.scheme, now, plan.predicted_s, bound, plan.to_json())
        )
        for m in group.members:
            self._status(m, WorkerState.GROUPED, group_id=group.id)
        self._assign(og, now)

    def _assign(self, og: OpenGroup, now: float) -> None:
        assert self.size_elems is not None
        msg = proto.Assign(
            group=og.group.id,
            rev=og.rev,
            scheme=og.scheme,
            members=list(og.members),
            weights=list(og.weights),
            routes=[r.to_list() for r in og.plan.routes],
            pipelined=og.plan.pipelined,
            total=self.size_elems,
            part_elems=self.cfg.part_elems_for(self.size_elems),
            prescatter=og.prescatter if og.rev == 0 else [],
            iterations=[og.group.iterations[og.group.members.index(m)] for m in og.members],
            split_epoch=og.split_epoch,
            kept=og.kept,
        )
        og.participants = og.plan.participants()
        kept = {k for k, _ in og.kept}
        fresh = tuple(r for k, r in enumerate(og.plan.routes) if k not in kept)
        # kept routes were counted by an earlier revision
        og.bytes_moved += int(link_load(fresh, og.plan.n, og.plan.elem_bytes).sum())
        og.rev_started = now
        og.have_all = set()
        og.result_projs = {}
        og.received = {}
        og.moved_at = now
        og.deadline = self.deadline_for(og.plan, now)
        for w in sorted(og.participants):
            self._send(w, msg)

    def _have_all(self, msg: proto.HaveAll, now: float) -> None:
        og = self.open.get(msg.group)
        if og is None or msg.rev != og.rev or msg.worker not in og.members:
            return  # a late report from a superseded revision
        og.have_all.add(msg.worker)
        og.result_projs[msg.worker] = msg.proj
        if og.have_all >= set(og.members):
            self._finish(og, now, committed=True, reason="")

    def _finish(self, og: OpenGroup, now: float, *, committed: bool, reason: str) -> None:
        gid = og.group.id
        del self.open[gid]
        for w in sorted(og.participants | set(og.group.members)):
            self._send(
                w, proto.Commit(gid, og.rev) if committed else proto.Abandon(gid, reason, [])
            )
        if self.trace is None:
            if committed:
                self.former.complete(gid, now)
            else:
                self.former.abandon(gid, now)
        err = None
        if committed:
            err = relative_error(
                [og.result_projs[m] for m in og.members],
                og.weights,
                [self.offered_proj.get(m, float("nan")) for m in og.members],
            )
            if not err <= CHECK_TOLERANCE:  # also catches NaN
                self._event(
                    now,
                    "error",
                    f"group {gid} result check failed: relative error {err}",
                    level=Level.ERROR,
                    data={"group": gid},
                )
        self._out.append(
            GroupClosedRecord(
                group_id=gid,
                ended_at=now,
                outcome=GroupOutcome.COMPLETED if committed else GroupOutcome.ABANDONED,
                bytes_moved=og.bytes_moved,
                reason=reason,
                members=og.members,
                weights=og.weights,
                plan_json=og.plan.to_json(),
                revisions=og.rev,
                verify_err=err,
                dropped=tuple(sorted(set(og.group.members) - set(og.members))),
            )
        )
        for m in og.members:  # dropped members were set back to training when dropped
            if m in self.connected:
                self._status(m, WorkerState.TRAINING, group_id=None)
        if not committed:
            self._event(
                now,
                "group",
                f"group {gid} abandoned: {reason}",
                level=Level.WARNING,
                data={"group": gid, "members": list(og.members)},
            )

    def _revise(self, og: OpenGroup, now: float, why: str, *, keep: bool = False) -> None:
        """A new revision of ``og``. ``keep``: the members are unchanged and something the plan
        used died (aggregator, relay, link), so the routes still whole are kept and only the
        rest is planned again (:meth:`_plan_lost`); otherwise everything is."""
        if og.rev + 1 >= MAX_REVISIONS:
            self._finish(og, now, committed=False, reason=f"too many revisions ({why})")
            return
        lost = self._plan_lost(og, now) if keep else None
        if lost is not None:
            plan, kept = lost
        else:
            try:
                plan, _ = self._plan(og.members, og.scheme, now)
            except planner.PlanError as exc:
                self._finish(og, now, committed=False, reason=f"no plan after {why}: {exc}")
                return
            kept = []
        og.rev += 1
        og.plan = plan
        og.kept = kept
        resent = sum(r.elems for k, r in enumerate(plan.routes) if k >= len(kept))
        self._event(
            now,
            "recovery",
            f"group {og.group.id} revision {og.rev}: {why}"
            + (
                f"; {len(kept)} route(s) kept, {resent / plan.total:.0%} of the vector re-planned"
                if kept
                else ""
            ),
            data={
                "group": og.group.id,
                "rev": og.rev,
                "kept_routes": len(kept),
                "replanned_elems": resent,
            },
        )
        self._assign(og, now)

    def _plan_lost(self, og: OpenGroup, now: float) -> tuple[GroupPlan, list[list[int]]] | None:
        """The next revision of ``og`` that keeps every route whose nodes are alive and whose
        links are usable, and plans only the ranges of the others; with its ``Assign.kept``.

        The lost ranges (possibly several) are planned as one vector of their total length on
        the residual capacity (``_planning_bw``: what other open groups still use) with the
        group's scheme, and laid back onto the ranges (``assignment.place_routes``). Suspect
        workers that are no members count as lost: a route through one is not kept, and they
        neither aggregate nor relay in the new part. None when nothing can
        be kept (or nothing was lost), when the lost part finds no plan, or for a non-blocking
        group's first revision (its parts were cut by the pre-scatter split): then the caller
        plans everything again.

        Cost: one planner call on the lost bytes only; the kept routes' remaining time is not
        re-estimated but bounds the prediction from below (what was left of the old one)."""
        assert self.size_elems is not None
        if og.rev == 0 and og.prescatter:
            return None
        old = list(og.plan.routes)
        active = self._active_for(og.members, now)
        bw = self.capacity.planning
        kept = keepable_routes(old, set(active), lambda s, d: bool(bw[s, d] > 0.0))
        if not kept or len(kept) == len(old):
            return None
        lost = lost_ranges(old, kept, self.size_elems)
        lost_elems = sum(b - a for a, b in lost)
        try:
            part = self._solve(self._plan_call(og.scheme, og.members, lost_elems, active, now))
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

    def _suspects(self, now: float) -> set[int]:
        """Workers with failed links to ``SUSPECT_PEERS`` peers, until ``SUSPECT_S`` after the
        last one."""
        return {w for w, until in self.suspect_until.items() if until > now}

    def _suspect(self, src: int, dst: int, now: float) -> set[int]:
        """Link ``src -> dst`` just failed: count it against both ends (against none for the
        end that is a lost worker: its links all fail, and name no live culprit). Returns the
        workers that became suspect by it (were not suspect before)."""
        before = self._suspects(now)
        alive = set(self.alive())
        for w, peer in ((src, dst), (dst, src)):
            if w not in alive or peer not in alive:
                continue  # a link to a lost worker says nothing about this end
            peers = self.failed_at.setdefault(w, {})
            for old in [q for q, t in peers.items() if now - t >= SUSPECT_S]:
                del peers[old]
            peers[peer] = now
            if len(peers) >= SUSPECT_PEERS:
                self.suspect_until[w] = now + SUSPECT_S
        self._update_deferred(now)
        return self._suspects(now) - before

    def _worker_lost(self, worker: int, now: float, why: str) -> None:
        self.former.mark_dead(worker, now)
        self._status(worker, WorkerState.DEAD)
        self._event(
            now, "fault", f"worker {worker} lost: {why}", level=Level.WARNING, worker=worker
        )
        self._update_split()
        for og in list(self.open.values()):
            if worker in og.members:
                survivors = tuple(m for m in og.members if m != worker)
                if not survivors:
                    self._finish(og, now, committed=False, reason=f"worker {worker} lost")
                    continue
                if self.trace is None:
                    self._drop_member(og, worker)
                else:
                    og.members = survivors
                    og.weights = tuple(1.0 / len(survivors) for _ in survivors)
                self._revise(og, now, f"member {worker} lost")
            elif worker in og.participants:
                self._revise(og, now, f"aggregator {worker} lost", keep=True)

    def _next_trace_group(self, now: float) -> None:
        """Benchmark mode: start the next group of the trace once the previous one ended."""
        assert self.trace is not None
        if self.open or self.trace_next >= len(self.trace):
            return
        if len(self.offered_proj) < self.cfg.n:
            return  # not every worker has registered and offered its vector yet
        members = self.trace[self.trace_next]
        self.trace_next += 1
        weights = tuple(1.0 / len(members) for _ in members)
        group = Group(
            id=self.trace_next,
            members=members,
            iterations=(0,) * len(members),
            weights=weights,
            formed_at=now,
        )
        self._start_group(group, now)
        if self.trace_next == len(self.trace):
            self._out.append(MetaRecord({"trace_started_all": "1"}))
        elif self.open and not self.cfg.nonblocking:
            # The next group starts when this one ends, so it will be planned on the capacity
            # with no group in flight (a non-blocking plan depends on what was sent: not ahead).
            assert self.size_elems is not None
            after = self.trace[self.trace_next]
            active = self._active_for(after, now)
            elems = self.size_elems
            call = self._plan_call(self.scheme, after, elems, active, now, in_flight=False)
            self._out.append(PlanAhead(call))

    # -- links -------------------------------------------------------------------------------

    def _link_event(self, u: LinkUpdate, now: float) -> None:
        if u.kind is LinkChange.FAILED:
            return  # recorded with its reason by _link_failed
        if u.kind is LinkChange.RETRIED:
            self._event(
                now,
                "recovery",
                f"link {u.src}->{u.dst} back in plans: its probes pass again",
                data={"src": u.src, "dst": u.dst, "probe": True},
            )
        elif u.kind is LinkChange.ALIVE:
            self._event(
                now,
                "recovery",
                f"link {u.src}->{u.dst} alive again (probes): back in plans",
                data={"src": u.src, "dst": u.dst, "probe": True},
            )
        elif u.kind is LinkChange.DEAD:
            self._event(
                now,
                "fault",
                f"link {u.src}->{u.dst} failed: "
                + (
                    "no probes arrive"
                    if (u.src, u.dst) in self.capacity.dead
                    else f"no probes arrive on {u.dst}->{u.src}, which carries its ACKs"
                ),
                level=Level.WARNING,
                data={"src": u.src, "dst": u.dst, "probe": True},
            )
        else:
            self._event(
                now,
                "capacity",
                f"link {u.src}->{u.dst} measured {u.mbit:.1f} Mbit/s, "
                f"planned {u.was:.1f}: re-planning with the measurement",
                data={"src": u.src, "dst": u.dst, "mbit": u.mbit, "was": u.was},
            )

    def _update_deferred(self, now: float) -> None:
        """Keep poorly reached workers out of groups while others are ready (module doc)."""
        if self.trace is not None:
            return
        reach = self.capacity.reach_mbit(self.alive())
        poor = poorly_reached(reach)
        suspects = self._suspects(now) & set(reach)
        deferred = poor | suspects
        was = self.former.deferred
        if deferred == was:
            return
        self.former.set_deferred(deferred)
        median = float(np.median(list(reach.values()))) if reach else 0.0
        for w in sorted(deferred - was):
            why = (
                f"its live links reach it at {reach[w]:.1f} Mbit/s (median worker {median:.1f})"
                if w in poor
                else f"its links to {SUSPECT_PEERS}+ peers failed within {SUSPECT_S:g} s"
                " (suspect: more may be cut)"
            )
            self._event(
                now,
                "capacity",
                f"worker {w} deferred: {why}; grouped only when too few others are ready"
                f" or after {self.former.defer_max_wait:g} s",
                worker=w,
                data={"reach_mbit": reach[w], "median_mbit": median, "suspect": w not in poor},
            )
        for w in sorted(was - deferred):
            self._event(
                now,
                "capacity",
                f"worker {w} no longer deferred"
                + (f": reached at {reach[w]:.1f} Mbit/s" if w in reach else ""),
                worker=w,
            )

    def _link_failed(self, src: int, dst: int, reason: str, now: float) -> None:
        if not (0 <= src < self.cfg.n and 0 <= dst < self.cfg.n) or src == dst:
            raise proto.ProtocolError(f"link_failed: {src}->{dst} is not a link of this run")
        if self.capacity.fail(src, dst, now) is not None:
            self._event(
                now,
                "fault",
                f"link {src}->{dst} failed: {reason}",
                level=Level.WARNING,
                data={"src": src, "dst": dst},
            )
            self._update_split()
            newly = self._suspect(src, dst, now)
        else:
            newly = set()
        self._after_link_faults([(src, dst)], newly, now)

    def _link_health(self, msg: proto.LinkHealth, now: float) -> None:
        """Probe states of the links into ``msg.worker``, and its groups' progress."""
        self.progress_reported = True
        if any(not 0 <= s < self.cfg.n for s in msg.down):
            raise proto.ProtocolError(f"link_health.down: {msg.down} names no worker of this run")
        for entry in msg.received:
            if len(entry) != 3:
                raise proto.ProtocolError(f"link_health.received: {entry} is not [group, rev, n]")
            og = self.open.get(entry[0])
            if og is not None and entry[1] == og.rev:
                if entry[2] > og.received.get(msg.worker, 0):
                    og.received[msg.worker] = entry[2]
                    og.moved_at = now
        updates = self.capacity.probe_report(msg.worker, msg.down, now)
        for u in updates:
            self._link_event(u, now)
        if not updates:
            return
        self._update_split()
        dead = [(u.src, u.dst) for u in updates if u.kind is LinkChange.DEAD]
        newly: set[int] = set()
        for src, dst in dead:
            newly |= self._suspect(src, dst, now)
        self._after_link_faults(dead, newly, now)

    def _after_link_faults(
        self, dead: Sequence[tuple[int, int]], newly: set[int], now: float
    ) -> None:
        """Links ``dead`` just failed and made ``newly`` suspect: at most one revision of each
        open group, for all of it at once.

        * A member that just became suspect is dropped, like a lost member, if at least two
          members remain (it is told with an ``Abandon`` and trains on); the survivors get a
          whole new plan without it.
        * Otherwise a group whose plan uses a dead link, or a suspect that is no member as an
          aggregator or relay, gets a revision that keeps the routes clear of both
          (:meth:`_plan_lost`). So a suspect is set aside once, when it becomes suspect, and
          not once per cut link of it that the probes find later."""
        suspects = self._suspects(now)
        for og in list(self.open.values()):
            if og.group.id not in self.open:
                continue
            drop = [m for m in og.members if m in newly]
            if drop and self.trace is None and len(og.members) - len(drop) >= 2:
                self._drop_suspects(og, drop, now)
                continue
            used = [(s, d) for s, d in dead if og.plan.uses(s, d)]
            aside = sorted((og.participants - set(og.members)) & suspects)
            why = [f"link {s}->{d} failed during {og.plan.phase_of(s, d)}" for s, d in used[:1]]
            if aside:
                why.append(
                    f"suspect worker{'s' if len(aside) > 1 else ''}"
                    f" {', '.join(map(str, aside))} set aside"
                )
            if why:
                self._revise(og, now, "; ".join(why), keep=True)

    def _drop_member(self, og: OpenGroup, worker: int) -> None:
        """The former forgets ``worker`` in the group; the open group takes its new weights."""
        shrunk = self.former.drop_member(og.group.id, worker)
        og.members, og.weights = shrunk.members, shrunk.weights

    def _drop_suspects(self, og: OpenGroup, drop: Sequence[int], now: float) -> None:
        gid = og.group.id
        for w in drop:
            self._drop_member(og, w)
            self._send(w, proto.Abandon(gid, "dropped from the group: suspect", []))
            self._status(w, WorkerState.TRAINING, group_id=None)
        names = ", ".join(map(str, drop))
        self._revise(
            og,
            now,
            f"member{'s' if len(drop) > 1 else ''} {names} suspect"
            f" (links to {SUSPECT_PEERS}+ peers failed within {SUSPECT_S:g} s): dropped",
        )

    def _link_rates(self, msg: proto.LinkRates, now: float) -> None:
        """Fold measured arrival rates into the estimates; re-plan on drift ("measured" mode)."""
        for u in self.capacity.measure(msg.worker, msg.samples):
            self._link_event(u, now)
            self._update_split()

    def _security_event(self, note: SecurityNote, now: float) -> None:
        self._event(
            now,
            "security",
            f"worker {note.worker} rejected {note.count} frame(s) ({note.reason})"
            f" from {', '.join(note.peers)}",
            level=Level.WARNING,
            worker=note.worker,
            data={"reason": note.reason, "count": note.count, "peers": list(note.peers)},
        )

    # -- the lab's requests ------------------------------------------------------------------

    def _admin(self, msg: proto.Admin, now: float) -> None:
        args: dict[str, Any] = msg.args
        try:
            self._admin_op(msg.op, args, now)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, GroupingError | proto.ProtocolError | planner.PlanError):
                raise
            raise proto.ProtocolError(f"admin.args: bad arguments for {msg.op!r}: {exc!r}") from exc

    def _admin_op(self, op: str, args: dict[str, Any], now: float) -> None:
        if op == "set_p":
            p = int(args["p"])
            self.former.set_p(p)
            self._out.append(MetaRecord({"p": str(p)}))
            for group in self.former.form(now):
                self._start_group(group, now)
        elif op == "set_scheme":
            name = str(args["scheme"])
            if name not in GROUP_SCHEMES:
                raise proto.ProtocolError(f"admin.args.scheme: unknown {name!r}")
            scheme = Scheme(name)
            self.scheme = scheme
            self._out.append(MetaRecord({"scheme": scheme}))
        elif op == "set_link":
            src, dst, rate = int(args["src"]), int(args["dst"]), float(args["rate_mbit"])
            if not (0 <= src < self.cfg.n and 0 <= dst < self.cfg.n) or src == dst:
                raise proto.ProtocolError(f"admin.args: {src}->{dst} is not a link of this run")
            delay = args.get("delay_ms")
            self.capacity.set_link(src, dst, rate, delay_ms=None if delay is None else float(delay))
            self._update_split()
        elif op == "slow_worker":
            self._send(int(args["worker"]), proto.SetSlowdown(float(args["factor"])))
        elif op == "stop":
            self._out.append(StopRequested())
        else:
            raise proto.ProtocolError(f"admin.op: unknown {op!r}")
