"""The adaptive quorum rule on scripted ready times, without a coordinator."""

from __future__ import annotations

import pytest

from crew.control.quorum import CloseReason, Decision, QuorumError, QuorumRule, QuorumState


def learned(rule: QuorumRule, arrivals: list[float]) -> QuorumState:
    state = QuorumState(rule)
    for t in arrivals:
        state.observe(t)
    return state


def test_steady_arrivals_are_waited_for_one_gap_and_a_straggler_is_not():
    # Workers became ready every 1.0 s: median gap 1, MAD 0, so the window is 1 s.
    state = learned(QuorumRule(p_min=2, p_max=4), [0.0, 1.0, 2.0, 3.0])
    assert state.window() == 1.0
    ready = [10.0, 10.5]  # the quorum is there: wait one window after the last arrival
    assert state.decide(ready, now=10.5) == Decision(0, wake_at=11.5)
    ready.append(11.2)  # one more came within it: the window restarts from it
    assert state.decide(ready, now=11.5) == Decision(0, wake_at=12.2)
    # Nobody else within the window: close the three.
    assert state.decide(ready, now=12.2) == Decision(3, CloseReason.WINDOW)


def test_p_max_ready_closes_at_once_and_below_p_min_waits_for_arrivals():
    state = learned(QuorumRule(p_min=2, p_max=3), [0.0, 1.0, 2.0])
    assert state.decide([5.0, 5.1, 5.2, 5.3], now=5.3) == Decision(3, CloseReason.CAP)
    assert state.decide([5.0], now=100.0) == Decision(0)  # no deadline without a quorum


def test_without_history_the_quorum_closes_at_once():
    state = learned(QuorumRule(p_min=2, p_max=5), [0.0, 1.0])  # one gap: not enough
    assert state.window() == 0.0
    assert state.decide([3.0, 3.5], now=3.5) == Decision(2, CloseReason.QUORUM)


def test_one_straggler_gap_does_not_widen_the_window():
    gaps = [1.0, 1.0, 1.0, 1.0, 30.0]  # four steady gaps, then a 30 s straggler
    arrivals = [sum(gaps[:k]) for k in range(len(gaps) + 1)]
    state = learned(QuorumRule(p_min=2, p_max=8, k_mad=3.0), arrivals)
    assert state.window() == 1.0  # median 1, MAD 0: the 30 s gap is an outlier


def test_spread_widens_the_window_by_k_mad_and_the_cap_bounds_it():
    # gaps 1, 2, 3, 4, 5: median 3, MAD 1 -> 3 + 2 * 1 = 5
    state = learned(QuorumRule(p_min=2, p_max=8, k_mad=2.0), [0, 1, 3, 6, 10, 15])
    assert state.window() == 5.0
    capped = learned(QuorumRule(2, 8, k_mad=2.0, max_window_s=4.0), [0, 1, 3, 6, 10, 15])
    assert capped.window() == 4.0


def test_only_the_recent_gaps_count():
    state = learned(QuorumRule(p_min=2, p_max=8, history=3), [0, 10, 20, 21, 22, 23])
    assert state.window() == 1.0  # the 10 s gaps fell out of the history


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"p_min": 0, "p_max": 2}, "p_min"),
        ({"p_min": 3, "p_max": 2}, "p_max"),
        ({"p_min": 1, "p_max": 2, "k_mad": -1.0}, "k_mad"),
        ({"p_min": 1, "p_max": 2, "history": 1}, "history"),
        ({"p_min": 1, "p_max": 2, "max_window_s": float("nan")}, "max_window_s"),
    ],
)
def test_bad_settings_are_named(kwargs, named):
    with pytest.raises(QuorumError, match=named):
        QuorumRule(**kwargs)
