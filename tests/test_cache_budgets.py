"""The planners' caches honour their byte budgets and key groups canonically: a week-long run
plans millions of groups, and what the caches hold must not grow with them."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from crew.plan import routelp
from crew.plan.footprint import deep_size
from crew.plan.memo import Memo
from crew.plan.routelp.cache import RouteLPCache
from crew.plan.routelp.shapes import Shape

MB = 1 << 20


def test_deep_size_counts_buffers_and_shared_parts_once() -> None:
    buf = np.zeros(1000)
    assert deep_size(buf) >= buf.nbytes
    assert deep_size(buf[10:]) >= buf.nbytes  # a view keeps its base's buffer alive
    text = "x" * 5000
    assert deep_size((text, text)) == sys.getsizeof((text, text)) + sys.getsizeof(text)
    assert deep_size([1, 2, 3]) == sys.getsizeof([1, 2, 3])  # small ints are shared


def test_memo_keeps_within_its_budget_and_drops_the_oldest() -> None:
    memo = Memo(1000, budget_bytes=50_000)
    for k in range(100):
        memo.get(k, lambda: b"v" * 2_000)  # ~2 KB each: 100 of them would be ~200 KB
    assert 0 < memo.bytes <= 50_000
    assert 10 <= len(memo) < 100
    calls: list[int] = []
    memo.get(99, lambda: calls.append(99))  # the newest is kept
    memo.get(0, lambda: calls.append(0) or b"")  # the oldest is gone
    assert calls == [0]
    memo.get("big", lambda: b"v" * 60_000)  # larger than the budget: returned, not kept
    assert memo.bytes <= 50_000
    assert memo.get("big", lambda: b"again") == b"again"


def test_memo_bytes_match_what_it_holds() -> None:
    memo = Memo(8, budget_bytes=1 << 20)
    for k in range(20):
        memo.get(("key", k), lambda k=k: tuple(range(300 + k)))
    held = sum(deep_size((key, value)) for key, (value, _) in memo._items.items())
    assert memo.bytes == held and len(memo) == 8
    memo.clear()
    assert memo.bytes == 0


def shapes(root: int, count: int) -> list[Shape]:
    return [Shape(root, tuple((i, root) for i in range(k % 7 + 1)), ()) for k in range(count)]


def test_warm_pool_honours_its_budget() -> None:
    cache = RouteLPCache(groups=10_000, shapes_per_group=50, pool_budget_bytes=200_000)
    for g in range(500):
        cache.remember(("group", g), shapes(g % 7, 50))
    held = sum(deep_size((key, kept)) for key, (kept, _) in cache._pool.items())
    assert cache.pool_bytes == held <= 200_000
    assert 0 < len(cache._pool) < 500
    assert cache.warm_shapes(("group", 499)) and not cache.warm_shapes(("group", 0))


def test_results_honour_their_budget_at_large_n() -> None:
    rng = np.random.default_rng(1)
    n = 40
    cache = RouteLPCache(results_budget_bytes=200_000)
    settings = routelp.RouteLPSettings(max_rounds=2)
    for _k in range(12):
        bw = rng.uniform(10, 100, (n, n))
        np.fill_diagonal(bw, np.inf)
        routelp.plan_routes(bw, (0, 1, 2), MB, cache=cache, settings=settings)
    assert 0 < cache.results.bytes <= 200_000
    assert len(cache) < 12  # each key holds 12.8 KB of rates: not all of them fit


def test_warm_columns_are_keyed_by_the_set_of_members() -> None:
    rng = np.random.default_rng(7)
    bw = rng.uniform(10, 100, (8, 8))
    np.fill_diagonal(bw, np.inf)
    cache = RouteLPCache()
    routelp.plan_routes(bw, (5, 0, 3), MB, cache=cache)
    routelp.plan_routes(bw * 1.1, (3, 5, 0), MB, cache=cache)
    assert len(cache._pool) == 1
    key = RouteLPCache.group_key(8, (0, 3, 5), np.ones(8, dtype=bool).tobytes())
    assert key == RouteLPCache.group_key(8, (5, 3, 0), np.ones(8, dtype=bool).tobytes())
    assert cache.warm_shapes(key)


@pytest.mark.parametrize("bad", [0, -1])
def test_budgets_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError):
        Memo(4, budget_bytes=bad)
    with pytest.raises(ValueError):
        RouteLPCache(pool_budget_bytes=bad)
