"""Rate limits for records that a repeated fault would otherwise write without bound."""

from __future__ import annotations


class Throttle:
    """At most one record per key every ``every_s`` seconds, in at most ``keys`` keys: a fault
    that repeats on every tick or every connection must not grow the run's event log."""

    def __init__(self, every_s: float = 10.0, keys: int = 256) -> None:
        self.every_s = every_s
        self.keys = keys
        self._last: dict[str, float] = {}

    def due(self, key: str, now: float) -> bool:
        last = self._last.get(key)
        if last is not None and now - last < self.every_s:
            return False
        if key not in self._last and len(self._last) >= self.keys:
            self._last.pop(min(self._last, key=self._last.__getitem__))  # the oldest key
        self._last[key] = now
        return True
