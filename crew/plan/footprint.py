"""How many bytes of memory a planner's cached value holds: the measure the caches' byte
budgets count in. Pure.

:func:`deep_size` adds ``sys.getsizeof`` over an object and everything it refers to through
tuples, lists, sets, dicts, frozen dataclasses and numpy arrays (their data buffers included),
counting each object once. Small ints, None, booleans and enum members are shared by the
interpreter and are not counted. The figure is what a value keeps alive if nothing else refers
to its parts; parts shared with other cached values are counted in each, so a budget errs on
the safe side.

Cost: one visit per reachable object (a route LP result of n = 60 has a few thousand).
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from typing import Any

import numpy as np

_SHARED = (type(None), bool, enum.Enum)  # one object each, for the whole process
_SMALL_INT = range(-5, 257)  # CPython keeps these once for the whole process


def deep_size(value: Any) -> int:
    """Bytes held by ``value`` and everything reachable from it (see the module docstring)."""
    seen: set[int] = set()
    total = 0
    stack = [value]
    # Bounded: every object is visited at most once (``seen``), and the graph is finite.
    while stack:
        obj = stack.pop()
        if isinstance(obj, _SHARED) or (type(obj) is int and obj in _SMALL_INT):
            continue
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            total += sys.getsizeof(obj) + (obj.nbytes if obj.base is not None else 0)
            continue  # getsizeof counts an owned buffer already; a view's base is counted here
        total += sys.getsizeof(obj)
        if isinstance(obj, str | bytes | bytearray | int | float | complex):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, tuple | list | set | frozenset):
            stack.extend(obj)
        elif dataclasses.is_dataclass(obj):
            stack.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
            if hasattr(obj, "__dict__"):
                total += sys.getsizeof(obj.__dict__)
    return total
