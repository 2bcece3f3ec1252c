"""Unit tests for crew.plan.baselines: every scheme's routes compute the exact sum, use no dead
link, respect the lower bound, and the hand-checked choices (PS server, ring order) are the best."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest

from crew.config import Scheme
from crew.plan.baselines import (
    BASELINE_SCHEMES,
    RoutePlan,
    cost_pipelined,
    cost_store_and_forward,
    plan_a2a,
    plan_blink,
    plan_for,
    plan_ps,
    plan_ring,
    plan_topoadopt,
)
from crew.plan.bound import lower_bound
from crew.plan.inputs import BYTES_PER_S_PER_MBIT, ELEM_BYTES, PlanError
from crew.plan.routes import Route, RouteError, validate_routes
from crew.plan.trees import pack_trees

M = 400_000  # bytes: 1e5 float32 elements
REL = 1e-9
QUICK_SA = 150  # annealing steps in the many random cases; the default runs in its own tests
SCHEMES = [s.value for s in BASELINE_SCHEMES]


def secs(nbytes: float, mbit: float) -> float:
    return nbytes / (mbit * BYTES_PER_S_PER_MBIT)


def uniform(n: int, rate: float = 100.0) -> np.ndarray:
    bw = np.full((n, n), rate)
    np.fill_diagonal(bw, np.inf)
    return bw


def random_case(seed: int, dead: float = 0.0) -> tuple[np.ndarray, tuple[int, ...]]:
    """n in 6..8, p in 2..6, asymmetric rates in [10, 1000] Mbit/s, a fraction of dead links."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(6, 9))
    p = int(rng.integers(2, 7))
    bw = rng.uniform(10.0, 1000.0, (n, n))
    bw[rng.random((n, n)) < dead] = 0.0
    np.fill_diagonal(bw, np.inf)
    group = tuple(int(g) for g in rng.choice(n, size=p, replace=False))
    return bw, group


def build(scheme: str, bw: np.ndarray, group: tuple[int, ...], size: int = M) -> RoutePlan:
    if scheme == Scheme.TOPOADOPT:
        return plan_topoadopt(bw, group, size, seed=1, iterations=QUICK_SA)
    return plan_for(scheme, bw, group, size)


def execute(plan: RoutePlan, seed: int = 0) -> None:
    """Walk every route with random integer member vectors, independently of validate_routes:
    each member must end with every element of the exact sum, written exactly once."""
    rng = np.random.default_rng(seed)
    vec = {m: rng.integers(-(10**9), 10**9, plan.total) for m in plan.group}
    want = sum(vec.values())
    got = {m: np.zeros(plan.total, dtype=np.int64) for m in plan.group}
    written = {m: np.zeros(plan.total, dtype=int) for m in plan.group}
    for r in plan.routes:
        kids: dict[int, list[int]] = {}
        for child, parent in r.up:
            kids.setdefault(parent, []).append(child)
        visits = [0]

        def partial(
            x: int, r: Route = r, kids: dict[int, list[int]] = kids, visits: list[int] = visits
        ) -> np.ndarray:
            visits[0] += 1
            assert visits[0] <= plan.n * len(r.up) + 1, "reduce tree has a cycle"
            own = vec[x][r.start : r.stop] if x in vec else np.zeros(r.elems, dtype=np.int64)
            return own + sum((partial(c) for c in kids.get(x, [])), np.zeros(r.elems, np.int64))

        holds = {r.root: partial(r.root)}
        for _ in range(plan.n):  # broadcast, one tree level per round
            for parent, child in r.down:
                if parent in holds and child not in holds:
                    holds[child] = holds[parent]
        for m, value in holds.items():
            if m in got:
                got[m][r.start : r.stop] = value
                written[m][r.start : r.stop] += 1
    for m in plan.group:
        assert np.all(written[m] == 1), f"member {m} does not receive every element once"
        assert np.array_equal(got[m], want), f"member {m} ends with a wrong sum"


