"""Link health: which links fail, come back or drift, and whom their failures make suspect.

Pure: no clock, no I/O. Every call takes ``now`` (seconds, any epoch, non-decreasing) and the
events of the links; it returns decisions, never acts. The rates the planner sees are kept by a
:class:`~crew.control.capacity.CapacityView` (dead, failed and retried links, measured
estimates); :class:`LinkHealthTracker` drives it and adds what it cannot know alone.

Events in, decisions out:

* a sender reports a link failed with data (:meth:`LinkHealthTracker.sender_failed`), a
  receiver reports which of its links its probes find dead (:meth:`~LinkHealthTracker.probed`,
  from ``crew.wire.probes``), a receiver reports the rates it measured
  (:meth:`~LinkHealthTracker.measured`), time passes (:meth:`~LinkHealthTracker.retry_due`):
  each returns a :class:`LinkReport`: what changed, to record (:class:`LinkNote`, in order),
  the links that just *failed* (they count towards suspicion) and the links that open groups
  must stop using (``dead``). A link already failed that a sender reports again is no news
  but still ``dead``: a plan that uses it is revised.
* a failed link counts against both its ends (:meth:`~LinkHealthTracker.suspect`, which says
  who became suspect by it);
* who to keep out of groups (:meth:`~LinkHealthTracker.deferral`): a :class:`Deferral`, with
  the events that record its changes.

Suspects (staggered cuts): a worker whose links to ``SUSPECT_PEERS`` different peers failed
within ``SUSPECT_S`` is *suspect* until ``SUSPECT_S`` after the last of them. Cuts often come in
bursts at one worker (its uplink, its host), and the probes find each within about
``crew.wire.probes.dead_after(n - 1)`` (``DEAD_AFTER_S`` up to n = 11, longer where the probe
budget stretches the interval), one after another, so its other links may be cut already
without anyone knowing. One failed link names no culprit: both ends stay in use. A link to a
lost worker counts against neither end: all of a lost worker's links fail, and name no live
culprit. The group life cycle sets a suspect aside once, when it becomes suspect, in every open
group, and plans no group it is no member of on it while it is suspect.

Deferral: a worker the live links reach poorly (``capacity.poorly_reached``: most of its links
dead, the rest contended) or a suspect one is kept out of new groups while enough others are
ready (``GroupFormer.set_deferred``, for at most its ``defer_max_wait``).

Cost: a report is ``O(n^2)`` (the capacity view's); suspicion is ``O(peers)`` per failed link
and ``O(n)`` per question; a deferral is ``O(n^2)`` (the reach of every live worker).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from crew.control.capacity import CapacityView, LinkChange, LinkUpdate, poorly_reached
from crew.control.records import EventRecord, Level
from crew.wire import protocol as proto

SUSPECT_S = 3.0  # how long a failed link counts towards its ends' suspicion (module doc)
SUSPECT_PEERS = 2  # failed links to this many peers within SUSPECT_S make a worker suspect

Link = tuple[int, int]  # (src, dst)


@dataclass(frozen=True)
class LinkNote:
    """A change of what the planner sees on one link, to record. ``reason``: what the sender
    saw (``FAILED``) or whose probes are missing (``DEAD``)."""

    change: LinkChange
    src: int
    dst: int
    mbit: float  # the planned rate after the change
    was: float  # the planned rate before it
    reason: str = ""

    def record(self, now: float) -> EventRecord:
        """The event-log row of this change."""
        link = f"link {self.src}->{self.dst}"
        probe = {"src": self.src, "dst": self.dst, "probe": True}
        if self.change is LinkChange.FAILED:
            return EventRecord(
                now,
                "fault",
                f"{link} failed: {self.reason}",
                Level.WARNING,
                data={"src": self.src, "dst": self.dst},
            )
        if self.change is LinkChange.RETRIED:
            return EventRecord(
                now, "recovery", f"{link} back in plans: its probes pass again", data=probe
            )
        if self.change is LinkChange.ALIVE:
            return EventRecord(
                now, "recovery", f"{link} alive again (probes): back in plans", data=probe
            )
        if self.change is LinkChange.DEAD:
            return EventRecord(
                now, "fault", f"{link} failed: {self.reason}", Level.WARNING, data=probe
            )
        return EventRecord(
            now,
            "capacity",
            f"{link} measured {self.mbit:.1f} Mbit/s, "
            f"planned {self.was:.1f}: re-planning with the measurement",
            data={"src": self.src, "dst": self.dst, "mbit": self.mbit, "was": self.was},
        )


@dataclass(frozen=True)
class LinkReport:
    """What one link event changed (see the module doc)."""

    notes: tuple[LinkNote, ...] = ()  # what the planner sees differently now, in order
    failed: tuple[Link, ...] = ()  # links that just failed: they count towards suspicion
    dead: tuple[Link, ...] = ()  # links no open group may keep using

    @property
    def changed(self) -> bool:
        """Whether the planning rates changed."""
        return bool(self.notes)


@dataclass(frozen=True)
class Deferral:
    """Who to keep out of new groups, and why: ``poor`` are poorly reached, the rest of
    ``workers`` suspect. ``reach`` is every live worker's reach in Mbit/s."""

    workers: frozenset[int]
    poor: frozenset[int]
    reach: Mapping[int, float] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return float(np.median(list(self.reach.values()))) if self.reach else 0.0

    def notes(
        self, was: frozenset[int], now_deferred: frozenset[int], max_wait: float, now: float
    ) -> list[EventRecord]:
        """The events of a change of the deferred workers from ``was`` to ``now_deferred``
        (what the former applied: a former of fixed groups defers no one), each worker's
        reason given. ``max_wait``: how long the former defers a ready worker at most."""
        median = self.median
        out: list[EventRecord] = []
        for w in sorted(now_deferred - was):
            reach = self.reach[w]
            why = (
                f"its live links reach it at {reach:.1f} Mbit/s (median worker {median:.1f})"
                if w in self.poor
                else f"its links to {SUSPECT_PEERS}+ peers failed within {SUSPECT_S:g} s"
                " (suspect: more may be cut)"
            )
            out.append(
                EventRecord(
                    now,
                    "capacity",
                    f"worker {w} deferred: {why}; grouped only when too few others are ready"
                    f" or after {max_wait:g} s",
                    worker=w,
                    data={
                        "reach_mbit": reach,
                        "median_mbit": median,
                        "suspect": w not in self.poor,
                    },
                )
            )
        for w in sorted(was - now_deferred):
            out.append(
                EventRecord(
                    now,
                    "capacity",
                    f"worker {w} no longer deferred"
                    + (f": reached at {self.reach[w]:.1f} Mbit/s" if w in self.reach else ""),
                    worker=w,
                )
            )
        return out


