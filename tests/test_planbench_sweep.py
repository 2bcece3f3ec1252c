"""lab.studies.planbench sweep: the seeded random-matrix sweep of the planners alone (issue 10:
crew's
plan is no worse than any baseline's on every matrix, and the table gives plan / bound). No root,
the real planners."""

from __future__ import annotations

import json
import math

import pytest

from crew.config import Scheme
from lab.studies import planbench

SCHEMES = "crew,crew-star,crew-paper,preduce,blink-pipe,ring,ps"


def sweep_json(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    status = planbench.main(
        ["sweep", "--matrices", "6", "--seed", "3", "--schemes", SCHEMES, "--json", "-", *extra]
    )
    return status, json.loads(capsys.readouterr().out)


def test_crew_plans_no_slower_than_any_baseline_on_every_matrix(capsys) -> None:
    status, res = sweep_json(capsys)
    assert status == 0
    rows = res["schemes"]
    assert set(rows) == set(SCHEMES.split(","))
    assert all(r["below_crew"] == 0 for r in rows.values())
    assert all(r["planned"] == 6 for r in rows.values())
    crew = rows[Scheme.CREW]
    # plan / bound: the bound is a lower bound, and crew's plan sits on or just above it
    assert 1.0 - 1e-9 <= crew["median"] <= crew["max"] < 1.5
    assert all(crew["median"] <= r["median"] for r in rows.values())


def test_a_baseline_planned_below_crew_fails_the_sweep(capsys, monkeypatch) -> None:
    """The verdict can fail: make ring's plan 10% faster than crew's on every matrix."""
    real = planbench.plan_all

    def ring_wins(*args, **kw) -> dict[str, float]:
        times = real(*args, **kw)
        times[Scheme.RING] = 0.9 * times[Scheme.CREW]
        return times

    monkeypatch.setattr(planbench, "plan_all", ring_wins)
    status, res = sweep_json(capsys)
    assert status == 1
    assert res["schemes"][Scheme.RING]["below_crew"] == 6
    assert res["schemes"][Scheme.PS]["below_crew"] == 0
    assert math.isclose(
        res["schemes"][Scheme.RING]["median"], 0.9 * res["schemes"][Scheme.CREW]["median"]
    )
