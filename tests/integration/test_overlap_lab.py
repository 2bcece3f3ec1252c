"""End to end: torch workers that train on while their groups reduce (``--overlap``).

A real lab on the 3-worker topology, with DiLoCo outer steps, so the delta is applied to an
outer loop's result. The groups must complete with verified averages, and every worker must
report its time split.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from labkit import completed_groups, rows, small_opts, wait_until

from lab.net.preflight import check
from lab.orchestrate.runner import REPO, LabRun
from lab.orchestrate.summary import summarize
from lab.spec.topology import load_topology

pytestmark = pytest.mark.root

SMALL = REPO / "topologies" / "small.yaml"
GROUPS = 6
WAIT_S = 150.0  # three torch imports on two cores, then the groups


def test_overlapped_diloco_workers_complete_verified_groups(tmp_path: Path) -> None:
    topo = load_topology(SMALL)
    opts = small_opts(scheme="crew", width=128, overlap=True, sync="diloco", local_steps=2)
    with LabRun(topo, check(topo), opts, tmp_path / "run", state_dir=tmp_path / "state") as lab:
        db = lab.db_path
        wait_until(lab, lambda: len(completed_groups(db)) >= GROUPS, WAIT_S, f"{GROUPS} groups")
        # Until every worker has reported its time split at least twice (every 5 s).
        wait_until(
            lab,
            lambda: (
                len(rows(db, "SELECT worker FROM utilisation GROUP BY worker HAVING COUNT(*) > 1"))
                == topo.n
            ),
            30.0,
            "two time splits from every worker",
        )
    groups = completed_groups(db)
    assert len(groups) >= GROUPS
    assert all(g["verify_err"] is not None and g["verify_err"] < 1e-3 for g in groups)
    summary = summarize(db)
    assert summary["overlap"] is True and summary["sync"] == "diloco"
    shares = summary["utilisation_per_worker"]
    assert set(shares) == {str(w) for w in range(topo.n)}
    assert all(s["compute_s"] > 0 and 0 < s["utilisation"] <= 1 for s in shares.values())
