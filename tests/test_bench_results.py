"""``results.json``'s type (lab.report.benchresults): what lab.bench writes has exactly its keys,
and the results files saved under docs/ still fit it."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from lab.bench import cli as bench_cli
from lab.bench.ops import SchemeResult
from lab.orchestrate.runner import REPO
from lab.report.benchresults import BenchResults, RoundsSummary, SchemeResults
from lab.report.benchrounds import round_summary

SAVED = sorted(
    p
    for where in (REPO / "docs", REPO / "tests" / "data" / "bench-results")
    for p in where.rglob("*results.json")
    if "schemes" in json.loads(p.read_text())
)


def _keys(td: Any) -> tuple[frozenset[str], frozenset[str]]:
    """(required, all) keys of a TypedDict."""
    return frozenset(td.__required_keys__), frozenset(td.__required_keys__ | td.__optional_keys__)


def _spec(tmp_path: Path, *extra: str) -> Any:
    small = str(REPO / "topologies" / "small.yaml")
    argv = ["--topology", small, "--out", str(tmp_path), "--p", "2", "--schemes", "crew,ps"]
    return bench_cli.spec_from_args(bench_cli.build_parser().parse_args([*argv, *extra]))


def test_a_scheme_result_has_exactly_the_typed_keys() -> None:
    assert {f.name for f in fields(SchemeResult)} == _keys(SchemeResults)[1]
    assert set(SchemeResult().to_dict()) == _keys(SchemeResults)[1]


def test_the_benchmark_writes_every_key_of_results_json(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "--rounds", "2")
    results = bench_cli.results_header(spec, [[0, 1]], "ab12", [], 1.0)
    one = SchemeResult(op_times_s=(0.5,), bound_s=(0.25,), predicted_s=(0.4,), correct=True)
    rounds = [{"crew": one.to_dict(), "ps": one.to_dict()} for _ in range(2)]
    bench_cli.record_rounds(results, spec.schemes, rounds, 2)
    assert set(results) == _keys(BenchResults)[1]
    assert set(results["repeat"]["crew"]) == _keys(RoundsSummary)[1]
    assert results["round_count"] == 2 and results["p"] == 2
    assert set(results["schemes"]["ps"]) == _keys(SchemeResults)[1]


def test_one_round_writes_no_rounds_and_no_summary(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    results = bench_cli.results_header(spec, [[0, 1]], "ab12", [], 1.0)
    bench_cli.record_rounds(results, spec.schemes, [{"crew": SchemeResult().to_dict()}], 1)
    assert set(results) == _keys(BenchResults)[0] | {
        "warmup",
        "round_count",
        "pace",
        "host_cpu_s_per_gb",
        "host_cores",
        "hop_backlog_bytes",
    }


def test_the_rounds_summary_has_exactly_the_typed_keys() -> None:
    r = SchemeResult(op_times_s=(1.0,), correct=True, median_s=1.0).to_dict()
    assert set(round_summary([{"crew": r}])["crew"]) == _keys(RoundsSummary)[1]


@pytest.mark.parametrize("path", SAVED, ids=lambda p: str(p.relative_to(REPO)))
def test_saved_results_files_fit_the_type(path: Path) -> None:
    data = json.loads(path.read_text())
    required, known = _keys(BenchResults)
    assert required <= set(data) <= known, (required - set(data), set(data) - known)
    s_required, s_known = _keys(SchemeResults)
    for name, r in data["schemes"].items():
        assert s_required <= set(r) <= s_known, (name, s_required - set(r), set(r) - s_known)


def test_the_saved_files_are_found() -> None:
    oldest = REPO / "tests" / "data" / "bench-results" / "2026-11-30-bench-hetero-results.json"
    assert len(SAVED) >= 7 and oldest in SAVED


def test_a_scheme_without_plans_is_measured_by_what_its_links_carried() -> None:
    planned = SchemeResult(planned_link_bytes={"0->1": 10}, link_bytes={"0->1": 12})
    gloo = SchemeResult(link_bytes={"0->1": 12, "1->0": 12})
    assert planned.moved_link_bytes == {"0->1": 10}
    assert gloo.moved_link_bytes == {"0->1": 12, "1->0": 12}
