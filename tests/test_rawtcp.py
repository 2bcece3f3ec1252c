"""The raw TCP reference: the mover on loopback, one op's bytes, and the table's ratios."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from lab.bench.rawtcp import per_op_link_bytes
from lab.bench.report import results_table


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mover(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lab.net.rawmove", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_movers_carry_every_byte_and_report_cpu_after_the_start():
    a, b = free_port(), free_port()
    start = f"{time.time() + 1.5:.6f}"
    nbytes = {"a->b": 24 << 20, "b->a": 3 << 20}
    procs = [
        mover("--listen", f"127.0.0.1:{a}", "--expect", "1", "--start-at", start,
              "--send", f"127.0.0.1:{b}={nbytes['a->b']}", "--timeout", "30"),
        mover("--listen", f"127.0.0.1:{b}", "--expect", "1", "--start-at", start,
              "--send", f"127.0.0.1:{a}={nbytes['b->a']}", "--timeout", "30"),
    ]  # fmt: skip
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=60)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout))
    assert out[0]["sent"] == out[1]["received"] == nbytes["a->b"]
    assert out[1]["sent"] == out[0]["received"] == nbytes["b->a"]
    for o in out:
        assert o["recv_end"] >= float(start) and o["send_end"] >= float(start)
        assert 0 < o["cpu_s"] < 30 and o["errors"] == []


def test_a_mover_without_its_peer_fails_within_its_timeout():
    start = f"{time.time():.6f}"
    p = mover("--start-at", start, "--send", f"127.0.0.1:{free_port()}=10", "--timeout", "2")
    _, stderr = p.communicate(timeout=30)
    assert p.returncode != 0 and "refused" in stderr


@pytest.mark.parametrize("bad", ["127.0.0.1:1", "127.0.0.1:1=-5", "127.0.0.1:1=x"])
def test_bad_send_arguments_are_named(bad):
    p = mover("--start-at", "0", "--send", bad)
    _, stderr = p.communicate(timeout=30)
    assert p.returncode == 2 and "--send" in stderr


def test_one_ops_bytes_are_the_plans_total_over_the_ops():
    planned = {"0->1": 3000, "1->2": 10, "2->0": 4}
    assert per_op_link_bytes(planned, 5) == {(0, 1): 600, (1, 2): 2}  # 4 / 5 rounds to 0


def test_the_table_divides_by_the_raw_reference():
    row = {
        "median_s": 0.5,
        "p90_s": 0.6,
        "median_over_bound": 1.2,
        "correct": True,
        "completed": 4,
        "cpu_s_per_gb": 6.0,
        "raw_s": 0.25,
        "raw_cpu_s_per_gb": 2.0,
    }
    table = results_table({"crew": row, "ps": row | {"raw_s": None}}, "t", 4)  # type: ignore[dict-item]
    cols = {c.header: list(c.cells) for c in table.columns}
    assert cols["÷ raw"] == ["2.00", "-"]
    assert cols["CPU ÷ raw"] == ["3.00", "3.00"]
