"""Shared uplinks built for real (root): clouds-4x2 behind gateways, and one cloud pair's WAN
rate shared by its workers (lab.check's sharing measurement)."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest

from lab.check import PAYLOAD_FRACTION, measure_batch, measure_sharing, remeasure
from lab.net.mesh import LabError, LabNetwork
from lab.spec.topology import Uplinks, load_topology

REPO = Path(__file__).resolve().parents[2]
CLOUDS_4X2 = REPO / "topologies" / "clouds-4x2.yaml"
TEST_MGMT = "198.19.249.0/24"
RETRIES = 2  # of a LOW measurement (see the test)


@pytest.mark.root
def test_clouds_4x2_workers_share_their_cloud_pair_uplink(tmp_path: Path) -> None:
    topo = load_topology(CLOUDS_4X2)
    assert topo.uplinks is Uplinks.SHARED
    tag = "up" + secrets.token_hex(2)
    with LabNetwork(topo, tag=tag, state_dir=tmp_path, mgmt_subnet=TEST_MGMT) as net:
        # Every identity reaches every other: direct in a cloud, through two gateways across.
        for j in (1, 2, 7):
            res = subprocess.run(
                [
                    "mnexec",
                    "-a",
                    str(net.host_pid(0)),
                    "ping",
                    "-c1",
                    "-W2",
                    net.identity_address(j),
                ],
                capture_output=True,
                text=True,
                timeout=10,
            )
            assert res.returncode == 0, res.stdout + res.stderr
        with pytest.raises(LabError, match="share an uplink"):
            net.set_link(0, 2, rate_mbit=5)
        # us-east -> eu-west is 80 Mbit/s: one flow alone gets it; two flows share it.
        # lab.check's policy: a LOW 1.5 s transfer is measured again before it counts (one CI
        # run measured 64.9 against the 65.0 Mbit/s floor; lab.check's module doc says why).
        # Twice here: right after a benchmark, a slow phase of the host failed two in a row.
        first = measure_batch(net, [topo.link(0, 2)], 1.5, 0.1)
        (alone,) = remeasure(net, first, 1.5, 0.1, retries=RETRIES)
        assert alone.measured_mbit > 0.85 * 80 * PAYLOAD_FRACTION
        assert alone.status == "ok", alone  # its per-pair counter carried the bytes
        assert (0, 2) in net.tx_bytes() and (0, 1) in net.tx_bytes()
        # The same policy for the shared uplink's row: LOW is measured again, NOT SHARED is not.
        shared = {
            (r.src_cloud, r.dst_cloud): r
            for r in measure_sharing(net, 1.5, 0.1, limit=2, retries=RETRIES)
        }
        row = shared[("us-east", "eu-west")]
        assert row.flows == 2 and row.status == "ok", row
        assert row.total_mbit < 1.1 * 80  # private links would give ~2 x 80
        # Intra-cloud stays fast (500 Mbit/s configured): well above any WAN rate.
        (intra,) = measure_batch(net, [topo.link(0, 1)], 1.0, 0.5)
        assert intra.measured_mbit > 150
    assert not list(tmp_path.glob("*.json"))  # teardown removed the state file
