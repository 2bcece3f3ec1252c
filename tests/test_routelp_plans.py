"""The route LP's plans stay what they were: speed work on crew.plan.routelp must not change a
plan. tests/data/routelp_plans.json holds plan_routes inputs (a bench-hetero replay's groups and
seeded random matrices with delays, active sets and shared links) and the routes and predicted
times the planner made for them cold at commit 0a9fb08. A change that moves them changes
plans: it must be deliberate, and the fixture's plans regenerated with it from its own inputs:
``python tests/test_routelp_plans.py --write`` (then say why in the commit)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from crew.plan import routelp
from crew.plan.inputs import ELEM_BYTES, SharedLink
from crew.plan.routes import validate_routes

FIXTURE = Path(__file__).parent / "data" / "routelp_plans.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


ALTERNATIVE_OPTIMUM_REL = 1e-6
"""How far an equally good plan with other routes may be from the pinned time. HiGHS pivots
differently on other CPUs (an AMD EPYC with AVX-512 planned case random13 with another 28
routes, 1.4e-7 slower): the LP stops within its settings' ``gap`` (1e-7) of its optimum, so its
ties and near-ties are not the same bit for bit everywhere."""


def _inputs(case: dict[str, Any]) -> dict[str, Any]:
    """The case's network, as keywords of both ``plan_routes`` and ``route_time``."""
    shared = [SharedLink(tuple(map(tuple, pairs)), mbit, d) for mbit, pairs, d in case["shared"]]
    delay = case["delay_s"]
    return {
        "bw": np.array(case["bw"]),
        "shared": shared or None,
        "delay_s": None if delay is None else np.array(delay),
        "part_bytes": case["part_bytes"],
    }


def _plan(case: dict[str, Any]) -> routelp.RoutePlanResult:
    """The plan of one case's inputs, cold (no cache: nothing kept from other plans)."""
    return routelp.plan_routes(
        members=case["members"], size=case["size"], active=case["active"], **_inputs(case)
    )


def _summary(got: routelp.RoutePlanResult) -> dict[str, Any]:
    routes = [[r.start, r.stop, r.root, [list(e) for e in r.up], [list(e) for e in r.down]]
              for r in got.routes]  # fmt: skip
    return {"predicted_s": got.predicted_s, "routes": routes}


def plan_case(case: dict[str, Any]) -> dict[str, Any]:
    """The plan of one case's inputs, cold: its predicted time and routes, as the fixture keeps
    them."""
    return _summary(_plan(case))


@pytest.mark.parametrize("case", CASES, ids=[f"{c['kind']}{i}" for i, c in enumerate(CASES)])
def test_plan_unchanged(case: dict) -> None:
    plan = _plan(case)
    got, want = _summary(plan), case["expect"]
    if got["routes"] == want["routes"]:
        assert got["predicted_s"] == pytest.approx(want["predicted_s"], rel=1e-9, abs=0)
        return
    # Other routes: only an equally good plan passes, one that is a real plan (every member gets
    # every element's sum once) and whose own cost is the time it claims.
    assert got["predicted_s"] == pytest.approx(
        want["predicted_s"], rel=ALTERNATIVE_OPTIMUM_REL, abs=0
    )
    n, total = len(case["bw"]), case["size"] // ELEM_BYTES
    validate_routes(plan.routes, case["members"], n, total)
    assert routelp.route_time(plan.routes, **_inputs(case)) == pytest.approx(
        plan.predicted_s, rel=1e-9
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python {sys.argv[0]} --write  (re-plan every case of {FIXTURE.name})")
    data = json.loads(FIXTURE.read_text())
    for case in data["cases"]:
        case["expect"] = plan_case(case)
    data["plans_from"] = "re-planned by python tests/test_routelp_plans.py --write"
    FIXTURE.write_text(json.dumps(data, separators=(",", ":")))
    print(f"{FIXTURE}: {len(data['cases'])} plans rewritten")
