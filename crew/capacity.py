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

A failed link is tried again ``RETRY_LINK_S`` after its failure, doubling on each further
failure of the same link: a failure may be transient, and with TCP a one-way cut also fails the
reverse direction (its ACKs are lost), which nobody would ever report repaired.

Committed capacity (:meth:`CapacityView.residual`): a new group is planned on what groups in
flight leave. Each open group is assumed ``elapsed / predicted`` done, so the bytes its plan
still puts on each link are committed over the longest remaining predicted time
(``planner.residual_capacity``). A heuristic, not a bound: lower bounds use ``planning``.

Cost: every call is ``O(n^2)`` at most (the residual: ``O(groups * n^2)``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from crew import planner

RETRY_LINK_S = 20.0  # a failed link is tried again after this, doubling on each failure
EWMA = 0.3  # weight of a new rate measurement
DRIFT = 0.25  # relative change of a link's estimate that makes the planner use it
TCP_GOODPUT = 0.95  # payload share of the frames HTB counts (docs/architecture.md §5)


class LinkChange(enum.Enum):
    FAILED = "failed"  # a sender reported the link broken: planned at 0 until its retry
    RETRIED = "retried"  # its retry time came: planned at its configured rate again
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
    retry_at: float
    tries: int


class CapacityView:
    """Configured, estimated and failed links; ``planning`` is what the planner sees."""

    def __init__(self, configured: Sequence[Sequence[float]] | np.ndarray, *, measured: bool):
        bw = np.array(configured, dtype=float)
        if bw.ndim != 2 or bw.shape[0] != bw.shape[1]:
            raise ValueError(f"configured: must be a square matrix, got shape {bw.shape}")
        np.fill_diagonal(bw, np.inf)
        self.measured = measured
        self.planning = bw
        self.configured = bw.copy()
        self.estimated = bw.copy()
        self.failed: dict[tuple[int, int], FailedLink] = {}

    @property
    def n(self) -> int:
        return int(self.planning.shape[0])

    def fail(self, src: int, dst: int, now: float) -> LinkUpdate | None:
        """A sender reports ``src -> dst`` broken; None if it is already planned at 0."""
        was = float(self.planning[src, dst])
        if was <= 0:
            return None
        tries = self.failed[(src, dst)].tries + 1 if (src, dst) in self.failed else 1
        self.failed[(src, dst)] = FailedLink(now + RETRY_LINK_S * 2 ** (tries - 1), tries)
        self.planning[src, dst] = 0.0
        return LinkUpdate(LinkChange.FAILED, src, dst, 0.0, was)

    def retry_due(self, now: float) -> list[LinkUpdate]:
        """Failed links whose retry time has come go back to their configured rate.

        They stay in ``failed`` so that a further failure doubles the wait."""
        updates = []
        for (src, dst), f in self.failed.items():
            if f.retry_at <= now and self.planning[src, dst] == 0.0:
                rate = float(self.configured[src, dst])
                self.planning[src, dst] = self.estimated[src, dst] = rate
                updates.append(LinkUpdate(LinkChange.RETRIED, src, dst, rate, 0.0))
        return updates

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
        for src, dst in list(self.failed):
            if worker in (src, dst):
                del self.failed[(src, dst)]
                self.planning[src, dst] = self.estimated[src, dst] = self.configured[src, dst]

    def set_link(self, src: int, dst: int, rate_mbit: float) -> None:
        """The lab changed a link's configured rate: plan on it from now on."""
        rate = max(float(rate_mbit), 0.0)
        self.planning[src, dst] = self.configured[src, dst] = self.estimated[src, dst] = rate
        self.failed.pop((src, dst), None)

    def residual(self, in_flight: Iterable[InFlight], now: float) -> np.ndarray:
        """``planning`` minus what the groups in flight still send (see the module doc)."""
        committed = np.zeros_like(self.planning)
        horizon = 0.0
        for g in in_flight:
            predicted = max(g.predicted_s, 1e-3)
            left = max(0.0, 1.0 - (now - g.started) / predicted)
            committed += g.link_bytes * left
            horizon = max(horizon, predicted * left)
        if horizon <= 0.0:
            return self.planning
        return planner.residual_capacity(self.planning, committed, horizon)