class LinkHealthTracker:
    """The health of the links among ``capacity.n`` workers; see the module doc."""

    def __init__(self, capacity: CapacityView):
        self.capacity = capacity
        self.failed_at: dict[int, dict[int, float]] = {}  # worker -> peer -> last link failure
        self.suspect_until: dict[int, float] = {}

    @property
    def n(self) -> int:
        return self.capacity.n

    # -- link events -----------------------------------------------------------------------

    def sender_failed(self, src: int, dst: int, reason: str, now: float) -> LinkReport:
        """A sender saw data fail on ``src -> dst`` (a reset, no progress): planned at 0 until
        its probes pass again and its retry wait is over (``CapacityView.fail``)."""
        if not (0 <= src < self.n and 0 <= dst < self.n) or src == dst:
            raise proto.ProtocolError(f"link_failed: {src}->{dst} is not a link of this run")
        u = self.capacity.fail(src, dst, now)
        if u is None:  # already planned at 0: no news, but no plan may keep it
            return LinkReport(dead=((src, dst),))
        note = LinkNote(u.kind, u.src, u.dst, u.mbit, u.was, reason)
        return LinkReport((note,), failed=((src, dst),), dead=((src, dst),))

    def probed(self, worker: int, down: Sequence[int], now: float) -> LinkReport:
        """Receiver ``worker``'s probes find the links from ``down`` dead and the others
        alive; a dead link takes its reverse direction (its ACKs) with it."""
        self.check_down(down)
        updates = self.capacity.probe_report(worker, down, now)
        dead = tuple((u.src, u.dst) for u in updates if u.kind is LinkChange.DEAD)
        return LinkReport(tuple(self._note(u) for u in updates), failed=dead, dead=dead)

    def check_down(self, down: Sequence[int]) -> None:
        """Refuse a probe report whose ``down`` names no worker of this run."""
        if any(not 0 <= s < self.n for s in down):
            raise proto.ProtocolError(f"link_health.down: {down} names no worker of this run")

    def measured(self, worker: int, samples: Iterable[Sequence[float]]) -> LinkReport:
        """Receiver ``worker`` measured ``[src, bytes, seconds]`` arrivals: the links whose
        estimate drifted far enough to be planned on (only when the run plans on measurements)."""
        return LinkReport(tuple(self._note(u) for u in self.capacity.measure(worker, samples)))

    def retry_due(self, now: float) -> LinkReport:
        """Failed links whose probes passed and whose wait is over are back in plans."""
        return LinkReport(tuple(self._note(u) for u in self.capacity.retry_due(now)))

    def _note(self, u: LinkUpdate) -> LinkNote:
        reason = ""
        if u.kind is LinkChange.DEAD:
            reason = (
                "no probes arrive"
                if (u.src, u.dst) in self.capacity.dead
                else f"no probes arrive on {u.dst}->{u.src}, which carries its ACKs"
            )
        return LinkNote(u.kind, u.src, u.dst, u.mbit, u.was, reason)

    # -- suspects ----------------------------------------------------------------------------

    def suspects(self, now: float) -> frozenset[int]:
        """Workers with failed links to ``SUSPECT_PEERS`` peers, until ``SUSPECT_S`` after the
        last one."""
        return frozenset(w for w, until in self.suspect_until.items() if until > now)

    def suspect(self, src: int, dst: int, alive: Iterable[int], now: float) -> frozenset[int]:
        """Link ``src -> dst`` just failed: count it against both ends (against neither if an
        end is not ``alive``). Returns the workers that became suspect by it."""
        before = self.suspects(now)
        live = set(alive)
        for w, peer in ((src, dst), (dst, src)):
            if w not in live or peer not in live:
                continue  # a link to a lost worker says nothing about this end
            peers = self.failed_at.setdefault(w, {})
            for old in [q for q, t in peers.items() if now - t >= SUSPECT_S]:
                del peers[old]
            peers[peer] = now
            if len(peers) >= SUSPECT_PEERS:
                self.suspect_until[w] = now + SUSPECT_S
        return self.suspects(now) - before

    # -- deferral ----------------------------------------------------------------------------

    def deferral(self, alive: Iterable[int], now: float) -> Deferral:
        """The live workers to keep out of new groups now: the poorly reached and the
        suspects."""
        reach = self.capacity.reach_mbit(alive)
        poor = poorly_reached(reach)
        suspects = self.suspects(now) & set(reach)
        return Deferral(poor | suspects, poor, reach)
