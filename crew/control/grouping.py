"""Partial-reduce group formation: who averages with whom, decided from a FIFO ready queue.

Pure and deterministic: no I/O, no threads, no clock. Every event carries ``now`` (seconds, any
epoch, non-decreasing); the coordinator feeds real events, tests feed a fake clock.

Model (docs/architecture.md §1 "Partial reduce", after P-Reduce, Miao et al., SIGMOD 2021):

* ``n`` workers, ids ``0..n-1``. A worker finishing local computation reports *ready*
  (:meth:`GroupFormer.ready`) and joins the FIFO ready queue.
* As soon as ``p_eff`` workers are ready, the first ``p_eff`` in the queue form a :class:`Group`
  (subject to the isolation guard below). Several groups may be open at once; a worker is in at
  most one open group, and cannot be ready while in one.
* ``p_eff = min(p, n - dead)``: workers that have not joined yet (:attr:`WorkerState.ABSENT`)
  still count, so a lab whose workers are slow to start waits for them instead of forming
  small groups; once workers are DEAD (expired or :meth:`GroupFormer.mark_dead`) groups shrink
  so training never stalls. Such groups are flagged ``reduced``. A worker that never shows up
  holds groups back until the coordinator calls ``mark_dead`` on it.
* Staleness weights (optional): ``s = newest iteration in group - own iteration + 1`` and weight
  ``∝ decay**s`` (decay 0.9). Normalisation cancels the newest iteration, so the weights are
  ``∝ decay**(-iteration)``: dropping a member and recomputing equals renormalising.
* Groups leave the open set by :meth:`~GroupFormer.complete` (counted in
  :meth:`~GroupFormer.rounds`) or :meth:`~GroupFormer.abandon`; :meth:`~GroupFormer.drop_member`
  removes one member (a death mid-reduce) and renormalises the rest. Deaths never close a group
  on their own: the coordinator decides, and :meth:`~GroupFormer.open_group_of` tells it which
  group is affected.

Isolation guard (the rule implemented; P-Reduce's own guard instead grows a periodic group
until it connects everyone):

* The *window* is the last ``W`` formed groups (``isolation_window``; default
  ``2 * ceil(n / p)``, i.e. about two turns of every worker at the current p; 0 disables the
  guard). Abandoned groups keep their slot but contribute no edges (nothing was averaged); open
  and completed groups contribute their current members.
* Union-find over the window's groups gives components. *Participants* are the live workers
  that appear in the window. Workers absent from the window are slow, not isolated: they are
  grouped FIFO when they become ready, and are never a reason to intervene.
* The guard acts only once ``W`` groups have been formed (isolation means *for long*) and
  ``p_eff >= 2``. Take the FIFO candidate (first ``p_eff`` ready). If its participants all lie
  in one component A while some live participant lies outside A, the candidate would keep A
  isolated, so:

  1. *swap*: if a ready participant outside A exists, the earliest such replaces the
     latest-ready candidate (never the candidate's only A member), so A merges with another
     component. The displaced worker keeps its place at the head of the queue.
  2. *hold*: otherwise formation waits until one becomes ready, for at most
     ``isolation_max_wait`` seconds from when the hold began; then the FIFO candidate forms
     anyway. Holds release only on a later event, so the coordinator must call
     :meth:`GroupFormer.form` on its periodic tick (as it does :meth:`GroupFormer.expire`).
     ``isolation_max_wait=0`` gives swap-only behaviour.

  Consequence: a set of participants grouped only among itself for ``W`` formations is merged
  at the next one (if a worker from another component becomes ready within
  ``isolation_max_wait``). In the two-clique case of the tests, every ``W + 1`` consecutive
  formations connect all workers, where pure FIFO never connects them.

Deferral (:meth:`GroupFormer.set_deferred`; the caller decides who, e.g. from
``crew.control.capacity.poorly_reached``): a deferred worker would make any group it joins
several times slower. While it has been ready for less than ``defer_max_wait`` seconds, the
candidate is the first ``p_eff`` ready workers that are *not* deferred; if fewer are ready but
enough live non-deferred workers exist, formation waits for them (on a later event or tick).
Once its wait is over, or when too few other workers are alive, it is grouped FIFO again. So a
deferred worker still averages at least once per ``defer_max_wait`` plus a group's time, and
the others are not made to wait on it meanwhile. The isolation guard then acts on that
candidate.

Cost: each formation attempt with the guard active is ``O(W * p + n)`` (a fresh union-find over
the window), fine for n in the hundreds.

Memory is bounded, whatever the run's length: the former keeps the open groups, the groups of
the largest isolation window it may need (``2 n``, or an explicit ``isolation_window``), and the
newest ``history_limit`` closed groups in :attr:`GroupFormer.history`. Older groups are
forgotten; the run database is their record.
"""

