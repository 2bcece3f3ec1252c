"""Unit tests for crew.plan.routelp, CREW's route LP: no baseline beats it, routes are exact, and
latency and shared capacities change the plan the way the cost model says."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crew.plan import baselines, planner, routelp
from crew.plan.planner import PlanError, SharedLink, lower_bound
from crew.plan.routelp import DEFAULT_SETTINGS, RouteLPCache, RouteLPSettings, levels
from crew.plan.routelp.levels import LevelLP, choose_level
from crew.plan.routelp.master import MasterLP
from crew.plan.routelp.pricing import price_exact
from crew.plan.routelp.seeds import relay_star_columns, seed_columns
from crew.plan.routes import validate_routes
from crew.plan.schemes import plan_group

MB16 = 16_777_216
REL = 1e-6  # whole elements move a time by about one element in millions


def sym(n: int, rates: list[float]) -> np.ndarray:
    """Symmetric matrix from the upper triangle's rates in row order."""
    bw = np.full((n, n), np.inf)
    it = iter(rates)
    for i in range(n):
        for j in range(i + 1, n):
            bw[i, j] = bw[j, i] = next(it)
    return bw


def check_routes(rp: routelp.RoutePlanResult, bw: np.ndarray, members, size, active=None):
    n = bw.shape[0]
    validate_routes(rp.routes, members, n, size // 4)
    act = set(range(n)) if active is None else set(active)
    for r in rp.routes:
        assert isinstance(r.start, int) and isinstance(r.stop, int)
        assert r.nodes() <= act, f"route through an inactive worker: {r}"
        for a, b in (*r.up, *r.down):
            assert bw[a, b] > 0, f"dead link {a}->{b} used"


def baseline_plans(bw, members, size, active):
    """Every baseline's plan that exists on these inputs, with its own predicted time."""
    out = {}
    for scheme in ("ps", "ring", "a2a", "blink", "blink-pipe"):
        try:
            out[scheme] = baselines.plan_for(scheme, bw, members, size, active=active)
        except PlanError:
            pass
    try:
        out["topoadopt"] = baselines.plan_topoadopt(bw, members, size, iterations=150)
    except PlanError:
        pass
    for scheme in ("crew-star", "crew-paper", "preduce", "crew-relay"):
        try:
            out[scheme] = plan_group(scheme, bw, members, size, active=active)
        except PlanError:
            pass
    return out


# --------------------------------------------------------------------------- named cases


def test_one_slow_pair_beats_blink_and_nears_the_bound() -> None:
    # issue 10: 4 clouds, pairs at 20, 40, 60, 80, 100, 30 Mbit/s, p = n = 4, 16.8 MB:
    # the star LP planned 2.68 s, blink-pipe 1.34 s, the bound is 1.12 s.
    bw = sym(4, [20, 40, 60, 80, 100, 30])
    members = (0, 1, 2, 3)
    rp = routelp.plan_routes(bw, members, MB16)
    check_routes(rp, bw, members, MB16)
    bound = lower_bound(bw, members, MB16)
    blink = baselines.plan_for("blink-pipe", bw, members, MB16).predicted_s
    assert rp.optimal
    assert rp.predicted_s <= blink
    assert rp.predicted_s <= 1.10 * bound
    assert rp.predicted_s == pytest.approx(rp.lp_s, rel=REL)
    assert planner.solve_pipelined(bw, members, MB16).predicted_s > 2 * bound  # the old plan


def test_uniform_clouds_reach_the_ring_limit() -> None:
    # p = n = 4 at 50 Mbit/s: every route crosses >= 6 of the 12 links, so M/2 per link is
    # the best any route mix can do: 1.342 s, the ring's limit.
    bw = sym(4, [50.0] * 6)
    rp = routelp.plan_routes(bw, (0, 1, 2, 3), MB16)
    assert rp.predicted_s == pytest.approx(MB16 / 2 / (50e6 / 8), rel=REL)


def test_crew_relay_is_priced_with_both_hops() -> None:
    """The old crew-relay predicted 0.96 s below the 1.12 s bound on the slow pair."""
    bw = sym(4, [20, 40, 60, 80, 100, 30])
    plan = plan_group("crew-relay", bw, (0, 1, 2, 3), MB16)
    assert plan.predicted_s >= lower_bound(bw, (0, 1, 2, 3), MB16)
    assert plan.predicted_s == pytest.approx(
        baselines.cost_pipelined(plan.routes, bw, 4), rel=1e-12
    )


# --------------------------------------------------------------------------- the guarantee


@st.composite
def instances(draw):
    n = draw(st.integers(2, 7))
    p = draw(st.integers(2, min(n, 5)))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    bw = rng.choice([5.0, 10.0, 20.0, 50.0, 100.0, 1000.0], size=(n, n))
    bw *= rng.uniform(0.5, 1.5, size=(n, n))
    dead = rng.random((n, n)) < draw(st.sampled_from([0.0, 0.15, 0.3]))
    bw[dead] = 0.0
    np.fill_diagonal(bw, np.inf)
    members = tuple(sorted(rng.choice(n, p, replace=False).tolist()))
    others = [i for i in range(n) if i not in members]
    inactive = [i for i in others if rng.random() < draw(st.sampled_from([0.0, 0.5]))]
    active = tuple(i for i in range(n) if i not in inactive)
    size = 4 * draw(st.integers(1, 3_000_000))
    return bw, members, size, active


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_no_baseline_beats_crew(case) -> None:
    bw, members, size, active = case
    try:
        crew = plan_group("crew", bw, members, size, active=active)
    except PlanError:
        # then no route reaches every member, so no baseline can exist either
        assert not baseline_plans(bw, members, size, active)
        return
    rp = routelp.plan_routes(bw, members, size, active)
    check_routes(rp, bw, members, size, active)
    # The same LP optimum; a degenerate LP may round its fractions to whole elements one
    # element apart from one solve to the next (seen: 503012 against 503013 of 749999).
    assert crew.predicted_s == pytest.approx(rp.predicted_s, rel=REL)
    assert crew.predicted_s >= lower_bound(bw, members, size, active) * (1 - 1e-9)
    # The LP optimum is never above a baseline's (its routes are columns, or pricing proved
    # nothing beats the pool); whole elements add at most one element per route to a link.
    slowest = float(bw[np.isfinite(bw) & (bw > 0)].min()) * 1e6 / 8
    slack = 2 * len(crew.routes) * 4 / slowest
    for scheme, plan in baseline_plans(bw, members, size, active).items():
        assert crew.predicted_s <= plan.predicted_s * (1 + 1e-9) + slack, scheme
    assert rp.lp_s <= min(
        (p.predicted_s for p in baseline_plans(bw, members, size, active).values()),
        default=math.inf,
    ) * (1 + 1e-6)


def test_warm_start_changes_nothing_but_time() -> None:
    rng = np.random.default_rng(7)
    bw = rng.uniform(10, 100, (8, 8))
    np.fill_diagonal(bw, np.inf)
    group = (8, (0, 3, 5, 6), np.ones(8, dtype=bool).tobytes())  # the warm pool's key
    cache = RouteLPCache()
    cold = routelp.plan_routes(bw, (0, 3, 5, 6), MB16)
    routelp.plan_routes(bw * 1.1, (0, 3, 5, 6), MB16, cache=cache)  # fills the warm pool
    assert cache.warm_shapes(group)
    warm = routelp.plan_routes(bw, (0, 3, 5, 6), MB16, cache=cache)
    assert warm.predicted_s == pytest.approx(cold.predicted_s, rel=1e-5)
    assert warm.rounds < cold.rounds  # the warm columns started the pool near the optimum
    assert routelp.plan_routes(bw, (0, 3, 5, 6), MB16, cache=cache) is warm  # identical: cached
    assert routelp.plan_routes(bw, (0, 3, 5, 6), MB16) is not warm  # no cache: planned anew
    cache.clear()
    assert len(cache) == 0 and not cache.warm_shapes(group)


def test_offsets_exact_for_a_large_group_and_vector() -> None:
    rng = np.random.default_rng(3)
    n = 96
    bw = rng.uniform(10, 1000, (n, n))
    np.fill_diagonal(bw, np.inf)
    members = tuple(range(0, n, 3))
    size = 4 * (2**29 + 12345)
    rp = routelp.plan_routes(bw, members, size)
    check_routes(rp, bw, members, size)
    assert not rp.optimal or rp.columns > 0
    star = planner.solve_pipelined(bw, members, size).predicted_s
    assert rp.predicted_s <= star * (1 + REL)


# --------------------------------------------------------------------------- latency


def relay_triangle() -> np.ndarray:
    """Members 0 and 1 on a 10 Mbit/s link; helper 2 at 100 Mbit/s to both."""
    bw = np.array([[np.inf, 10, 100], [10, np.inf, 100], [100, 100, np.inf]], dtype=float)
    return bw


def test_relay_wins_without_latency_and_loses_with_it() -> None:
    bw = relay_triangle()
    size = 400_000  # 3.2 Mbit: 0.32 s over the direct link, 0.032 s through the relay
    fast = routelp.plan_routes(bw, (0, 1), size)
    assert any(2 in r.nodes() for r in fast.routes)  # the relay pays
    delay = np.zeros((3, 3))
    delay[0, 2] = delay[2, 0] = delay[1, 2] = delay[2, 1] = 0.5  # far away
    slow = routelp.plan_routes(bw, (0, 1), size, delay_s=delay)
    assert all(2 not in r.nodes() for r in slow.routes)  # direct only
    direct_only = routelp.plan_routes(bw, (0, 1), size, active=(0, 1))
    assert slow.predicted_s == pytest.approx(direct_only.predicted_s, rel=REL)
    assert slow.latency_s == 0.0
    assert slow.predicted_s == pytest.approx(0.32, rel=REL)
    # with the same delays, the relayed plan costs its bandwidth time + at least 2 x 0.5 s
    relayed = routelp.route_time(fast.routes, bw, delay_s=delay)
    assert relayed >= fast.predicted_s + 1.0 - 1e-9
    assert slow.predicted_s < relayed
    # and a small delay keeps the relay, paying its latency
    near = routelp.plan_routes(bw, (0, 1), size, delay_s=delay / 1000)
    assert any(2 in r.nodes() for r in near.routes)
    assert near.latency_s >= 0.001
    assert near.predicted_s == pytest.approx(near.bandwidth_s + near.latency_s, rel=1e-12)
    assert near.predicted_s < 0.1


def test_latency_bound_counts_the_shortest_delay_path() -> None:
    bw = relay_triangle()
    delay = np.full((3, 3), 0.2)
    delay[0, 1] = delay[1, 0] = 1.0
    size = 4_000_000
    plain = lower_bound(bw, (0, 1), size)
    with_delay = lower_bound(bw, (0, 1), size, delay_s=delay)
    assert with_delay == pytest.approx(plain + 0.4)  # 0 -> 2 -> 1 is 0.4 s
    rp = routelp.plan_routes(bw, (0, 1), size, delay_s=delay)
    assert rp.predicted_s >= with_delay


def test_part_fill_counts_each_hop() -> None:
    bw = relay_triangle()
    hop = routelp.hop_latency(bw, None, part_bytes=1_250_000)  # 10 Mbit: 1 s, 100 Mbit: 0.1 s
    assert hop[0, 1] == pytest.approx(1.0)
    assert hop[0, 2] == pytest.approx(0.1)


# --------------------------------------------------------------------------- shared links


def two_clouds() -> tuple[np.ndarray, list[SharedLink]]:
    """Workers 0, 1 in cloud A and 2, 3 in cloud B: 1000 Mbit/s inside, 100 per WAN pair,
    but one 100 Mbit/s WAN uplink per direction shared by the pairs crossing it."""
    bw = np.full((4, 4), 100.0)
    bw[0, 1] = bw[1, 0] = bw[2, 3] = bw[3, 2] = 1000.0
    np.fill_diagonal(bw, np.inf)
    ab = tuple((a, b) for a in (0, 1) for b in (2, 3))
    ba = tuple((b, a) for a, b in ab)
    return bw, [SharedLink(ab, 100.0, 0.01), SharedLink(ba, 100.0, 0.01)]


def test_shared_uplink_caps_the_plan_and_the_bound() -> None:
    bw, shared = two_clouds()
    size = 8_000_000
    members = (0, 2)
    free = routelp.plan_routes(bw, members, size)
    capped = routelp.plan_routes(bw, members, size, shared=shared)
    check_routes(capped, bw, members, size)
    # Without sharing, helpers 1 and 3 open three more WAN pairs; with it, M must cross the
    # one 100 Mbit/s uplink each way: 0.64 s, and the bound knows it.
    wan = size * 8 / 100e6
    assert free.predicted_s < 0.5 * wan
    assert capped.bandwidth_s == pytest.approx(wan, rel=REL)
    assert lower_bound(bw, members, size) < 0.5 * wan
    assert lower_bound(bw, members, size, shared=shared) == pytest.approx(wan, rel=1e-6)
    # The uplink's delay is a floor for every pair crossing it; with two members the best
    # plan is all-to-all (each sends its vector across once: one hop of latency).
    assert capped.latency_s == pytest.approx(0.01)
    assert lower_bound(bw, members, size, shared=shared, delay_s=np.zeros((4, 4))) >= 0.01
    assert routelp.bandwidth_time(free.routes, bw, shared) > capped.bandwidth_s * (1 - REL)


def test_shared_links_are_checked() -> None:
    with pytest.raises(PlanError, match="shared"):
        SharedLink(((0, 0),), 10.0)
    with pytest.raises(PlanError, match="shared"):
        SharedLink(((0, 1),), 0.0)
    with pytest.raises(PlanError, match="shared"):
        routelp.plan_routes(np.full((2, 2), 10.0), (0, 1), 8, shared=[SharedLink(((0, 5),), 1.0)])
    with pytest.raises(PlanError, match="delay_s"):
        routelp.plan_routes(np.full((2, 2), 10.0), (0, 1), 8, delay_s=np.zeros((3, 3)))


def test_unreachable_members_are_refused() -> None:
    bw = np.array([[np.inf, 0, 10], [0, np.inf, 10], [10, 10, np.inf]])
    with pytest.raises(PlanError):
        routelp.plan_routes(bw, (0, 1), 400, active=(0, 1))
    rp = routelp.plan_routes(bw, (0, 1), 400)  # through helper 2
    assert all(2 in r.nodes() for r in rp.routes)
    assert math.isfinite(rp.predicted_s)


# --------------------------------------------------------------------------- capped plans


@pytest.mark.parametrize("seed", range(6))
def test_gap_bounds_a_capped_plan(seed) -> None:
    """A plan cut short (max_rounds) states a gap; the optimum is never below the bound it
    implies, and the uncapped plan proves its own optimality (gap 0)."""
    rng = np.random.default_rng(seed)
    n = 8 + 3 * (seed % 3)  # 8, 11, 14: without and with the max-flow stop
    bw = rng.choice([5.0, 10.0, 20.0, 50.0, 100.0], size=(n, n)) * rng.uniform(0.5, 1.5, (n, n))
    np.fill_diagonal(bw, np.inf)
    members = tuple(sorted(rng.choice(n, 4, replace=False).tolist()))
    unbounded = RouteLPSettings(time_budget_s=60, max_rounds=400)
    full = routelp.plan_routes(bw, members, MB16, settings=unbounded)
    capped = routelp.plan_routes(bw, members, MB16, settings=RouteLPSettings(max_rounds=1))
    check_routes(capped, bw, members, MB16)
    assert full.optimal and full.gap == 0.0
    assert capped.lp_s >= full.lp_s * (1 - REL)  # fewer columns never beat the optimum
    assert math.isfinite(capped.gap) and capped.gap >= 0.0
    # lp_s / (1 + gap) is the lower bound the capped plan found: it never exceeds the optimum
    assert capped.lp_s / (1 + capped.gap) <= full.lp_s * (1 + REL)
    assert capped.gap >= capped.lp_s / full.lp_s - 1 - REL


def test_settings_apply_only_to_the_call_they_are_passed_to() -> None:
    rng = np.random.default_rng(11)
    bw = rng.uniform(10, 100, (10, 10))
    np.fill_diagonal(bw, np.inf)
    capped = routelp.plan_routes(bw, (0, 2, 5, 7), MB16, settings=RouteLPSettings(max_rounds=1))
    default = routelp.plan_routes(bw, (0, 2, 5, 7), MB16)
    assert capped.rounds == 1
    assert default.rounds > 1 and default.optimal
    with pytest.raises(PlanError, match="max_rounds"):
        RouteLPSettings(max_rounds=0)
    with pytest.raises(PlanError, match="settings"):
        routelp.plan_routes(bw, (0, 2), MB16, settings={"max_rounds": 1})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- latency levels


def brute_force_choose(master: MasterLP, seconds_per_unit: float) -> float:
    """min over every latency level l of T_bw(l) + the worst used latency: every level solved."""
    lat = np.asarray(master.lat)
    best = math.inf
    for lam in np.unique(lat):
        sol = master.solve(allowed=lat <= lam)
        assert sol is not None
        x, t = sol[0], sol[1]
        best = min(best, t * seconds_per_unit + float(lat[x > 1e-9].max()))
    return best


def _many_levels(seed: int) -> tuple[MasterLP, float]:
    """A master LP with many latency levels (random rates and delays, 64 KiB parts)."""
    rng = np.random.default_rng(seed)
    n, members, size = 8, (0, 2, 5, 7), 8 << 20
    bw = np.round(rng.uniform(10, 110, (n, n)), 1)
    np.fill_diagonal(bw, np.inf)
    delays = rng.uniform(0.0, 0.03, (n, n))
    hop = routelp.hop_latency(bw, delays, part_bytes=65536)
    master = MasterLP(bw, (), hop)
    act = np.ones(n, dtype=bool)
    for col in seed_columns(bw, members, act, with_ring=True):
        master.add(col)
    for col in relay_star_columns(bw, members, act):
        master.add(col)
    usable = np.isfinite(bw) & (bw > 0)
    for k in range(6):  # trees of least dual-weighted cost on random weights: many levels
        wts = rng.uniform(0.1, 1.0, (n, n))
        for _, shape in price_exact(wts, usable, members, np.arange(n), math.inf, 8)[1]:
            master.add(routelp.Column((shape,), f"tree{k}"))
    assert len(np.unique(master.lat)) > 20
    return master, size / (master.r_ref * planner.BYTES_PER_S_PER_MBIT)


def _counted_choose(
    master: MasterLP, spu: float, tolerance: float = 0.0
) -> tuple[float, float, int]:
    """(modelled time T_bw + latency of choose_level's plan, that latency, LP solves)."""
    solves = []
    real_solve = master.solve
    master.solve = lambda *a, **kw: solves.append(1) or real_solve(*a, **kw)  # type: ignore[method-assign]
    try:
        settings = RouteLPSettings(level_tolerance=tolerance)
        x, t_bw, lat = choose_level(master, spu, settings)
    finally:
        master.solve = real_solve  # type: ignore[method-assign]
    assert lat == pytest.approx(float(np.asarray(master.lat)[x > 1e-9].max()))
    return t_bw + lat, lat, len(solves)


@pytest.mark.parametrize("seed", range(10))
def test_latency_levels_branch_and_bound_matches_every_level(seed) -> None:
    """``choose_level`` solves a few levels, yet finds the optimum of solving all of them."""
    master, spu = _many_levels(seed)
    t, _, chosen = _counted_choose(master, spu)
    assert t == pytest.approx(brute_force_choose(master, spu), rel=1e-7)
    assert chosen < len(np.unique(master.lat))


@pytest.mark.parametrize("seed", range(6))
def test_level_tolerance_stays_within_its_factor(seed) -> None:
    """With a tolerance the search skips levels, and its plan is within 1 / (1 - tol) of the
    optimum over every level."""
    master, spu = _many_levels(seed)
    best = brute_force_choose(master, spu)
    _, _, exact_solves = _counted_choose(master, spu)
    for tol in (0.01, 0.05, 0.2):
        t, _, solves = _counted_choose(master, spu, tol)
        assert best * (1 - 1e-7) <= t <= best / (1 - tol) * (1 + 1e-7)
        assert solves <= exact_solves
    assert solves < exact_solves  # 20% skips levels on every seed here (3-4 solves, not 8-12)


def test_settings_are_checked_and_each_says_why() -> None:
    with pytest.raises(PlanError, match="level_tolerance"):
        RouteLPSettings(level_tolerance=1.0)
    with pytest.raises(PlanError, match="time_budget_s"):
        RouteLPSettings(time_budget_s=0.0)
    with pytest.raises(PlanError, match="exact"):
        RouteLPSettings(exact=1)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="cross_pairs"):
        RouteLPSettings(cross_pairs=1)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="gap"):
        RouteLPSettings(gap=math.nan)
    assert RouteLPSettings(level_rows_min_n=0).level_rows_min_n == 0  # 0: always
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_SETTINGS.max_rounds = 1  # type: ignore[misc]
    for f in dataclasses.fields(RouteLPSettings):
        why = f.metadata.get("why", "")
        assert why and "\n" not in why and len(why) <= 90, f.name


