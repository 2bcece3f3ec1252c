"""Pace figures from completed-group times: baseline, windows, worst, back to 80%."""

from __future__ import annotations

import pytest

from lab.report.pace import RECOVERED, WINDOW_S, is_fault_start, pace_of


def steady(a: float, b: float, per_s: float) -> list[float]:
    n = int((b - a) * per_s)
    return [a + (k + 0.5) / per_s for k in range(n)]


def test_a_dip_and_its_recovery() -> None:
    # 5 groups/s for 40 s, a fault at 40 s: 0.5/s until the repair at 70 s, 5/s again from 78 s.
    ends = steady(0, 40, 5) + steady(40, 78, 0.5) + steady(78, 120, 5)
    p = pace_of(ends, [40.0], [55.0, 70.0], start=0.0, end=120.0)
    assert p.baseline == pytest.approx(50.0, rel=0.02)
    assert len(p.windows) == 8 and p.windows[0] == 5
    assert p.worst == 5 and p.worst_share == pytest.approx(0.1, rel=0.05)
    assert p.first_fault_s == 40.0 and p.last_repair_s == 70.0
    # From 70 + d, a window holds 0.5/s until 78 and 5/s after: >= 40 once d >= ~7.
    assert p.recovered_after_s is not None and 6.0 <= p.recovered_after_s <= 8.5
    assert "worst 5 (10%)" in p.describe()


def test_no_faults_and_a_run_that_never_recovers() -> None:
    assert pace_of(steady(0, 50, 1), [], [], 0.0, 50.0).describe() == "no faults injected"
    p = pace_of(steady(0, 30, 2) + steady(30, 60, 0.1), [30.0], [35.0], 0.0, 60.0)
    assert p.recovered_after_s is None and "never" in p.describe()
    assert p.baseline is not None and p.baseline * RECOVERED > max(p.windows)
    early = pace_of(steady(0, 30, 2), [WINDOW_S / 2], [], 0.0, 30.0)
    assert early.baseline is None and "too early" in early.describe()


def test_what_counts_as_a_fault() -> None:
    rates = {(0, 1): 50.0}
    assert is_fault_start("cut_link", {}, rates) and not is_fault_start("restore_link", {}, rates)
    assert is_fault_start("slow_worker", {"factor": 8}, rates)
    assert not is_fault_start("slow_worker", {"factor": 1}, rates)
    assert is_fault_start("set_link", {"src": 0, "dst": 1, "rate_mbit": 5}, rates)
    assert not is_fault_start("set_link", {"src": 0, "dst": 1, "rate_mbit": 50}, rates)
    assert not is_fault_start("set_p", {"p": 5}, rates)


def test_describe_while_a_fault_is_still_in_force() -> None:
    """No repair yet and no full window yet: the dashboard shows this mid-cut (it raised
    TypeError formatting None)."""
    from lab.report.pace import Pace

    live = Pace(5.0, (), 30.0, None, None, None, None)
    text = live.describe()
    assert "no repair yet" in text and "no full window yet" in text
    partial = Pace(5.0, (3,), 30.0, None, 3, 30.0, None)
    assert "worst 3 (60%) at t=30 s" in partial.describe()


def test_a_window_reads_only_the_groups_and_commands_after_its_start(tmp_path) -> None:  # noqa: ANN001
    import time

    from test_dashboard_figures import make_run

    from crew.runtime import rundb
    from lab.report.pace import read_pace_inputs

    now = time.time()
    conn = rundb.connect(make_run(tmp_path, now=now), readonly=True)
    try:
        whole = read_pace_inputs(conn, now)
        since = (min(whole.ends) + max(whole.ends)) / 2  # between the first and the last
        window = read_pace_inputs(conn, now, since)
    finally:
        conn.close()
    assert whole.ends and window.ends
    assert window.ends == tuple(e for e in whole.ends if e > since)
    assert all(t > since for t, _ in (*window.faults, *window.repairs))