from __future__ import annotations

import enum
import itertools
import logging
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from crew.control.quorum import CloseReason, QuorumRule, QuorumState

log = logging.getLogger(__name__)

DEFAULT_DECAY = 0.9
_WEIGHT_SUM_TOL = 1e-9
DEFER_MAX_WAIT_S = 10.0  # a deferred ready worker is grouped FIFO again after this long
# Closed groups kept for GroupFormer.history: readers look at the last few, and a week-long run
# forms millions.
HISTORY_LIMIT = 1024


class GroupingError(ValueError):
    """A grouping call got a bad argument or an impossible transition; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class WorkerState(enum.Enum):
    """Where a worker stands. Values follow the run DB's ``worker_status.state`` vocabulary."""

    ABSENT = "absent"  # never joined; counts towards p_eff, cannot be ready
    TRAINING = "training"
    IDLE = "training"  # alias of TRAINING: joined, alive, not ready
    READY = "ready"
    GROUPED = "reducing"  # member of an open group
    DEAD = "dead"


class GroupStatus(enum.StrEnum):
    """A group's ``groups.status`` in the run DB: open while it reduces, then its outcome."""

    OPEN = "open"
    COMPLETED = "completed"
    ABANDONED = "abandoned"


class GroupOutcome(enum.Enum):
    """How a group ended: the closed subset of :class:`GroupStatus`."""

    COMPLETED = GroupStatus.COMPLETED.value
    ABANDONED = GroupStatus.ABANDONED.value


def staleness_weights(
    iterations: Sequence[int], decay: float = DEFAULT_DECAY, enabled: bool = True
) -> tuple[float, ...]:
    """Normalised averaging weights for members whose updates come from ``iterations``.

    ``w_i ∝ decay**s_i`` with ``s_i = max(iterations) - iterations[i] + 1``; equal weights when
    ``enabled`` is false. The newest member always has ``s = 1``, so the sum never underflows.
    """
    its = _check_iterations(iterations)
    if not (isinstance(decay, int | float) and math.isfinite(decay) and 0 < decay <= 1):
        raise GroupingError("decay", f"must be in (0, 1], got {decay!r}")
    if not enabled:
        return tuple([1.0 / len(its)] * len(its))
    s = staleness(its)
    w = np.power(float(decay), np.asarray(s, dtype=np.float64))
    w /= w.sum()
    return tuple(float(x) for x in w)


def staleness(iterations: Sequence[int]) -> tuple[int, ...]:
    """``newest iteration - own iteration + 1`` per member (1 for the newest)."""
    its = _check_iterations(iterations)
    newest = max(its)
    return tuple(newest - i + 1 for i in its)


def _check_iterations(iterations: Sequence[int]) -> tuple[int, ...]:
    its = tuple(iterations)
    if not its:
        raise GroupingError("iterations", "is empty")
    for i in its:
        if not _is_int(i) or i < 0:
            raise GroupingError("iterations", f"must be ints >= 0, got {i!r}")
    return its


def _is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