def used_links(plan: RoutePlan) -> set[tuple[int, int]]:
    return {e for r in plan.routes for e in (*r.up, *r.down)}


def check(plan: RoutePlan, bw: np.ndarray, group: tuple[int, ...], size: int = M) -> None:
    assert plan.group == group and plan.total * ELEM_BYTES == size
    validate_routes(plan.routes, group, plan.n, plan.total)
    execute(plan)
    for a, b in used_links(plan):
        assert bw[a, b] > 0, f"{plan.scheme} uses dead link {a}->{b}"
    bound = lower_bound(bw, group, size)
    assert plan.predicted_s >= bound * (1 - REL), (plan.scheme, plan.predicted_s, bound)
    pipe = cost_pipelined(plan.routes, bw, plan.n)
    saf = cost_store_and_forward(plan.routes, bw, plan.n)
    assert saf >= pipe * (1 - REL)
    assert pipe >= bound * (1 - REL)
    if plan.scheme == Scheme.RING:
        assert plan.predicted_s >= pipe * (1 - REL)
    elif plan.pipelined:
        assert plan.predicted_s == pytest.approx(pipe, rel=REL)
    else:
        assert plan.predicted_s == pytest.approx(saf, rel=REL)


# --------------------------------------------------------------------------- all schemes


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("scheme", SCHEMES)
def test_random_matrices_give_exact_sums_above_the_bound(scheme: str, seed: int) -> None:
    bw, group = random_case(seed)
    plan = build(scheme, bw, group)
    assert plan.scheme == scheme
    check(plan, bw, group)


def _ps_possible(bw: np.ndarray, group: tuple[int, ...]) -> bool:
    return any(
        all(bw[g, s] > 0 and bw[s, g] > 0 for g in group if g != s) for s in range(bw.shape[0])
    )


def _ring_possible(bw: np.ndarray, group: tuple[int, ...]) -> bool:
    first, *rest = group
    for perm in itertools.permutations(rest):
        cyc = (first, *perm)
        if all(bw[cyc[k], cyc[(k + 1) % len(cyc)]] > 0 for k in range(len(cyc))):
            return True
    return False


def _both_ways_connected(bw: np.ndarray, group: tuple[int, ...]) -> bool:
    seen = {group[0]}
    frontier = [group[0]]
    for x in frontier:
        for y in group:
            if y not in seen and bw[x, y] > 0 and bw[y, x] > 0:
                seen.add(y)
                frontier.append(y)
    return len(seen) == len(group)


