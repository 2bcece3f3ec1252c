"""crew.plan.memo: exact keys, bounded size, errors never remembered; the bound and the star tie
check the coordinator runs per group are memoised on exact inputs."""

from __future__ import annotations

import numpy as np
import pytest

from crew.plan import planner
from crew.plan.bound import BOUNDS
from crew.plan.memo import Memo, key_part
from crew.plan.schemes import GroupPlanner


def test_keys_are_exact() -> None:
    a = np.array([[np.inf, 10.0], [20.0, np.inf]])
    b = a.copy()
    b[0, 1] = np.nextafter(10.0, 11.0)
    assert key_part((a, (0, 1), None)) == key_part((a.copy(), [0, 1], None))
    assert key_part(a) != key_part(b)
    assert key_part(a) != key_part(a.astype(np.float32))
    assert key_part({3, 1}) == key_part(frozenset({1, 3}))
    with pytest.raises(TypeError):
        key_part({"a": 1})


def test_memo_is_bounded_and_forgets_errors() -> None:
    memo = Memo(2)
    calls: list[int] = []
    for k in (1, 2, 1, 3, 2):
        memo.get(k, lambda k=k: calls.append(k) or k * 10)
    assert calls == [1, 2, 3, 2]  # 1 hit once; 2 fell out when 3 came (1 was used more recently)

    def boom() -> int:
        raise planner.PlanError("bw", "no")

    for _ in range(2):
        with pytest.raises(planner.PlanError):
            memo.get("x", boom)


def test_bound_and_star_tie_are_memoised() -> None:
    BOUNDS.clear()
    rng = np.random.default_rng(2)
    bw = np.round(rng.uniform(10, 100, (6, 6)), 1)
    np.fill_diagonal(bw, np.inf)
    first = planner.lower_bound(bw, (0, 2, 4), 1 << 20)
    assert planner.lower_bound(bw.copy(), [0, 2, 4], 1 << 20) == first
    assert planner.lower_bound(bw, (0, 2, 4), 1 << 21) == pytest.approx(2 * first)
    assert len(BOUNDS) == 2
    group_planner = GroupPlanner()
    plan = group_planner("crew", bw, (0, 2, 4), 1 << 20, part_bytes=65536)
    again = group_planner("crew", bw, (0, 2, 4), 1 << 20, part_bytes=65536)
    assert again == plan
    assert len(group_planner.star_ties) == 1 and len(group_planner.route_cache) == 1
    assert len(group_planner.crew_plans) == 1
    group_planner.clear()
    assert not group_planner.star_ties and not group_planner.route_cache
    assert not group_planner.crew_plans
    BOUNDS.clear()
    assert not BOUNDS