@dataclass(frozen=True)
class Group:
    """An open or closed partial-reduce group.

    ``members`` are in ready order (the order they entered the queue); ``iterations`` and
    ``weights`` align with them. ``reduced``: formed with fewer than p members because of
    deaths. ``dropped``: members removed since formation. ``swapped_in``: the worker the
    isolation guard brought in, if it intervened. ``formed_by``: why the quorum rule closed it
    at its size (``crew.control.quorum``), None when groups have a fixed p.
    """

    id: int
    members: tuple[int, ...]
    iterations: tuple[int, ...]
    weights: tuple[float, ...]
    formed_at: float
    reduced: bool = False
    dropped: tuple[int, ...] = ()
    swapped_in: int | None = None
    formed_by: CloseReason | None = None  # the quorum rule's reason; None: a fixed p

    def __post_init__(self) -> None:
        if not self.members:
            raise GroupingError("members", "is empty")
        if len(set(self.members)) != len(self.members):
            raise GroupingError("members", f"not distinct: {self.members}")
        if len(self.iterations) != len(self.members):
            raise GroupingError("iterations", "length differs from members")
        if len(self.weights) != len(self.members):
            raise GroupingError("weights", "length differs from members")
        if abs(math.fsum(self.weights) - 1.0) > _WEIGHT_SUM_TOL:
            raise GroupingError("weights", f"sum to {math.fsum(self.weights)}, need 1")

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def staleness(self) -> tuple[int, ...]:
        return staleness(self.iterations)

    def weight_of(self, worker: int) -> float:
        try:
            return self.weights[self.members.index(worker)]
        except ValueError:
            raise GroupingError("worker", f"{worker} is not in group {self.id}") from None


@dataclass(frozen=True)
class GroupRecord:
    """A closed group as it stood when closed."""

    group: Group
    outcome: GroupOutcome
    closed_at: float


class _UnionFind:
    def __init__(self, n: int) -> None:
        self._parent = list(range(n))

    def find(self, x: int) -> int:
        root = x
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[x] != root:  # path compression
            self._parent[x], x = root, self._parent[x]
        return root

    def union_all(self, xs: Iterable[int]) -> None:
        it = iter(xs)
        first = next(it, None)
        if first is None:
            return
        r = self.find(first)
        for x in it:
            self._parent[self.find(x)] = r


