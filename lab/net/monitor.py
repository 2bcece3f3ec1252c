"""Link monitor: samples every directed link's tx byte counter at 1 Hz into ``link_samples``.

The counter is the sender interface's (``/proc/<host pid>/net/dev``), so it counts frames as
HTB let them out, headers included: expect goodput to be at most ~95.6% of ``mbit``.
``mbit`` is the rate over the interval since the previous sample, using the real elapsed time
(the thread may wake late on a busy machine).

Once a minute the monitor also applies the run's retention policy (``crew.runtime.retention``):
samples older than an hour are folded into 10 s and, after a day, 1 min buckets, so a week-long
run's database grows by a stated rate.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from typing import Protocol

from crew.runtime.retention import RetentionPolicy
from crew.runtime.rundb import LinkSampleRow, RunDB

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0
# A monitor runs as long as the lab, but never unboundedly: four weeks of 1 Hz samples.
MAX_SAMPLES = 28 * 86_400
COMPACT_EVERY_S = 60.0  # one minute's rows per retention pass


class CounterSource(Protocol):
    def tx_bytes(self) -> dict[tuple[int, int], int]: ...


class LinkMonitor:
    """A daemon thread writing one row per directed link per interval. ``start``/``stop``."""

    def __init__(
        self,
        net: CounterSource,
        db: RunDB,
        interval: float = DEFAULT_INTERVAL_S,
        max_samples: int = MAX_SAMPLES,
        retention: RetentionPolicy | None = None,
        compact_every_s: float = COMPACT_EVERY_S,
    ):
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.net = net
        self.db = db
        self.interval = interval
        self.max_samples = max_samples
        self.retention = RetentionPolicy() if retention is None else retention
        self.compact_every_s = compact_every_s
        self.samples_taken = 0
        self.rows_compacted = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("LinkMonitor already started")
        self._thread = threading.Thread(target=self._run, name="link-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("link monitor did not stop within %.1f s", timeout)

    def __enter__(self) -> LinkMonitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sample_once(
        self, prev: dict[tuple[int, int], int] | None, prev_t: float | None
    ) -> tuple[dict[tuple[int, int], int], float]:
        """Read the counters and write one row per link; return them for the next call."""
        now = time.time()
        counters = self.net.tx_bytes()
        rows = []
        for (src, dst), tx in sorted(counters.items()):
            mbit = 0.0
            if prev is not None and prev_t is not None and (src, dst) in prev and now > prev_t:
                # A counter that went down (interface recreated) restarts the delta at 0.
                delta = max(0, tx - prev[(src, dst)])
                mbit = delta * 8 / (now - prev_t) / 1e6
            rows.append(LinkSampleRow(now, src, dst, tx, mbit))
        self.db.add_link_samples(rows)
        self.samples_taken += 1
        return counters, now

    def _run(self) -> None:
        prev: dict[tuple[int, int], int] | None = None
        prev_t: float | None = None
        next_at = time.monotonic()
        compact_at = next_at + self.compact_every_s
        while not self._stop.is_set() and self.samples_taken < self.max_samples:
            try:
                prev, prev_t = self.sample_once(prev, prev_t)
                if time.monotonic() >= compact_at:
                    compact_at = time.monotonic() + self.compact_every_s
                    self.rows_compacted += sum(self.db.compact(self.retention).values())
            except (OSError, ValueError, sqlite3.Error) as e:
                # A host that just went away, or a locked DB: skip this sample, keep going.
                self.errors += 1
                log.warning("link sample failed: %s", e)
            next_at += self.interval
            # If we fell behind (suspended, overloaded), skip missed ticks instead of bursting.
            next_at = max(next_at, time.monotonic())
            self._stop.wait(max(0.0, next_at - time.monotonic()))
