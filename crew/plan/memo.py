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
    """Least recently used results of one function, at most ``size`` of them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = compute()  # an exception is not remembered: the next call raises it again
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
