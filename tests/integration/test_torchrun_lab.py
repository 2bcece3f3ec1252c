"""examples/train_digits.py in the lab: one ``torchrun --nnodes 3 --node-rank i`` per emulated
cloud of topologies/small.yaml, over its shaped WAN links (no lab runner, no config.json).

Shows: every rank trains and averages, groups of 2 formed over the emulated links and their
results check exact (the coordinator's projection check), and the start-up probe measured the
emulated capacities within 15%.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from labkit import rows

from lab.mesh import LabNetwork
from lab.topology import load_topology

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "topologies" / "small.yaml"
TORCHRUN = Path(sys.executable).with_name("torchrun")
TEST_MGMT = "198.19.246.0/24"
RDZV_PORT = 29400


def test_the_example_runs_through_torchrun_in_the_lab(tmp_path: Path) -> None:
    topo = load_topology(SMALL)
    n = topo.n
    run_dir = tmp_path / "run"
    with LabNetwork(
        topo, tag="t" + secrets.token_hex(2), state_dir=tmp_path / "state", mgmt_subnet=TEST_MGMT
    ) as net:
        host0 = net.identity_address(0)
        procs = []
        for i in range(n):
            env = {
                **os.environ,
                "CREW_SECRET": "lab-torchrun-test-secret-0123",
                "CREW_DATA_HOST": net.identity_address(i),
                "CREW_RUN_DIR": str(run_dir),
                "CREW_PROBE_BYTES": str(4 << 20),
                "PYTHONPATH": str(REPO),
                "OMP_NUM_THREADS": "1",
            }
            argv = [
                str(TORCHRUN),
                "--nnodes", str(n),
                "--node-rank", str(i),
                "--nproc-per-node", "1",
                "--rdzv-backend", "static",
                "--rdzv-endpoint", f"{host0}:{RDZV_PORT}",
                "--master-addr", host0,
                "--master-port", str(RDZV_PORT),
                "examples/train_digits.py", "--group-size", "2", "--steps", "30",
            ]  # fmt: skip
            log = open(tmp_path / f"w{i}.log", "w")  # noqa: SIM115 - closed with the process
            procs.append(
                (net.popen(i, argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env), log)
            )
        codes = []
        for proc, log in procs:
            try:
                codes.append(proc.wait(timeout=300))
            except subprocess.TimeoutExpired:
                net.stop_process(proc)
                codes.append(None)
            log.close()
    out = "\n".join((tmp_path / f"w{i}.log").read_text() for i in range(n))
    assert codes == [0] * n, out[-4000:]
    lines = re.findall(r"rank (\d): averaged (\d+)/30 rounds, accuracy ([\d.]+)", out)
    assert sorted(int(r) for r, _, _ in lines) == list(range(n)), out[-4000:]
    assert all(int(a) >= 20 and float(acc) > 0.7 for _, a, acc in lines), lines

    db = run_dir / "run.db"
    groups = rows(db, "SELECT members, status, verify_err FROM groups")
    # the last ranks to finish may average alone once the others have left
    done = [g for g in groups if g["status"] == "completed" and len(json.loads(g["members"])) == 2]
    assert len(done) >= 20, groups
    assert all(g["verify_err"] is not None and g["verify_err"] < 1e-5 for g in done)

    (probe,) = rows(db, "SELECT message, data FROM events WHERE kind = 'probe'")
    measured = json.loads(probe["data"])["bw_mbit"]
    emulated = topo.bw_matrix()
    errors = {
        (i, j): measured[i][j] / emulated[i][j] - 1 for i in range(n) for j in range(n) if i != j
    }
    print("probe:", probe["message"], {k: f"{v:+.1%}" for k, v in errors.items()})
    assert all(abs(e) <= 0.15 for e in errors.values()), errors
