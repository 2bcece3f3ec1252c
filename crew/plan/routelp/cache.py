"""What a route LP planner keeps between calls: results by exact inputs, and warm columns by
group. Thread-safe; owned by whoever plans (the coordinator's planner, one simulator run).

* **Results**: the same inputs (rates, members, active set, size, shared links, delays, part
  size, and the settings' round cap, level tolerance and pricing choice) return the cached
  result, computed once.
* **Warm columns**: per group (n, members, active set), the single-shape columns that recent
  plans used, then the rest of their pools, most recent first. A plan of the same group on other
  rates starts its pool with them, so column generation usually ends within a round or two.
  The chosen plan's columns alone would not do: a plan with a latency term often skips the
  bandwidth optimum's columns, which the next plan on moved rates needs again.

What warm columns may change: without a latency term and with column generation run to its
end, only ties within the LP's ``gap`` (pricing has the last word on the bandwidth optimum).
With a latency term, the level search picks among the pool's columns, and a plan capped by
``max_rounds`` or the time budget stops wherever its pool got to: both can differ with the
pool's start. So a planner's plans depend on its history; a run that must replay the same
(the simulator) starts from an empty cache.

Cost: a lookup hashes the inputs' bytes; a warm start adds at most ``shapes_per_group``
columns to the new pool.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

from crew.plan.memo import Memo
from crew.plan.routelp.shapes import Shape

T = TypeVar("T")


class RouteLPCache:
    """Results and warm columns of one planner's earlier calls (see the module docstring).

    ``results``: plans kept for repeated identical inputs; ``groups``: groups whose warm
    columns are kept; ``shapes_per_group``: warm columns kept per group."""

    def __init__(self, results: int = 256, groups: int = 512, shapes_per_group: int = 160) -> None:
        self.results = Memo(results)
        self.groups = groups
        self.shapes_per_group = shapes_per_group
        self._pool: OrderedDict[Hashable, list[Shape]] = OrderedDict()
        # The coordinator may plan ahead on a second thread (crew.runtime.planahead); the
        # results' Memo has its own lock.
        self._lock = threading.Lock()

    def result(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The result cached for ``key``, computed (and kept) if there is none."""
        return self.results.get(key, compute)

    def warm_shapes(self, group: Hashable) -> list[Shape]:
        """The shapes kept for ``group``, most recently used first."""
        with self._lock:
            return list(self._pool.get(group, ()))

    def remember(self, group: Hashable, used: Iterable[Shape]) -> None:
        """Keep ``used`` (most recent first) ahead of the shapes already kept for ``group``."""
        shapes = dict.fromkeys(used)
        with self._lock:
            for s in self._pool.pop(group, ()):
                shapes.setdefault(s)
            self._pool[group] = list(shapes)[: self.shapes_per_group]
            while len(self._pool) > self.groups:
                self._pool.popitem(last=False)

    def clear(self) -> None:
        """Forget every result and warm column."""
        self.results.clear()
        with self._lock:
            self._pool.clear()

    def __len__(self) -> int:
        """Results kept."""
        return len(self.results)
