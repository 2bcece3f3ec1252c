"""The life of every partial-reduce group, as a pure state machine.

No sockets, threads, clock or database: every call takes the events and ``now`` (seconds, any
epoch, non-decreasing) and returns the outputs, in the order they were decided: messages to
send (:class:`SendTo`) and rows to record (the ``*Record`` classes, in
``crew.control.records``). The coordinator (``crew.runtime.coordinator``) is the socket shell
around it; a simulator can drive it with simulated time. See docs/architecture.md §4 "The life
of a group".

A group's life::

    Ready x p ──► form (the former) ──► plan (crew.control.groupplanning) ──► Assign rev 0 to
    every worker with a role ──► HaveAll from every member ──► [Reveal, a Proof from every
    member: check "secret", crew.control.secretcheck] ──► Commit ──► completed

The former decides who averages with whom (``crew.control.former``): a ``GroupFormer`` forms
groups from the workers' readiness; a ``TraceFormer`` runs a benchmark's fixed trace, one
group at a time, and its next group is planned ahead (:class:`PlanAhead`). The life cycle treats
both alike, except that to a former of fixed groups a ``Ready`` is the offer of a fixed vector
(no readiness, no pre-scatter split) and it announces the next group's plan.

When something breaks while a group is open:

* a member dies: the survivors get a new revision, planned without it, and average among
  themselves; with no survivor left the group is abandoned;
* an aggregator that is no member dies, or a link the plan uses fails: a new revision is
  planned on what is left, and only for what was lost (``GroupPlanning.lost``): the routes
  whose nodes and links are all still alive are kept as they are (``Assign.kept``; the workers
  keep their partial sums, contributors and delivered results), and the planner's LP places
  the other routes' ranges on the residual capacity, with backup aggregators and relays. A
  member's loss re-plans everything (the weights change);
* a revision stops moving data (the workers' ``LinkHealth`` progress reports show no new bytes
  for ``stall_after``, see :meth:`GroupLifecycle.stall_after`): a new revision is planned at
  once; a revision that keeps moving bytes is left alone up to its hard deadline
  (:meth:`GroupLifecycle.deadline_for`, a generous multiple of the prediction);
* no revision completes within its deadline, or revisions run out (``MAX_REVISIONS``): the
  group is abandoned, its members keep their own models and train on. Every outcome is
  recorded: no group is left hanging.

Links (``crew.control.linkhealth``): the receivers' probes take dead links out of plans at once
and put them back when they pass again; a link a sender reports failed with data returns only
after its probes pass. A group whose plan uses a link that just died is revised at once. A
worker whose links to several peers failed within a few seconds is *suspect* (staggered cuts):
it is set aside once, when it becomes suspect, in every open group at the same time
(:meth:`GroupLifecycle._after_link_faults`): a group that has it as a member drops it like a
lost member (if at least two members remain and the former keeps it out of new groups: a
trace's groups keep theirs), and one that uses it only as an aggregator or relay gets one
revision that re-plans its routes on the others. While suspect it is in no plan of a group it
is no member of. Suspects, and workers the live links reach poorly, are kept out of new groups
while enough others are ready, for at most ``grouping.DEFER_MAX_WAIT_S``: with p close to the
live workers, groups run one at a time, and one such member would gate every one of them.

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

Cost: an event or tick is ``O(n^2)`` per open group, plus a planner call per group or revision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from crew.config import RunConfig, Scheme
from crew.control.admin import SetLink, SetP, SetScheme, SlowWorker, parse_admin
from crew.control.capacity import CapacityView
from crew.control.former import FixedFormer, Former, former_for
from crew.control.grouping import Group, GroupingError, GroupOutcome, WorkerState
from crew.control.groupplanning import BoundFn, GroupPlanning, PlanFn, PlanNonblockingFn
from crew.control.linkhealth import SUSPECT_PEERS, SUSPECT_S, LinkHealthTracker, LinkReport
from crew.control.opengroup import LifecycleSnapshot, OpenGroup, OpenGroupState, check_progress
from crew.control.records import (
    AllReduceRecord,
    Event,
    EventRecord,
    GroupClosedRecord,
    GroupOpenedRecord,
    GroupUnplannedRecord,
    IterationRecord,
    Level,
    MetaRecord,
    Outbox,
    Output,
    PlanAhead,
    SendTo,
    StopRequested,
    UtilisationRecord,
    WorkerDisconnected,
    WorkerStatusRecord,
    security_record,
)
from crew.control.rejections import RejectionLimiter
from crew.control.secretcheck import CheckMode, CodecTolerance, SecretChecks, draw_nonce
from crew.control.throttle import Throttle
from crew.control.verify import CHECK_TOLERANCE
from crew.plan import planner
from crew.plan.routes import link_load
from crew.plan.schemes import GroupPlan, plan_group, plan_group_nonblocking
from crew.wire import protocol as proto

__all__ = [
    "AWAY_FRACTION",
    "DEADLINE_FACTOR",
    "MAX_REVISIONS",
    "STALL_FACTOR",
    "STALL_MIN_S",
    "SUSPECT_PEERS",
    "SUSPECT_S",
    "AllReduceRecord",
    "BoundFn",
    "Event",
    "EventRecord",
    "GroupClosedRecord",
    "GroupLifecycle",
    "GroupOpenedRecord",
    "GroupUnplannedRecord",
    "IterationRecord",
    "UtilisationRecord",
    "Level",
    "LifecycleSnapshot",
    "MetaRecord",
    "OpenGroup",
    "OpenGroupState",
    "Output",
    "PlanAhead",
    "PlanFn",
    "PlanNonblockingFn",
    "SendTo",
    "StopRequested",
    "WorkerDisconnected",
    "WorkerStatusRecord",
]

log = logging.getLogger("crew.control.lifecycle")

MAX_REVISIONS = 8
# The coordinator ticks every quarter second; a gap above this share of the heartbeat timeout
# means it was not running, and the workers' silence over the gap is not theirs.
AWAY_FRACTION = 0.5
DEADLINE_FACTOR = 10.0  # a revision may take this many times its predicted time
STALL_MIN_S = 3.0  # a revision that received no data for this long (at least) has stalled
STALL_FACTOR = 3.0  # ... or for this many times its predicted time, if longer


class GroupLifecycle:
    """Forms, plans, revises, commits or abandons groups; see the module doc.

    ``former`` defaults to the one ``cfg`` asks for (``crew.control.former.former_for``: a
    benchmark's trace or readiness). ``plan``, ``plan_nonblocking`` and ``lower_bound`` default
    to the real planners; tests and simulators may pass others with the same signatures."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        capacity: CapacityView | None = None,
        former: Former | None = None,
        plan: PlanFn = plan_group,
        plan_nonblocking: PlanNonblockingFn = plan_group_nonblocking,
        lower_bound: BoundFn = planner.lower_bound,
        nonce: Callable[[], int] = draw_nonce,
        codec_tolerance: CodecTolerance | None = None,
    ):
        self.cfg = cfg
        self.capacity = capacity or CapacityView(
            cfg.bw_mbit, measured=cfg.capacity == "measured", delay_ms=cfg.delay_ms
        )
        self.former: Former = former if former is not None else former_for(cfg)
        # A former of fixed groups: Ready offers a vector, and its next group is known ahead.
        self._fixed = self.former if isinstance(self.former, FixedFormer) else None
        self.planning = GroupPlanning(
            cfg,
            self.capacity,
            plan=plan,
            plan_nonblocking=plan_nonblocking,
            lower_bound=lower_bound,
        )
        self.links = LinkHealthTracker(self.capacity)
        if cfg.check == CheckMode.SECRET and cfg.compress != "none" and codec_tolerance is None:
            raise ValueError(f"a secret check of {cfg.compress} payloads needs codec_tolerance")
        self.secret = SecretChecks.for_run(cfg, codec_tolerance, nonce)
        self.scheme = cfg.scheme
        self.size_elems: int | None = None
        self.connected: set[int] = set()  # workers with a live control connection
        self.open: dict[int, OpenGroup] = {}
        self.offered_proj: dict[int, float] = {}  # worker -> projection of its offered vector
        # Non-blocking mode: the a2a split ready workers scatter with before their group forms.
        self.split: planner.Plan | None = None
        self.split_epoch = -1
        self.ready_at: dict[int, tuple[float, int]] = {}  # worker -> (time, split epoch used)
        self.rejections = RejectionLimiter()
        self.errors = Throttle()  # unforeseen failures of a tick: one record per kind per 10 s
        # Whether the workers report their groups' progress (LinkHealth): only then can a
        # revision be judged stalled before its hard deadline.
        self.progress_reported = False
        self._looked_at: float | None = None  # when an event or tick last reached us
        self._out = Outbox()

    # -- the public calls --------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Output]:
        """One event; a refused one (bad worker id, impossible transition) is recorded as a
        warning, with what was decided before the refusal kept."""
        self._out = Outbox()
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
            self._out.event(now, "warning", f"refused {kind}: {exc}", level=Level.WARNING)
        except Exception as exc:  # a message no check foresaw must not end the run: refuse it
            log.exception("event %s failed", kind)
            self._out.event(
                now, "error", f"refused {kind} ({type(event).__name__}): {exc!r}", level=Level.ERROR
            )
        return self._out.take()

    def tick(self, now: float) -> list[Output]:
        """Time passes: rejection summaries, link retries, silent workers, deadlines, holds."""
        self._out = Outbox()
        try:
            self._watch(now)
            for note in self.rejections.expire(now):
                self._out.add(security_record(note, now))
            self._links(self.links.retry_due(now), now)
            for worker in self.former.expire(now):
                if worker in self.connected:
                    self._worker_lost(worker, now, "no heartbeat")
            self._update_deferred(now)
            for og in list(self.open.values()):
                proving = self.secret.waiting(og.group.id, og.rev)  # all data moved: no stall
                stalled = not proving and now - og.moved_at > self.stall_after(og.plan)
                if now > og.deadline and proving:
                    why = self.secret.overdue(og.group.id)
                    self._finish(og, now, committed=False, reason=why, error=True)
                elif now > og.deadline:
                    self._revise(og, now, f"revision {og.rev} missed its deadline")
                elif self.progress_reported and stalled:
                    self._revise(
                        og, now, f"revision {og.rev} received no data for {now - og.moved_at:.1f} s"
                    )
            # The isolation guard may hold a group back for a while, and a trace forms its next
            # group once the open one has ended: only a later call forms them.
            for group in self.former.form(now):
                self._start_group(group, now)
        except Exception as exc:  # keep time moving: the next tick tries again
            log.exception("tick failed")
            if self.errors.due(f"tick {type(exc).__name__}", now):  # not one row per tick
                self._out.event(now, "error", f"tick failed: {exc!r}", level=Level.ERROR)
        return self._out.take()

    def shutdown(self, now: float, reason: str) -> list[Output]:
        """The run ends: open groups are abandoned, every worker is told to stop."""
        self._out = Outbox()
        for note in self.rejections.flush_all():
            self._out.add(security_record(note, now))
        for og in list(self.open.values()):
            self._finish(og, now, committed=False, reason="run stopped")
        for w in sorted(self.connected):
            self._out.send(w, proto.Stop(reason))
        return self._out.take()

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
            open_groups=tuple(og.freeze() for og in self.open.values()),
            scheme=self.scheme,
            size_elems=self.size_elems,
            connected=frozenset(self.connected),
            offered_proj=tuple(sorted(self.offered_proj.items())),
        )

    def restore(self, snap: LifecycleSnapshot) -> None:
        """Take over the state of ``snap`` (the former is the caller's to rebuild)."""
        self.open = {s.group.id: OpenGroup.thaw(s) for s in snap.open_groups}
        self.scheme = snap.scheme
        self.size_elems = snap.size_elems
        self.connected = set(snap.connected)
        self.offered_proj = dict(snap.offered_proj)

    def plan_for(self, members: tuple[int, ...], now: float) -> tuple[GroupPlan, float]:
        """The plan and bound a group of ``members`` would get now, exactly as a forming group
        gets them (``lab.studies.planbench timing --db`` replays a run's groups through it)."""
        return self._plan(tuple(members), self.scheme, now)

    # -- liveness ----------------------------------------------------------------------------

    def _watch(self, now: float) -> None:
        """Excuse the workers' silence over a gap in the coordinator's own attention."""
        last, self._looked_at = self._looked_at, now
        if last is None or now - last <= AWAY_FRACTION * self.cfg.heartbeat_timeout_s:
            return
        self.former.excuse(now - last, now)
        self._out.event(
            now,
            "coordinator",
            f"the coordinator was away {now - last:.1f} s (no event or tick reached it):"
            " the workers' silence in that time is not counted",
            level=Level.WARNING,
        )

    def _heard_again(self, worker: int, now: float) -> None:
        """A worker lost to silence spoke on its open connection: it is back (module doc)."""
        self.former.join(worker, now)
        self._out.status(now, worker, WorkerState.TRAINING)
        self._out.event(
            now,
            "recovery",
            f"worker {worker} heard again after it was lost to silence: back in groups",
            worker=worker,
        )
        self._update_split()

    def _worker_lost(self, worker: int, now: float, why: str) -> None:
        self.former.mark_dead(worker, now)
        self._out.status(now, worker, WorkerState.DEAD)
        self._out.event(
            now, "fault", f"worker {worker} lost: {why}", level=Level.WARNING, worker=worker
        )
        self._update_split()
        for og in list(self.open.values()):
            if worker in og.members:
                if len(og.members) == 1:
                    self._finish(og, now, committed=False, reason=f"worker {worker} lost")
                    continue
                shrunk = self.former.drop_member(og.group.id, worker)
                og.members, og.weights = shrunk.members, shrunk.weights
                self._revise(og, now, f"member {worker} lost")
            elif worker in og.participants:
                self._revise(og, now, f"aggregator {worker} lost", keep=True)

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
        elif isinstance(msg, proto.Ready):
            self._ready(msg, now)
        elif isinstance(msg, proto.Metrics):
            self._out.add(IterationRecord(msg.t, worker, msg.iteration, msg.loss, msg.accuracy))
        elif isinstance(msg, proto.Utilisation):
            self._out.add(UtilisationRecord.of(msg))
        elif isinstance(msg, proto.HaveAll):
            self._have_all(msg, now)
        elif isinstance(msg, proto.Proof):
            verdict = self.secret.proof(msg)
            og = None if verdict is None else self.open.get(msg.group)
            if verdict is not None and og is not None and og.rev == verdict.rev:
                ok, err = verdict.passed, og.verify_err
                self._finish(og, now, committed=ok, reason=verdict.reason, err=err, error=not ok)
        elif isinstance(msg, proto.LinkFailed):
            self._links(self.links.sender_failed(msg.src, msg.dst, msg.reason, now), now)
        elif isinstance(msg, proto.LinkRates):
            # "measured" mode: each drift re-plans at once (a new split per link)
            for drift in self.links.measured(worker, msg.samples).notes:
                self._links(LinkReport((drift,)), now)
        elif isinstance(msg, proto.LinkHealth):
            # the probe states of the links into the worker, and its groups' progress
            self.progress_reported = True
            self.links.check_down(msg.down)
            for entry in msg.received:
                gid, rev, received = check_progress(entry)
                og = self.open.get(gid)
                if og is not None:
                    og.progress(worker, rev, received, now)
            self._links(self.links.probed(worker, msg.down, now), now)
        elif isinstance(msg, proto.Rejected):
            for note in self.rejections.rejected(worker, msg.reason, msg.peer, now):
                self._out.add(security_record(note, now))
        elif isinstance(msg, proto.OpTime):
            n = self.cfg.n
            # Gloo's ring all-reduce: each of n ranks sends 2(n-1)/n of the vector
            self._out.add(
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
        w = msg.worker
        self.connected.add(w)
        self.capacity.forget_worker(w)
        self.former.join(w, now)
        self._out.status(now, w, WorkerState.TRAINING, iteration=msg.iteration, pid=msg.pid)
        self._out.event(now, "worker", f"worker {w} registered (pid {msg.pid})", worker=w)
        self._update_split()

    def _ready(self, msg: proto.Ready, now: float) -> None:
        worker = msg.worker
        if self._fixed is not None:
            # the fixed vector it offers for the benchmark; its groups form on ticks
            self.offered_proj[worker] = msg.proj
            self.former.ready(worker, msg.iteration, now)
            return
        self.former.heartbeat(worker, now)
        self.offered_proj[worker] = msg.proj
        self.ready_at[worker] = (now, msg.split_epoch)
        self._out.status(now, worker, WorkerState.READY, iteration=msg.iteration)
        self._update_deferred(now)
        for group in self.former.ready(worker, msg.iteration, now):
            self._start_group(group, now)

    def _have_all(self, msg: proto.HaveAll, now: float) -> None:
        og = self.open.get(msg.group)
        if og is None or msg.rev != og.rev or msg.worker not in og.members:
            return  # a late report from a superseded revision
        og.have_all.add(msg.worker)
        og.result_projs[msg.worker] = msg.proj
        if og.have_all < set(og.members):
            return
        err = og.public_error(self.offered_proj, self.cfg.clip_rho is not None)  # before applying
        if not err <= CHECK_TOLERANCE:  # also catches NaN
            why = f"result check failed: relative error {err:.3g}"
            self._finish(og, now, committed=False, reason=why, err=err, error=True)
            return
        og.verify_err = err
        reveal = self.secret.start(og.group.id, og.rev, og.members, og.weights, og.plan)
        if reveal is None:
            self._finish(og, now, committed=True, reason="", err=err)
            return
        for m in og.members:
            self._out.send(m, reveal)

    def _admin(self, msg: proto.Admin, now: float) -> None:
        """The lab's requests (``crew.control.admin``): change p, the scheme or a link's rate;
        slow a worker; stop."""
        req = parse_admin(msg, self.cfg.n)
        if isinstance(req, SetP):
            self.former.set_p(req.p)
            self._out.add(MetaRecord({"p": str(req.p)}))
            for group in self.former.form(now):
                self._start_group(group, now)
        elif isinstance(req, SetScheme):
            self.scheme = Scheme(req.scheme)
            self._out.add(MetaRecord({"scheme": self.scheme}))
        elif isinstance(req, SetLink):
            self.capacity.set_link(req.src, req.dst, req.rate_mbit, delay_ms=req.delay_ms)
            self._update_split()
        elif isinstance(req, SlowWorker):
            self._out.send(req.worker, proto.SetSlowdown(req.factor))
        else:
            self._out.add(StopRequested())

    # -- groups ------------------------------------------------------------------------------

    def _start_group(self, group: Group, now: float) -> None:
        assert self.size_elems is not None
        split = self.split
        if not (
            self.cfg.nonblocking
            and self.scheme in (Scheme.CREW, Scheme.CREW_PAPER)
            and all(self.ready_at.get(m, (0.0, -1))[1] == self.split_epoch for m in group.members)
        ):
            split = None  # no pre-scatter, or someone scattered with an older split: plan normally
        try:
            if split is not None:
                ready_since = {m: self.ready_at[m][0] for m in group.members}
                active = self._active_for(group.members, now)
                plan, bound = self.planning.nonblocking(
                    self.scheme, group.members, active, split, ready_since, now, self.size_elems
                )
            else:
                plan, bound = self._plan(group.members, self.scheme, now)
        except planner.PlanError as exc:
            reason = f"no plan: {exc}"
            self._out.add(GroupUnplannedRecord(group, self.scheme, now, reason))
            self.former.abandon(group.id, now)
            for m in group.members:
                self._out.send(m, proto.Abandon(group.id, reason, list(group.members)))
            self._announce(now)
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
        if split is not None:
            og.prescatter = [[s.worker, s.start, s.stop] for s in split.segments]
            og.split_epoch = self.split_epoch
        self.open[group.id] = og
        self._out.add(
            GroupOpenedRecord(group, self.scheme, now, plan.predicted_s, bound, plan.to_json())
        )
        for m in group.members:
            self._out.status(now, m, WorkerState.GROUPED, group_id=group.id)
        self._assign(og, now)
        self._announce(now)

    def _announce(self, now: float) -> None:
        """After a group of fixed groups started: the call that will plan the next one, to make
        while this one runs (:class:`PlanAhead`), or that all of them have started."""
        if self._fixed is None:
            return
        after = self._fixed.upcoming()
        if after is None:
            self._out.add(MetaRecord({"trace_started_all": "1"}))
        elif self.open and not self.cfg.nonblocking:
            # The next group starts when this one ends, so it will be planned on the capacity
            # with no group in flight (a non-blocking plan depends on what was sent: not ahead).
            assert self.size_elems is not None
            size = self.size_elems
            active = self._active_for(after, now)
            call = self.planning.call(self.scheme, after, size, active, (), now, size)
            self._out.add(PlanAhead(call))

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
            clip_rho=self.secret.clip_rho(og.group.id),
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
            self._out.send(w, msg)

    def _finish(
        self,
        og: OpenGroup,
        now: float,
        *,
        committed: bool,
        reason: str,
        err: float | None = None,
        error: bool = False,
    ) -> None:
        """Close ``og``. ``err``: its public check's relative error; ``error``: it failed a
        check (an ERROR event names it)."""
        gid = og.group.id
        del self.open[gid]
        self.secret.end(gid)
        if error:
            self._out.event(
                now, "error", f"group {gid} {reason}", level=Level.ERROR, data={"group": gid}
            )
        for w in sorted(og.participants | set(og.group.members)):
            self._out.send(
                w, proto.Commit(gid, og.rev) if committed else proto.Abandon(gid, reason, [])
            )
        if committed:
            self.former.complete(gid, now)
        else:
            self.former.abandon(gid, now)
        self._out.add(
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
                self._out.status(now, m, WorkerState.TRAINING, group_id=None)
        if not committed:
            self._out.event(
                now,
                "group",
                f"group {gid} abandoned: {reason}",
                level=Level.WARNING,
                data={"group": gid, "members": list(og.members)},
            )

    def _revise(self, og: OpenGroup, now: float, why: str, *, keep: bool = False) -> None:
        """A new revision of ``og``. ``keep``: the members are unchanged and something the plan
        used died (aggregator, relay, link), so the routes still whole are kept and only the
        rest is planned again (``GroupPlanning.lost``); otherwise everything is."""
        if og.rev + 1 >= MAX_REVISIONS:
            self._finish(og, now, committed=False, reason=f"too many revisions ({why})")
            return
        assert self.size_elems is not None
        active = self._active_for(og.members, now)
        lost = (
            self.planning.lost(og, active, self.open.values(), now, self.size_elems)
            if keep
            else None
        )
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
        self._out.event(
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

    # -- planning ----------------------------------------------------------------------------

    def _plan(
        self, members: tuple[int, ...], scheme: Scheme, now: float
    ) -> tuple[GroupPlan, float]:
        """The whole vector's plan for ``members`` on the capacity the open groups leave, and
        its lower bound."""
        assert self.size_elems is not None
        active = self._active_for(members, now)
        return self.planning.plan(scheme, members, active, self.open.values(), now, self.size_elems)

    def _active_for(self, members: tuple[int, ...], now: float) -> list[int]:
        """The workers a plan for ``members`` may use: the live ones, without the suspects
        that are no members (a suspect aggregates or relays for no one while suspect)."""
        aside = self.links.suspects(now) - set(members)
        return [w for w in self.alive() if w not in aside]

    def _update_split(self) -> None:
        """Non-blocking mode: re-solve the a2a split when the workers or links change (not for
        fixed groups: their workers offer fixed vectors and pre-scatter nothing)."""
        if not self.cfg.nonblocking or self.size_elems is None or self._fixed is not None:
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
            self._out.send(w, proto.Split(self.split_epoch, segments, part_elems))

    # -- links -------------------------------------------------------------------------------

    def _links(self, report: LinkReport, now: float) -> None:
        """Record what changed on the links and act on it: a new split, the suspicion each
        failed link adds (with who is deferred after it), and the open groups' revisions."""
        for note in report.notes:
            self._out.add(note.record(now))
        if report.changed:
            self._update_split()
        newly: set[int] = set()
        alive = self.alive()
        for src, dst in report.failed:
            newly |= self.links.suspect(src, dst, alive, now)
            self._update_deferred(now)
        if report.dead or newly:
            self._after_link_faults(report.dead, newly, now)

    def _update_deferred(self, now: float) -> None:
        """Keep poorly reached and suspect workers out of new groups while others are ready
        (``crew.control.linkhealth``); records what the former applied."""
        deferral = self.links.deferral(self.alive(), now)
        was = self.former.deferred
        if deferral.workers == was:
            return
        self.former.set_deferred(deferral.workers)
        applied = self.former.deferred
        for record in deferral.notes(was, applied, self.former.defer_max_wait, now):
            self._out.add(record)

    def _after_link_faults(
        self, dead: tuple[tuple[int, int], ...], newly: set[int], now: float
    ) -> None:
        """Links ``dead`` just failed and made ``newly`` suspect: at most one revision of each
        open group, for all of it at once.

        * A member that just became suspect, and that the former now keeps out of new groups,
          is dropped, like a lost member, if at least two members remain (it is told with an
          ``Abandon`` and trains on); the survivors get a whole new plan without it.
        * Otherwise a group whose plan uses a dead link, or a suspect that is no member as an
          aggregator or relay, gets a revision that keeps the routes clear of both
          (``GroupPlanning.lost``). So a suspect is set aside once, when it becomes suspect, and
          not once per cut link of it that the probes find later."""
        suspects = self.links.suspects(now)
        for og in list(self.open.values()):
            if og.group.id not in self.open:
                continue
            drop = [m for m in og.members if m in newly and m in self.former.deferred]
            if drop and len(og.members) - len(drop) >= 2:
                gid = og.group.id
                for w in drop:
                    shrunk = self.former.drop_member(gid, w)
                    og.members, og.weights = shrunk.members, shrunk.weights
                    self._out.send(w, proto.Abandon(gid, "dropped from the group: suspect", []))
                    self._out.status(now, w, WorkerState.TRAINING, group_id=None)
                names = ", ".join(map(str, drop))
                self._revise(
                    og,
                    now,
                    f"member{'s' if len(drop) > 1 else ''} {names} suspect"
                    f" (links to {SUSPECT_PEERS}+ peers failed within {SUSPECT_S:g} s): dropped",
                )
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
