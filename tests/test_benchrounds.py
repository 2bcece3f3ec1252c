"""``lab.report.benchrounds`` (``lab.bench --rounds``): round orders, pooling and the summary.
Pure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.bench import cli as bench_cli
from lab.bench import ops as bench_ops
from lab.bench import report as bench_report
from lab.bench.spec import BenchError
from lab.orchestrate.runner import REPO
from lab.report.benchrounds import (
    op_stats,
    pool_results,
    pooled_rounds,
    round_orders,
    round_summary,
    run_folder,
)


def _result(times: list[float], **over: Any) -> dict[str, Any]:
    """A ``SchemeResult.to_dict()`` of ops taking ``times``, planned at 0.5 s, bound 0.25 s."""
    n = len(times)
    r = bench_ops.SchemeResult(
        op_times_s=tuple(times),
        bound_s=(0.25,) * n,
        predicted_s=(0.5,) * n,
        **op_stats(times, [0.25] * n, [0.5] * n),
        correct=True,
        completed=n,
        max_verify_err=1e-7,
        link_bytes={"0->1": 100 * n},
        planned_link_bytes={"0->1": 90 * n},
        startup_s=2.0,
        wall_s=5.0,
        worker_cpu_s=0.5 * n,
    ).to_dict()
    return r | over


@given(st.lists(st.text(min_size=1), min_size=1, max_size=6, unique=True))
def test_over_s_rounds_every_scheme_runs_once_at_every_position(schemes: list[str]) -> None:
    orders = round_orders(schemes, len(schemes))
    assert orders[0] == tuple(schemes)  # the first round is the order asked for
    for order in orders:
        assert sorted(order) == sorted(schemes)
    for pos in range(len(schemes)):
        assert sorted(o[pos] for o in orders) == sorted(schemes)


def test_round_orders_rotate_and_refuse_no_rounds() -> None:
    assert round_orders(["a", "b", "c"], 4) == [
        ("a", "b", "c"),
        ("b", "c", "a"),
        ("c", "a", "b"),
        ("a", "b", "c"),
    ]
    with pytest.raises(ValueError, match="rounds"):
        round_orders(["a"], 0)


def test_run_folders_keep_the_single_round_layout() -> None:
    out = Path("/x")
    assert run_folder(out, "crew", 1, 1) == out / "crew"
    assert run_folder(out, "crew", 2, 3) == out / "round-2" / "crew"


def test_op_stats_leave_out_ops_without_bound_or_plan() -> None:
    s = op_stats([1.0, 2.0, 4.0], [0.5, None, math.inf], [1.0, 2.0, None])
    assert s["median_s"] == 2.0
    assert s["median_over_bound"] == 2.0  # only the first op has a finite bound
    assert s["median_over_planned"] == 1.0 and s["planned_s"] == 1.5
    empty = op_stats([], [], [])
    assert all(v is None for v in empty.values())


def test_pool_concatenates_ops_and_sums_counts() -> None:
    a, b = _result([1.0, 1.0]), _result([3.0, 3.0, 3.0])
    pooled = pool_results([a, b])
    assert pooled["op_times_s"] == [1.0, 1.0, 3.0, 3.0, 3.0]
    assert pooled["median_s"] == 3.0 and pooled["completed"] == 5
    assert pooled["median_over_planned"] == 6.0 and pooled["median_over_bound"] == 12.0
    assert pooled["link_bytes"] == {"0->1": 500} and pooled["planned_link_bytes"] == {"0->1": 450}
    assert pooled["worker_cpu_s"] == 2.5
    assert pooled["cpu_s_per_gb"] == pytest.approx(2.5 / 450e-9)
    assert pooled["correct"] and pooled["error"] is None
    # Every field of one run is there, so the tables and figures read a pooled result as one.
    assert set(pooled) == set(a)


def test_pool_is_wrong_if_any_round_was_and_names_the_round() -> None:
    bad = _result([2.0], correct=False, error="timed out", worker_cpu_s=None)
    pooled = pool_results([_result([1.0]), bad])
    assert not pooled["correct"]
    assert pooled["error"] == "round 2: timed out"
    assert pooled["worker_cpu_s"] is None and pooled["cpu_s_per_gb"] is None
    with pytest.raises(ValueError):
        pool_results([])


def test_summary_spreads_and_fastest_rounds() -> None:
    rounds = [
        {"a": _result([1.0]), "b": _result([2.0])},
        {"b": _result([1.5]), "a": _result([3.0])},
        {"a": _result([2.0]), "b": _result([2.0])},  # a tie: both count
        {"a": _result([0.5], correct=False), "b": _result([4.0])},  # a wrong scheme never wins
    ]
    s = round_summary(rounds)
    assert list(s) == ["a", "b"]
    assert s["a"]["fastest"] == 2 and s["b"]["fastest"] == 3
    assert s["a"]["correct"] == 3 and s["a"]["rounds"] == 4
    assert s["a"]["per_round"]["median_s"] == [1.0, 3.0, 2.0, 0.5]
    assert s["a"]["median_s"] == {"median": 1.5, "min": 0.5, "max": 3.0}
    assert s["b"]["median_over_planned"]["max"] == 8.0


def test_record_rounds_keeps_one_round_as_before_and_pools_several() -> None:
    one: dict[str, Any] = {}
    r1 = {"crew": _result([1.0]), "ps": _result([2.0])}
    bench_cli.record_rounds(one, ["crew", "ps"], [r1], 1)
    assert one == {"schemes": r1}
    several: dict[str, Any] = {}
    r2 = {"ps": _result([2.5]), "crew": _result([1.5])}
    bench_cli.record_rounds(several, ["crew", "ps"], [r1, r2], 2)
    assert several["rounds"] == [r1, r2]
    assert list(several["schemes"]) == ["crew", "ps"]  # the order asked for, not round 2's
    assert several["schemes"]["crew"]["op_times_s"] == [1.0, 1.5]
    assert several["repeat"]["crew"]["fastest"] == 2
    table = bench_report.rounds_table(several["repeat"], "small", 2)
    assert table.row_count == 2


def test_rounds_option_names_the_round_folders(tmp_path: Path) -> None:
    small = str(REPO / "topologies" / "small.yaml")
    args = ["--topology", small, "--out", str(tmp_path), "--p", "2", "--schemes", "crew,ps"]
    spec = bench_cli.spec_from_args(bench_cli.build_parser().parse_args([*args, "--rounds", "2"]))
    assert spec.rounds == 2
    (tmp_path / "round-2" / "ps").mkdir(parents=True)
    with pytest.raises(BenchError, match="round-2/ps exists"):
        bench_cli.prepare_out(spec, overwrite=False)
    bench_cli.prepare_out(spec, overwrite=True)
    assert not (tmp_path / "round-2" / "ps").exists()


def test_pooled_rounds_counts_rounds_and_reads_old_files_as_one() -> None:
    assert pooled_rounds({"round_count": 3, "ops": 8}) == 3
    assert pooled_rounds({"ops": 8}) == 1  # written before --rounds
    assert pooled_rounds({"round_count": 0}) == 1
