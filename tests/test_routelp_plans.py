"""The route LP's plans stay what they were: speed work on crew.plan.routelp must not change a
plan. tests/data/routelp_plans.json holds plan_routes inputs (a bench-hetero replay's groups and
seeded random matrices with delays, active sets and shared links) and the routes and predicted
times the planner made for them cold before the session-15 speed work (commit 0a9fb08). A change
that moves them changes plans: it must be deliberate, and the fixture regenerated with it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from crew.plan import routelp
from crew.plan.planner import SharedLink

CASES = json.loads((Path(__file__).parent / "data" / "routelp_plans.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['kind']}{i}" for i, c in enumerate(CASES)])
def test_plan_unchanged(case: dict) -> None:
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
    want = case["expect"]
    assert got.predicted_s == pytest.approx(want["predicted_s"], rel=1e-9, abs=0)
    routes = [[r.start, r.stop, r.root, [list(e) for e in r.up], [list(e) for e in r.down]]
              for r in got.routes]  # fmt: skip
    assert routes == want["routes"]
