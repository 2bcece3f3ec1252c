"""A coordinator that stops running for longer than the heartbeat timeout (a frozen host, a
blocked database write) loses no worker: it excuses the time it was away instead of finding
every worker silent on waking (crew.control.lifecycle, "Liveness"). A CI run once lost all
eight workers this way; p fell to 1 and the run trained on alone. Here SIGSTOP freezes the
real coordinator of a real lab."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from labkit import completed_groups, rows, small_opts, wait_until

from lab.net.preflight import check
from lab.orchestrate.runner import REPO, LabRun
from lab.spec.topology import load_topology

pytestmark = [pytest.mark.root, pytest.mark.slow]

FOUR = REPO / "tests" / "data" / "topologies" / "four.yaml"
FIRST_GROUPS = 3
WARM_WAIT_S = 240.0  # torch imports on two shared cores
AFTER_WAIT_S = 60.0
FREEZE_FACTOR = 2.0  # x the heartbeat timeout


def test_a_coordinator_frozen_past_the_heartbeat_timeout_loses_no_worker(tmp_path: Path) -> None:
    topo = load_topology(FOUR)
    with LabRun(
        topo, check(topo), small_opts(), tmp_path / "run", state_dir=tmp_path / "state"
    ) as lab:
        db = lab.db_path
        wait_until(
            lab, lambda: len(completed_groups(db)) >= FIRST_GROUPS, WARM_WAIT_S, "the first groups"
        )
        assert lab.cfg is not None and lab.coordinator is not None
        freeze_s = FREEZE_FACTOR * lab.cfg.heartbeat_timeout_s
        pgid = lab.coordinator.pid  # its own session: the group is the coordinator alone
        os.killpg(pgid, signal.SIGSTOP)
        try:
            frozen_at = time.time()
            # The lab goes on (its poll reaps, the workers train and heartbeat into the void).
            for _ in range(int(freeze_s / 0.5) + 1):
                if time.time() - frozen_at >= freeze_s:
                    break
                lab.poll()
                time.sleep(0.5)
        finally:
            os.killpg(pgid, signal.SIGCONT)
        woke_at = time.time()
        wait_until(
            lab,
            lambda: len(completed_groups(db, woke_at)) >= FIRST_GROUPS,
            AFTER_WAIT_S,
            "groups formed after the coordinator woke",
        )
        assert lab.coordinator.poll() is None, "the coordinator died"
    lost = rows(db, "SELECT message FROM events WHERE message LIKE '%lost:%'")
    assert not lost, [r["message"] for r in lost]
    away = rows(db, "SELECT message FROM events WHERE kind='coordinator' AND message LIKE '%away%'")
    assert away, "the coordinator did not notice it had been away"
    gap = max(float(r["message"].split("away ")[1].split(" s")[0]) for r in away)
    assert gap >= 0.9 * freeze_s, away
    after = completed_groups(db, woke_at)
    # Groups of p = 2, as before: nobody was declared dead, so p_eff did not shrink.
    assert all(len(json.loads(g["members"])) == 2 for g in after), [g["members"] for g in after]
