"""The coordinator's view of the links: what the planner is told each link can carry.

Pure: no clock, no I/O. Every call that depends on time takes ``now``; the caller (the group
life cycle, and through it the coordinator or a simulator) turns the returned
:class:`LinkUpdate`s into events for the run database.

Three matrices, in Mbit/s, ``[src, dst]``, diagonal ``inf``:

* ``configured``: what the topology says (changed only by an admin ``set_link``);
* ``estimated``: an exponential average (weight ``EWMA``) of the rates the receivers measured,
  scaled up by ``TCP_GOODPUT`` so it compares with the configured frame-level rate;
* ``planning``: what plans are made on. The configured rate, or under ``measured=True`` the
  estimate once it drifts more than ``DRIFT`` (relative) from what is planned; 0 for a failed
  link until its retry.

Delays: ``delay_s`` is the configured one-way delay of each link in seconds (``None`` when no
link has one), passed with ``planning`` to the planner's latency term and the lower bound. It
changes only with the configuration (``set_link(..., delay_ms=)``), never with measurements.

Dead links (docs/architecture.md §5): each receiver's probes (``crew.wire.probes``) say whether a
directed link is alive. A link a receiver reports dead is planned at 0 at once, and so is its
reverse direction: the data plane is TCP, whose ACKs travel the other way. It returns when the
probes say both directions are alive again. A link a sender reports failed with data (a reset,
no progress) is planned at 0 too, and returns only once a probe report from its receiver, made
after the failure, says it is alive, and not before ``RETRY_LINK_S`` (doubling on each further
failure of the same link, up to ``RETRY_MAX_S``): a link that passes probes but stalls data is
not tried again at once. No link is ever tried again blind, by sending a group's data into it.

Committed capacity (:meth:`CapacityView.residual`): a new group is planned on what groups in
flight leave. Each open group is assumed ``elapsed / predicted`` done, so the bytes its plan
still puts on each link are committed over the longest remaining predicted time
(``planner.residual_capacity``). A heuristic, not a bound: lower bounds use ``planning``.

Reach (:meth:`CapacityView.reach_mbit`, :func:`poorly_reached`): a member of a group must
receive the whole average and send its whole update, so a group's time is at least ``size /
reach`` of each member, where *reach* is the smaller of the member's live in-capacity and
out-capacity among the live workers (each link at the smaller of its planned rate and its
measured estimate, so a contended link counts at what it delivers). A worker whose reach is
below ``POOR_REACH_SHARE`` of the median live worker's (six of its seven links into it cut, and
contention on the seventh) would make every group it joins several times slower; the group
life cycle keeps such a worker out of groups while enough others are ready, for a bounded wait
(``crew.control.grouping``, deferral).

Cost: every call is ``O(n^2)`` at most (the residual: ``O(groups * n^2)``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from crew.plan import planner

RETRY_LINK_S = 2.0  # a failed link waits this long for probes, doubling on each failure
RETRY_MAX_S = 60.0
EWMA = 0.3  # weight of a new rate measurement
DRIFT = 0.25  # relative change of a link's estimate that makes the planner use it
TCP_GOODPUT = 0.95  # payload share of the frames HTB counts (docs/architecture.md §5)
# A worker reached at less than this share of the median live worker's reach is deferred: its
# groups would take at least 1/share of a typical group's transfer time.
POOR_REACH_SHARE = 0.25


class LinkChange(enum.Enum):
    FAILED = "failed"  # a sender reported the link broken: planned at 0 until probes pass
    RETRIED = "retried"  # probes passed after the failure and its wait: back in plans
    DEAD = "dead"  # probes: this link or its reverse is dead (planned at 0)
    ALIVE = "alive"  # probes: both directions alive again (back in plans)
    DRIFTED = "drifted"  # measured mode: the estimate replaced the planned rate


@dataclass(frozen=True)
class LinkUpdate:
    """A change of what the planner sees on one link."""

    kind: LinkChange
    src: int
    dst: int
    mbit: float  # the planned rate after the change
    was: float  # the planned rate before it


@dataclass(frozen=True)
class InFlight:
    """What an open group still puts on the links, for committed capacity."""

    link_bytes: np.ndarray  # bytes per link of its current revision's plan
    predicted_s: float
    started: float  # when its current revision was assigned


@dataclass(frozen=True)
class FailedLink:
    since: float
    retry_at: float
    tries: int
    probed: bool = False  # a probe report after ``since`` said the link is alive


class CapacityView:
    """Configured, estimated and failed links; ``planning`` is what the planner sees."""

    def __init__(
        self,
        configured: Sequence[Sequence[float]] | np.ndarray,
        *,
        measured: bool,
        delay_ms: Sequence[Sequence[float]] | np.ndarray | None = None,
    ):
        bw = np.array(configured, dtype=float)
        if bw.ndim != 2 or bw.shape[0] != bw.shape[1]:
            raise ValueError(f"configured: must be a square matrix, got shape {bw.shape}")
        self.delay_s: np.ndarray | None = None
        if delay_ms is not None and len(delay_ms):
            d = np.array(delay_ms, dtype=float) / 1000.0
            if d.shape != bw.shape:
                raise ValueError(f"delay_ms: must have shape {bw.shape}, got {d.shape}")
            np.fill_diagonal(d, 0.0)
            self.delay_s = d if d.any() else None
        np.fill_diagonal(bw, np.inf)
        self.measured = measured
        self.planning = bw
        self.configured = bw.copy()
        self.estimated = bw.copy()
        self.failed: dict[tuple[int, int], FailedLink] = {}
        self.dead: set[tuple[int, int]] = set()  # directed links their receiver's probes call dead

    @property
    def n(self) -> int:
        return int(self.planning.shape[0])

    def fail(self, src: int, dst: int, now: float) -> LinkUpdate | None:
        """A sender reports ``src -> dst`` broken; None if it is already planned at 0."""
        was = float(self.planning[src, dst])
        if was <= 0:
            return None
        tries = self.failed[(src, dst)].tries + 1 if (src, dst) in self.failed else 1
        wait = min(RETRY_MAX_S, RETRY_LINK_S * 2 ** (tries - 1))
        self.failed[(src, dst)] = FailedLink(now, now + wait, tries)
        self.planning[src, dst] = 0.0
        return LinkUpdate(LinkChange.FAILED, src, dst, 0.0, was)

    def retry_due(self, now: float) -> list[LinkUpdate]:
        """Failed links whose probes passed since the failure, and whose wait is over, go back
        to their configured rate.

        They stay in ``failed`` so that a further failure doubles the wait."""
        updates = []
        for (src, dst), f in self.failed.items():
            if f.probed and f.retry_at <= now and self.planning[src, dst] == 0.0:
                if self._probed_dead(src, dst):
                    continue
                rate = float(self.configured[src, dst])
                self.planning[src, dst] = self.estimated[src, dst] = rate
                updates.append(LinkUpdate(LinkChange.RETRIED, src, dst, rate, 0.0))
        return updates

    def _probed_dead(self, src: int, dst: int) -> bool:
        return (src, dst) in self.dead or (dst, src) in self.dead

    def probe_report(self, dst: int, down: Iterable[int], now: float) -> list[LinkUpdate]:
        """Receiver ``dst``'s probes: the links ``src -> dst`` for ``src`` in ``down`` are dead,
        the others alive. Returns the changes of planned rates (both directions of a link)."""
        down_set = {int(s) for s in down}
        updates = []
        for src in range(self.n):
            if src == dst:
                continue
            if src in down_set:
                if (src, dst) in self.dead:
                    continue
                self.dead.add((src, dst))
                for a, b in ((src, dst), (dst, src)):
                    was = float(self.planning[a, b])
                    if was > 0:
                        self.planning[a, b] = 0.0
                        updates.append(LinkUpdate(LinkChange.DEAD, a, b, 0.0, was))
                continue
            f = self.failed.get((src, dst))
            if f is not None and not f.probed and now > f.since:
                self.failed[(src, dst)] = FailedLink(f.since, f.retry_at, f.tries, probed=True)
            if (src, dst) not in self.dead:
                continue
            self.dead.discard((src, dst))
            for a, b in ((src, dst), (dst, src)):
                if self.planning[a, b] == 0.0 and not self._probed_dead(a, b):
                    if (a, b) in self.failed and not self._retry_passed(a, b, now):
                        continue
                    rate = float(self.configured[a, b])
                    self.planning[a, b] = self.estimated[a, b] = rate
                    updates.append(LinkUpdate(LinkChange.ALIVE, a, b, rate, 0.0))
        return updates

    def _retry_passed(self, src: int, dst: int, now: float) -> bool:
        f = self.failed[(src, dst)]
        return f.probed and f.retry_at <= now

    def measure(self, dst: int, samples: Iterable[Sequence[float]]) -> list[LinkUpdate]:
        """Fold a receiver's ``[src, bytes, seconds]`` samples into the estimates.

        Samples naming no other worker, or with no bytes or time, are skipped. Returns the
        links whose planned rate changed (only with ``measured``; a failed link waits for its
        retry, whatever it measured)."""
        updates = []
        for src_f, nbytes, seconds in samples:
            src = int(src_f)
            if not 0 <= src < self.n or src == dst or seconds <= 0 or nbytes <= 0:
                continue
            mbit = nbytes * 8 / seconds / 1e6 / TCP_GOODPUT
            old = self.estimated[src, dst]
            self.estimated[src, dst] = est = (1 - EWMA) * old + EWMA * mbit
            planned = float(self.planning[src, dst])
            if not self.measured or planned <= 0:
                continue
            if abs(est - planned) > DRIFT * planned:
                self.planning[src, dst] = est
                updates.append(LinkUpdate(LinkChange.DRIFTED, src, dst, float(est), planned))
        return updates

    def forget_worker(self, worker: int) -> None:
        """A (re)started worker is a new process: failures of links to or from its predecessor
        (peers' connections to it were reset when it died) say nothing about its links."""
        # Its own probe reports start afresh; its peers' reports of its links stand.
        self.dead = {(s, d) for s, d in self.dead if d != worker}
        for src, dst in list(self.failed):
            if worker in (src, dst):
                del self.failed[(src, dst)]
        for src in range(self.n):
            for a, b in ((src, worker), (worker, src)):
                if a != b and self.planning[a, b] == 0.0 and not self._probed_dead(a, b):
                    self.planning[a, b] = self.estimated[a, b] = self.configured[a, b]

    def set_link(
        self, src: int, dst: int, rate_mbit: float, *, delay_ms: float | None = None
    ) -> None:
        """The lab changed a link's configured rate (and delay): plan on it from now on."""
        if delay_ms is not None:
            if self.delay_s is None:
                self.delay_s = np.zeros_like(self.planning)
            self.delay_s[src, dst] = max(float(delay_ms), 0.0) / 1000.0
        rate = max(float(rate_mbit), 0.0)
        self.configured[src, dst] = self.estimated[src, dst] = rate
        self.failed.pop((src, dst), None)
        self.planning[src, dst] = 0.0 if self._probed_dead(src, dst) else rate

    def reach_mbit(self, alive: Iterable[int]) -> dict[int, float]:
        """Per live worker: min(in-capacity, out-capacity) over the links among ``alive``, each
        at min(planned, estimated) Mbit/s (see the module doc)."""
        live = sorted({int(w) for w in alive})
        if not live:
            return {}
        bw = np.minimum(self.planning, self.estimated)[np.ix_(live, live)]
        bw = np.where(np.isfinite(bw), np.maximum(bw, 0.0), 0.0)
        np.fill_diagonal(bw, 0.0)
        reach = np.minimum(bw.sum(axis=0), bw.sum(axis=1))
        return {w: float(r) for w, r in zip(live, reach, strict=True)}

    def residual(self, in_flight: Iterable[InFlight], now: float, share: float = 1.0) -> np.ndarray:
        """``share`` x ``planning`` minus what the groups in flight still send (see the module
        doc). ``share``: the payload share of the rates (``RunConfig.goodput``), since the
        groups' committed bytes are payload."""
        base = self.planning * share if share != 1.0 else self.planning
        committed = np.zeros_like(self.planning)
        horizon = 0.0
        for g in in_flight:
            predicted = max(g.predicted_s, 1e-3)
            left = max(0.0, 1.0 - (now - g.started) / predicted)
            committed += g.link_bytes * left
            horizon = max(horizon, predicted * left)
        if horizon <= 0.0:
            return base
        return planner.residual_capacity(base, committed, horizon)


def poorly_reached(reach: dict[int, float], share: float = POOR_REACH_SHARE) -> frozenset[int]:
    """Workers whose reach is below ``share`` of the median reach (none with fewer than three
    live workers: with two, there is no "typical" worker to compare with)."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"share: must be in (0, 1), got {share!r}")
    if len(reach) < 3:
        return frozenset()
    median = float(np.median(list(reach.values())))
    return frozenset(w for w, r in reach.items() if r < share * median)