class GroupFormer:
    """Forms partial-reduce groups from a FIFO ready queue; see the module docstring.

    All methods taking ``now`` require it to be finite and non-decreasing across calls.
    """

    def __init__(
        self,
        n: int,
        p: int,
        *,
        heartbeat_timeout: float = 10.0,
        staleness: bool = False,
        staleness_decay: float = DEFAULT_DECAY,
        isolation_window: int | None = None,
        isolation_max_wait: float = 10.0,
        defer_max_wait: float = DEFER_MAX_WAIT_S,
        history_limit: int = HISTORY_LIMIT,
        quorum: QuorumRule | None = None,
    ) -> None:
        if not _is_int(history_limit) or history_limit < 1:
            raise GroupingError("history_limit", f"must be an int >= 1, got {history_limit!r}")
        if not _is_int(n) or n < 1:
            raise GroupingError("n", f"must be an int >= 1, got {n!r}")
        self._n = int(n)
        self._p = self._check_p(p)
        if not _positive_finite(heartbeat_timeout):
            raise GroupingError("heartbeat_timeout", f"must be > 0, got {heartbeat_timeout!r}")
        staleness_weights([0], staleness_decay)  # validates decay
        if isolation_window is not None and (not _is_int(isolation_window) or isolation_window < 0):
            raise GroupingError(
                "isolation_window", f"must be None or an int >= 0, got {isolation_window!r}"
            )
        if not _non_negative_finite(isolation_max_wait):
            raise GroupingError(
                "isolation_max_wait", f"must be >= 0 and finite, got {isolation_max_wait!r}"
            )
        self.heartbeat_timeout = float(heartbeat_timeout)
        self.staleness = bool(staleness)
        self.staleness_decay = float(staleness_decay)
        self._isolation_window = None if isolation_window is None else int(isolation_window)
        self.isolation_max_wait = float(isolation_max_wait)
        if not _non_negative_finite(defer_max_wait):
            raise GroupingError(
                "defer_max_wait", f"must be >= 0 and finite, got {defer_max_wait!r}"
            )
        self.defer_max_wait = float(defer_max_wait)
        self._deferred: frozenset[int] = frozenset()
        self._ready_since: list[float] = [0.0] * n

        self._state = [WorkerState.ABSENT] * self._n
        self._last_seen: list[float | None] = [None] * self._n
        self._iteration: list[int] = [0] * self._n  # iteration reported with the last ready
        self._queue: list[int] = []  # FIFO of READY workers
        self._open: dict[int, Group] = {}
        self._member_of: dict[int, int] = {}  # worker -> open group id (dead members included)
        # The groups the isolation guard may read (the newest ``_keep_formed`` formed, in
        # formation order) and the open ones, each as it stands now.
        self._keep_formed = max(2 * self._n, self._isolation_window or 0)
        self._groups: dict[int, Group] = {}
        self._formed: deque[int] = deque()
        self._abandoned: set[int] = set()  # among _formed
        self._history: deque[GroupRecord] = deque(maxlen=int(history_limit))
        self._rounds = [0] * self._n
        self._next_id = 1  # 1-based: the run DB's INTEGER PRIMARY KEY
        self._now = -math.inf
        self._hold_since: float | None = None
        # Groups that size themselves: ``p`` is then unused, the rule picks each size.
        self._quorum = None if quorum is None else QuorumState(quorum)

    # ---- configuration ------------------------------------------------------------------

    def continue_ids_after(self, last_id: int) -> None:
        """A restarted coordinator: new groups take ids after those already recorded, and after
        the ``n`` that may have been sent unrecorded.

        The coordinator sends a batch's ``Assign`` messages before it writes their rows
        (``crew.runtime.coordinator``), so a crash in between leaves workers holding ids the
        database lacks. A worker ignores a group id it has already ended, so a reused id would
        stall the new group until a re-plan. One batch opens at most ``n`` groups (their members
        are disjoint), and every earlier batch was written before the next event."""
        self._next_id = max(self._next_id, last_id + 1 + self._n)

    @property
    def n(self) -> int:
        return self._n

    @property
    def p(self) -> int:
        return self._p

    def set_p(self, p: int) -> None:
        """Change p for groups formed from now on; open groups keep their size.

        Call :meth:`form` afterwards: a smaller p may let queued workers form at once.
        """
        self._p = self._check_p(p)
        log.info("p set to %d", self._p)

    @property
    def isolation_window(self) -> int:
        """The guard's window in formed groups (0: guard disabled)."""
        if self._isolation_window is not None:
            return self._isolation_window
        return 2 * math.ceil(self._n / self._p)

    @property
    def deferred(self) -> frozenset[int]:
        return self._deferred

    def set_deferred(self, workers: Iterable[int]) -> None:
        """Workers to keep out of groups while others are ready (see the module doc).

        Call :meth:`form` afterwards (or let the next event or tick do it)."""
        self._deferred = frozenset(self._check_worker(w) for w in workers)

    def p_effective(self) -> int:
        """Size of the next group: ``min(p, n - dead)`` (at least 1)."""
        dead = sum(1 for s in self._state if s is WorkerState.DEAD)
        return max(1, min(self._p, self._n - dead))

    # ---- worker events ------------------------------------------------------------------

    def join(self, worker: int, now: float) -> None:
        """Worker registered or rejoined: alive, training, not ready.

        A live worker rejoining (restarted process) leaves the ready queue. A worker still
        listed in an open group must first be dropped or its group abandoned.
        """
        self._tick(now)
        w = self._check_worker(worker)
        if w in self._member_of:
            raise GroupingError(
                "worker",
                f"{w} is still a member of open group {self._member_of[w]}; "
                "drop_member or abandon first",
            )
        if self._state[w] is WorkerState.READY:
            self._queue.remove(w)
        if self._state[w] in (WorkerState.ABSENT, WorkerState.DEAD):
            log.info("worker %d joined (was %s)", w, self._state[w].name)
        self._state[w] = WorkerState.TRAINING
        self._last_seen[w] = now

    def ready(self, worker: int, iteration: int, now: float) -> list[Group]:
        """Enqueue ``worker`` with the update of ``iteration``; return the groups formed now.

        The returned groups may not contain ``worker`` (it may still be queued).
        """
        self._tick(now)
        w = self._check_worker(worker)
        if not _is_int(iteration) or iteration < 0:
            raise GroupingError("iteration", f"must be an int >= 0, got {iteration!r}")
        st = self._state[w]
        if st is WorkerState.READY:
            raise GroupingError("worker", f"{w} is already ready")
        if st is WorkerState.GROUPED:
            raise GroupingError("worker", f"{w} is in open group {self._member_of[w]}")
        if st in (WorkerState.ABSENT, WorkerState.DEAD):
            raise GroupingError("worker", f"{w} is {st.name}; it must join first")
        self._state[w] = WorkerState.READY
        self._iteration[w] = int(iteration)
        self._last_seen[w] = now
        self._ready_since[w] = now
        self._queue.append(w)
        if self._quorum is not None:
            self._quorum.observe(now)
        return self.form(now)

    def heartbeat(self, worker: int, now: float) -> None:
        self._tick(now)
        w = self._check_worker(worker)
        if self._state[w] in (WorkerState.ABSENT, WorkerState.DEAD):
            raise GroupingError("worker", f"{w} is {self._state[w].name}; it must join first")
        self._last_seen[w] = now

    def expire(self, now: float) -> list[int]:
        """Mark DEAD every live worker silent for more than ``heartbeat_timeout``.

        Returns them (ascending). They leave the ready queue; their open groups stay open.
        Call :meth:`form` afterwards, since fewer live workers may lower ``p_eff``.
        """
        self._tick(now)
        gone = [w for w in range(self._n) if self._is_alive(w) and self._silent(w, now)]
        for w in gone:
            log.warning("worker %d silent since %.3f: dead", w, self._last_seen[w])
            self._kill(w)
        return gone

    def excuse(self, seconds: float, now: float) -> None:
        """The observer (the coordinator) was away for ``seconds``: every live worker's last
        sighting moves forward by that much, so time nobody watched is not counted as silence.
        Without it, a coordinator that stalls longer than ``heartbeat_timeout`` (a frozen host,
        a blocked write) would find every worker silent on waking and declare them all dead."""
        self._tick(now)
        if not _non_negative_finite(seconds):
            raise GroupingError("seconds", f"must be >= 0 and finite, got {seconds!r}")
        for w in range(self._n):
            seen = self._last_seen[w]
            if self._is_alive(w) and seen is not None:
                self._last_seen[w] = min(now, seen + seconds)

    def mark_dead(self, worker: int, now: float) -> None:
        """Explicit death (connection lost, or gave up waiting for an ABSENT worker).

        Idempotent. Like :meth:`expire`, leaves any open group open.
        """
        self._tick(now)
        w = self._check_worker(worker)
        if self._state[w] is not WorkerState.DEAD:
            log.info("worker %d marked dead", w)
            self._kill(w)

    # ---- group events -------------------------------------------------------------------

    def complete(self, group_id: int, now: float) -> Group:
        """Close a group as completed; its current members each gain one round."""
        self._tick(now)
        g = self._close(group_id, GroupOutcome.COMPLETED, now)
        for w in g.members:
            self._rounds[w] += 1
        return g

    def abandon(self, group_id: int, now: float) -> Group:
        """Close a group without averaging; its live members go back to training."""
        self._tick(now)
        self._abandoned.add(self._check_open(group_id))
        return self._close(group_id, GroupOutcome.ABANDONED, now)

    def drop_member(self, group_id: int, worker: int) -> Group:
        """Remove ``worker`` from an open group; survivors' weights are renormalised.

        A live dropped worker goes back to training. Dropping the last member is refused:
        abandon the group instead.
        """
        gid = self._check_open(group_id)
        w = self._check_worker(worker)
        g = self._open[gid]
        if w not in g.members:
            raise GroupingError("worker", f"{w} is not a member of group {gid}")
        if g.size == 1:
            raise GroupingError("worker", f"{w} is the last member of group {gid}; abandon it")
        keep = [i for i, m in enumerate(g.members) if m != w]
        its = tuple(g.iterations[i] for i in keep)
        new = Group(
            id=gid,
            members=tuple(g.members[i] for i in keep),
            iterations=its,
            weights=self._weights(its),
            formed_at=g.formed_at,
            reduced=g.reduced,
            dropped=(*g.dropped, w),
            swapped_in=g.swapped_in,
        )
        self._open[gid] = self._groups[gid] = new
        del self._member_of[w]
        if self._state[w] is WorkerState.GROUPED:
            self._state[w] = WorkerState.TRAINING
        log.info("worker %d dropped from group %d", w, gid)
        return new

    def form(self, now: float) -> list[Group]:
        """Form groups while at least ``p_eff`` workers are ready (see the isolation guard)."""
        self._tick(now)
        formed: list[Group] = []
        # Each pass removes at least one worker from the queue, so n + 1 passes suffice.
        for _ in range(self._n + 1):
            k, reason = self._next_size(now)
            if k == 0 or len(self._queue) < k:
                self._hold_since = None
                break
            chosen = self._choose(k, now)
            if chosen is None:
                break
            members, swapped_in = chosen
            formed.append(self._open_group(members, k, swapped_in, now, reason))
        return formed

    def _next_size(self, now: float) -> tuple[int, CloseReason | None]:
        """The next group's size (0: none yet) and the quorum rule's reason for it."""
        if self._quorum is None:
            return self.p_effective(), None
        decision = self._quorum.decide([self._ready_since[w] for w in self._queue], now)
        if decision.size == 0 and self._queue and len(self._queue) >= len(self.alive()):
            return len(self._queue), CloseReason.CAP  # everyone alive is ready (deaths)
        return decision.size, decision.reason

    # ---- queries ------------------------------------------------------------------------

    def open_groups(self) -> list[Group]:
        """Open groups, oldest first."""
        return [self._open[g] for g in sorted(self._open)]

    def open_group_of(self, worker: int) -> Group | None:
        gid = self._member_of.get(self._check_worker(worker))
        return None if gid is None else self._open[gid]

    def group(self, group_id: int) -> Group:
        """An open group, or one of the recently formed, as it stands now."""
        try:
            return self._groups[group_id]
        except KeyError:
            known = _is_int(group_id) and 1 <= group_id < self._next_id
            what = "forgotten (older than the former keeps)" if known else "unknown"
            raise GroupingError("group_id", f"{what} group {group_id!r}") from None

    def ready_queue(self) -> list[int]:
        return list(self._queue)

    def state(self, worker: int) -> WorkerState:
        return self._state[self._check_worker(worker)]

    def alive(self) -> set[int]:
        return {w for w in range(self._n) if self._is_alive(w)}

    def iteration(self, worker: int) -> int:
        """The iteration the worker last reported ready with (0 before that)."""
        return self._iteration[self._check_worker(worker)]

    @property
    def history(self) -> tuple[GroupRecord, ...]:
        """The newest ``history_limit`` closed groups, in closing order."""
        return tuple(self._history)

    def rounds(self, worker: int) -> int:
        """Completed groups the worker was a member of when they completed."""
        return self._rounds[self._check_worker(worker)]

    @property
    def holding(self) -> bool:
        """True while the isolation guard is holding back a formable group."""
        return self._hold_since is not None

    # ---- internals ----------------------------------------------------------------------

    def _choose(self, k: int, now: float) -> tuple[list[int], int | None] | None:
        """Members for the next group, the guard's swapped-in worker, or None to hold."""
        queue = self._eligible(k, now)
        if queue is None:
            return None
        candidate = queue[:k]
        window = self.isolation_window
        if k < 2 or window == 0 or len(self._formed) < window:
            return candidate, None
        uf, participants = self._window_components(window)
        touched = {uf.find(w) for w in candidate if w in participants}
        if len(touched) != 1:
            return candidate, None  # bridges components already, or touches none
        (home,) = touched
        if all(uf.find(w) == home for w in participants):
            return candidate, None  # live participants connected
        outsider = next(
            (w for w in queue[k:] if w in participants and uf.find(w) != home),
            None,
        )
        if outsider is not None:
            anchor = next(w for w in candidate if w in participants)
            victim = next(w for w in reversed(candidate) if w != anchor)
            chosen = {*candidate, outsider} - {victim}
            log.info("isolation guard: worker %d replaces %d to merge components", outsider, victim)
            return [w for w in self._queue if w in chosen], outsider
        if self._hold_since is None:
            self._hold_since = now
            log.info("isolation guard: holding %s for another component", candidate)
        if now - self._hold_since < self.isolation_max_wait:
            return None
        log.warning(
            "isolation guard: no other component ready after %.3f s; forming FIFO",
            now - self._hold_since,
        )
        return candidate, None

    def _eligible(self, k: int, now: float) -> list[int] | None:
        """The ready queue without deferred workers still within their wait, or None to wait
        for non-deferred workers (see Deferral in the module doc)."""
        waiting = {
            w
            for w in self._queue
            if w in self._deferred and now - self._ready_since[w] < self.defer_max_wait
        }
        if not waiting:
            return self._queue
        rest = [w for w in self._queue if w not in waiting]
        if len(rest) >= k:
            return rest
        others = sum(1 for w in range(self._n) if self._is_alive(w) and w not in waiting)
        if others >= k:
            return None
        return self._queue

    def _window_components(self, window: int) -> tuple[_UnionFind, set[int]]:
        uf = _UnionFind(self._n)
        seen: set[int] = set()
        for gid in itertools.islice(self._formed, max(0, len(self._formed) - window), None):
            if gid in self._abandoned:
                continue
            members = self._groups[gid].members
            uf.union_all(members)
            seen.update(members)
        return uf, {w for w in seen if self._is_alive(w)}

    def _open_group(
        self,
        members: list[int],
        k: int,
        swapped_in: int | None,
        now: float,
        formed_by: CloseReason | None = None,
    ) -> Group:
        gid = self._next_id
        self._next_id += 1
        its = tuple(self._iteration[w] for w in members)
        g = Group(
            id=gid,
            members=tuple(members),
            iterations=its,
            weights=self._weights(its),
            formed_at=now,
            reduced=k < self._p and formed_by is None,
            swapped_in=swapped_in,
            formed_by=formed_by,
        )
        chosen = set(members)
        self._queue = [w for w in self._queue if w not in chosen]
        for w in members:
            self._state[w] = WorkerState.GROUPED
            self._member_of[w] = gid
        self._open[gid] = self._groups[gid] = g
        self._formed.append(gid)
        while len(self._formed) > self._keep_formed:
            old = self._formed.popleft()
            self._abandoned.discard(old)
            if old not in self._open:
                del self._groups[old]
        self._hold_since = None
        log.debug("group %d formed: %s (reduced=%s)", gid, g.members, g.reduced)
        return g

    def _close(self, group_id: int, outcome: GroupOutcome, now: float) -> Group:
        gid = self._check_open(group_id)
        g = self._open.pop(gid)
        for w in g.members:
            del self._member_of[w]
            if self._state[w] is WorkerState.GROUPED:
                self._state[w] = WorkerState.TRAINING
        self._history.append(GroupRecord(g, outcome, now))
        if not self._formed or gid < self._formed[0]:
            # Older than the guard's window: it stayed only while open.
            del self._groups[gid]
            self._abandoned.discard(gid)
        log.debug("group %d %s", gid, outcome.value)
        return g

    def _weights(self, iterations: tuple[int, ...]) -> tuple[float, ...]:
        return staleness_weights(iterations, self.staleness_decay, enabled=self.staleness)

    def _kill(self, w: int) -> None:
        if self._state[w] is WorkerState.READY:
            self._queue.remove(w)
        self._state[w] = WorkerState.DEAD

    def _silent(self, w: int, now: float) -> bool:
        seen = self._last_seen[w]
        return seen is not None and now - seen > self.heartbeat_timeout

    def _is_alive(self, w: int) -> bool:
        return self._state[w] not in (WorkerState.ABSENT, WorkerState.DEAD)

    def _tick(self, now: float) -> None:
        if not isinstance(now, int | float) or not math.isfinite(now):
            raise GroupingError("now", f"must be a finite number, got {now!r}")
        if now < self._now:
            raise GroupingError("now", f"went backwards: {now} < {self._now}")
        self._now = float(now)

    def _check_worker(self, worker: int) -> int:
        if not _is_int(worker) or not 0 <= worker < self._n:
            raise GroupingError("worker", f"must be an int in [0, {self._n}), got {worker!r}")
        return int(worker)

    def _check_p(self, p: int) -> int:
        if not _is_int(p) or not 1 <= p <= self._n:
            raise GroupingError("p", f"must be an int in [1, {self._n}], got {p!r}")
        return int(p)

    def _check_open(self, group_id: int) -> int:
        if group_id not in self._open:
            known = _is_int(group_id) and 1 <= group_id < self._next_id
            state = "closed" if known else "unknown"
            raise GroupingError("group_id", f"{group_id!r} is not open ({state})")
        return group_id


def _positive_finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _non_negative_finite(x: object) -> bool:
    return _positive_finite(x) or x == 0
