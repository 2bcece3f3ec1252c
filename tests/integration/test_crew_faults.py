"""CREW on a real lab: correctness with groups in flight, and a re-plan on measured capacity.

Every completed group's result is checked by the coordinator (``crew.control.verify``): each member
reports the projection of what it received, and ``groups.verify_err`` is its relative
deviation from the weighted average of the members' offered vectors.

Faults are tested where the shipped scenarios inject them (test_reliability): a link cut during
a scatter or a broadcast (link-cut-during-*), a worker killed mid-reduce (worker-crash).
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest
from labkit import completed_groups, rows, small_opts, wait_until

from lab.net.preflight import check
from lab.orchestrate import commands as cmds
from lab.orchestrate.runner import REPO, LabRun
from lab.spec.topology import load_topology

pytestmark = [pytest.mark.root, pytest.mark.slow]

FOUR = REPO / "tests" / "data" / "topologies" / "four.yaml"
SMALL = REPO / "topologies" / "small.yaml"
START_WAIT_S = 120.0
FAULT_WAIT_S = 90.0


def _assert_exact(groups) -> None:
    for g in groups:
        assert g["verify_err"] is not None and g["verify_err"] < 1e-3, (
            f"group {g['id']} averaged wrongly: relative error {g['verify_err']}"
        )


@pytest.mark.parametrize("nonblocking", [False, True])
def test_groups_in_flight_are_exact(tmp_path: Path, nonblocking: bool) -> None:
    topo = load_topology(FOUR)
    with LabRun(
        topo,
        check(topo),
        small_opts(nonblocking=nonblocking),
        tmp_path / "run",
        state_dir=tmp_path / "state",
    ) as lab:
        db = lab.db_path

        def overlapping() -> bool:
            done = completed_groups(db)
            return any(
                a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"]
                for a, b in itertools.combinations(done, 2)
            )

        wait_until(
            lab,
            lambda: len(completed_groups(db)) >= 12 and overlapping(),
            START_WAIT_S,
            "two groups in flight at once",
        )
        done = completed_groups(db)
    _assert_exact(done)
    assert all(len(set(json.loads(g["members"]))) == 2 for g in done)


def test_measured_capacity_replans_when_contention_eats_a_link(tmp_path: Path) -> None:
    """With --capacity measured, a background flow on a busy link lowers its measured rate
    below the configured one, and the coordinator switches the planner to the measurement."""
    topo = load_topology(SMALL)
    with LabRun(
        topo,
        check(topo),
        small_opts(capacity="measured", width=640, depth=3),
        tmp_path / "run",
        state_dir=tmp_path / "state",
    ) as lab:
        db = lab.db_path
        wait_until(lab, lambda: len(completed_groups(db)) >= 3, START_WAIT_S, "first groups")
        src, dst = max(
            ((lk.src, lk.dst) for lk in topo.links), key=lambda sd: topo.link(*sd).rate_mbit
        )
        rate = topo.link(src, dst).rate_mbit
        cmds.submit(db, cmds.StartContention(src=src, dst=dst, rate_mbit=rate))
        wait_until(
            lab,
            lambda: bool(
                rows(
                    db,
                    "SELECT id FROM events WHERE kind='capacity' AND message LIKE ?",
                    (f"link {src}->{dst} measured%",),
                )
            ),
            FAULT_WAIT_S,
            "a re-plan on measured capacity",
        )
        event = rows(
            db,
            "SELECT data FROM events WHERE kind='capacity' AND message LIKE ?",
            (f"link {src}->{dst} measured%",),
        )[0]
        after = time.time()
        wait_until(
            lab, lambda: len(completed_groups(db, after)) >= 2, FAULT_WAIT_S, "groups after it"
        )
        done = completed_groups(db, after)
    measured = json.loads(event["data"])
    assert measured["mbit"] < 0.75 * rate
    _assert_exact(done)
