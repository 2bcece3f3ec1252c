"""The event loop: workers compute, become ready, form groups, move data, train on.

One :class:`Simulation` is one run in simulated time. It owns

* the workers: each computes an iteration whose time is drawn from its straggler profile
  exactly as the lab's worker draws it (``crew.train.stragglers.ComputeDelay`` seeded
  ``seed * 1000 + worker``; the iteration takes ``max(sample, compute_s)``, where
  ``compute_s`` stands for the real step time the lab pads up to, plus the executor's
  ``turnaround_s``), then reports ready and waits for its group's commit or abandonment;
* the life cycle: the real ``crew.control.lifecycle.GroupLifecycle`` (group former, planner,
  revisions, failover, deadlines) behind the adapter ``crew.sim.lifecycle.SimLifecycle``,
  fed with events and obeyed;
* the network (``crew.sim.network``): each assigned revision's routes are timed on FCFS
  link queues (``RouteTimer`` on ``LinkQueues``);
* the coordinator's one thread: with ``PlanDelay.MEASURED`` it plans groups one after
  another, and a Ready or a revision's delivery that arrives meanwhile waits for the plan
  (each plan as long as its real call took here, or as ``SimConfig.plan_times`` say);
* faults: link cuts (permanent) and worker crashes at given times, and rate steps of links
  that follow a trace (``crew.drift.DriftSchedule.steps``: what the lab applies each second),
  told to the planner only with ``SimConfig.oracle``.

Time only jumps from event to event: a compute finishing, a node holding a whole range
(store-and-forward), a revision's data all delivered, a fault, a deadline or isolation-guard
tick, a 1 Hz link sample, the end. Nothing sleeps.

Invariants checked as it runs (a violation raises :class:`SimInvariantError`): no worker is in
two open groups; no link carries more than its capacity; every group ends completed or
abandoned (open ones are abandoned with "run stopped" at the end, as the coordinator does).
"""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from crew.config import RunConfig, Scheme
from crew.sim.lifecycle import Abandon, Assign, Commit, Decision, SimLifecycle
from crew.sim.network import ExecutorModel, LinkQueues, RouteTimer, part_bytes
from crew.sim.record import Recorder
from crew.sim.topogen import SimTopology
from crew.train.stragglers import ComputeDelay

log = logging.getLogger(__name__)

TICK_S = 0.25  # the coordinator's tick: isolation-guard holds are re-tried this often


class SimInvariantError(AssertionError):
    """The simulation broke one of its invariants (see the module docstring)."""


class FaultKind(enum.Enum):
    CUT_LINK = "cut_link"
    KILL_WORKER = "kill_worker"
    SET_RATE = "set_rate"  # a rate trace's step (crew.ratetrace); not a failure


@dataclass(frozen=True)
class Fault:
    at: float
    kind: FaultKind
    a: int  # src of the link, or the worker
    b: int = -1  # dst of the link
    mbit: float = 0.0  # SET_RATE: the link's new rate

    def describe(self) -> str:
        if self.kind is FaultKind.CUT_LINK:
            return f"cut link {self.a}->{self.b}"
        if self.kind is FaultKind.SET_RATE:
            return f"link {self.a}->{self.b} at {self.mbit:g} Mbit/s"
        return f"kill worker {self.a}"


@dataclass(frozen=True)
class PlanDelay(enum.Enum):
    """Whether a group's routes wait for its plan.

    ``NONE``: they start when the group forms (deterministic; the paper-scale default).
    ``MEASURED``: the coordinator plans groups one after another, and a group's routes start
    once its real planner call has returned: after the wall time that call took here (or the
    next of ``SimConfig.plan_times``), queued behind the plans before it (the lab's op time
    includes its plan). Runs then depend on the machine's speed, unless the times are given."""

    NONE = "none"
    MEASURED = "measured"


