"""The route LP's plans stay what they were: speed work on crew.plan.routelp must not change a
plan. tests/data/routelp_plans.json holds plan_routes inputs (a bench-hetero replay's groups and
seeded random matrices with delays, active sets and shared links) and the routes and predicted
times the planner made for them cold before the session-15 speed work (commit 0a9fb08). A change
that moves them changes plans: it must be deliberate, and the fixture's plans regenerated with
it from its own inputs: ``python tests/test_routelp_plans.py --write`` (then say why in the
commit)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from crew.plan import routelp
from crew.plan.planner import SharedLink

FIXTURE = Path(__file__).parent / "data" / "routelp_plans.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


def plan_case(case: dict[str, Any]) -> dict[str, Any]:
    """The plan of one case's inputs, cold: its predicted time and routes, as the fixture keeps
    them."""
    shared = [SharedLink(tuple(map(tuple, pairs)), mbit, d) for mbit, pairs, d in case["shared"]]
    delay = case["delay_s"]
    routelp.clear_caches()
    try:
        got = routelp.plan_routes(
            np.array(case["bw"]),
            case["members"],
            case["size"],
            case["active"],
            shared=shared or None,
            delay_s=None if delay is None else np.array(delay),
            part_bytes=case["part_bytes"],
        )
    finally:
        routelp.clear_caches()
    routes = [[r.start, r.stop, r.root, [list(e) for e in r.up], [list(e) for e in r.down]]
              for r in got.routes]  # fmt: skip
    return {"predicted_s": got.predicted_s, "routes": routes}


@pytest.mark.parametrize("case", CASES, ids=[f"{c['kind']}{i}" for i, c in enumerate(CASES)])
def test_plan_unchanged(case: dict) -> None:
    got, want = plan_case(case), case["expect"]
    assert got["predicted_s"] == pytest.approx(want["predicted_s"], rel=1e-9, abs=0)
    assert got["routes"] == want["routes"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python {sys.argv[0]} --write  (re-plan every case of {FIXTURE.name})")
    data = json.loads(FIXTURE.read_text())
    for case in data["cases"]:
        case["expect"] = plan_case(case)
    data["plans_from"] = "re-planned by python tests/test_routelp_plans.py --write"
    FIXTURE.write_text(json.dumps(data, separators=(",", ":")))
    print(f"{FIXTURE}: {len(data['cases'])} plans rewritten")
