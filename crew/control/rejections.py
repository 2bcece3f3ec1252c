"""Rate-limiting of the security events for frames the workers rejected.

Pure: time is passed in. One event per rejected frame, up to ``REJECT_EVENTS`` per worker and
reason in each ``REJECT_WINDOW_S``; beyond that they are counted and written as one summary
when the window ends, so a flood of bad connections cannot become a flood of rows. A summary
names at most ``SUMMARY_PEERS`` of the peers it counts, so that a flood from many addresses
cannot grow the limiter's memory either; its count stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REJECT_WINDOW_S = 5.0
REJECT_EVENTS = 50
SUMMARY_PEERS = 16


@dataclass(frozen=True)
class SecurityNote:
    """What to record: ``count`` frames from ``peers`` rejected by ``worker`` for ``reason``."""

    worker: int
    reason: str
    count: int
    peers: tuple[str, ...]


@dataclass
class _Window:
    start: float
    seen: int = 0
    suppressed: int = 0
    peers: set[str] = field(default_factory=set)


class RejectionLimiter:
    def __init__(self, window_s: float = REJECT_WINDOW_S, per_window: int = REJECT_EVENTS):
        self.window_s = window_s
        self.per_window = per_window
        self._windows: dict[tuple[int, str], _Window] = {}

    def rejected(self, worker: int, reason: str, peer: str, now: float) -> list[SecurityNote]:
        key = (worker, reason)
        notes: list[SecurityNote] = []
        window = self._windows.get(key)
        if window is None or now - window.start >= self.window_s:
            notes += self._flush(key)
            window = self._windows[key] = _Window(now)
        window.seen += 1
        if window.seen <= self.per_window:
            notes.append(SecurityNote(worker, reason, 1, (peer,)))
        else:
            window.suppressed += 1
            if len(window.peers) < SUMMARY_PEERS:
                window.peers.add(peer)
        return notes

    def expire(self, now: float) -> list[SecurityNote]:
        """Summaries of the windows that have ended."""
        notes: list[SecurityNote] = []
        for key, window in list(self._windows.items()):
            if now - window.start >= self.window_s:
                notes += self._flush(key)
        return notes

    def flush_all(self) -> list[SecurityNote]:
        notes: list[SecurityNote] = []
        for key in list(self._windows):
            notes += self._flush(key)
        return notes

    def _flush(self, key: tuple[int, str]) -> list[SecurityNote]:
        window = self._windows.pop(key, None)
        if window is None or not window.suppressed:
            return []
        return [SecurityNote(key[0], key[1], window.suppressed, tuple(sorted(window.peers)))]