# --------------------------------------------------------------------------- row-generated levels


def _binding_rows(master: MasterLP, coef) -> np.ndarray:  # noqa: ANN001
    """The rows that bind in the master's (all columns) optimum, as choose_level starts from."""
    sol = master.solve()
    assert sol is not None
    load = sol[0] @ coef
    binding = (sol[2] > 0) | (load >= sol[1] * (1 - DEFAULT_SETTINGS.level_rows_slack))
    binding[0] = False
    return np.flatnonzero(binding)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("start", ["binding", "none"])
def test_level_lp_with_generated_rows_is_the_full_lp(seed, start) -> None:  # noqa: ANN001
    """At every latency level the row-generated LP reaches the full LP's optimum, though it
    keeps only some rows, and its duals are a valid dual bound of the full LP."""
    master, _ = _many_levels(seed)
    coef = master.coef_sparse()
    rows = _binding_rows(master, coef) if start == "binding" else np.zeros(0, dtype=np.int64)
    level_lp = LevelLP(coef, rows)
    lat = np.asarray(master.lat)
    levels = np.unique(lat)
    rng = np.random.default_rng(seed)
    for i in rng.permutation(levels.size):  # any order: rows kept from earlier levels stay
        allowed = lat <= levels[i]
        full = master.solve(allowed=allowed)
        x, t, y, _ = level_lp.solve(allowed)
        assert full is not None
        assert t == pytest.approx(full[1], rel=1e-7)
        assert np.all(x[~allowed] == 0.0)
        load = x @ coef
        assert load.max() <= t * (1 + 1e-7)  # feasible for every row, kept or not
        y = y / max(1.0, float(y.sum()))  # weak duality: the cheapest allowed column at y
        assert float((coef @ y)[allowed].min()) <= full[1] * (1 + 1e-7)
    assert 0 < level_lp.kept.sum() < coef.shape[1]  # rows were generated, not all of them


