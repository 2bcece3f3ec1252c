"""examples/train_digits.py in the lab: one ``torchrun --nnodes 3 --node-rank i`` per emulated
cloud of topologies/small.yaml, over its shaped WAN links (no lab runner, no config.json).

Shows: every rank trains and averages, groups of 2 formed over the emulated links and their
results check exact (the coordinator's projection check), and the start-up probe measured every
directed link, in n - 1 = 2 rounds, within 15% of its emulated rate.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from labkit import rows

from lab.spec.topology import load_topology
from lab.torchrun import probe_result, run_in_lab

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "topologies" / "small.yaml"


def test_the_example_runs_through_torchrun_in_the_lab(tmp_path: Path) -> None:
    topo = load_topology(SMALL)
    n = topo.n
    run = run_in_lab(topo, tmp_path, ["--group-size", "2", "--steps", "30"])
    assert run.codes == [0] * n, run.output[-4000:]
    # torchrun keeps its logs in each rank's own temporary folder in the job's, not in /tmp.
    assert all(any((tmp_path / f"w{i}.tmp").glob("torchelastic_*")) for i in range(n))
    lines = re.findall(r"rank (\d): averaged (\d+)/30 rounds, accuracy ([\d.]+)", run.output)
    assert sorted(int(r) for r, _, _ in lines) == list(range(n)), run.output[-4000:]
    assert all(int(a) >= 20 and float(acc) > 0.7 for _, a, acc in lines), lines

    groups = rows(run.db, "SELECT members, status, verify_err FROM groups")
    # the last ranks to finish may average alone once the others have left
    done = [g for g in groups if g["status"] == "completed" and len(json.loads(g["members"])) == 2]
    assert len(done) >= 20, groups
    unchecked = [dict(g) for g in done if g["verify_err"] is None or g["verify_err"] >= 1e-5]
    assert not unchecked, unchecked

    probe = probe_result(run.db, topo)
    print("probe:", probe.message, {k: f"{v:.3f}" for k, v in probe.ratio.items()})
    rounds = n - 1 if n % 2 else n  # even n: the n/2 shift runs one direction per round
    assert (probe.rounds, probe.links_measured) == (rounds, n * (n - 1)), probe.message
    off = {k: round(r, 3) for k, r in probe.ratio.items() if abs(r - 1) > 0.15}
    assert not off, f"measured/emulated off by more than 15%: {off}"
