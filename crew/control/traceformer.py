"""A benchmark's groups: a fixed trace, formed one at a time, with ``GroupFormer``'s interface.

Pure and deterministic: no I/O, no clock. ``lab.bench`` compares schemes on the same groups: it
draws a seeded trace of groups and runs them one after another, each as soon as the one before
has ended. :class:`TraceFormer` forms exactly those groups, for the group life cycle
(``crew.control.lifecycle``) in place of the readiness-driven :class:`GroupFormer`:

* a worker's ``Ready`` is the offer of its fixed vector (:meth:`TraceFormer.ready`); groups
  form only once every worker of the run has offered one, on :meth:`TraceFormer.form` (the
  life cycle calls it on every tick), never on an offer itself;
* one group is open at a time: the next forms once the open one is completed or abandoned;
* the trace's k-th group (1-based) gets group id k, equal weights and iteration 0 for every
  member; a member lost while it is open is dropped and the others keep equal weights
  (:meth:`TraceFormer.drop_member`);
* its groups are fixed: no one is deferred (:attr:`TraceFormer.deferred` stays empty), so the
  life cycle drops no live member for suspicion, and the group after the open one is known in
  advance (:meth:`TraceFormer.upcoming`), so its plan can be made ahead (``PlanAhead``).

Liveness (joins, heartbeats, silence, deaths, ``p``) is a :class:`GroupFormer`'s, passed in,
that forms no group itself.

Cost: every call is ``O(p)``, ``O(n)`` for liveness.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from crew.control.grouping import Group, GroupFormer, GroupingError, WorkerState


class TraceFormer:
    """Forms the groups of ``trace``, in order, one at a time; see the module doc."""

    defer_max_wait: float = 0.0  # no one is deferred

    def __init__(self, trace: Sequence[Sequence[int]], liveness: GroupFormer) -> None:
        n = liveness.n
        groups: list[tuple[int, ...]] = []
        for k, g in enumerate(trace):
            members = tuple(int(m) for m in g)
            if not members or len(set(members)) != len(members):
                raise GroupingError("trace", f"group {k} {list(g)} must be distinct workers")
            if not all(0 <= m < n for m in members):
                raise GroupingError("trace", f"group {k} {list(g)} names no worker of 0..{n - 1}")
            groups.append(members)
        self.trace: tuple[tuple[int, ...], ...] = tuple(groups)
        self._live = liveness
        self._next = 0  # index of the next group to form
        self._offered: set[int] = set()
        self._open: Group | None = None
        self._rounds = [0] * n

    @property
    def n(self) -> int:
        return self._live.n

    @property
    def p(self) -> int:
        return self._live.p

    @property
    def position(self) -> int:
        """How many of the trace's groups have formed."""
        return self._next

    def upcoming(self) -> tuple[int, ...] | None:
        """The members of the group that forms once the open one has ended; None at the end."""
        return self.trace[self._next] if self._next < len(self.trace) else None

    def continue_ids_after(self, last_id: int) -> None:
        """A restarted coordinator: the groups up to ``last_id`` ran, and the next may have been
        sent unrecorded (``GroupFormer.continue_ids_after``; one group is open at a time), so go
        on after it: like the groups open at the crash, it is not run again."""
        self._next = max(self._next, min(int(last_id) + 1, len(self.trace)))

    # -- groups ----------------------------------------------------------------------------

    def ready(self, worker: int, iteration: int, now: float) -> list[Group]:
        """``worker`` offers its fixed vector; groups form on :meth:`form`, so none now."""
        self._offered.add(self._check_worker(worker))
        return []

    def form(self, now: float) -> list[Group]:
        """The trace's next group, once every worker has offered and no group is open."""
        if self._open is not None or len(self._offered) < self.n:
            return []
        members = self.upcoming()
        if members is None:
            return []
        self._next += 1
        weights = tuple(1.0 / len(members) for _ in members)
        self._open = Group(self._next, members, (0,) * len(members), weights, formed_at=now)
        return [self._open]

    def complete(self, group_id: int, now: float) -> Group:
        g = self._close(group_id)
        for w in g.members:
            self._rounds[w] += 1
        return g

    def abandon(self, group_id: int, now: float) -> Group:
        return self._close(group_id)

    def drop_member(self, group_id: int, worker: int) -> Group:
        """The open group without ``worker``; the others keep equal weights."""
        g = self._check_open(group_id)
        if worker not in g.members:
            raise GroupingError("worker", f"{worker} is not a member of group {group_id}")
        if g.size == 1:
            raise GroupingError("worker", f"{worker} is the last member of group {group_id}")
        members = tuple(m for m in g.members if m != worker)
        self._open = Group(
            g.id,
            members,
            (0,) * len(members),
            tuple(1.0 / len(members) for _ in members),
            g.formed_at,
            dropped=(*g.dropped, worker),
        )
        return self._open

    def open_groups(self) -> list[Group]:
        return [] if self._open is None else [self._open]

    def rounds(self, worker: int) -> int:
        """Completed groups the worker was a member of when they completed."""
        return self._rounds[self._check_worker(worker)]

    @property
    def deferred(self) -> frozenset[int]:
        return frozenset()

    def set_deferred(self, workers: Iterable[int]) -> None:
        """A trace's groups are fixed: no one is kept out of them."""
        for w in workers:
            self._check_worker(w)

    # -- liveness: the GroupFormer's ---------------------------------------------------------

    def set_p(self, p: int) -> None:
        self._live.set_p(p)

    def join(self, worker: int, now: float) -> None:
        self._live.join(worker, now)

    def heartbeat(self, worker: int, now: float) -> None:
        self._live.heartbeat(worker, now)

    def expire(self, now: float) -> list[int]:
        return self._live.expire(now)

    def excuse(self, seconds: float, now: float) -> None:
        self._live.excuse(seconds, now)

    def mark_dead(self, worker: int, now: float) -> None:
        self._live.mark_dead(worker, now)

    def state(self, worker: int) -> WorkerState:
        return self._live.state(worker)

    def alive(self) -> set[int]:
        return self._live.alive()

    # -- internals ---------------------------------------------------------------------------

    def _close(self, group_id: int) -> Group:
        g = self._check_open(group_id)
        self._open = None
        return g

    def _check_open(self, group_id: int) -> Group:
        if self._open is None or self._open.id != group_id:
            raise GroupingError("group_id", f"{group_id!r} is not open")
        return self._open

    def _check_worker(self, worker: int) -> int:
        if not isinstance(worker, int) or not 0 <= worker < self.n:
            raise GroupingError("worker", f"must be an int in [0, {self.n}), got {worker!r}")
        return worker