@pytest.mark.parametrize("seed", range(10))
def test_choose_on_generated_rows_matches_every_level(seed) -> None:  # noqa: ANN001
    """Row-generated level solves (threshold lowered to force them at n = 8) give the optimum
    over every level, as the full-row search does, with no more level solves."""
    master, spu = _many_levels(seed)
    best = brute_force_choose(master, spu)
    full_rows = RouteLPSettings(level_rows_min_n=10**9)
    x_full, t_full, lat_full = choose_level(master, spu, full_rows)
    solves: list[int] = []
    real = LevelLP.solve

    def counted(self, allowed):  # noqa: ANN001, ANN202
        solves.append(1)
        return real(self, allowed)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LevelLP, "solve", counted)
        x, t_bw, lat = choose_level(master, spu, RouteLPSettings(level_rows_min_n=0))
    assert solves, "the level solves did not use the row-generated LP"
    assert t_bw + lat == pytest.approx(best, rel=1e-7)
    assert t_bw + lat == pytest.approx(t_full + lat_full, rel=1e-7)
    assert lat == pytest.approx(float(np.asarray(master.lat)[x > 1e-9].max()))


@pytest.mark.parametrize("seed", range(10))
def test_latency_levels_are_searched_best_first(seed, monkeypatch) -> None:  # noqa: ANN001
    """The open intervals of levels come out of the heap lowest bound first (the bounds only
    rise, so the keys popped never fall), and the search still reaches the optimum of solving
    every level."""
    import heapq

    popped: list[float] = []

    class Recording:
        heappush = staticmethod(heapq.heappush)

        @staticmethod
        def heappop(heap):  # noqa: ANN001, ANN205
            item = heapq.heappop(heap)
            popped.append(item[0])
            return item

    monkeypatch.setattr(levels, "heapq", Recording)
    master, spu = _many_levels(seed)
    t, _, solves = _counted_choose(master, spu)
    assert t == pytest.approx(brute_force_choose(master, spu), rel=1e-7)
    assert len(popped) >= solves - 2  # every level solve but the top and the last was popped
    assert popped == sorted(popped)


