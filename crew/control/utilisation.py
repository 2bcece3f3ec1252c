"""Compute utilisation: how a worker's wall time splits between computing and waiting.

The field states cross-cloud training by one figure, the share of each accelerator's time
spent computing. A worker here alternates between its own training and waiting on a round (from
the moment it blocks on its offered model until its group settles). The wait splits by what
the worker was waiting for:

* ``compute_s``: while not blocked on a round, the worker's local steps (and anything else its
  loop does), including while an overlapped round reduces in the background;
* ``ready_s``: offered and ready, but not yet in a group (waiting for p ready workers);
* ``group_s``: in a group whose result it applied (the reduce itself);
* ``stalled_s``: in a group that was abandoned (a fault cost it that time and gave nothing).

``utilisation = compute_s / wall_s`` with ``wall_s`` the sum of the four, measured from the
meter's start. The meter is pure: callers pass the times (any one monotonic clock), so a test
can script them exactly.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimeSplit:
    """A worker's wall time since its meter started, in seconds, by what it was doing."""

    compute_s: float = 0.0
    ready_s: float = 0.0
    group_s: float = 0.0
    stalled_s: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.compute_s + self.ready_s + self.group_s + self.stalled_s

    @property
    def utilisation(self) -> float:
        """Computing ÷ wall time (1.0 before any time has passed: nothing waited yet)."""
        wall = self.wall_s
        return self.compute_s / wall if wall > 0 else 1.0


class UtilisationMeter:
    """Accumulates a :class:`TimeSplit` from a worker's round boundaries.

    A worker computes until it blocks on a round. ``offered(t)`` starts a round; a blocking
    offer blocks at once, an overlapped one (``blocking=False``) lets the worker compute on
    until ``waiting(t)``. ``settled(t, assigned_at, applied)`` ends the round: the blocked time
    before ``assigned_at`` (the group's assignment reaching this worker; None when no group
    took it) was ready-waiting, the rest was in the group, counted as ``group_s`` when the
    average was applied and as ``stalled_s`` when it was not. Time an overlapped round spends
    while the worker computes counts as compute: that is the point of overlapping."""

    def __init__(self, start: float) -> None:
        self._since = start  # start of the current stretch (compute, or the blocked wait)
        self._in_round = False
        self._blocked = False
        self._split = TimeSplit()
        self.rounds = 0  # rounds offered so far

    @property
    def in_round(self) -> bool:
        return self._in_round

    def offered(self, t: float, *, blocking: bool = True) -> None:
        if self._in_round:
            raise ValueError("offered twice without settling the first round")
        self._in_round = True
        self.rounds += 1
        if blocking:
            self.waiting(t)

    def waiting(self, t: float) -> None:
        """The worker blocks on its open round from ``t`` (no-op when already blocked)."""
        if not self._in_round:
            raise ValueError("waiting without an offered round")
        if self._blocked:
            return
        s = self._split
        compute = s.compute_s + _span(self._since, t)
        self._split = TimeSplit(compute, s.ready_s, s.group_s, s.stalled_s)
        self._since = t
        self._blocked = True

    def settled(self, t: float, assigned_at: float | None, applied: bool) -> None:
        if not self._in_round:
            raise ValueError("settled without an offered round")
        self.waiting(t)
        joined = t if assigned_at is None else min(max(assigned_at, self._since), t)
        ready = _span(self._since, joined)
        grouped = _span(joined, t)
        s = self._split
        self._split = TimeSplit(
            s.compute_s,
            s.ready_s + ready,
            s.group_s + (grouped if applied else 0.0),
            s.stalled_s + (0.0 if applied else grouped),
        )
        self._since = t
        self._in_round = False
        self._blocked = False

    def split(self, now: float) -> TimeSplit:
        """The totals up to ``now``, the open stretch included (a blocked wait counts as
        ready-waiting until its group is known)."""
        open_s = _span(self._since, now)
        s = self._split
        if self._blocked:
            return TimeSplit(s.compute_s, s.ready_s + open_s, s.group_s, s.stalled_s)
        return TimeSplit(s.compute_s + open_s, s.ready_s, s.group_s, s.stalled_s)


def _span(a: float, b: float) -> float:
    # A clock read on another thread may come a hair before the stretch's start: never negative.
    return max(0.0, b - a)
