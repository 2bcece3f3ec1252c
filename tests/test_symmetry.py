"""Plans shared between groups that are the same up to renaming workers (crew.plan.symmetry)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crew.config import Scheme
from crew.plan import symmetry
from crew.plan.inputs import SharedLink
from crew.plan.routes import link_load, validate_routes
from crew.plan.schemes import GroupPlanner, plan_group

SIZE = 1 << 20


def uniform(n: int, mbit: float = 36.7) -> np.ndarray:
    bw = np.full((n, n), mbit)
    np.fill_diagonal(bw, np.inf)
    return bw


def uneven(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    bw = rng.uniform(5.0, 100.0, (n, n)).round(1)
    np.fill_diagonal(bw, np.inf)
    return bw


def test_isomorphic_groups_share_one_key_and_different_ones_do_not() -> None:
    bw = uniform(8)
    keys = set()
    for members in [(0, 1, 2, 3), (4, 5, 6, 7), (0, 2, 5, 7)]:
        order = symmetry.canonical_order(bw, members, None)
        assert sorted(order[:4]) == sorted(members)  # members come first
        keys.add(symmetry.canonical_key(order, bw, members, None, None, None, SIZE))
    assert len(keys) == 1
    bw2 = bw.copy()
    bw2[0, 1] = 10.0  # group (0, 1, 2, 3) now holds a slow link, (4, 5, 6, 7) does not
    k = [
        symmetry.canonical_key(symmetry.canonical_order(bw2, m, None), bw2, m, None, None, None)
        for m in [(0, 1, 2, 3), (4, 5, 6, 7)]
    ]
    assert k[0] != k[1]


def test_the_key_covers_active_set_shared_links_delays_and_size() -> None:
    bw = uniform(6)
    m = (0, 1, 2)
    order = symmetry.canonical_order(bw, m, None)
    base = symmetry.canonical_key(order, bw, m, None, None, None, SIZE)
    assert symmetry.canonical_key(order, bw, m, None, None, None, SIZE * 2) != base
    assert symmetry.canonical_key(order, bw, m, [0, 1, 2, 3], None, None, SIZE) != base
    link = SharedLink(((0, 3), (1, 3)), 50.0)
    assert symmetry.canonical_key(order, bw, m, None, [link], None, SIZE) != base
    delay = np.full((6, 6), 0.01)
    assert symmetry.canonical_key(order, bw, m, None, None, delay, SIZE) != base


def test_a_cached_plan_is_renamed_onto_the_new_group() -> None:
    bw = uniform(8)
    planner = GroupPlanner()
    first = planner(Scheme.CREW, bw, (0, 1, 2, 3), SIZE, part_bytes=65536)
    second = planner(Scheme.CREW, bw, (2, 4, 5, 7), SIZE, part_bytes=65536)
    assert len(planner.crew_plans) == 1  # one plan served both groups
    assert len(planner.route_cache) == 1  # and one route LP made it
    validate_routes(second.routes, (2, 4, 5, 7), 8, SIZE // 4)
    assert second.members == (2, 4, 5, 7)
    assert second.predicted_s == first.predicted_s
    # the same load, moved by the renaming: sorted per-link loads agree
    a, b = link_load(first.routes, 8), link_load(second.routes, 8)
    assert sorted(a.ravel()) == sorted(b.ravel())
    cold = plan_group(Scheme.CREW, bw, (2, 4, 5, 7), SIZE, part_bytes=65536)
    assert cold.predicted_s == pytest.approx(second.predicted_s, rel=1e-9)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), perm_seed=st.integers(0, 10_000))
def test_a_renamed_network_gets_the_renamed_plan(seed: int, perm_seed: int) -> None:
    """Renaming the workers of an uneven network: the plan is served from the cache, valid for
    the renamed group, and as fast as planning that group from scratch."""
    planner = GroupPlanner()
    n = 6
    bw = uneven(n, seed)
    members = (0, 2, 3)
    plan = planner(Scheme.CREW, bw, members, SIZE)
    perm = np.random.default_rng(perm_seed).permutation(n)  # worker i becomes perm[i]
    bw2 = np.empty_like(bw)
    bw2[np.ix_(perm, perm)] = bw
    members2 = tuple(sorted(int(perm[m]) for m in members))
    renamed = planner(Scheme.CREW, bw2, members2, SIZE)
    assert len(planner.crew_plans) == 1  # served from the cache
    validate_routes(renamed.routes, members2, n, SIZE // 4)
    assert renamed.predicted_s == plan.predicted_s
    loads = link_load(renamed.routes, n)
    assert np.allclose(loads[np.ix_(perm, perm)], link_load(plan.routes, n))
    cold = plan_group(Scheme.CREW, bw2, members2, SIZE)
    # equally fast LP optima may round to whole elements differently (a few elements of 262,144)
    assert cold.predicted_s == pytest.approx(renamed.predicted_s, rel=1e-4)


def test_rename_round_trip() -> None:
    bw = uneven(5, 3)
    order = symmetry.canonical_order(bw, (1, 4), None)
    plan = plan_group(Scheme.CREW, bw, (1, 4), SIZE)
    there = symmetry.rename_routes(plan.routes, symmetry.to_canonical(order))
    assert symmetry.rename_routes(there, order) == plan.routes
