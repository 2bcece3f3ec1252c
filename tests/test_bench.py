"""lab.bench's pure parts: trace, scheme list, statistics, and results read from a hand-built
run database (no lab, no root)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from crew.control.verify import CHECK_TOLERANCE
from crew.plan import planner
from crew.plan.schemes import GROUP_SCHEMES
from crew.runtime.rundb import connect
from lab.bench import cli as bench_cli
from lab.bench import ops as bench_ops
from lab.bench import procs as bench_procs
from lab.bench import report as bench_report
from lab.bench import spec as bench_spec
from lab.bench import train as bench_train
from lab.bench.spec import BenchError
from lab.orchestrate.runner import REPO
from lab.report.benchrounds import percentile

N = 3
BW = np.array([[np.inf, 60.0, 20.0], [40.0, np.inf, 50.0], [30.0, 25.0, np.inf]])
SIZE = 1_000_000


def _plan(routes: list[list]) -> str:
    return json.dumps({"scheme": "preduce", "members": [0, 1], "routes": routes})


# One star route: block [0, 100) summed at worker 0; 1 sends up to 0, 0 sends the sum down to 1.
ROUTES = [[0, 100, 0, [[1, 0]], [[0, 1]]], [100, 250, 1, [[0, 1]], [[1, 0]]]]


def _db(
    tmp_path: Path,
    groups: list[dict],
    samples: list[tuple[float, int, int, int]] = (),
    iterations: list[tuple[float, int, float | None]] = (),
    meta: dict[str, str] | None = None,
) -> Path:
    path = tmp_path / "lab.db"
    conn = connect(path)
    with conn:
        for gid, g in enumerate(groups, 1):
            conn.execute(
                "INSERT INTO groups (id, scheme, members, weights, formed_at, started_at,"
                " ended_at, status, bound_s, predicted_s, verify_err, revisions, plan)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    gid,
                    g.get("scheme", "preduce"),
                    json.dumps(g.get("members", [0, 1])),
                    "[0.5, 0.5]",
                    g["start"],
                    g["start"],
                    g.get("end"),
                    g.get("status", "completed"),
                    g.get("bound"),
                    g.get("predicted"),
                    g.get("err"),
                    g.get("revisions", 0),
                    g.get("plan"),
                ),
            )
        conn.executemany(
            "INSERT INTO link_samples (t, src, dst, tx_bytes, mbit) VALUES (?,?,?,?,0)",
            samples,
        )
        conn.executemany(
            "INSERT INTO iterations (t, worker, iteration, accuracy) VALUES (?,?,0,?)",
            iterations,
        )
        conn.executemany("INSERT INTO meta (key, value) VALUES (?,?)", list((meta or {}).items()))
    conn.close()
    return path


def _good_groups() -> list[dict]:
    # times 1, 2, 3, 4 s; bounds 0.5, 0.5, 1, 1 -> ratios 2, 4, 3, 4
    return [
        dict(start=10.0, end=11.0, bound=0.5, predicted=0.9, err=1e-7, plan=_plan(ROUTES)),
        dict(start=11.0, end=13.0, bound=0.5, predicted=1.9, err=2e-7, plan=_plan(ROUTES)),
        dict(start=13.0, end=16.0, bound=1.0, predicted=2.9, err=0.0, revisions=1),
        dict(start=16.0, end=20.0, bound=1.0, predicted=3.9, err=1e-6),
    ]


# -- trace and options ------------------------------------------------------------------------


def test_trace_is_deterministic_and_valid() -> None:
    a = bench_ops.make_trace(8, 4, 50, seed=7)
    assert a == bench_ops.make_trace(8, 4, 50, seed=7)
    assert a != bench_ops.make_trace(8, 4, 50, seed=8)
    assert len(a) == 50
    for g in a:
        assert len(g) == 4 and len(set(g)) == 4
        assert g == sorted(g) and all(0 <= m < 8 for m in g)
    # Not the same group every time: the trace exercises different members.
    assert len({tuple(g) for g in a}) > 10


@pytest.mark.parametrize("p", [1, 9])
def test_trace_rejects_bad_group_size(p: int) -> None:
    with pytest.raises(BenchError) as info:
        bench_ops.make_trace(8, p, 5, seed=0)
    assert info.value.field == "--group-size"


def test_parse_schemes() -> None:
    every = bench_spec.parse_schemes("all")
    assert set(every) == set(GROUP_SCHEMES) | {"gloo"}
    assert bench_spec.parse_schemes(" ps, crew ,gloo") == ("ps", "crew", "gloo")
    for bad in ("crew,nope", "", "crew,crew"):
        with pytest.raises(BenchError) as info:
            bench_spec.parse_schemes(bad)
        assert info.value.field == "--schemes"


def test_encrypted_scheme_labels() -> None:
    assert bench_spec.parse_schemes("crew,crew+enc") == ("crew", "crew+enc")
    assert bench_spec.scheme_arm("crew+enc") == ("crew", True)
    assert bench_spec.scheme_arm("preduce") == ("preduce", False)
    for bad in ("gloo+enc", "nope+enc", "crew+enc,crew+enc"):
        with pytest.raises(BenchError, match="--schemes"):
            bench_spec.parse_schemes(bad)


def test_encrypted_label_runs_its_scheme_encrypted() -> None:
    small = str(REPO / "topologies" / "small.yaml")
    args = ["--topology", small, "--out", "/nonexistent/x", "--p", "2", "--schemes"]
    parser = bench_cli.build_parser()
    spec = bench_cli.spec_from_args(parser.parse_args([*args, "crew,crew+enc"]))
    trace = bench_ops.make_trace(3, 2, spec.ops, spec.seed)
    plain = bench_ops.ops_options(spec, "crew", trace, 0)
    enc = bench_ops.ops_options(spec, "crew+enc", trace, 0)
    assert (plain.scheme, plain.encrypt) == ("crew", False)
    assert (enc.scheme, enc.encrypt) == ("crew", True)
    assert enc.extra["ops"] == spec.ops
    with pytest.raises(BenchError, match="with --train use --encrypt"):
        bench_cli.spec_from_args(parser.parse_args([*args, "crew+enc", "--train"]))


def test_secret_label_runs_its_scheme_with_the_secret_check() -> None:
    assert bench_spec.parse_schemes("crew,crew+secret,crew+enc+secret") == (
        "crew",
        "crew+secret",
        "crew+enc+secret",
    )
    assert bench_spec.scheme_arm("crew+enc+secret") == ("crew", True)
    for bad in ("gloo+secret", "crew+secret+enc", "crew+secret,crew+secret"):
        with pytest.raises(BenchError, match="--schemes"):
            bench_spec.parse_schemes(bad)
    small = str(REPO / "topologies" / "small.yaml")
    args = ["--topology", small, "--out", "/nonexistent/x", "--p", "2", "--schemes"]
    parser = bench_cli.build_parser()
    spec = bench_cli.spec_from_args(parser.parse_args([*args, "crew,crew+secret"]))
    trace = bench_ops.make_trace(3, 2, spec.ops, spec.seed)
    plain = bench_ops.ops_options(spec, "crew", trace, 0)
    secret = bench_ops.ops_options(spec, "crew+secret", trace, 0)
    assert (plain.scheme, plain.check, plain.encrypt) == ("crew", "public", False)
    assert (secret.scheme, secret.check, secret.encrypt) == ("crew", "secret", False)
    with pytest.raises(BenchError, match="are for op benchmarks"):
        bench_cli.spec_from_args(parser.parse_args([*args, "crew+secret", "--train"]))


def test_options_are_validated() -> None:
    small = str(REPO / "topologies" / "small.yaml")
    parser = bench_cli.build_parser()
    base = ["--topology", small, "--out", "/nonexistent/x"]
    spec = bench_cli.spec_from_args(parser.parse_args([*base, "--size-mb", "0.25", "--p", "2"]))
    assert spec.size_bytes == 250_000 and spec.size_elems == 62_500 and spec.p == 2
    for extra, field in [
        (["--group-size", "4"], "--group-size"),
        (["--p", "1"], "--group-size"),
        (["--part-bytes", "6"], "--part-bytes"),
        (["--hop-backlog-bytes", "-1"], "--hop-backlog-bytes"),
        (["--local-steps", "4", "--sync", "every-step"], "--local-steps"),
        (["--size-mb", "0"], "--size-mb"),
        (["--ops", "0"], "--ops"),
        (["--timeout-per-op", "-1"], "--timeout-per-op"),
        (["--target-accuracy", "1.5"], "--target-accuracy"),
        (["--pace", "1.5"], "--pace"),
        (["--pace", "-0.1"], "--pace"),
        (["--rounds", "0"], "--rounds"),
    ]:
        with pytest.raises(BenchError) as info:
            bench_cli.spec_from_args(parser.parse_args([*base, "--p", "2", *extra]))
        assert info.value.field == field
    # --ops 0 is fine with --train: training only.
    assert (
        bench_cli.spec_from_args(
            parser.parse_args([*base, "--p", "2", "--ops", "0", "--train"])
        ).ops
        == 0
    )


def test_pace_option(monkeypatch: pytest.MonkeyPatch) -> None:
    small = str(REPO / "topologies" / "small.yaml")
    parser = bench_cli.build_parser()
    base = ["--topology", small, "--out", "/nonexistent/x", "--p", "2"]
    monkeypatch.delenv("CREW_PACE", raising=False)
    assert bench_cli.spec_from_args(parser.parse_args(base)).pace == bench_spec.BENCH_PACE
    assert bench_cli.spec_from_args(parser.parse_args([*base, "--pace", "0"])).pace == 0.0
    # The workers' own variable, when set, is the default; the flag still wins.
    monkeypatch.setenv("CREW_PACE", "0.9")
    assert bench_cli.spec_from_args(parser.parse_args(base)).pace == 0.9
    assert bench_cli.spec_from_args(parser.parse_args([*base, "--pace", "0.8"])).pace == 0.8


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([float(x) for x in range(11)], 90) == pytest.approx(9.0)


# -- results from a run database --------------------------------------------------------------


def test_op_results_of_a_correct_scheme(tmp_path: Path) -> None:
    db = _db(tmp_path, _good_groups())
    r = bench_ops.op_results(db, ops=4, gloo=False, bw=BW, size_bytes=SIZE)
    assert r.op_times_s == (1.0, 2.0, 3.0, 4.0)
    assert r.bound_s == (0.5, 0.5, 1.0, 1.0)
    assert r.predicted_s == (0.9, 1.9, 2.9, 3.9)
    assert r.median_s == 2.5
    assert r.p90_s == pytest.approx(3.7)
    assert r.median_over_bound == 3.5  # ratios 2, 4, 3, 4
    assert r.planned_s == pytest.approx(2.4)
    assert r.median_over_planned == pytest.approx((2 / 1.9 + 3 / 2.9) / 2)
    assert r.correct and r.error is None
    assert r.completed == 4 and r.abandoned == 0 and r.revisions == 1
    assert r.max_verify_err == 1e-6
    # Two plans carry each route's range once per tree edge, 4 bytes an element.
    assert r.planned_link_bytes == {"0->1": 2 * 4 * (100 + 150), "1->0": 2 * 4 * (150 + 100)}
    d = r.to_dict()
    json.dumps(d)  # serialisable as results.json needs
    assert d["op_times_s"] == (1.0, 2.0, 3.0, 4.0) and d["error"] is None


def test_op_results_leave_out_the_warmup_groups(tmp_path: Path) -> None:
    # --warmup W: the coordinator's first W groups (ids 1..W, all n workers) are not ops.
    warm = dict(start=5.0, end=9.0, bound=0.5, predicted=0.9, err=1e-7, members=[0, 1])
    db = _db(tmp_path, [warm, *_good_groups()])
    r = bench_ops.op_results(db, ops=4, gloo=False, bw=BW, size_bytes=SIZE, warmup=1)
    assert r.op_times_s == (1.0, 2.0, 3.0, 4.0) and r.correct
    assert not bench_ops.op_results(db, ops=4, gloo=False, bw=BW, size_bytes=SIZE).correct  # 5 ops
    parser = bench_cli.build_parser()
    small = str(REPO / "topologies" / "small.yaml")
    base = ["--topology", small, "--out", "/nonexistent/x", "--p", "2"]
    assert bench_cli.spec_from_args(parser.parse_args(base)).warmup == 0
    assert bench_cli.spec_from_args(parser.parse_args([*base, "--warmup", "1"])).warmup == 1
    with pytest.raises(bench_spec.BenchError, match="--warmup"):
        bench_cli.spec_from_args(parser.parse_args([*base, "--warmup", "-1"]))


@pytest.mark.parametrize(
    "change, why",
    [
        ({"err": 0.5}, "a wrong average"),
        ({"err": None}, "no check made"),
        ({"err": float("nan")}, "a NaN check"),
        ({"err": CHECK_TOLERANCE}, "an error at the tolerance"),
        ({"status": "abandoned", "err": None}, "an abandoned op"),
    ],
)
def test_op_results_detects_a_bad_op(tmp_path: Path, change: dict, why: str) -> None:
    groups = _good_groups()
    groups[2].update(change)
    r = bench_ops.op_results(_db(tmp_path, groups), ops=4, gloo=False, bw=BW, size_bytes=SIZE)
    assert not r.correct, why
    if change.get("status") == "abandoned":
        assert r.abandoned == 1 and r.completed == 3 and len(r.op_times_s) == 3


def test_op_results_missing_ops_are_not_correct(tmp_path: Path) -> None:
    r = bench_ops.op_results(
        _db(tmp_path, _good_groups()[:3]), ops=4, gloo=False, bw=BW, size_bytes=SIZE
    )
    assert not r.correct and r.completed == 3


def test_gloo_uses_the_all_worker_bound_and_needs_no_check(tmp_path: Path) -> None:
    groups = [
        dict(scheme="gloo", members=[0, 1, 2], start=10.0 + k, end=10.5 + k) for k in range(3)
    ]
    r = bench_ops.op_results(_db(tmp_path, groups), ops=3, gloo=True, bw=BW, size_bytes=SIZE)
    bound = planner.lower_bound(BW, [0, 1, 2], SIZE)
    assert r.correct
    assert r.bound_s == (bound,) * 3
    assert r.median_over_bound == pytest.approx(0.5 / bound)
    assert r.planned_link_bytes == {}
    r = bench_ops.op_results(
        _db(tmp_path / "b", groups[:2]), ops=3, gloo=True, bw=BW, size_bytes=SIZE
    )
    assert not r.correct


def test_link_bytes_bracket_the_ops(tmp_path: Path) -> None:
    # Ops run from 10.0 to 20.0. Samples of link 0->1 at 9, 9.8, 15, 20.3, 21; link 2->0 only
    # during the ops (no sample before: falls back to its first, none after: its last).
    samples = [
        (9.0, 0, 1, 100),
        (9.8, 0, 1, 150),
        (15.0, 0, 1, 600),
        (20.3, 0, 1, 1000),
        (21.0, 0, 1, 5000),
        (12.0, 2, 0, 10),
        (18.0, 2, 0, 70),
    ]
    db = _db(tmp_path, _good_groups(), samples=samples)
    r = bench_ops.op_results(db, ops=4, gloo=False, bw=BW, size_bytes=SIZE)
    assert r.link_bytes == {"0->1": 1000 - 150, "2->0": 70 - 10}


def test_timing_of_the_lab(tmp_path: Path) -> None:
    db = _db(tmp_path, _good_groups())
    r = bench_ops.op_results(
        db, ops=4, gloo=False, bw=BW, size_bytes=SIZE, entered_at=4.0, left_at=25.0
    )
    assert r.startup_s == 6.0 and r.wall_s == 21.0


def test_train_results(tmp_path: Path) -> None:
    iterations = [
        (100.0, 0, None),
        (101.0, 0, 0.9),
        (102.0, 1, 0.7),  # mean 0.8, and worker 2 has not reported yet
        (103.0, 2, 0.9),  # mean 0.8333
        (104.0, 1, 0.8),  # mean 0.8667 >= 0.85: 4 s after the first iteration
        (105.0, 2, 0.5),
    ]
    groups = [
        dict(members=[0, 1], start=101.0, end=102.0),
        dict(members=[1, 2], start=102.0, end=103.0),
        dict(members=[0, 2], start=103.0, end=104.0, status="abandoned"),
        dict(members=[0, 2], start=129.0, end=131.0),  # ended after the run's end: not counted
    ]
    db = _db(tmp_path, groups, iterations=iterations, meta={"ended_at": "130.0"})
    r = bench_train.train_results(db, n=3, target=0.85)
    assert r.time_to_target_s == 4.0
    assert r.training_s == 30.0
    assert r.rounds_per_worker == {"0": 1, "1": 2, "2": 1}
    assert r.rounds_per_worker_per_min == pytest.approx((4 / 3) / 0.5)
    assert r.final_accuracy == pytest.approx((0.9 + 0.8 + 0.5) / 3)
    assert (r.groups_completed, r.groups_abandoned) == (2, 1)
    assert bench_train.train_results(db, n=3, target=0.95).time_to_target_s is None
    assert bench_train.train_results(db, n=3, target=0.85, ended_at=160.0).training_s == 60.0
    assert (
        bench_train.train_results(db, n=3, target=0.85, ended_at=160.0).rounds_per_worker["0"] == 2
    )


def test_train_results_without_iterations(tmp_path: Path) -> None:
    r = bench_train.train_results(_db(tmp_path, []), n=3, target=0.85)
    assert r.error and r.rounds_per_worker_per_min is None


# -- reporting --------------------------------------------------------------------------------


def _results(tmp_path: Path) -> dict:
    samples = [(9.0, 0, 1, 0), (21.0, 0, 1, 2_000_000), (9.0, 1, 0, 0), (21.0, 1, 0, 500_000)]
    ok = bench_ops.op_results(
        _db(tmp_path, _good_groups(), samples=samples), ops=4, gloo=False, bw=BW, size_bytes=SIZE
    )
    failed = bench_ops.SchemeResult(error="worker 1 exited with code 1: boom")
    return {
        "topology": "small",
        "n": N,
        "p": 2,
        "size_bytes": SIZE,
        "ops": 4,
        "schemes": {"preduce": ok.to_dict(), "ps": failed.to_dict()},
    }


def test_figures(tmp_path: Path) -> None:
    figs = bench_report.build_figures(_results(tmp_path))
    times, links = figs["op-times"], figs["link-bytes"]
    boxes = [t for t in times.data if t.type == "box"]
    assert [b.name for b in boxes] == ["preduce"]  # a scheme without ops has no box
    assert list(boxes[0].y) == [1.0, 2.0, 3.0, 4.0]
    (heat,) = links.data
    per_op = np.array(heat.customdata, dtype=float)  # MB per op, shown on hover
    assert per_op[0, 1] == 0.5 and per_op[1, 0] == 0.125 and math.isnan(per_op[2, 0])
    z = np.array(heat.z, dtype=float)  # the colour: log10 of it
    assert z[0, 1] == pytest.approx(math.log10(0.5)) and math.isnan(z[2, 0])


def test_table_and_errors(tmp_path: Path) -> None:
    from rich.console import Console

    schemes = _results(tmp_path)["schemes"]
    console = Console(width=200, record=True)
    console.print(bench_report.results_table(schemes, "t", 4))
    text = console.export_text()
    assert "preduce" in text and "2.500" in text and "3.50" in text and "4/4" in text
    assert "meas/plan" in text and "2.400" in text and "1.04" in text
    assert bench_report.error_lines(schemes) == ["ps: worker 1 exited with code 1: boom"]


def test_html_is_written_when_png_export_fails(tmp_path: Path, monkeypatch) -> None:
    import plotly.basedatatypes

    def no_browser(*_a, **_k):
        raise RuntimeError("no browser here")

    monkeypatch.setattr(plotly.basedatatypes.BaseFigure, "write_image", no_browser)
    notes = bench_report.write_figures(bench_report.build_figures(_results(tmp_path)), tmp_path)
    html = (tmp_path / "plots.html").read_text()
    assert html.count("<div") >= 2 and "plotly" in html.lower()
    assert not list(tmp_path.glob("*.png"))
    assert any("no PNG" in n and "no browser here" in n for n in notes)


def test_process_cpu_s_counts_this_process_and_not_a_missing_one() -> None:
    before = bench_procs.process_cpu_s(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    after = bench_procs.process_cpu_s(os.getpid())
    assert before is not None and after is not None and after > before
    assert bench_procs.process_cpu_s(2**22 + 12345) is None  # above pid_max's default: no such pid


def test_planned_link_bytes_use_each_plans_wire_size() -> None:
    """An int8 plan (about 1.03 wire bytes an element) moves a quarter of a float32 plan's
    bytes over the same routes; a plan JSON without the field counts 4 bytes an element."""
    route = [0, 100, 0, [], [[0, 1]]]
    f32 = json.dumps({"routes": [route], "elem_bytes": 4.0})
    int8 = json.dumps({"routes": [route], "elem_bytes": 1.03125})
    old = json.dumps({"routes": [route]})
    assert bench_ops.planned_link_bytes([f32], 2) == {"0->1": 400}
    assert bench_ops.planned_link_bytes([old], 2) == {"0->1": 400}
    assert bench_ops.planned_link_bytes([int8, f32], 2) == {"0->1": 103 + 400}


def test_link_figure_of_pooled_rounds_is_per_op(tmp_path: Path) -> None:
    # Two rounds pooled (lab.report.benchrounds): bytes summed over 2 x 4 ops, so per op as one
    # round.
    one = _results(tmp_path)
    pooled = dict(one, round_count=2)
    r = dict(one["schemes"]["preduce"])
    r["link_bytes"] = {k: 2 * b for k, b in r["link_bytes"].items()}
    pooled["schemes"] = {"preduce": r}
    (heat,) = bench_report.build_figures(pooled)["link-bytes"].data
    per_op = np.array(heat.customdata, dtype=float)
    assert per_op[0, 1] == 0.5 and per_op[1, 0] == 0.125


def test_group_sizes_multiply_the_training_runs_and_quorum_gives_no_p() -> None:
    from lab.bench.spec import BenchError, TrainRun, expand_group_sizes

    runs = (TrainRun("crew", "crew", {"sync": "every-step"}),)
    assert expand_group_sizes(runs, None, 8) == runs
    out = expand_group_sizes(runs, "2,5,quorum", 8)
    assert [(r.name, r.p) for r in out] == [("crew-p2", 2), ("crew-p5", 5), ("crew-quorum", 2)]
    assert out[2].training == {"sync": "every-step", "quorum_min": 2, "quorum_max": 8}
    assert "quorum_min" not in out[0].training
    for bad, why in (("9", "between 1 and 8"), ("big", "neither"), ("3,3", "twice"), (",", "give")):
        with pytest.raises(BenchError, match=why):
            expand_group_sizes(runs, bad, 8)


def test_the_bytes_ratio_compares_runs_of_the_same_group_size() -> None:
    from lab.bench.report import _fp32_twin

    def cfg(p: int, compress: str) -> dict:
        config = {"scheme": "crew", "sync": "every-step", "local_steps": 1, "overlap": False}
        return {"config": config | {"p": p, "compress": compress}}

    results = {"crew-p3": cfg(3, "none"), "crew-p2": cfg(2, "none"), "crew-p2-int8": cfg(2, "int8")}
    assert _fp32_twin("crew-p2-int8", results["crew-p2-int8"], results) == "crew-p2"
    assert _fp32_twin("crew-p3", results["crew-p3"], results) is None
