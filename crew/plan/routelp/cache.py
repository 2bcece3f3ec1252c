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

Memory: both parts are bounded by count and by a byte budget (``RESULTS_BUDGET_BYTES``,
``POOL_BUDGET_BYTES``), least recently used out first, so a week-long run holds at most
12 MiB here whatever its groups.

Cost: a lookup hashes the inputs' bytes; a warm start adds at most ``shapes_per_group``
columns to the new pool; keeping a result or a group's columns walks them once to size them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

from crew.plan.footprint import deep_size
from crew.plan.memo import Memo
from crew.plan.routelp.shapes import Shape

T = TypeVar("T")


RESULTS_BUDGET_BYTES = 4 << 20
"""Bytes of exact keys and results a cache keeps at most (n = 8: a result and its key are about
3 KB, so the 256 results fit; n = 60: about 90 KB, the rates and delays in the key alone 58 KB,
so about 45 of them)."""
POOL_BUDGET_BYTES = 8 << 20
"""Bytes of warm columns a cache keeps at most, over all groups (a shape of a p = 5 group on
n = 8 is about 0.5 KB; of a group spread over n = 60, about 4 KB)."""


class RouteLPCache:
    """Results and warm columns of one planner's earlier calls (see the module docstring).

    ``results``: plans kept for repeated identical inputs, within ``results_budget_bytes``
    together with their keys; ``groups``: groups whose warm columns are kept;
    ``shapes_per_group``: warm columns kept per group; all warm columns together within
    ``pool_budget_bytes`` (:func:`crew.plan.footprint.deep_size`), least recently used group
    out first. A group's key is canonical: its members as a sorted tuple, whatever order
    they became ready in."""

    def __init__(
        self,
        results: int = 256,
        groups: int = 512,
        shapes_per_group: int = 160,
        *,
        results_budget_bytes: int = RESULTS_BUDGET_BYTES,
        pool_budget_bytes: int = POOL_BUDGET_BYTES,
    ) -> None:
        if min(groups, shapes_per_group, pool_budget_bytes) < 1:
            raise ValueError("groups, shapes_per_group and pool_budget_bytes must be >= 1")
        self.results = Memo(results, results_budget_bytes)
        self.groups = groups
        self.shapes_per_group = shapes_per_group
        self.pool_budget_bytes = pool_budget_bytes
        self._pool: OrderedDict[Hashable, tuple[list[Shape], int]] = OrderedDict()
        self._pool_bytes = 0
        # The coordinator may plan ahead on a second thread (crew.runtime.planahead); the
        # results' Memo has its own lock.
        self._lock = threading.Lock()

    @staticmethod
    def group_key(n: int, members: Iterable[int], active: bytes) -> Hashable:
        """The warm-column pool's key of a group: the same for any order of its members."""
        return (n, tuple(sorted(members)), active)

    def result(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The result cached for ``key``, computed (and kept) if there is none."""
        return self.results.get(key, compute)

    def warm_shapes(self, group: Hashable) -> list[Shape]:
        """The shapes kept for ``group``, most recently used first."""
        with self._lock:
            kept = self._pool.get(group)
            return list(kept[0]) if kept is not None else []

    def remember(self, group: Hashable, used: Iterable[Shape]) -> None:
        """Keep ``used`` (most recent first) ahead of the shapes already kept for ``group``."""
        shapes = dict.fromkeys(used)
        with self._lock:
            old = self._pool.pop(group, None)
            if old is not None:
                self._pool_bytes -= old[1]
                for s in old[0]:
                    shapes.setdefault(s)
            kept = list(shapes)[: self.shapes_per_group]
            cost = deep_size((group, kept))
            # Bounded: each pass removes one group, and the new one is never removed.
            while self._pool and (
                len(self._pool) >= self.groups or self._pool_bytes + cost > self.pool_budget_bytes
            ):
                self._pool_bytes -= self._pool.popitem(last=False)[1][1]
            if cost <= self.pool_budget_bytes:
                self._pool[group] = (kept, cost)
                self._pool_bytes += cost

    @property
    def pool_bytes(self) -> int:
        """Bytes the warm columns hold, keys included."""
        return self._pool_bytes

    @property
    def bytes(self) -> int:
        """Bytes the cache holds: results and warm columns, keys included."""
        return self.results.bytes + self._pool_bytes

    def clear(self) -> None:
        """Forget every result and warm column."""
        self.results.clear()
        with self._lock:
            self._pool.clear()
            self._pool_bytes = 0

    def __len__(self) -> int:
        """Results kept."""
        return len(self.results)
