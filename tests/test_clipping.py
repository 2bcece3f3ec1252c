"""Clipped aggregation (crew.control.clipping): CenteredClip itself, the stars it accepts, and
the reduce engine running it in process: one member offering 100 times its vector moves the
clipped result by its weight times the radius, and the mean by far more."""

from __future__ import annotations

import math

import numpy as np
import pytest
from reduce_kit import Net, assign_routes, near_vectors, path_and_tree

from crew.config import AGGREGATES, CLIP_SCHEMES, ConfigError, RunConfig, Scheme
from crew.control import clipping
from crew.control.assignment import ReduceError
from crew.control.clipping import (
    DEFAULT_RHO,
    Aggregate,
    ClipRule,
    centered_clip,
    clip_factors,
    star_violation,
)
from crew.control.verify import agreement_error, relative_error
from crew.plan.routes import Route, star_routes

RHO = DEFAULT_RHO


def _honest(p: int, size: int, spread: float, seed: int = 0) -> np.ndarray:
    """``p`` copies of one model, each element off by ``spread``."""
    return np.stack(list(near_vectors(range(p), size, seed=seed, spread=spread).values()))


def test_names_match_the_config_vocabulary() -> None:
    assert tuple(a.value for a in Aggregate) == AGGREGATES
    assert RunConfig.default("clip_radius") == DEFAULT_RHO
    assert RunConfig.default("aggregate") == Aggregate.MEAN


def test_clip_factors() -> None:
    np.testing.assert_allclose(clip_factors(np.array([0.0, 1.0, 4.0]), 2.0), [1.0, 1.0, 0.5])


def test_without_outliers_it_is_the_weighted_mean() -> None:
    copies = _honest(4, 20_000, 0.01)
    weights = np.array([0.1, 0.2, 0.3, 0.4])
    x, c = centered_clip(copies, weights, RHO)
    assert x.dtype == np.float32
    np.testing.assert_array_equal(c, 1.0)
    mean = weights @ copies.astype(np.float64)
    np.testing.assert_allclose(x, mean, rtol=0, atol=1e-6)


def test_one_member_at_100x_moves_the_result_by_its_weight_times_the_radius() -> None:
    copies = _honest(4, 20_000, 0.01)
    copies[3] *= 100
    w = np.full(4, 0.25)
    x, c = centered_clip(copies, w, RHO)
    honest = copies[:3].astype(np.float64).mean(axis=0)
    tau = RHO * np.linalg.norm(x)
    # At the fixed point the three honest members (unclipped) balance the poisoned one's pull
    # of w tau: x sits w tau / (1 - w) from their mean.
    moved = np.linalg.norm(x - honest)
    assert moved <= 0.25 * tau / 0.75 * 1.01
    assert c[3] < 0.01 and np.all(c[:3] == 1.0)
    mean = w @ copies.astype(np.float64)
    assert np.linalg.norm(mean - honest) > 200 * moved  # what the mean would have applied


def test_fixed_point_residual_is_small() -> None:
    rng = np.random.default_rng(4)
    copies = _honest(5, 5_000, 0.05)
    copies[0] += rng.standard_normal(5_000).astype(np.float32) * 2  # far, clipped
    copies[1] *= -3  # far, clipped
    w = np.array([0.2, 0.2, 0.2, 0.2, 0.2])
    x, c = centered_clip(copies, w, RHO)
    d = copies.astype(np.float64) - x
    residual = (w * c) @ d
    spread = float((w * c) @ np.linalg.norm(d, axis=1))
    assert c[0] < 1 and c[1] < 1
    assert np.linalg.norm(residual) <= 1e-4 * spread


def test_members_just_outside_the_radius_reach_the_same_fixed_point_from_the_mean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    copies = _honest(3, 5_000, 0.05)
    w = np.array([0.5, 0.25, 0.25])
    spread = np.linalg.norm(copies - w @ copies, axis=1) / np.linalg.norm(w @ copies)
    rho = float(np.median(spread))  # someone is outside, nobody is FAR radii away
    from_mean, c = centered_clip(copies, w, rho)
    assert np.any(c < 1)
    monkeypatch.setattr(clipping, "FAR", 0.0)  # always start from the median
    from_median, _ = centered_clip(copies, w, rho)
    d = copies.astype(np.float64) - from_mean
    residual = np.linalg.norm((w * c) @ d) / float((w * c) @ np.linalg.norm(d, axis=1))
    assert residual <= 1e-4
    gap = np.linalg.norm(from_mean - from_median.astype(np.float64))
    assert gap <= 1e-5 * np.linalg.norm(from_median)


def test_bad_shapes_and_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="copies"):
        centered_clip(np.zeros(5, dtype=np.float32), [1.0], RHO)
    with pytest.raises(ValueError, match="weights"):
        centered_clip(np.zeros((2, 5), dtype=np.float32), [1.0], RHO)


def test_stars_of_members_only() -> None:
    stars = star_routes([(3, 0, 10), (0, 10, 20)], (0, 1, 2))  # non-member root 3 is fine
    assert star_violation(stars, (0, 1, 2)) is None
    relay = Route(0, 20, 3, up=((0, 4), (4, 3), (1, 3)), down=((3, 0), (3, 1)))
    assert "0 -> 4" in (star_violation([relay], (0, 1)) or "")
    overlapping = [Route(0, 20, m, up=((1 - m, m),), down=()) for m in (0, 1)]
    assert "more than once" in (star_violation(overlapping, (0, 1)) or "")


