"""The adaptive quorum rule on scripted ready times, without a coordinator."""

from __future__ import annotations

import sqlite3

import pytest

from crew.config import Scheme
from crew.control.grouping import GroupFormer
from crew.control.quorum import CloseReason, Decision, QuorumError, QuorumRule, QuorumState
from crew.runtime import rundb


def learned(rule: QuorumRule, arrivals: list[float]) -> QuorumState:
    state = QuorumState(rule)
    for t in arrivals:
        state.observe(t)
    return state


def test_the_window_runs_from_the_quorum_and_the_next_arrival_closes_it():
    # Workers became ready every 1.0 s: median gap 1, MAD 0, so the window is 1 s.
    state = learned(QuorumRule(p_min=2, p_max=4), [0.0, 1.0, 2.0, 3.0])
    assert state.window() == 1.0
    ready = [10.0, 10.5]  # the quorum is there at 10.5: wait one window from it
    assert state.decide(ready, now=10.5) == Decision(0, wake_at=11.5)
    assert state.decide(ready, now=11.0) == Decision(0, wake_at=11.5)
    ready.append(11.2)  # one more came within it: the group closes with it, at once
    assert state.decide(ready, now=11.2) == Decision(3, CloseReason.BEYOND)
    # Nobody came within the window: the quorum alone closes at its deadline.
    assert state.decide([20.0, 20.4], now=21.39) == Decision(0, wake_at=21.4)
    assert state.decide([20.0, 20.4], now=21.4) == Decision(2, CloseReason.WINDOW)
    # Several ready at once (below the cap) all go, without waiting for a window.
    assert state.decide([30.0, 30.0, 30.0], now=30.0) == Decision(3, CloseReason.BEYOND)


def test_p_max_ready_closes_at_once_and_below_p_min_waits_for_arrivals():
    state = learned(QuorumRule(p_min=2, p_max=3), [0.0, 1.0, 2.0])
    assert state.decide([5.0, 5.1, 5.2, 5.3], now=5.3) == Decision(3, CloseReason.CAP)
    assert state.decide([5.0], now=100.0) == Decision(0)  # no deadline without a quorum


def test_without_history_the_quorum_closes_at_once():
    state = learned(QuorumRule(p_min=2, p_max=5), [0.0, 1.0])  # one gap: not enough
    assert state.window() == 0.0
    assert state.decide([3.0, 3.5], now=3.5) == Decision(2, CloseReason.QUORUM)


def test_the_window_waits_three_mads_by_default() -> None:
    # Gaps 1, 2, 1, 3: median 1.5, MAD 0.5; the default window is 1.5 + 3 * 0.5.
    assert learned(QuorumRule(p_min=2, p_max=8), [0, 1, 3, 4, 7]).window() == 3.0


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


def test_the_former_closes_groups_by_the_rule_and_says_why():
    former = GroupFormer(5, 2, quorum=QuorumRule(p_min=2, p_max=3, k_mad=1.0))
    for w in range(5):
        former.join(w, 0.0)
    assert former.ready(0, 1, 1.0) == []
    (g,) = former.ready(1, 1, 2.0)  # one gap known: no window yet, the quorum closes it
    assert g.members == (0, 1) and g.formed_by is CloseReason.QUORUM
    former.complete(g.id, 2.0)
    # Gaps 1, 1, 0.5: a window of 1 s after each arrival.
    assert former.ready(2, 1, 3.0) == []
    assert former.ready(3, 1, 3.5) == []
    assert former.form(4.4) == []
    (g,) = former.ready(4, 1, 4.4)  # three ready: the cap
    assert g.members == (2, 3, 4) and g.formed_by is CloseReason.CAP
    former.complete(g.id, 4.4)
    # Gaps 1, 1, 0.5, 0.9, 1.6, 0.5: median 0.95, MAD 0.25, window 0.95 + 1 * 0.25 = 1.2.
    assert former.ready(0, 2, 6.0) == []
    assert former.ready(1, 2, 6.5) == []
    assert former.form(7.6) == []
    (g,) = former.form(7.75)  # nobody else came within the window after the quorum at 6.5
    assert g.members == (0, 1) and g.formed_by is CloseReason.WINDOW and not g.reduced


def test_a_former_with_a_fixed_p_records_no_reason():
    former = GroupFormer(2, 2)
    for w in range(2):
        former.join(w, 0.0)
    former.ready(0, 1, 1.0)
    (g,) = former.ready(1, 1, 2.0)
    assert g.formed_by is None


def test_the_reason_is_recorded_and_an_older_database_gains_its_column(tmp_path):
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    conn.execute(  # the groups table as databases written before the column have it
        "CREATE TABLE groups (id INTEGER PRIMARY KEY, scheme TEXT NOT NULL, members TEXT NOT NULL,"
        " weights TEXT NOT NULL, formed_at REAL NOT NULL, started_at REAL, ended_at REAL,"
        " status TEXT NOT NULL DEFAULT 'open', bytes INTEGER NOT NULL DEFAULT 0,"
        " predicted_s REAL, bound_s REAL, plan TEXT, reason TEXT,"
        " revisions INTEGER NOT NULL DEFAULT 0, verify_err REAL)"
    )
    conn.commit()
    conn.close()
    db = rundb.RunDB(old)
    try:
        db.open_group(
            1,
            scheme=Scheme.CREW,
            members=[0, 1],
            weights=[0.5, 0.5],
            formed_at=1.0,
            started_at=1.0,
            predicted_s=None,
            bound_s=None,
            plan_json=None,
            member_rows=[],
            formed_by=CloseReason.WINDOW.value,
        )
    finally:
        db.close()
    conn = rundb.connect(old, readonly=True)
    try:
        assert conn.execute("SELECT formed_by FROM groups").fetchone()[0] == "window"
    finally:
        conn.close()
