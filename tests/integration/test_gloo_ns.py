"""The gloo scheme across network namespaces that share one hostname, as lab hosts do.

The fixture builds three namespaces of its own (random names), joins every pair with a veth
pair, gives each namespace a 198.18.x.y/32 identity address on ``lo`` with /32 routes to its
peers over the veths (the lab's addressing, without Mininet), and always deletes them. Each
rank then runs ``python -m crew.runtime.gloo`` inside its namespace through ``ip netns exec``.

``ip netns`` does not unshare the UTS namespace, so all ranks see the root hostname: the case
where Gloo's own address choice goes wrong. The second test shows that it does, so the first
one proves something.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from proc_kit import run_all

from crew.runtime.gloo import demo_vector

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
WORLD = 3
PROC_LIMIT_S = 90.0

# What people do by default: init_process_group with GLOO_SOCKET_IFNAME naming the interface
# that holds the identity address. argv: rank addresses(comma) store_port timeout_s
IFNAME_PROBE = textwrap.dedent("""
    import sys
    from datetime import timedelta
    import torch.distributed as dist
    rank, addrs = int(sys.argv[1]), sys.argv[2].split(",")
    port, t = int(sys.argv[3]), float(sys.argv[4])
    store = dist.TCPStore(addrs[0], port, len(addrs), rank == 0, timedelta(seconds=t))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=len(addrs),
                            timeout=timedelta(seconds=t))
    print("connected", flush=True)
    dist.destroy_process_group()
""")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


def _in_ns(ns: str, *argv: str) -> None:
    _ip("netns", "exec", ns, *argv)


@dataclass(frozen=True)
class NsMesh:
    namespaces: tuple[str, ...]
    addresses: tuple[str, ...]
    # (namespace, interface) of the veth end that carries traffic from rank i to rank j.
    links: dict[tuple[int, int], tuple[str, str]]


@pytest.fixture
def ns_mesh() -> Iterator[NsMesh]:
    tag = secrets.token_hex(2)
    namespaces = tuple(f"crewgloo-{tag}-{i}" for i in range(WORLD))
    # Any 198.18.0.0/15 subnet would do: these namespaces route only among themselves.
    octet = 100 + secrets.randbelow(100)
    addresses = tuple(f"198.18.{octet}.{i + 1}" for i in range(WORLD))
    links: dict[tuple[int, int], tuple[str, str]] = {}
    made: list[str] = []
    try:
        for ns in namespaces:
            _ip("netns", "add", ns)
            made.append(ns)
        for ns, addr in zip(namespaces, addresses, strict=True):
            _in_ns(ns, "ip", "link", "set", "lo", "up")
            _in_ns(ns, "ip", "addr", "add", f"{addr}/32", "dev", "lo")
        for i in range(WORLD):
            for j in range(i + 1, WORLD):
                # Created directly inside the namespaces, so nothing is ever left in the root one.
                a, b = f"g{tag}{i}{j}", f"g{tag}{j}{i}"
                _ip("-n", namespaces[i], "link", "add", a, "type", "veth",
                    "peer", "name", b, "netns", namespaces[j])  # fmt: skip
                for here, there, dev in ((i, j, a), (j, i, b)):
                    _in_ns(namespaces[here], "ip", "link", "set", dev, "up")
                    _in_ns(namespaces[here], "ip", "route", "add", f"{addresses[there]}/32",
                           "dev", dev, "src", addresses[here])  # fmt: skip
                links[(i, j)] = (namespaces[i], a)
                links[(j, i)] = (namespaces[j], b)
        yield NsMesh(namespaces, addresses, links)
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def _tx_bytes(ns: str, dev: str) -> int:
    argv = ["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/tx_bytes"]
    res = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=10)
    return int(res.stdout)


def _free_port() -> int:
    # Any port free here is free in the fresh namespaces too; it only has to be a valid one.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_in_namespaces(jobs: list[tuple[str, list[str]]]) -> list[subprocess.CompletedProcess[str]]:
    """Run every (namespace, argv) job at once; wait for all, each wait bounded."""
    return run_all([["ip", "netns", "exec", ns, *argv] for ns, argv in jobs], PROC_LIMIT_S)


def test_gloo_binds_identity_addresses_across_namespaces(ns_mesh: NsMesh) -> None:
    length, rounds, seed = 100_000, 2, 3
    common = ["--addresses", ",".join(ns_mesh.addresses), "--store-port", str(_free_port())]
    common += ["--timeout", "30", "--length", str(length), "--rounds", str(rounds)]
    common += ["--seed", str(seed)]
    jobs = [
        (ns, [sys.executable, "-m", "crew.runtime.gloo", "--rank", str(r), *common])
        for r, ns in enumerate(ns_mesh.namespaces)
    ]
    before = {k: _tx_bytes(*v) for k, v in ns_mesh.links.items()}
    results = _run_in_namespaces(jobs)
    sent = {k: _tx_bytes(*v) - before[k] for k, v in ns_mesh.links.items()}

    for rank, res in enumerate(results):
        assert res.returncode == 0, f"rank {rank} failed:\n{res.stderr}"
    reports = [json.loads(res.stdout.strip().splitlines()[-1]) for res in results]
    assert [rep["address"] for rep in reports] == list(ns_mesh.addresses)
    for k in range(rounds):
        vectors = [demo_vector(seed, k, r, length).astype(np.float64) for r in range(WORLD)]
        expected = np.mean(vectors, axis=0)
        for rank, rep in enumerate(reports):
            got = np.asarray(rep["averages"][k], dtype=np.float32)
            msg = f"rank {rank} round {k}"
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=msg)

    # The vectors crossed the veths, in Gloo's ring order (crew.runtime.gloo's cost model): each
    # round rank r sends 2(n-1)/n of the vector to rank r-1, and only control bytes to anyone else.
    print("bytes sent per directed link:", dict(sorted(sent.items())))
    ring_bytes = rounds * 2 * (WORLD - 1) / WORLD * length * 4
    for (i, j), b in sent.items():
        if j == (i - 1) % WORLD:
            assert b >= ring_bytes, f"{i}->{j} carried {b} B, ring needs >= {ring_bytes:.0f}"
        else:
            assert b < ring_bytes / 10, f"{i}->{j} carried {b} B, off the ring"


def test_stock_init_process_group_advertises_loopback_and_cannot_connect(ns_mesh: NsMesh) -> None:
    """Negative control: the stock ``init_process_group("gloo")``, with and without
    ``GLOO_SOCKET_IFNAME=lo`` (two groups of three, run side by side to save time).

    With it, Gloo takes the first IPv4 address of ``lo``: 127.0.0.1. Without it, the shared
    hostname, which resolves to loopback. Either way every rank advertises 127.0.0.1, a peer
    dialling it reaches its own namespace, and the mesh never connects.
    """
    addresses = ",".join(ns_mesh.addresses)
    jobs = []
    for env in (["GLOO_SOCKET_IFNAME=lo"], []):
        port = str(_free_port())
        for r, ns in enumerate(ns_mesh.namespaces):
            argv = [sys.executable, "-c", IFNAME_PROBE, str(r), addresses, port, "2"]
            jobs.append((ns, ["env", *env, *argv]))
    results = _run_in_namespaces(jobs)
    for (ns, argv), res in zip(jobs, results, strict=True):
        assert res.returncode != 0, f"{argv[:2]} in {ns} connected:\n{res.stdout}"
        assert "connected" not in res.stdout
        assert "connectFullMesh failed" in res.stderr, res.stderr
    for group in (results[:WORLD], results[WORLD:]):
        assert any("remote=[127.0.0.1]" in res.stderr for res in group)
