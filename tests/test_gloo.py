"""The gloo scheme on loopback: three real ranks averaging through Gloo, and its failure modes.

Ranks run as ``python -m crew.runtime.gloo`` subprocesses (each imports torch, so they are separate
processes anyway); every wait on them is bounded, so a hang fails the test instead of stalling
the suite.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from proc_kit import run_all

from crew.runtime.gloo import (
    GlooAllReduce,
    GlooClosedError,
    GlooSetupError,
    GlooSpec,
    GlooSpecError,
    GlooVectorError,
    demo_vector,
)

REPO = Path(__file__).resolve().parents[1]
LOOP = "127.0.0.1"
# Generous: three concurrent `import torch` on two cores take a few seconds.
PROC_LIMIT_S = 60.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOP, 0))
        return int(s.getsockname()[1])


def _run_ranks(
    ports: list[int], *, length: int, rounds: int, seed: int, timeout_s: float
) -> list[subprocess.CompletedProcess[str]]:
    """Start one ``crew.runtime.gloo`` process per entry of ``ports`` (rank r: ports[r]); wait."""
    addresses = ",".join([LOOP] * len(ports))
    commands = [
        [
            sys.executable, "-m", "crew.runtime.gloo",
            "--rank", str(rank), "--addresses", addresses, "--store-port", str(port),
            "--timeout", str(timeout_s), "--length", str(length),
            "--rounds", str(rounds), "--seed", str(seed),
        ]
        for rank, port in enumerate(ports)
    ]  # fmt: skip
    return run_all(commands, PROC_LIMIT_S)


def test_three_ranks_average_to_the_numpy_mean_twice() -> None:
    length, rounds, seed, world = 1001, 2, 7, 3
    results = _run_ranks([_free_port()] * world, length=length, rounds=rounds, seed=seed,
                         timeout_s=30.0)  # fmt: skip
    for rank, res in enumerate(results):
        assert res.returncode == 0, f"rank {rank} failed:\n{res.stderr}"
    reports = [json.loads(res.stdout.strip().splitlines()[-1]) for res in results]
    assert [r["rank"] for r in reports] == [0, 1, 2]
    for k in range(rounds):
        expected = np.mean(
            [demo_vector(seed, k, r, length).astype(np.float64) for r in range(world)], axis=0
        )
        got = [np.asarray(rep["averages"][k], dtype=np.float32) for rep in reports]
        for rank, avg in enumerate(got):
            assert avg.shape == (length,)
            np.testing.assert_allclose(avg, expected, rtol=1e-5, atol=1e-6, err_msg=f"rank {rank}")
        # The all-gather hands every rank the same reduced chunks: results are bitwise equal.
        assert all(np.array_equal(got[0], g) for g in got[1:])
    # Reuse: the second round averaged the second round's vectors, not the first's again.
    assert reports[0]["averages"][0] != reports[0]["averages"][1]


def test_rank_with_wrong_store_port_fails_clearly_and_nobody_hangs() -> None:
    good, bad = _free_port(), _free_port()
    assert good != bad
    results = _run_ranks([good, good, bad], length=10, rounds=1, seed=0, timeout_s=3.0)
    for rank, res in enumerate(results):
        assert res.returncode == 2, f"rank {rank}: rc {res.returncode}\n{res.stderr}"
        assert res.stdout == ""
        assert f"error: rank {rank}/3 at {LOOP}" in res.stderr
    assert f"store {LOOP}:{bad}" in results[2].stderr
    assert "reaching the rendezvous store failed" in results[2].stderr
    # Rank 0 served the right port and reports that a client never came.
    assert f"store {LOOP}:{good}" in results[0].stderr
    assert "serving the rendezvous store failed" in results[0].stderr


def test_importing_the_module_does_not_import_torch() -> None:
    code = "import sys, crew.runtime.gloo; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=PROC_LIMIT_S, check=True)  # fmt: skip
    assert res.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"world": 0, "rank": 0, "addresses": ()}, "world"),
        ({"rank": 3}, "rank"),
        ({"rank": -1}, "rank"),
        ({"addresses": (LOOP, LOOP)}, "addresses"),
        ({"addresses": [LOOP, LOOP, LOOP]}, "addresses"),
        ({"addresses": (LOOP, "localhost", LOOP)}, "addresses"),
        ({"store_port": 0}, "store_port"),
        ({"store_port": 70000}, "store_port"),
        ({"timeout_s": 0.0}, "timeout_s"),
    ],
)
def test_spec_rejects_bad_fields(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {
        "rank": 0, "world": 3, "addresses": (LOOP, LOOP, LOOP), "store_port": 29500,
    }  # fmt: skip
    with pytest.raises(GlooSpecError) as info:
        GlooSpec(**(base | kwargs))  # type: ignore[arg-type]
    assert info.value.field == field


def test_spec_accepts_ipv6_and_formats_the_store_endpoint() -> None:
    spec = GlooSpec(rank=1, world=2, addresses=("::1", "198.18.0.2"), store_port=29500)
    assert spec.address == "198.18.0.2"
    assert spec.store_endpoint == "[::1]:29500"


def test_identity_address_not_in_this_namespace_fails_before_any_rendezvous() -> None:
    # 192.0.2.1 is TEST-NET-1: never configured here, so the bind fails; nothing is sent.
    spec = GlooSpec(rank=0, world=1, addresses=("192.0.2.1",), store_port=_free_port(),
                    timeout_s=2.0)  # fmt: skip
    with pytest.raises(GlooSetupError, match=r"rank 0/1 at 192\.0\.2\.1.*cannot bind"):
        GlooAllReduce(spec)


def test_single_rank_group_validates_input_and_closes() -> None:
    spec = GlooSpec(rank=0, world=1, addresses=(LOOP,), store_port=_free_port(), timeout_s=10.0)
    gloo = GlooAllReduce(spec)
    try:
        vec = np.arange(5, dtype=np.float32)
        out = gloo.average(vec)
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out, vec)
        out[0] = 42.0
        assert vec[0] == 0.0  # the caller's array is neither mutated nor aliased
        with pytest.raises(GlooVectorError, match="float32"):
            gloo.average(vec.astype(np.float64))
        with pytest.raises(GlooVectorError, match="1-D"):
            gloo.average(vec.reshape(5, 1))
        with pytest.raises(GlooVectorError, match="numpy"):
            gloo.average([1.0, 2.0])  # type: ignore[arg-type]
        gloo.barrier()
    finally:
        gloo.close()
    gloo.close()  # idempotent
    with pytest.raises(GlooClosedError):
        gloo.average(np.zeros(3, dtype=np.float32))
    with pytest.raises(GlooClosedError):
        gloo.barrier()
