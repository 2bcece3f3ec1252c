"""Which links of a drifting network change rate when: the schedule shared by the lab's drift
applier (``lab.orchestrate.drift``) and the simulator (``crew.sim``).

Given each directed link's rate trace (``crew.ratetrace``), :meth:`DriftSchedule.due` says which
links must change at a time since the run started. A link changes when its trace's rate differs
from the one last applied by more than ``min_change`` (relative, default 2%), so a slowly moving
trace costs few shaping calls. Rates above ``max_mbit`` are clamped to it. Pure: times in,
changes out; the caller confirms each change it made with :meth:`DriftSchedule.done`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from crew.ratetrace import RateTrace

DEFAULT_MIN_CHANGE = 0.02


@dataclass(frozen=True)
class RateChange:
    src: int
    dst: int
    mbit: float


class DriftSchedule:
    """Which links' rates are due at a time (seconds since the run started)."""

    def __init__(
        self,
        traces: Mapping[tuple[int, int], RateTrace],
        min_change: float = DEFAULT_MIN_CHANGE,
        max_mbit: float = math.inf,
    ) -> None:
        if not 0 <= min_change < 1:
            raise ValueError(f"min_change: a fraction in [0, 1), got {min_change}")
        self.traces = dict(traces)
        self.min_change = min_change
        self.max_mbit = max_mbit
        self.applied: dict[tuple[int, int], float] = {}

    def due(self, elapsed_s: float) -> list[RateChange]:
        """The changes to make at ``elapsed_s``; the caller confirms each with :meth:`done`."""
        out = []
        for (i, j), trace in sorted(self.traces.items()):
            rate = min(trace.rate_at(elapsed_s), self.max_mbit)
            last = self.applied.get((i, j))
            if last is None or abs(rate - last) > self.min_change * last:
                out.append(RateChange(i, j, rate))
        return out

    def done(self, change: RateChange) -> None:
        self.applied[(change.src, change.dst)] = change.mbit

    def steps(self, duration_s: float, period_s: float = 1.0) -> list[tuple[float, RateChange]]:
        """Every change over ``[0, duration_s]`` when applied each ``period_s`` and all succeed:
        what a lab run applies, for the simulator to replay."""
        out = []
        for k in range(int(duration_s / period_s) + 1):
            for change in self.due(k * period_s):
                self.done(change)
                out.append((k * period_s, change))
        return out
