"""Straggler profiles: loading, spec parsing, sampling statistics and padding semantics."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from crew.train.stragglers import (
    ComputeDelay,
    IterationPace,
    StragglerError,
    StragglerProfile,
    available_profiles,
    get_profile,
)


def test_bundled_profiles_load_and_are_normalised() -> None:
    names = available_profiles()
    assert {"1", "2"} <= set(names)
    for name in names:
        p = get_profile(name)
        assert p.name == name
        assert len(p.values) == len(p.probs) > 0
        assert math.isclose(sum(p.probs), 1.0, abs_tol=1e-12)
        assert p.minimum >= 0


def test_profile_2_matches_file_range() -> None:
    p = get_profile("2")
    assert p.minimum == pytest.approx(0.05)
    assert p.maximum == pytest.approx(0.2)


def test_shifted_variant_minimum_equals_shift_and_keeps_spread() -> None:
    base = get_profile("2")
    shifted = get_profile("2@0.4")
    assert shifted.minimum == 0.4
    assert shifted.maximum - shifted.minimum == pytest.approx(base.maximum - base.minimum)
    assert shifted.probs == base.probs
    assert shifted.mean == pytest.approx(base.mean + 0.4 - base.minimum)


def test_rescaled_variant_spans_requested_range() -> None:
    p = get_profile("2@0.2:0.4")
    assert p.minimum == pytest.approx(0.2)
    assert p.maximum == pytest.approx(0.4)
    assert p.probs == get_profile("2").probs


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("99", "unknown profile '99'"),
        ("", "non-empty"),
        ("2@abc", "'abc' is not a number"),
        ("2@-0.1", "finite and >= 0"),
        ("2@nan", "finite and >= 0"),
        ("2@0.6:0.4", "below low"),
        ("x@0.4", "unknown profile 'x'"),
    ],
)
def test_bad_specs_rejected_with_clear_message(spec: str, fragment: str) -> None:
    with pytest.raises(StragglerError) as info:
        get_profile(spec)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_profile_message_lists_available() -> None:
    with pytest.raises(StragglerError, match="available: 1, 2"):
        get_profile("7")


@pytest.mark.parametrize(
    ("values", "probs", "fragment"),
    [
        ((), (), "empty"),
        ((0.1, 0.2), (1.0,), "2 values but 1 probs"),
        ((-0.1,), (1.0,), "values must be"),
        ((0.1,), (-1.0,), "probs must be"),
        ((0.1, 0.2), (0.0, 0.0), "sum to"),
    ],
)
def test_profile_validation(values: tuple, probs: tuple, fragment: str) -> None:
    with pytest.raises(StragglerError, match=fragment):
        StragglerProfile("custom", values, probs)


def test_probs_are_normalised() -> None:
    p = StragglerProfile("w", (1.0, 3.0), (1.0, 3.0))
    assert p.probs == (0.25, 0.75)
    assert p.mean == pytest.approx(2.5)


def test_sampling_follows_distribution() -> None:
    profile = get_profile("1")
    delay = ComputeDelay(profile, seed=7)
    draws = delay.samples(50_000)
    assert set(np.unique(draws)) <= set(profile.values)
    # Standard error of the mean here is ~2e-4; 3e-3 is a loose bound.
    assert abs(draws.mean() - profile.mean) < 3e-3
    # The most likely value is drawn most often.
    values, counts = np.unique(draws, return_counts=True)
    assert values[counts.argmax()] == profile.values[int(np.argmax(profile.probs))]


def test_single_samples_are_seeded_and_in_support() -> None:
    profile = get_profile("2@0.4")
    d1, d2, d3 = (ComputeDelay(profile, seed=s) for s in (3, 3, 4))
    s1 = [d1.sample() for _ in range(200)]
    assert s1 == [d2.sample() for _ in range(200)]
    assert s1 != [d3.sample() for _ in range(200)]
    assert set(s1) <= set(profile.values)


def test_no_profile_samples_zero_and_pads_only_for_slowdown() -> None:
    delay = ComputeDelay(None, seed=0)
    assert delay.sample() == 0.0
    assert delay.padding(0.3) == 0.0
    delay.slowdown = 3.0
    # The iteration should take 3 x 0.3 s: pad by 0.6 s.
    assert delay.padding(0.3) == pytest.approx(0.6)


def test_padding_makes_iteration_take_sampled_time_times_slowdown() -> None:
    one_point = StragglerProfile("fixed", (0.5,), (1.0,))
    delay = ComputeDelay(one_point, seed=0)
    assert delay.padding(0.1) == pytest.approx(0.4)
    assert delay.last_sample == 0.5
    # Compute already slower than the target: no padding at slowdown 1.
    assert delay.padding(0.8) == 0.0
    delay.slowdown = 2.0
    assert delay.padding(0.1) == pytest.approx(0.9)  # 0.5 * 2 - 0.1
    assert delay.padding(0.8) == pytest.approx(0.8)  # 0.8 * 2 - 0.8
    delay.slowdown = 0.5  # a speed-up can cut padding but never below zero
    assert delay.padding(0.1) == pytest.approx(0.15)
    assert delay.padding(0.4) == 0.0


def test_a_floor_makes_every_iteration_last_at_least_that_long() -> None:
    # An accelerator of the worker's own: 2 s an iteration, whatever the CPU took.
    delay = ComputeDelay(None, seed=0, floor_s=2.0)
    assert delay.padding(0.5) == pytest.approx(1.5)
    assert delay.padding(2.5) == 0.0  # slower than the floor: its real time
    one_point = StragglerProfile("fixed", (3.0,), (1.0,))
    above = ComputeDelay(one_point, seed=0, floor_s=2.0)
    assert above.padding(0.5) == pytest.approx(2.5)  # the profile's longer sample wins
    delay.slowdown = 2.0
    assert delay.padding(0.5) == pytest.approx(3.5)  # 2 * 2 - 0.5
    worker = ComputeDelay.for_worker(None, run_seed=1, worker=3, floor_s=1.25)
    assert worker.padding(0.25) == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_bad_floor_rejected(bad: float) -> None:
    with pytest.raises(StragglerError, match="floor_s"):
        ComputeDelay(None, seed=0, floor_s=bad)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_slowdown_rejected(bad: float) -> None:
    with pytest.raises(StragglerError, match="slowdown"):
        ComputeDelay(None, seed=0, slowdown=bad)
    delay = ComputeDelay(None, seed=0)
    with pytest.raises(StragglerError, match="slowdown"):
        delay.slowdown = bad
    assert delay.slowdown == 1.0


def test_bad_actual_time_rejected() -> None:
    with pytest.raises(StragglerError, match="actual_s"):
        ComputeDelay(None, seed=0).padding(-0.1)


def test_torch_free_modules_do_not_import_torch() -> None:
    # A fresh interpreter: this test process may already have torch from test_training.
    code = (
        "import sys, crew.train.stragglers, crew.train.datasets, crew.plan.modelsize\n"
        "crew.plan.modelsize.ModelConfig().size_bytes\n"
        "sys.exit(1 if 'torch' in sys.modules else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()


def test_the_generated_heavy_profile_has_the_tail_it_states() -> None:
    from crew.train import heavytail

    profile = get_profile(heavytail.HEAVY)
    values = sorted(profile.values)
    median = values[len(values) // 2]
    assert len(values) == heavytail.POINTS and set(profile.probs) == {1 / heavytail.POINTS}
    assert min(values) >= heavytail.MINIMUM_S
    assert max(values) / median > 10  # the slowest iteration is many times the usual one
    # Its quantiles are those of a Pareto of the stated shape: P(X > x) = (min / x) ** alpha.
    x = values[48]  # the 48.5 / 64 quantile
    assert (heavytail.MINIMUM_S / x) ** heavytail.ALPHA == pytest.approx(1 - 48.5 / 64, rel=1e-2)


def test_an_iteration_spreads_its_time_evenly_over_its_steps() -> None:
    # 4 steps of a 2 s iteration: step k ends no sooner than k * 0.5 s into it.
    pace = ComputeDelay(None, seed=0, floor_s=2.0).pace(4)
    assert pace.budget_s == 2.0 and pace.steps == 4
    assert pace.after_step(1, 0.1) == pytest.approx(0.4)
    assert pace.after_step(2, 0.6) == pytest.approx(0.4)
    assert pace.after_step(3, 1.7) == 0.0  # a slow step is not made up for by sleeping less later
    assert pace.after_step(4, 1.8) == 0.0  # the last step's sleep is the end's
    assert pace.at_end(0.9, 1.8) == pytest.approx(0.2)
    # Compute longer than the budget: the iteration takes it, times the slowdown.
    slow = ComputeDelay(None, seed=0, floor_s=1.0)
    slow.slowdown = 2.0
    paced = slow.pace(2)
    assert paced.budget_s == 2.0
    assert paced.at_end(1.5, 1.5) == pytest.approx(1.5)  # 1.5 * 2 - 1.5


def test_padding_at_the_end_is_the_pace_of_one_step() -> None:
    profile = StragglerProfile("two", (0.2, 0.6), (0.5, 0.5))
    a, b = ComputeDelay(profile, seed=7, floor_s=0.3), ComputeDelay(profile, seed=7, floor_s=0.3)
    for actual in (0.0, 0.1, 0.25, 0.5, 0.9):
        pace = b.pace(1)
        assert a.padding(actual) == pytest.approx(pace.at_end(actual, actual))
        assert a.last_sample == b.last_sample  # the same draws, one per iteration


@pytest.mark.parametrize(
    ("budget", "steps", "fragment"),
    [(-1.0, 2, "budget_s"), (float("nan"), 2, "budget_s"), (1.0, 0, "steps"), (1.0, True, "steps")],
)
def test_a_bad_pace_is_refused(budget: float, steps: int, fragment: str) -> None:
    with pytest.raises(StragglerError, match=fragment):
        IterationPace(budget, steps)