@dataclass(frozen=True)
class SimConfig:
    scheme: Scheme = Scheme.CREW
    p: int = 5
    duration_s: float = 50.0
    seed: int = 0
    size_bytes: int = 180_000_000  # the paper's model, ~180 MB
    # payload share of the shaped rate, as the lab measures with TCP; the plans count it too
    goodput: float = RunConfig.default("goodput")
    compute_s: float = 0.0  # the real step time the straggler sample pads up to
    staleness: bool = False
    committed_capacity: bool = True
    shared_links: bool = True
    """False: every group revision has the links to itself (``LinkQueues.private``), and plans
    on their full capacity (no committed capacity): concurrent groups never slow each other.
    Not the lab's network; a model some simulators make."""
    group_timeout_min_s: float = 30.0
    sample_s: float = 1.0  # link sample interval (the lab's monitor: 1 Hz)
    epoch: float | None = None  # Unix time of simulated t=0 in the run DB (default: now)
    plan_rounds: int | None = None
    """Column-generation rounds per crew plan at most (``RouteLPSettings.max_rounds``; None: the
    planner's own bound). Rounds, not seconds, so that a run does not depend on the machine."""
    plan_level_tol: float = 0.0
    """Relative tolerance of crew's latency-level search (``RouteLPSettings.level_tolerance``; 0:
    exact). Like ``plan_rounds``, a bound on work that does not depend on the machine."""
    executor: ExecutorModel = field(default_factory=ExecutorModel)
    plan_delay: PlanDelay = PlanDelay.NONE
    helpers: int | None = None
    """Plan each group over its members and this many best-connected others
    (``crew.plan.candidates``); None: over every worker."""
    history: bool = True
    """Keep every group's times and the life cycle's records (for ``SimResult.group_times`` and
    a run database); False keeps only open groups and the last ``PLAN_TIMES_KEPT`` planner
    times, so that memory does not grow with the groups (a run of a million groups)."""
    stop_after_groups: int | None = None
    """End the run once this many groups have completed (None: run for ``duration_s``)."""
    oracle: bool = False
    """Tell the planner each ``SET_RATE`` step as it happens (the lab's ``--capacity oracle``);
    False: it plans on the configured rates throughout."""
    join_at: tuple[float, ...] | None = None
    """Each worker's start, seconds after t = 0 (a lab run's registrations, which spread over
    1.5-5 s at n = 20 to 32); None: every worker starts at t = 0."""
    plan_times: tuple[float, ...] | None = None
    """With ``PlanDelay.MEASURED``: each plan takes the next of these seconds, in order and
    cycled, instead of the wall time of the simulator's own planner call (a lab run's recorded
    plan costs: its coordinator plans on a host busy with every worker's data path, where the
    same calls take longer than on a quiet one). None: the call's own time."""

    def __post_init__(self) -> None:
        if self.size_bytes <= 0 or self.size_bytes % 4:
            raise ValueError(f"size_bytes must be a positive multiple of 4, got {self.size_bytes}")
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ValueError(f"duration_s must be positive, got {self.duration_s}")
        if self.join_at is not None and not all(0 <= t < math.inf for t in self.join_at):
            raise ValueError(f"join_at: every start must be finite and >= 0, got {self.join_at}")
        if self.sample_s <= 0:
            raise ValueError(f"sample_s must be positive, got {self.sample_s}")
        if self.plan_rounds is not None and self.plan_rounds < 1:
            raise ValueError(f"plan_rounds must be >= 1, got {self.plan_rounds}")
        if not 0.0 <= self.plan_level_tol < 1.0:
            raise ValueError(f"plan_level_tol must be in [0, 1), got {self.plan_level_tol}")
        if self.helpers is not None and self.helpers < 0:
            raise ValueError(f"helpers must be >= 0, got {self.helpers}")
        if self.stop_after_groups is not None and self.stop_after_groups < 1:
            raise ValueError(f"stop_after_groups must be >= 1, got {self.stop_after_groups}")
        if self.plan_times is not None:
            if self.plan_delay is not PlanDelay.MEASURED:
                raise ValueError(
                    "plan_times needs plan_delay=measured: without it plans take no time"
                )
            if not self.plan_times or not all(0 <= t < math.inf for t in self.plan_times):
                raise ValueError(
                    f"plan_times: one or more finite seconds >= 0, got {self.plan_times!r}"
                )


PROGRESS_EVERY_S = 5  # simulated seconds between progress lines (logged at INFO)
PLAN_ROUNDS_FROM_N = 16
LARGE_PLAN_ROUNDS = 5
"""Above PLAN_ROUNDS_FROM_N workers, crew's route LP gets this many column-generation rounds per
group by default. At n = 60 an unbounded plan takes ~1 s (60 rounds, hundreds of columns: the
optimum spreads a group over most of the network's links), and a run plans ~350 groups (12
rounds: 0.24 s per plan, 99 s per run). A capped plan is within the gap that
``lab.studies.planbench timing --max-rounds 5`` reports (median, max) of the LP optimum."""


