"""Clipped aggregation's learned radius (crew.control.clipradius): it follows the members'
spread, a liar cannot raise it, each group keeps the radius it was assigned, and a member
that poisons every group pulls the models by about the honest spread, not by the ceiling."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_clipcheck import MEMBERS, PARTS, RUN, WEIGHTS, _vectors

from crew.config import ConfigError, RunConfig
from crew.control.clipcheck import clip_proof
from crew.control.clipping import DEFAULT_RHO, ClipRule, centered_clip
from crew.control.clipradius import (
    DEFAULT_FACTOR,
    FLOOR,
    MIN_GROUPS,
    ClipRadius,
    lower_median,
    projection_spread,
)
from crew.control.secretcheck import CheckMode, SecretChecks
from crew.plan.routes import Route
from crew.wire import protocol as proto

finite = st.floats(-1e6, 1e6, allow_nan=False)


def test_lower_median_takes_the_lower_middle() -> None:
    assert lower_median([3.0, 1.0, 2.0]) == 2.0
    assert lower_median([4.0, 1.0, 3.0, 2.0]) == 2.0
    assert lower_median([5.0]) == 5.0
    with pytest.raises(ValueError, match="no values"):
        lower_median([])


@given(finite, finite, finite)
def test_a_liar_in_a_group_of_three_cannot_look_further_apart_than_the_honest_pair(
    h1: float, h2: float, liar: float
) -> None:
    assert projection_spread([h1, h2, liar]) <= abs(h1 - h2) + 1e-9


@given(st.lists(finite, min_size=2, max_size=3), st.lists(finite, min_size=1, max_size=2))
def test_a_minority_of_liars_cannot_raise_the_spread_above_every_honest_deviation(
    honest: list[float], liars: list[float]
) -> None:
    liars = liars[: len(honest) - 1]  # a strict minority
    if not liars:
        return
    group = honest + liars
    widest = max(honest) - min(honest)
    assert projection_spread(group) <= widest + 1e-9


def test_the_radius_stays_at_the_ceiling_until_enough_groups_are_known() -> None:
    radius = ClipRadius(0.1, 4.0)
    for _ in range(MIN_GROUPS - 1):
        radius.observe([100.0, 101.0, 102.0], 1000.0)
        assert radius.current() == 0.1
    radius.observe([100.0, 101.0, 102.0], 1000.0)
    # spread: |100 - 101| = 1 of the norm 1000, times 4
    assert radius.current() == pytest.approx(0.004)


def test_the_radius_is_clamped_and_factor_zero_keeps_the_ceiling() -> None:
    wide, tight, fixed = ClipRadius(0.01, 4.0), ClipRadius(0.1, 4.0), ClipRadius(0.1, 0.0)
    for _ in range(MIN_GROUPS):
        wide.observe([0.0, 50.0, 100.0], 1000.0)  # 4 x 0.05 = 0.2, over the ceiling
        tight.observe([7.0, 7.0, 7.0], 1000.0)  # no spread at all
        fixed.observe([100.0, 101.0, 102.0], 1000.0)
    assert wide.current() == 0.01
    assert tight.current() == FLOOR
    assert fixed.current() == 0.1


def test_the_radius_follows_the_window_median() -> None:
    radius = ClipRadius(1.0, 2.0, window=5, min_groups=1)
    for gap in (1.0, 1.0, 1.0, 9.0, 9.0):
        radius.observe([0.0, gap, 2 * gap], 100.0)
    assert radius.current() == pytest.approx(2 * 1.0 / 100)
    for _ in range(3):
        radius.observe([0.0, 9.0, 18.0], 100.0)  # the window now holds mostly 9s
    assert radius.current() == pytest.approx(2 * 9.0 / 100)


def test_groups_that_teach_nothing_are_ignored() -> None:
    radius = ClipRadius(0.1, 4.0, min_groups=1)
    radius.observe([1.0], 10.0)
    radius.observe([1.0, 2.0], 0.0)
    radius.observe([1.0, 2.0], math.nan)
    radius.observe([1.0, math.inf], 10.0)
    assert radius.current() == 0.1


def test_a_group_keeps_its_radius_until_it_ends() -> None:
    radius = ClipRadius(0.1, 4.0, min_groups=1)
    assert radius.for_group(7) == 0.1
    radius.observe([0.0, 1.0, 2.0], 1000.0)
    assert radius.current() == pytest.approx(0.004)
    assert radius.for_group(7) == 0.1  # assigned before: later revisions keep it
    assert radius.for_group(8) == pytest.approx(0.004)
    radius.end(7)
    radius.end(7)  # idempotent
    assert radius.open_groups() == 1
    assert radius.for_group(7) == pytest.approx(0.004)


def test_bad_settings_are_refused() -> None:
    for ceiling, factor in ((0.0, 1.0), (math.inf, 1.0), (0.1, -1.0), (0.1, math.nan)):
        with pytest.raises(ValueError):
            ClipRadius(ceiling, factor)
    with pytest.raises(ConfigError, match="clip_factor"):
        clip = {"aggregate": "clip", "check": "secret", "scheme": "crew-star"}
        RunConfig.in_process(4, 2, np.full((4, 4), 100.0), **clip, clip_factor=-1.0)
    assert RunConfig.default("clip_factor") == DEFAULT_FACTOR


def test_assign_carries_the_radius_and_refuses_a_bad_one() -> None:
    wire = {"type": "assign", "group": 1, "rev": 0, "scheme": "crew", "members": [0, 1]}
    wire |= {"weights": [0.5, 0.5], "routes": [], "pipelined": True, "total": 4}
    wire |= {"part_elems": 4, "prescatter": [], "iterations": [0, 0], "split_epoch": 0}
    old = proto.decode(wire)
    assert isinstance(old, proto.Assign) and old.clip_rho == 0.0
    assert ClipRule(0.25).radius(old) == 0.25  # none named: the run's radius
    new = proto.decode(wire | {"clip_rho": 0.003})
    assert isinstance(new, proto.Assign) and ClipRule(0.25).radius(new) == 0.003
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(proto.ProtocolError, match="clip_rho"):
            proto.decode(wire | {"clip_rho": bad})


class _Plan:
    from test_clipcheck import ASSIGN

    routes = tuple(Route.from_list(r) for r in ASSIGN.routes)
    total = 5000


def _proofs(vectors, rho: float, group: int, nonce: int) -> list[proto.Proof]:
    x = np.empty_like(vectors[MEMBERS[0]])
    for start, stop in PARTS:
        copies = np.stack([vectors[m][start:stop] for m in MEMBERS])
        x[start:stop] = centered_clip(copies, WEIGHTS, rho)[0]
    out = []
    for m in MEMBERS:
        c = clip_proof(RUN, nonce, vectors[m], x, PARTS, rho)
        p = proto.Proof(m, group, 0, c.offered_proj, c.result_proj, 0.0)
        out.append(replace(p, clip_residual=c.residual, clip_scale=c.scale, clip_norm=c.norm))
    return out


def test_secret_checks_learn_from_passed_groups_and_judge_each_at_its_own_radius() -> None:
    checks = SecretChecks(CheckMode.SECRET, nonce=lambda: 11, clip_rho=DEFAULT_RHO)
    assert checks.clip_rho(100) == DEFAULT_RHO  # group 100 is assigned before anything is known
    v = _vectors(poison=100.0)
    for g in range(MIN_GROUPS):
        checks.clip_rho(g)
        checks.start(g, 0, MEMBERS, WEIGHTS, _Plan())
        verdicts = [checks.proof(p) for p in _proofs(v, DEFAULT_RHO, g, 11)]
        assert verdicts[-1] is not None and verdicts[-1].passed
        checks.end(g)
    learned = checks.clip_rho(200)
    # near_vectors' members sit about 1% apart: well below the ceiling, above the floor
    assert FLOOR < learned < DEFAULT_RHO / 2
    # Group 100 is proved at the radius its roots clipped with, not today's ...
    checks.start(100, 0, MEMBERS, WEIGHTS, _Plan())
    verdicts = [checks.proof(p) for p in _proofs(v, DEFAULT_RHO, 100, 11)]
    assert verdicts[-1] is not None and verdicts[-1].passed
    # ... and a group clipped at the learned radius passes at it.
    checks.start(200, 0, MEMBERS, WEIGHTS, _Plan())
    verdicts = [checks.proof(p) for p in _proofs(v, learned, 200, 11)]
    assert verdicts[-1] is not None and verdicts[-1].passed
    checks.end(100)
    checks.end(200)
    assert checks.clip is not None and checks.clip.open_groups() == 0


def _poisoned_rounds(factor: float, groups: int = 150, size: int = 2000) -> float:
    """The models' norm after ``groups`` groups of three, one member offering 100 times its
    model every time and the others adopting each result plus a little noise (training with
    no pull of its own back to any model), relative to the norm before."""
    rng = np.random.default_rng(5)
    model = rng.standard_normal(size)
    start = float(np.linalg.norm(model))
    radius = ClipRadius(DEFAULT_RHO, factor)
    for _ in range(groups):
        honest = [model + 2e-3 * start / math.sqrt(size) * rng.standard_normal(size) for _ in "ab"]
        offers = np.stack([*honest, 100.0 * honest[0]])
        rho = radius.current()
        model = centered_clip(offers, [1 / 3] * 3, rho)[0].astype(np.float64)
        r = rng.standard_normal(size)
        radius.observe([float(r @ v) for v in offers], float(np.linalg.norm(model)))
    return float(np.linalg.norm(model)) / start


def test_a_poisoner_pulls_by_the_honest_spread_not_by_the_radius_ceiling() -> None:
    fixed, learned = _poisoned_rounds(0.0), _poisoned_rounds(DEFAULT_FACTOR)
    assert fixed > 100  # 5% a group at rho = 0.1, compounded: 1.05^150 = 1,500
    # About 0.4% a group (the honest noise here is 0.2%), with nothing pulling back; in
    # training, the honest members' gradients pull back (lab.studies.trainsim).
    assert learned < 2.0
