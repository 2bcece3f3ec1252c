"""A bounded memo for pure planning functions: same inputs, same result, computed once. Pure.

The coordinator plans every group, and with configured capacities the same group on the same
rates comes back again and again (70 groups of 4 among 8 workers). Planning is deterministic,
so a result computed for exactly these inputs is the result; nothing is approximated, only
recomputation is skipped. Keys are exact: arrays by dtype, shape and bytes.

Thread-safe: the coordinator may plan ahead on a second thread (``crew.runtime.planahead``).
A lock guards the table, not the computation, so two threads may compute one key at once
(same result; the later one is kept).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from crew.plan.footprint import deep_size


def key_part(value: Any) -> Hashable:
    """A hashable, exact stand-in for one input (arrays and nested sequences included)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, list | tuple):
        return tuple(key_part(v) for v in value)
    if isinstance(value, set | frozenset):
        return ("set", tuple(sorted(key_part(v) for v in value)))  # type: ignore[type-var]
    hash(value)  # frozen dataclasses and enums are their own key; anything else is an error
    return value


class Memo:
    """Least recently used results of one function: at most ``size`` of them, and, given a
    ``budget_bytes``, at most that many bytes of keys and values together
    (:func:`crew.plan.footprint.deep_size`). A result larger than the whole budget is returned
    but not kept."""

    def __init__(self, size: int, budget_bytes: int | None = None) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if budget_bytes is not None and budget_bytes < 1:
            raise ValueError(f"budget_bytes must be >= 1, got {budget_bytes}")
        self.size = size
        self.budget_bytes = budget_bytes
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key][0]
        value = compute()  # an exception is not remembered: the next call raises it again
        # Sized outside the lock: it walks the value, and the key and value are this call's.
        cost = 0 if self.budget_bytes is None else deep_size((key, value))
        if self.budget_bytes is not None and cost > self.budget_bytes:
            return value
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, cost)
            self._bytes += cost
            while len(self._items) > self.size or (
                self.budget_bytes is not None and self._bytes > self.budget_bytes
            ):
                self._bytes -= self._items.popitem(last=False)[1][1]
        return value

    @property
    def bytes(self) -> int:
        """Bytes the kept keys and values hold (0 when the memo has no budget: not measured)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