def default_plan_rounds(n: int) -> int | None:
    """The simulator's default ``SimConfig.plan_rounds`` for n workers."""
    return LARGE_PLAN_ROUNDS if n > PLAN_ROUNDS_FROM_N else None


@dataclass
class SimResult:
    n: int
    scheme: str
    p: int
    duration_s: float
    rounds: list[int]
    completed: int
    abandoned: int
    revisions: int
    wall_s: float
    plan_seconds: list[float]
    jobs: int
    group_times: list[tuple[int, float, float]] = field(default_factory=list)  # gid, start, end

    @property
    def rounds_per_worker(self) -> float:
        return float(np.mean(self.rounds)) if self.rounds else 0.0


class _Ev(enum.IntEnum):  # order of simultaneous events
    FAULT = 0
    JOIN = 1  # a worker starts late (SimConfig.join_at)
    DONE = 2
    DELIVERED = 3  # a revision's data arrived while the coordinator was planning
    WAKE = 4
    COMPUTE = 5
    READY = 6  # a worker's Ready arrived while the coordinator was planning
    TICK = 7
    SAMPLE = 8
    END = 9


class Simulation:
    def __init__(
        self,
        topo: SimTopology,
        cfg: SimConfig,
        faults: Sequence[Fault] = (),
        recorder: Recorder | None = None,
    ) -> None:
        n = topo.n
        if not 1 <= cfg.p <= n:
            raise ValueError(f"p must be in [1, {n}], got {cfg.p}")
        for f in faults:
            link = f.kind in (FaultKind.CUT_LINK, FaultKind.SET_RATE)
            if not 0 <= f.a < n or (link and not (0 <= f.b < n and f.a != f.b)):
                raise ValueError(f"fault {f.describe()}: not a worker/link of {n} workers")
        if cfg.join_at is not None and len(cfg.join_at) != n:
            raise ValueError(f"join_at: {len(cfg.join_at)} starts for {n} workers")
        self.topo = topo
        self.cfg = cfg
        self.n = n
        self.net = LinkQueues(topo.rate_mbit, cfg.goodput, topo.delay_ms / 1000.0, cfg.executor)
        self.part = part_bytes(cfg.size_bytes, n)
        self.transfers: dict[int, tuple[int, RouteTimer]] = {}  # gid -> (rev, timer)
        self.life = SimLifecycle(
            n,
            cfg.p,
            cfg.scheme,
            cfg.size_bytes,
            topo.rate_mbit,
            seed=cfg.seed,
            staleness=cfg.staleness,
            committed_capacity=cfg.committed_capacity and cfg.shared_links,
            group_timeout_min_s=cfg.group_timeout_min_s,
            plan_rounds=cfg.plan_rounds,
            plan_level_tol=cfg.plan_level_tol,
            helpers=cfg.helpers,
            goodput=cfg.goodput,  # plans count the payload rate the network delivers
            history=cfg.history,
        )
        self.rec = recorder
        self.delays = [
            ComputeDelay.for_worker(s, cfg.seed, w) for w, s in enumerate(topo.stragglers)
        ]
        self.iteration = [0] * n
        self.alive = [True] * n
        self.token = [0] * n  # bumps on death, so a dead worker's compute event is ignored
        self.in_group: dict[int, int] = {}  # worker -> open group id
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.faults = sorted(faults, key=lambda f: f.at)
        self.group_start: dict[int, float] = {}  # open groups only
        self.result_times: list[tuple[int, float, float]] = []
        self.completed = self.abandoned = self.revisions = 0
        self.last_sent = np.zeros(n * n)
        self.tick_pending = False
        self.planner_free = 0.0  # PlanDelay.MEASURED: when the coordinator's planner is free
        self._plan_times = None if cfg.plan_times is None else itertools.cycle(cfg.plan_times)
        self.on_commit: Callable[[Simulation], None] | None = None
        """Called after each event that completed one or more groups (a long run's meter)."""

    # ---- scheduling -----------------------------------------------------------------------

    def _push(self, t: float, kind: _Ev, payload: object) -> None:
        heapq.heappush(self.heap, (t, int(kind), next(self.seq), payload))

    def _compute(self, w: int) -> None:
        sample = self.delays[w].sample()
        dur = max(sample * self.delays[w].slowdown, self.cfg.compute_s)
        dur += self.cfg.executor.turnaround_s  # Commit in, Ready out (ExecutorModel)
        self._push(self.now + dur, _Ev.COMPUTE, (w, self.token[w]))

    def _join(self, w: int) -> None:
        self._apply(self.life.join(w, self.now))
        self._compute(w)

    def _planning(self, kind: _Ev, payload: tuple[int, int]) -> bool:
        """With ``PlanDelay.MEASURED`` the coordinator is one thread that plans groups one
        after another, as the lab's event loop does: a message that arrives while it plans is
        handled once the plan is made. True: ``payload`` is queued for then."""
        if self.cfg.plan_delay is PlanDelay.MEASURED and self.planner_free > self.now:
            self._push(self.planner_free, kind, payload)
            return True
        return False

    def _ready(self, w: int, token: int) -> None:
        if self.alive[w] and token == self.token[w] and not self._planning(_Ev.READY, (w, token)):
            self._apply(self.life.ready(w, self.iteration[w], self.now))

    def _delivered(self, gid: int, rev: int) -> None:
        og = self.life.life.open.get(gid)
        if og is not None and og.rev == rev and not self._planning(_Ev.DELIVERED, (gid, rev)):
            self._apply(self.life.delivered(gid, self.now))

    # ---- the loop -------------------------------------------------------------------------

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        # The route LP reuses earlier plans' columns (warm starts): a capped plan depends on
        # them, so every run starts from empty caches and replays the same in any process.
        self.life.planner.clear()
        for w in range(self.n):
            if self.cfg.join_at is None or self.cfg.join_at[w] == 0:
                self._join(w)
            else:
                self._push(self.cfg.join_at[w], _Ev.JOIN, w)
        for f in self.faults:
            self._push(f.at, _Ev.FAULT, f)
        if self.cfg.sample_s <= self.cfg.duration_s:  # each sample schedules the next
            self._push(self.cfg.sample_s, _Ev.SAMPLE, None)
        self._push(self.cfg.duration_s, _Ev.END, None)
        # Bounded: every iteration of the loop consumes a heap event or a stage end, and both
        # are finite before the END event (stages end at most once per revision).
        # Bounded: every pass pops one event; events are finite before END (computes and
        # releases only follow from earlier events, each revision's wakeups are its edges).
        stop = self.cfg.stop_after_groups
        done_before = 0
        while self.heap:
            t, kind, _, payload = heapq.heappop(self.heap)
            self.now = t
            if kind == _Ev.END:
                break
            if kind == _Ev.COMPUTE:
                w, token = cast(tuple[int, int], payload)
                if self.alive[w] and token == self.token[w]:
                    self.iteration[w] += 1
                    if self.rec:
                        self.rec.iteration(self.now, w, self.iteration[w])
                    self._ready(w, token)
            elif kind == _Ev.JOIN:
                self._join(cast(int, payload))
            elif kind == _Ev.READY:
                self._ready(*cast(tuple[int, int], payload))
            elif kind == _Ev.DONE:
                gid, rev = cast(tuple[int, int], payload)
                cur = self.transfers.get(gid)
                if cur is not None and cur[0] == rev:
                    del self.transfers[gid]
                    self._delivered(gid, rev)
            elif kind == _Ev.DELIVERED:
                self._delivered(*cast(tuple[int, int], payload))
            elif kind == _Ev.WAKE:
                self._wake(*payload)  # type: ignore[misc]
            elif kind == _Ev.FAULT:
                self._fault(payload)  # type: ignore[arg-type]
            elif kind == _Ev.TICK:
                self.tick_pending = False
                self._apply(self.life.tick(self.now))
            elif kind == _Ev.SAMPLE:
                self._sample()
                later = self.now + self.cfg.sample_s
                if later <= self.cfg.duration_s:
                    self._push(later, _Ev.SAMPLE, None)
                if log.isEnabledFor(logging.INFO) and round(self.now) % PROGRESS_EVERY_S == 0:
                    log.info(
                        "t=%.0f s simulated, wall %.1f s, planner %.1f s in %d calls",
                        self.now,
                        time.perf_counter() - wall0,
                        sum(self.life.plan_seconds),
                        len(self.life.plan_seconds),
                    )
            if self.completed != done_before:
                done_before = self.completed
                if self.on_commit is not None:
                    self.on_commit(self)
                if stop is not None and self.completed >= stop:
                    break
        self._apply(self.life.stop(self.now))
        wall = time.perf_counter() - wall0
        if self.rec:
            self.rec.finish(self)
        return SimResult(
            n=self.n,
            scheme=self.cfg.scheme,
            p=self.cfg.p,
            duration_s=self.cfg.duration_s,
            rounds=[self.life.former.rounds(w) for w in range(self.n)],
            completed=self.completed,
            abandoned=self.abandoned,
            revisions=self.revisions,
            wall_s=wall,
            plan_seconds=list(self.life.plan_seconds),
            jobs=self.net.jobs,
            group_times=self.result_times,
        )

    def _wake(self, gid: int, rev: int, i: int, node: int, phase: int) -> None:
        cur = self.transfers.get(gid)
        if cur is None or cur[0] != rev:
            return  # superseded or ended
        timer = cur[1]
        timer.release(self.now, i, node, phase)
        self._follow(gid, rev, timer)

    def _follow(self, gid: int, rev: int, timer: RouteTimer) -> None:
        for at, i, node, phase in timer.take_wakeups():
            self._push(at, _Ev.WAKE, (gid, rev, i, node, phase))
        if timer.finished:  # the members hear of the end a control round trip later
            self._push(timer.end + self.cfg.executor.control_s, _Ev.DONE, (gid, rev))

    # ---- events ---------------------------------------------------------------------------

    def _fault(self, f: Fault) -> None:
        if self.rec:
            self.rec.fault(self.now, f)
        if f.kind is FaultKind.CUT_LINK:
            self.net.cut(f.a, f.b, self.now)
            self._apply(self.life.link_failed(f.a, f.b, self.now))
        elif f.kind is FaultKind.SET_RATE:
            self.net.set_rate(f.a, f.b, f.mbit)
            if self.cfg.oracle:
                self._apply(self.life.set_link(f.a, f.b, f.mbit, self.now))
        elif self.alive[f.a]:
            self.alive[f.a] = False
            self.token[f.a] += 1
            self._apply(self.life.worker_lost(f.a, self.now))
            if self.rec:
                self.rec.worker_dead(f.a)

    def _sample(self) -> None:
        sent = self.net.sent_by(self.now)
        if self.rec:
            self.rec.link_sample(self.now, sent, self.last_sent, self.cfg)
        self.last_sent = sent

    def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Assign):
                self._assign(d)
            elif isinstance(d, Commit):
                self.transfers.pop(d.group.id, None)
                self._end(d.group.id, d.group.members, d.group.dropped)
                self.completed += 1
            elif isinstance(d, Abandon):
                self.transfers.pop(d.group.id, None)
                self._end(d.group.id, d.group.members, d.group.dropped)
                self.abandoned += 1
        if self.life.former.holding and not self.tick_pending:
            self.tick_pending = True
            self._push(self.now + TICK_S, _Ev.TICK, None)

    def _assign(self, d: Assign) -> None:
        gid = d.group.id
        if d.rev == 0:
            for m in d.group.members:
                other = self.in_group.get(m)
                if other is not None and other != gid:
                    raise SimInvariantError(f"worker {m} in open groups {other} and {gid}")
                self.in_group[m] = gid
            self.group_start[gid] = self.now
        else:
            self.revisions += 1
            for m in d.group.dropped:
                if self.in_group.get(m) == gid:
                    del self.in_group[m]
                    if self.alive[m]:  # dropped while alive (a suspect): it trains on
                        self._compute(m)
        net = self.net if self.cfg.shared_links else self.net.private()
        timer = RouteTimer(net, d.plan.routes, d.plan.pipelined, self.part)
        self.transfers[gid] = (d.rev, timer)
        start = self.now
        if self.cfg.plan_delay is PlanDelay.MEASURED:  # plans are made one after another
            plan_s = d.plan_s if self._plan_times is None else next(self._plan_times)
            start = self.planner_free = max(self.now, self.planner_free) + plan_s
        timer.start(start)
        self._follow(gid, d.rev, timer)
        self._push(d.deadline + 1e-9, _Ev.TICK, None)

    def _end(self, gid: int, members: Sequence[int], dropped: Sequence[int]) -> None:
        start = self.group_start.pop(gid, self.now)
        if self.cfg.history:
            self.result_times.append((gid, start, self.now))
        for m in (*members, *dropped):
            if self.in_group.get(m) == gid:
                del self.in_group[m]
        for m in members:
            if self.alive[m]:
                self._compute(m)
