"""The drift study's arithmetic: per-arm medians over repeats and the estimator ÷ oracle ratios."""

from __future__ import annotations

import pytest

from lab.studies.driftoracle import arm_figures, comparison, parse_arm, render, run_figures


def summary(group_s: float, *per_min: float) -> dict:
    return {
        "median_group_s": group_s,
        "rounds_per_worker_per_min": {str(w): r for w, r in enumerate(per_min)},
    }


def test_run_figures_average_rounds_over_workers() -> None:
    assert run_figures(summary(0.5, 10.0, 20.0, 30.0)) == (0.5, 20.0)
    assert run_figures({"median_group_s": None}) == (float("inf"), 0.0)


def test_arm_takes_medians_and_ranges_over_repeats() -> None:
    fig = arm_figures("crew/measured", [summary(0.3, 10), summary(0.5, 30), summary(0.4, 20)])
    assert fig.median_group_s == 0.4
    assert fig.group_s_range == (0.3, 0.5)
    assert fig.rounds_per_min == 20
    assert fig.rounds_range == (10, 30)
    assert fig.runs == 3


def test_comparison_ratios_and_winners() -> None:
    est = arm_figures("crew/measured", [summary(0.46, 23.0)])
    ora = arm_figures("crew/oracle", [summary(0.40, 25.0)])
    ref = arm_figures("preduce/measured", [summary(0.30, 5.0)])
    cmp = comparison([est, ora, ref])
    assert cmp["estimator_over_oracle_group_s"] == pytest.approx(1.15)
    assert cmp["oracle_over_estimator_rounds"] == pytest.approx(25 / 23)
    assert cmp["most_rounds"] == "crew/oracle"
    assert cmp["shortest_groups"] == "preduce/measured"
    text = render([est, ora, ref], cmp)
    assert "x1.150" in text and "most rounds: crew/oracle" in text


def test_comparison_without_both_crew_arms_has_no_ratio() -> None:
    cmp = comparison([arm_figures("preduce/measured", [summary(0.3, 5.0)])])
    assert cmp["estimator_over_oracle_group_s"] is None


@pytest.mark.parametrize("bad", ["crew", "crew/guess", "/oracle"])
def test_bad_arm_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match="SCHEME/CAPACITY"):
        parse_arm(bad)
