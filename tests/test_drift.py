"""Replaying rate traces: which links change when (pure), and what lands in the run database."""

from __future__ import annotations

from pathlib import Path

import pytest

from crew.ratetrace import DriftParams, RateTrace, generate
from crew.runtime.rundb import RunDB
from lab.orchestrate.drift import DriftApplier, DriftSchedule, RateChange, lab_schedule


def test_links_change_when_their_trace_moves_beyond_the_threshold() -> None:
    schedule = lab_schedule(
        {
            (0, 1): RateTrace((0.0, 5.0, 6.0), (100.0, 101.0, 50.0), "a"),
            (1, 0): RateTrace((0.0,), (20_000.0,), "b"),
        }
    )
    first = schedule.due(0.0)
    assert first == [RateChange(0, 1, 100.0), RateChange(1, 0, 10_000.0)]  # the lab's most
    for c in first:
        schedule.done(c)
    assert schedule.due(5.5) == []  # 1% is below the 2% threshold
    assert schedule.due(6.0) == [RateChange(0, 1, 50.0)]
    assert schedule.due(6.0) == [RateChange(0, 1, 50.0)]  # not confirmed: due again


def test_the_steps_of_a_run_are_what_a_lab_applies_each_second() -> None:
    trace = RateTrace((0.0, 2.5, 4.0), (10.0, 20.0, 20.1), "t")
    steps = DriftSchedule({(0, 1): trace}).steps(6.0)
    # At 0 s the first rate, at 3 s (the first tick after 2.5) the second; 20.1 is within 2%.
    assert steps == [(0.0, RateChange(0, 1, 10.0)), (3.0, RateChange(0, 1, 20.0))]


def test_a_drifting_trace_costs_a_change_only_when_it_moves(tmp_path: Path) -> None:
    trace = generate(DriftParams(100.0, spread=0.3, tau_s=30.0, duration_s=600, seed=1))
    schedule = DriftSchedule({(0, 1): trace}, min_change=0.05)
    changes = 0
    for t in range(601):
        for c in schedule.due(float(t)):
            schedule.done(c)
            changes += 1
            assert c.mbit == trace.rate_at(t)
    assert 10 < changes < 600


class _Net:
    """The one LabNetwork call the applier makes, for a run without a lab (no root)."""

    def __init__(self) -> None:
        self.rates: dict[tuple[int, int], float] = {}

    def set_link(self, i: int, j: int, *, rate_mbit: float) -> None:
        if rate_mbit > 5000:
            raise RuntimeError("refused")
        self.rates[(i, j)] = rate_mbit


def test_the_applier_records_configured_rates_and_retries_failures(tmp_path: Path) -> None:
    db = RunDB(tmp_path / "lab.db")
    net = _Net()
    schedule = DriftSchedule(
        {
            (0, 1): RateTrace((0.0, 2.0), (80.0, 40.0), "a"),
            (1, 0): RateTrace((0.0,), (6000.0,), "b"),
        }
    )
    told: list[RateChange] = []  # what an oracle planner hears: each rate once it is set
    applier = DriftApplier(net, db, schedule, on_change=told.append)  # type: ignore[arg-type]
    assert applier.tick(0.0) == 1 and applier.tick(1.0) == 0 and applier.tick(2.0) == 1
    assert net.rates == {(0, 1): 40.0}
    assert told == [RateChange(0, 1, 80.0), RateChange(0, 1, 40.0)]  # not the refused one
    rows = db.query("SELECT src, dst, rate_mbit, reason FROM link_state ORDER BY id")
    assert [tuple(r) for r in rows] == [(0, 1, 80.0, "trace"), (0, 1, 40.0, "trace")]
    assert schedule.due(3.0) == [RateChange(1, 0, 6000.0)]  # the refused link stays due
    with pytest.raises(ValueError, match="1 Hz"):
        DriftApplier(net, db, schedule, period_s=2.0)  # type: ignore[arg-type]
    db.close()