def test_the_clip_schemes_plan_stars_of_members() -> None:
    from crew.plan.schemes import plan_group

    rng = np.random.default_rng(1)
    for _ in range(3):
        bw = rng.uniform(20, 200, (8, 8))
        np.fill_diagonal(bw, 0)
        members = sorted(int(m) for m in rng.choice(8, 3, replace=False))
        for scheme in CLIP_SCHEMES:
            plan = plan_group(Scheme(scheme), bw, members, 1 << 20, active=list(range(8)))
            assert star_violation(plan.routes, members) is None, scheme


def test_the_engine_refuses_routes_with_relays() -> None:
    net = Net(clip=ClipRule(RHO))
    with pytest.raises(ReduceError, match="clipped aggregation needs stars"):
        net.engines[0].assign(path_and_tree(pipelined=True), np.zeros(3000, dtype=np.float32))


@pytest.mark.parametrize("pipelined", [True, False])
def test_the_engine_clips_a_member_that_poisons_its_own_vector(pipelined: bool) -> None:
    members, weights, total = (0, 1, 2, 3), (0.25, 0.25, 0.25, 0.25), 3000
    # [0, 1200) at non-member 4, [1200, 3000) at member 1: both stars of the members.
    routes = star_routes([(4, 0, 1200), (1, 1200, total)], members)
    assign = assign_routes(routes, total, 7, members, weights, part_elems=500, pipelined=pipelined)
    copies = _honest(4, total, 0.01, seed=2)
    poisoned = {m: copies[m] for m in members}
    poisoned[2] = copies[2] * np.float32(100)
    honest = copies[[0, 1, 3]].astype(np.float64).mean(axis=0)
    results = {}
    for rule in (ClipRule(RHO), None):
        net = Net(clip=rule)
        net.run(assign, poisoned)
        assert net.done == set(members)
        results[rule is None] = [net.engines[m].result(7) for m in members]
    clipped, mean = results[False], results[True]
    for r in clipped[1:]:
        np.testing.assert_array_equal(r, clipped[0])  # every member holds one result
    # Per part the poisoned member pulls by w tau_p and the honest ones (unclipped) balance
    # it w tau_p / (1 - w) away from their mean: over the whole vector, w rho ||x|| / (1 - w).
    bound = 0.25 / 0.75 * RHO * np.linalg.norm(clipped[0]) * 1.01
    assert np.linalg.norm(clipped[0] - honest) <= bound
    assert np.linalg.norm(mean[0] - honest) > 50 * bound


def test_the_engine_clips_honest_members_to_their_weighted_mean() -> None:
    members, weights, total = (0, 1, 2), (0.5, 0.3, 0.2), 2000
    routes = star_routes([(3, 0, 800), (0, 800, total)], members)
    assign = assign_routes(routes, total, 8, members, weights, part_elems=300)
    copies = _honest(3, total, 0.01, seed=3)
    net = Net(clip=ClipRule(RHO))
    net.run(assign, {m: copies[m] for m in members})
    mean = np.array(weights) @ copies.astype(np.float64)
    for m in members:
        np.testing.assert_allclose(net.engines[m].result(8), mean, rtol=0, atol=1e-6)


def _cfg(**settings: object) -> RunConfig:
    clip = {"aggregate": "clip", "check": "secret", "scheme": "crew-star"}
    return RunConfig.in_process(4, 2, np.full((4, 4), 100.0), **(clip | settings))


def test_config_accepts_clip_on_star_schemes_with_the_secret_check() -> None:
    for scheme in CLIP_SCHEMES:
        assert _cfg(scheme=scheme).clip_rho == DEFAULT_RHO
    assert _cfg(clip_radius=0.3).clip_rho == 0.3
    assert _cfg(aggregate="mean", check="public", scheme="crew").clip_rho is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"aggregate": "median"}, "aggregate: one of mean, clip"),
        ({"clip_radius": 0.0}, "clip_radius: a finite number > 0"),
        ({"clip_radius": float("inf")}, "clip_radius: a finite number > 0"),
        ({"check": "public"}, "verified by the secret check only"),
        ({"compress": "fp16"}, "use compress none"),
        ({"scheme": "crew"}, "got scheme 'crew'"),
        ({"scheme": "a2a"}, "got scheme 'a2a'"),
        ({"scheme": "crew-paper", "nonblocking": True}, "drop nonblocking"),
    ],
)
def test_config_refuses_what_clipping_cannot_run(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _cfg(**settings)


def test_the_public_check_of_a_clipped_result_is_agreement() -> None:
    offered = [2.0, 4.0]
    assert relative_error([5.0, 5.0], (0.5, 0.5), offered) > 0.5  # no linear mean
    assert agreement_error([5.0, 5.0], (0.5, 0.5), offered) == 0.0
    assert agreement_error([5.0, 5.1], (0.5, 0.5), offered) == pytest.approx(0.1 / 3)
    assert math.isnan(agreement_error([5.0, math.nan], (0.5, 0.5), offered))