ORACLE: dict[str, Callable[[np.ndarray, tuple[int, ...]], bool]] = {
    "ps": _ps_possible,
    "ring": _ring_possible,
    "a2a": lambda bw, g: all(bw[a, b] > 0 for a in g for b in g if a != b),
    "blink": _both_ways_connected,
    "blink-pipe": _both_ways_connected,
    "topoadopt": _both_ways_connected,
}


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("scheme", SCHEMES)
def test_dead_links_are_avoided_or_the_scheme_is_impossible(scheme: str, seed: int) -> None:
    bw, group = random_case(100 + seed, dead=0.3)
    if ORACLE[scheme](bw, group):
        check(build(scheme, bw, group), bw, group)
    else:
        with pytest.raises(PlanError) as err:
            build(scheme, bw, group)
        assert err.value.field == "bw"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_single_member_group_is_a_trivial_plan(scheme: str) -> None:
    bw = uniform(5)
    plan = build(scheme, bw, (3,))
    assert plan.predicted_s == 0.0
    assert plan.routes == (Route(0, M // ELEM_BYTES, 3, (), ()),)
    execute(plan)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_json_round_trip(scheme: str) -> None:
    bw, group = random_case(7)
    plan = build(scheme, bw, group)
    back = RoutePlan.from_json(plan.to_json())
    assert back == plan
    assert isinstance(back.scheme, Scheme) and back.scheme == scheme
    assert np.array_equal(back.link_load(), plan.link_load())


def test_from_dict_rejects_broken_routes() -> None:
    bw, group = random_case(3)
    data = plan_for("ps", bw, group, M).to_dict()
    data["routes"][0][3] = data["routes"][0][3][1:]  # one member no longer reaches the server
    with pytest.raises(PlanError) as err:
        RoutePlan.from_dict(data)
    assert err.value.field == "routes"
    with pytest.raises(PlanError) as err:
        RoutePlan.from_dict({"scheme": "ps"})
    assert err.value.field == "plan"


def unchecked(plan: RoutePlan, routes: tuple[Route, ...]) -> RoutePlan:
    """A copy of ``plan`` with other routes, bypassing RoutePlan's validation."""
    out = object.__new__(RoutePlan)
    for field, value in vars(plan).items():
        object.__setattr__(out, field, value)
    object.__setattr__(out, "routes", routes)
    return out


def test_executor_and_validate_routes_agree_on_broken_routes() -> None:
    """The executor is a second opinion on validate_routes: both must reject each breakage."""
    plan = plan_for("ps", uniform(4), (0, 1, 2), M)
    r = plan.routes[0]
    assert r.root == 0
    relay = Route(r.start, r.stop, r.root, (*r.up, (3, r.root)), r.down)
    execute(unchecked(plan, (relay,)))  # a relay adds nothing of its own: still exact
    overlap = (r, Route(0, 1, 0, (), ()))  # member 0 receives element 0 twice
    missing = (Route(r.start, r.stop, 0, ((1, 0),), r.down),)  # 2's copy is never summed
    short = (Route(r.start, r.stop - 1, 0, r.up, r.down),)  # the last element never moves
    for routes, why in (
        (overlap, "every element once"),
        (missing, "wrong sum"),
        (short, "every element once"),
    ):
        with pytest.raises(AssertionError, match=why):
            execute(unchecked(plan, routes))
        with pytest.raises(RouteError):
            validate_routes(routes, plan.group, plan.n, plan.total)


def test_plan_for_rejects_unknown_scheme() -> None:
    with pytest.raises(PlanError) as err:
        plan_for("gloo", uniform(3), (0, 1), M)
    assert err.value.field == "scheme" and "gloo" in str(err.value)


def test_inputs_are_checked() -> None:
    with pytest.raises(PlanError) as err:
        plan_ring(uniform(3), (0, 1), 6)  # not a whole number of float32 elements
    assert err.value.field == "size"
    with pytest.raises(PlanError) as err:
        plan_for("ring", uniform(3), (0, 1), M, active=[0])
    assert err.value.field == "group"
    with pytest.raises(PlanError) as err:
        plan_blink(uniform(3), (0, 1), M, pipelined=True, max_trees=0)
    assert err.value.field == "max_trees"
    with pytest.raises(PlanError) as err:
        cost_pipelined([Route(0, 4, 0, ((1, 0),), ())], uniform(3), 4)
    assert err.value.field == "n"


# --------------------------------------------------------------------------- cost models


def test_store_and_forward_on_a_chain_and_a_shared_link() -> None:
    bw = uniform(3, 100.0)
    bw[1, 2] = 50.0
    half = M // ELEM_BYTES // 2
    # chain 0 -> 1 -> 2 (root), broadcast 2 -> 1 -> 0: four whole-range hops, one at 50 Mbit/s
    chain = Route(0, 2 * half, 2, ((0, 1), (1, 2)), ((2, 1), (1, 0)))
    want = secs(M, 100) + secs(M, 50) + secs(M, 100) + secs(M, 100)
    assert cost_store_and_forward([chain], bw, 3) == pytest.approx(want, rel=REL)
    # streamed, the busiest link (1 -> 2 at 50) sets the pace
    assert cost_pipelined([chain], bw, 3) == pytest.approx(secs(M, 50), rel=REL)
    # two half ranges both sent 0 -> 1 at time 0: FCFS serves one after the other
    a = Route(0, half, 1, ((0, 1),), ())
    b = Route(half, 2 * half, 1, ((0, 1),), ())
    assert cost_store_and_forward([a, b], bw, 3) == pytest.approx(secs(M, 100), rel=REL)


def test_cost_models_refuse_dead_links() -> None:
    bw = uniform(3)
    bw[0, 1] = 0.0
    route = [Route(0, 10, 1, ((0, 1),), ())]
    for cost in (cost_pipelined, cost_store_and_forward):
        with pytest.raises(PlanError, match="dead link 0->1"):
            cost(route, bw, 3)


# --------------------------------------------------------------------------- PS


def ps_matrix() -> np.ndarray:
    """Members 0, 1 share a 10 Mbit/s link; 2 and 3 reach both at 100 resp. 50 Mbit/s."""
    bw = uniform(4, 10.0)
    for g in (0, 1):
        bw[g, 2] = bw[2, g] = 100.0
        bw[g, 3] = bw[3, g] = 50.0
    return bw


def test_ps_picks_the_fastest_server_even_a_non_member() -> None:
    bw = ps_matrix()
    # by hand: server 0 or 1: M/10 + M/10; server 2: M/100 + M/100; server 3: M/50 + M/50
    plan = plan_ps(bw, (0, 1), M)
    assert plan.routes[0].root == 2
    assert plan.predicted_s == pytest.approx(2 * secs(M, 100), rel=REL)
    assert plan_ps(bw, (0, 1), M, active=[0, 1, 3]).routes[0].root == 3
    assert plan_ps(bw, (0, 1), M, active=[0, 1]).routes[0].root == 0  # tie: lowest index
    bw[2, 0] = 0.0  # 2 can no longer send the sum back to 0
    assert plan_ps(bw, (0, 1), M).routes[0].root == 3
    route = plan_ps(bw, (0, 1), M).routes[0]
    assert set(route.up) == {(0, 3), (1, 3)} and set(route.down) == {(3, 0), (3, 1)}


def test_ps_with_member_server_sends_nothing_to_itself() -> None:
    bw = uniform(3, 100.0)
    bw[2, :] = bw[:, 2] = 1.0  # non-member 2 is useless; ties between 0 and 1 go to 0
    bw[2, 2] = np.inf
    plan = plan_ps(bw, (0, 1), M)
    assert plan.routes[0].root == 0 and plan.routes[0].up == ((1, 0),)
    assert plan.predicted_s == pytest.approx(2 * secs(M, 100), rel=REL)


# --------------------------------------------------------------------------- Ring


def ring_order(plan: RoutePlan) -> tuple[int, ...]:
    succ = dict(used_links(plan))
    assert len(succ) == len(plan.group), "ring links are not a single cycle"
    order = [min(plan.group)]
    while len(order) < len(plan.group):
        order.append(succ[order[-1]])
    assert succ[order[-1]] == order[0]
    return tuple(order)


def test_ring_picks_the_best_order_by_hand() -> None:
    bw = uniform(5, 10.0)
    for a, b in ((0, 2), (2, 1), (1, 3), (3, 0)):
        bw[a, b] = 50.0  # the only cycle with every link at 50
    for a, b in ((0, 3), (3, 1), (1, 2), (2, 0)):
        bw[a, b] = 40.0
    plan = plan_ring(bw, (0, 1, 2, 3), M)
    assert ring_order(plan) == (0, 2, 1, 3)
    assert not plan.pipelined
    assert plan.predicted_s == pytest.approx(2 * 3 * secs(M / 4, 50), rel=REL)
    check(plan, bw, (0, 1, 2, 3))
    # chunk k is owned by o_k: its reduce ends there and its broadcast starts there
    for r in plan.routes:
        assert r.up[-1][1] == r.root == r.down[0][0]
    load = plan.link_load()
    for a, b in ((0, 2), (2, 1), (1, 3), (3, 0)):
        assert load[a, b] == pytest.approx(2 * 3 * M / 4, abs=2 * 3 * ELEM_BYTES)


def test_ring_breaks_bottleneck_ties_by_the_next_slowest_link() -> None:
    bw = uniform(3, 20.0)
    bw[1, 2] = bw[2, 0] = 30.0  # 0 -> 1 -> 2 -> 0: links 20, 30, 30
    bw[0, 2] = 20.0
    bw[2, 1] = bw[1, 0] = 90.0  # 0 -> 2 -> 1 -> 0: links 20, 90, 90
    assert ring_order(plan_ring(bw, (2, 0, 1), M)) == (0, 2, 1)


def test_ring_without_a_live_cycle_is_refused() -> None:
    bw = uniform(4)
    bw[1, 2] = bw[0, 2] = 0.0  # 2 can only be entered from 3, a non-member
    with pytest.raises(PlanError) as err:
        plan_ring(bw, (0, 1, 2), M)
    assert err.value.field == "bw" and "cycle" in str(err.value)


@pytest.mark.parametrize("p", [9, 10])
def test_ring_heuristic_for_large_groups(p: int) -> None:
    rng = np.random.default_rng(p)
    bw = rng.uniform(10.0, 1000.0, (10, 10))
    bw[rng.random((10, 10)) < 0.3] = 0.0
    np.fill_diagonal(bw, np.inf)
    group = tuple(range(p))
    plan = plan_ring(bw, group, M)
    check(plan, bw, group)
    order = ring_order(plan)
    neck = min(bw[order[k], order[(k + 1) % p]] for k in range(p))
    chunk = math.ceil(M / ELEM_BYTES / p) * ELEM_BYTES
    assert plan.predicted_s == pytest.approx(2 * (p - 1) * secs(chunk, neck), rel=REL)


def test_ring_heuristic_finds_a_planted_fast_cycle() -> None:
    p = 10
    bw = uniform(p, 10.0)
    planted = (0, 7, 3, 9, 1, 5, 8, 2, 6, 4)
    for k in range(p):
        bw[planted[k], planted[(k + 1) % p]] = 100.0 + k  # the only cycle with all links >= 100
    plan = plan_ring(bw, tuple(range(p)), M)
    assert ring_order(plan) == planted


def test_ring_with_fewer_elements_than_members_skips_empty_chunks() -> None:
    plan = plan_ring(uniform(4), (0, 1, 2, 3), 2 * ELEM_BYTES)
    assert len(plan.routes) == 2
    execute(plan)


# --------------------------------------------------------------------------- all-to-all


def test_a2a_every_member_sends_its_vector_to_every_other() -> None:
    bw, group = random_case(5)
    p = len(group)
    plan = plan_a2a(group, M, bw.shape[0], bw=bw)
    load = plan.link_load()
    for g in group:
        assert load[g].sum() == (p - 1) * M
        for h in group:
            if h != g:
                assert load[g, h] == M
    assert load.sum() == p * (p - 1) * M
    slowest = min(bw[a, b] for a in group for b in group if a != b)
    assert plan.predicted_s == pytest.approx(secs(M, slowest), rel=REL)
    assert all(r.down == () for r in plan.routes)


def test_a2a_without_bw_is_routes_only() -> None:
    plan = plan_a2a((0, 2), M, 3)
    assert math.isnan(plan.predicted_s)
    back = RoutePlan.from_json(plan.to_json())
    assert back.routes == plan.routes and math.isnan(back.predicted_s)
    execute(plan)


# --------------------------------------------------------------------------- BLINK


@pytest.mark.parametrize("seed", range(6))
def test_blink_shares_follow_packed_tree_rates(seed: int) -> None:
    bw, group = random_case(200 + seed)
    trees = pack_trees(bw, group)
    assert 1 <= len(trees) <= 4
    used = np.zeros_like(bw)
    for t in trees:
        assert len(t.edges) == len(group) - 1 and t.rate > 0
        assert all(a in group and b in group for a, b in t.edges)
        for a, b in t.edges:
            used[a, b] += t.rate
            used[b, a] += t.rate
    off = ~np.eye(bw.shape[0], dtype=bool)
    assert np.all(used[off] <= bw[off] * (1 + REL)), "packing oversubscribes a link"
    for pipelined in (False, True):
        plan = plan_blink(bw, group, M, pipelined=pipelined)
        assert plan.pipelined is pipelined
        shares = [r.elems for r in plan.routes]
        assert sum(shares) == plan.total
        rates = np.array([t.rate for t in trees])
        quota = rates / rates.sum() * plan.total
        assert len(shares) == len(trees)  # M is large: no tree rounds to nothing
        assert np.all(np.abs(np.array(shares) - quota) < 1.0)
        for r, t in zip(plan.routes, trees, strict=True):
            assert {tuple(sorted(e)) for e in r.up} == set(t.edges)
            assert sorted(r.down) == sorted((b, a) for a, b in r.up)
        check(plan, bw, group)
    streamed = plan_blink(bw, group, M, pipelined=True).predicted_s
    # packed rates add up (up to one rounded element per tree)
    slack = secs(len(trees) * ELEM_BYTES, rates.min())
    assert streamed <= secs(M, rates.sum()) * (1 + REL) + slack
    assert streamed <= plan_blink(bw, group, M, pipelined=False).predicted_s


def test_blink_packs_two_trees_on_a_uniform_triangle() -> None:
    # K3 at 100 both ways: first tree takes two edges at 100, the last edge alone cannot span
    trees = pack_trees(uniform(3), (0, 1, 2), max_trees=4)
    assert [t.rate for t in trees] == [100.0]
    # K4: two edge-disjoint spanning trees at 100 each, then nothing spans (a star first would
    # leave only a triangle: the degree tie-break avoids it)
    trees = pack_trees(uniform(4), (0, 1, 2, 3))
    assert [t.rate for t in trees] == [100.0, 100.0]
    assert not set(trees[0].edges) & set(trees[1].edges)


# --------------------------------------------------------------------------- TopoAdopt


@pytest.mark.parametrize("seed", range(3))
def test_topoadopt_is_deterministic_and_no_worse_than_its_start(seed: int) -> None:
    bw, group = random_case(300 + seed)
    if len(group) < 3:
        group = (*group, next(i for i in range(bw.shape[0]) if i not in group))
    first = plan_topoadopt(bw, group, M, seed=seed)
    assert plan_topoadopt(bw, group, M, seed=seed) == first
    start = plan_blink(bw, group, M, pipelined=False, max_trees=3)
    assert first.predicted_s <= start.predicted_s * (1 + REL)
    assert not first.pipelined
    check(first, bw, group)
    assert all(len(r.up) == len(group) - 1 for r in first.routes)
    assert plan_topoadopt(bw, group, M, seed=seed, iterations=0).predicted_s == pytest.approx(
        start.predicted_s, rel=REL
    )


def test_topoadopt_improves_on_a_case_with_a_better_tree() -> None:
    # members 0..3 all at 100 except a slow hub: BLINK's first tree is not the shallowest one
    bw = uniform(4, 100.0)
    bw[0, 1] = bw[1, 0] = 1000.0
    bw[1, 2] = bw[2, 1] = 1000.0
    bw[2, 3] = bw[3, 2] = 1000.0
    start = plan_blink(bw, (0, 1, 2, 3), M, pipelined=False, max_trees=3).predicted_s
    best = plan_topoadopt(bw, (0, 1, 2, 3), M, seed=0).predicted_s
    assert best < start
