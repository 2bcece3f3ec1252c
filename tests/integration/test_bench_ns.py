"""End to end: ``lab.bench`` on the 3-worker topology, a few tiny ops per scheme.

Checks what the benchmark wrote (every scheme correct, K positive op times with their bounds,
per-link bytes) and that its network is gone afterwards. No timing assertions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.bench import cli as bench_cli
from lab.bench import ops as bench_ops
from lab.net.cleanup import ROOT_NAME_PREFIX, root_link_names
from lab.orchestrate.runner import REPO

pytestmark = [pytest.mark.root, pytest.mark.slow]

SMALL = REPO / "topologies" / "small.yaml"
OPS = 3
SIZE_MB = 0.25


# Gloo's all-reduce (crew.runtime.gloo) runs beside the partial-reduce schemes.
SCHEMES = ["crew", "preduce", "ps", "gloo"]


def test_bench_small(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    schemes = SCHEMES
    rc = bench_cli.main(
        [
            "--topology",
            str(SMALL),
            "--schemes",
            ",".join(schemes),
            "--p",
            "2",
            "--size-mb",
            str(SIZE_MB),
            "--ops",
            str(OPS),
            "--out",
            str(out),
            "--timeout-per-op",
            "30",
            "--raw-tcp",
        ]
    )
    results = json.loads((out / "results.json").read_text())
    errors = {s: r["error"] for s, r in results.get("schemes", {}).items() if r["error"]}
    assert rc == 0, f"benchmark failed: {errors}"
    assert not [
        n for n in root_link_names() if n.startswith(ROOT_NAME_PREFIX + results["lab_tag"])
    ], "network left behind"

    assert results["topology"] == "small" and results["p"] == 2 and results["ops"] == OPS
    assert results["size_bytes"] == int(SIZE_MB * 1e6)
    assert results["trace"] == bench_ops.make_trace(3, 2, OPS, 0)
    assert list(results["schemes"]) == schemes
    for name, r in results["schemes"].items():
        assert r["correct"] and r["error"] is None, name
        assert len(r["op_times_s"]) == OPS and all(t > 0 for t in r["op_times_s"]), name
        assert len(r["bound_s"]) == OPS and all(b > 0 for b in r["bound_s"]), name
        assert r["median_s"] > 0 and r["p90_s"] >= r["median_s"], name
        assert r["median_over_bound"] > 0, name
        # Every op moves at least the vector once over some link.
        assert sum(r["link_bytes"].values()) >= OPS * results["size_bytes"], name
        if name != "gloo":
            assert all(e < 1e-3 for e in [r["max_verify_err"]]), name
            # The coordinator recorded each op's planning wait; every op after the first was
            # planned while the one before it ran (crew.runtime.planahead).
            assert len(r["plan_ms"]) == OPS and all(m is not None for m in r["plan_ms"]), name
            assert r["planned_ahead"] == OPS - 1, name
            # Measured bytes cover what the plans sent (headers only add).
            for link, planned in r["planned_link_bytes"].items():
                assert r["link_bytes"][link] >= planned, (name, link)
            # --raw-tcp moved one op's planned bytes over plain TCP on the same links.
            assert r["raw_s"] > 0 and r["raw_cpu_s_per_gb"] > 0, name
    assert (out / "plots.html").stat().st_size > 0
    for name in schemes:
        assert (out / name / "lab.db").exists()


def test_bench_rounds(tmp_path: Path) -> None:
    """``--rounds 2``: each scheme runs twice on one network, round 2 in the rotated order, into
    its own run folder; results.json keeps both rounds, their summary and the pooled ops."""
    out = tmp_path / "bench"
    schemes = ["crew", "ps"]
    args = ["--topology", str(SMALL), "--schemes", ",".join(schemes), "--p", "2"]
    args += ["--size-mb", str(SIZE_MB), "--ops", "2", "--rounds", "2", "--out", str(out)]
    rc = bench_cli.main([*args, "--timeout-per-op", "30"])
    results = json.loads((out / "results.json").read_text())
    errors = {s: r["error"] for s, r in results.get("schemes", {}).items() if r["error"]}
    assert rc == 0, f"benchmark failed: {errors}"
    assert results["round_count"] == 2
    assert [list(r) for r in results["rounds"]] == [schemes, schemes[::-1]]
    for name in schemes:
        for k in (1, 2):
            assert (out / f"round-{k}" / name / "lab.db").exists()
        pooled = results["schemes"][name]
        per_round = [r[name]["op_times_s"] for r in results["rounds"]]
        assert pooled["op_times_s"] == per_round[0] + per_round[1]
        assert pooled["correct"] and pooled["completed"] == 4
        summary = results["repeat"][name]
        assert summary["rounds"] == 2 and summary["correct"] == 2
        assert summary["per_round"]["median_s"] == [r[name]["median_s"] for r in results["rounds"]]
    # one scheme is the fastest in each round (both, on a tie)
    assert sum(results["repeat"][s]["fastest"] for s in schemes) >= 2