def test_plans_above_the_row_threshold_match_full_row_plans(monkeypatch) -> None:  # noqa: ANN001
    """At n = 36 (>= level_rows_min_n) with delays and parts, the plan's LP time is the one
    the full-row level solves give."""
    assert DEFAULT_SETTINGS.level_rows_min_n <= 36
    rng = np.random.default_rng(5)
    n = 36
    bw = np.round(rng.uniform(10, 200, (n, n)), 1)
    np.fill_diagonal(bw, np.inf)
    delays = rng.uniform(0.0, 0.04, (n, n))
    members = (1, 7, 20, 33)

    def plan(settings: RouteLPSettings) -> routelp.RoutePlanResult:
        return routelp.plan_routes(
            bw, members, MB16, delay_s=delays, part_bytes=65536, settings=settings
        )

    built: list[int] = []
    real_init = LevelLP.__init__

    def spy(self, coef, rows, slack):  # noqa: ANN001, ANN202
        built.append(1)
        real_init(self, coef, rows, slack)

    monkeypatch.setattr(LevelLP, "__init__", spy)
    rows = plan(RouteLPSettings(max_rounds=5))
    assert built
    full = plan(RouteLPSettings(max_rounds=5, level_rows_min_n=10**9))
    assert len(built) == 1
    assert rows.lp_s == pytest.approx(full.lp_s, rel=1e-7)
    assert rows.predicted_s == pytest.approx(full.predicted_s, rel=1e-6)


def test_master_keeps_each_columns_coefficients() -> None:
    """MasterLP.add stores each column's sparse row entries once; coef_matrix is built from
    them and matches the column's edges."""
    master, _ = _many_levels(0)
    dense = master.coef_matrix()
    assert np.array_equal(dense, master.coef_sparse().toarray())
    assert np.all(dense[:, 0] == 0.0)
    for c in (0, len(master.cols) // 2, len(master.cols) - 1):
        uses = master.cols[c].edge_uses()
        for (a, b), k in uses.items():
            row = master.row_of[("link", a, b)]
            assert dense[c, row] == pytest.approx(k * master.r_ref / master.w[a, b])
        assert np.count_nonzero(dense[c]) == len(uses)
