"""Multi-hop plans under faults on a real lab: a relay dies, or a relay's link is cut, while a
group streams through it.

``relay4``'s direct 0<->1 pair runs at 2 Mbit/s, so ``crew-relay`` plans the benchmark trace's
group {0, 1} with worker 2 relaying one block between the members (0 -> 2 -> 1 up, 1 -> 2 -> 0
down) besides aggregating its own. Numpy-only benchmark workers (no torch) keep the lab quick;
each op moves 8 MB, about a second on these links, so a fault lands mid-group.

What must hold: the group in flight is re-planned (a new revision) and completes exact, or is
abandoned with a reason; later groups complete exact on plans that avoid the dead relay or
link; and ``lab.audit`` passes on the finished run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from labkit import completed_groups, rows, small_opts, wait_until

from crew.plan.routes import Route
from lab import audit as lab_audit
from lab.net.preflight import check
from lab.orchestrate import commands as cmds
from lab.orchestrate.runner import REPO, LabRun
from lab.spec.topology import load_topology

pytestmark = [pytest.mark.root, pytest.mark.slow]

RELAY4 = REPO / "tests" / "data" / "topologies" / "relay4.yaml"
OPS = 40  # trace length: more than the test waits for
SIZE_ELEMS = 2_000_000  # 8 MB per op
START_WAIT_S = 90.0
FAULT_WAIT_S = 60.0
RELAY = 2


def _routes(group) -> list[Route]:
    return [Route.from_list(r) for r in json.loads(group["plan"])["routes"]]


def _relays(group) -> set[int]:
    """Nodes that pass on another node's stream: inner nodes of a reduce tree below its root."""
    return {p for r in _routes(group) for _, p in r.up if p != r.root}


def _exact(groups) -> None:
    for g in groups:
        assert g["verify_err"] is not None and g["verify_err"] < 1e-3, (
            f"group {g['id']} averaged wrongly: relative error {g['verify_err']}"
        )


@pytest.mark.parametrize("fault", ["kill-relay", "cut-relay-link"])
def test_relay_fault_mid_group_replans_and_stays_exact(tmp_path: Path, fault: str) -> None:
    topo = load_topology(RELAY4)
    opts = small_opts(
        scheme="crew-relay",
        extra={"bench": True, "size_elems": SIZE_ELEMS, "trace": [[0, 1]] * OPS, "ops": OPS},
    )
    run_dir = tmp_path / "run"
    with LabRun(topo, check(topo), opts, run_dir, state_dir=tmp_path / "state") as lab:
        db = lab.db_path
        wait_until(lab, lambda: len(completed_groups(db)) >= 2, START_WAIT_S, "first groups")
        first = completed_groups(db)
        assert all(RELAY in _relays(g) for g in first), "the plan does not relay through 2"
        _exact(first)
        wait_until(
            lab,
            lambda: bool(rows(db, "SELECT id FROM groups WHERE status='open'")),
            FAULT_WAIT_S,
            "an open group",
        )
        victim = rows(db, "SELECT id FROM groups WHERE status='open' ORDER BY id DESC")[0]["id"]
        if fault == "kill-relay":
            cmds.submit(db, cmds.KillWorker(worker=RELAY))
        else:
            cmds.submit(db, cmds.CutLink(src=0, dst=RELAY))
        wait_until(
            lab,
            lambda: (
                rows(db, "SELECT status FROM groups WHERE id=?", (victim,))[0]["status"] != "open"
            ),
            FAULT_WAIT_S,
            f"group {victim} to end after the fault",
        )
        g = rows(db, "SELECT * FROM groups WHERE id=?", (victim,))[0]
        wait_until(
            lab,
            lambda: len(completed_groups(db, g["ended_at"])) >= 2,
            FAULT_WAIT_S,
            "groups after the fault",
        )
        after = completed_groups(db, g["ended_at"])
    if g["status"] == "completed":
        assert g["revisions"] > 0, f"group {victim} finished on its old plan through the fault"
        _exact([g])
    else:
        assert g["status"] == "abandoned" and g["reason"], dict(g)
    _exact(after)
    for a in after:  # re-planned without the dead relay or link
        edges = {e for r in _routes(a) for e in (*r.up, *r.down)}
        if fault == "kill-relay":
            assert all(RELAY not in e for e in edges), f"group {a['id']} still uses worker 2"
        else:
            assert (0, RELAY) not in edges, f"group {a['id']} still uses the cut link 0->2"
    report = lab_audit.audit(run_dir)
    assert report.ok, [f"{c.name}: {c.detail}" for c in report.violations]
