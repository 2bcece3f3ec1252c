"""Links that drift: replay each link's rate trace (``crew.ratetrace``) on the running lab.

``crew.drift.DriftSchedule`` is the pure part, shared with the simulator: given the time since
the run started, which links must change rate now (more than 2% from the rate last applied).
Every change is a ``tc class change`` on one HTB class (``LabNetwork.set_link``, the same call
a rate fault makes), about 5 ms of CPU each. Rates are clamped to the lab's range
``(0, MAX_RATE_MBIT]`` (:func:`lab_schedule`).

:class:`DriftApplier` runs a schedule against the lab: every ``period_s`` (1 s: at least the
1 Hz a trace sampled each second needs) it sets the due links' rates through
``LabNetwork.set_link`` and records each configured rate in the run database's ``link_state``
table (reason ``trace``), where the link monitor's measured rates sit beside it, and passes
each change to ``on_change`` (the lab tells the planner the true rate with it under
``--capacity oracle``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from crew.drift import DriftSchedule, RateChange
from crew.ratetrace import RateTrace
from crew.runtime.rundb import LinkStateRow, RunDB
from lab.spec.topology import MAX_RATE_MBIT

if TYPE_CHECKING:
    from lab.net.mesh import LabNetwork

log = logging.getLogger(__name__)

DEFAULT_PERIOD_S = 1.0
TRACE_REASON = "trace"

__all__ = ["DriftApplier", "DriftSchedule", "RateChange", "lab_schedule"]


def lab_schedule(traces: Mapping[tuple[int, int], RateTrace]) -> DriftSchedule:
    """The schedule of ``traces`` with rates clamped to what the lab can shape."""
    return DriftSchedule(traces, max_mbit=MAX_RATE_MBIT)


class DriftApplier:
    """Replays ``schedule`` on ``net`` from :meth:`start` until :meth:`stop`, recording in
    ``db`` (see the module docstring). A failed change is logged and retried next period."""

    def __init__(
        self,
        net: LabNetwork,
        db: RunDB,
        schedule: DriftSchedule,
        period_s: float = DEFAULT_PERIOD_S,
        on_change: Callable[[RateChange], None] | None = None,
    ) -> None:
        if not 0 < period_s <= 1.0:
            raise ValueError(f"period_s: in (0, 1] s (at least 1 Hz), got {period_s}")
        self.net = net
        self.db = db
        self.schedule = schedule
        self.period_s = period_s
        self.on_change = on_change
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = 0.0

    def tick(self, elapsed_s: float) -> int:
        """Apply what is due at ``elapsed_s``; the number of links changed."""
        rows = []
        for change in self.schedule.due(elapsed_s):
            try:
                self.net.set_link(change.src, change.dst, rate_mbit=change.mbit)
            except Exception as exc:  # noqa: BLE001 - one link's failure must not stop the rest
                log.warning("drift: link %d->%d not set: %s", change.src, change.dst, exc)
                continue
            self.schedule.done(change)
            if self.on_change is not None:
                self.on_change(change)
            rows.append(
                LinkStateRow(time.time(), change.src, change.dst, change.mbit, True, TRACE_REASON)
            )
        if rows:
            self.db.add_link_states(rows)
        return len(rows)

    def _loop(self) -> None:
        # Bounded by the stop event; each pass sleeps until the next period boundary.
        while not self._stop.is_set():
            elapsed = time.monotonic() - self.started
            self.tick(elapsed)
            self._stop.wait(self.period_s - (time.monotonic() - self.started) % self.period_s)

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="drift", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
