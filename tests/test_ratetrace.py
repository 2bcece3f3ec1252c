"""Rate traces: the CSV parser's errors name file, line and problem; the generator keeps the
statistics it states."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from crew.ratetrace import (
    DriftParams,
    RateTrace,
    TraceError,
    format_trace,
    generate,
    load_trace,
    parse_trace,
    write_trace,
)


def test_a_trace_file_reads_with_header_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "a-b.csv"
    path.write_text("# measured a->b\nt,mbit\n0,100\n\n2.5, 80\n10,120.5\n")
    trace = load_trace(path)
    assert trace.times == (0.0, 2.5, 10.0) and trace.mbit == (100.0, 80.0, 120.5)
    assert trace.source == str(path) and not trace.generated
    assert [trace.rate_at(t) for t in (-1, 0, 2.4, 2.5, 9.9, 10, 1e6)] == [
        100.0,
        100.0,
        100.0,
        80.0,
        80.0,
        120.5,
        120.5,
    ]


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("t,mbit\n0,100\n5,90\n5,80\n", 4, "not after the previous"),
        ("t,mbit\n0,100\n5,90\n3,80\n", 4, "not after the previous"),
        ("0,100\n1,-5\n", 2, "must be > 0"),
        ("0,100\n1,0\n", 2, "must be > 0"),
        ("0,100\n1,nan\n", 2, "not finite"),
        ("0,100\n1,inf\n", 2, "not finite"),
        ("t,mbit\n0,100\n7\n", 3, "expected 2 columns"),
        ("0,100,3\n", 1, "expected 2 columns"),
        ("0,fast\n", 1, "rate 'fast' is not a number"),
        ("-1,100\n", 1, "must be finite and >= 0"),
        ("x,mbit\n", 1, "time 'x' is not a number"),
    ],
)
def test_bad_lines_are_named_with_their_problem(
    tmp_path: Path, text: str, line: int, problem: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert f"{path}, line {line}: " in str(err.value)
    assert problem in str(err.value)


@pytest.mark.parametrize("text", ["", "t,mbit\n", "# only a comment\n\n"])
def test_an_empty_trace_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=rf"{path}: no samples"):
        load_trace(path)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="nope.csv: cannot read"):
        load_trace(tmp_path / "nope.csv")


def test_a_generated_trace_says_so_and_round_trips(tmp_path: Path) -> None:
    params = DriftParams(200.0, duration_s=60, seed=3)
    trace = generate(params, (1, 2))
    assert trace.generated and "Ornstein-Uhlenbeck" in trace.source and "(1, 2)" in trace.source
    assert len(trace.times) == 61 and trace.times[1] - trace.times[0] == 1.0
    path = tmp_path / "gen.csv"
    write_trace(trace, path)
    assert path.read_text().startswith("# generated: ")
    back = load_trace(path)
    assert back.generated
    np.testing.assert_allclose(back.mbit, trace.mbit, rtol=1e-5)
    assert parse_trace(format_trace(back)).generated


def test_streams_are_independent_and_seeds_reproducible() -> None:
    params = DriftParams(100.0, duration_s=2000, seed=9)
    a, b = generate(params, (0, 1)), generate(params, (1, 0))
    assert a.mbit == generate(params, (0, 1)).mbit
    assert abs(np.corrcoef(np.log(a.mbit), np.log(b.mbit))[0, 1]) < 0.25


@pytest.mark.parametrize(("spread", "tau"), [(0.3, 30.0), (0.1, 5.0)])
def test_the_generator_keeps_its_stated_statistics(spread: float, tau: float) -> None:
    params = DriftParams(150.0, spread=spread, tau_s=tau, duration_s=200_000, seed=1)
    rate = np.asarray(generate(params).mbit)
    x = np.log(rate)
    assert rate.mean() == pytest.approx(150.0, rel=0.03)
    assert x.std() == pytest.approx(spread, rel=0.05)
    lag = round(tau)  # autocorrelation e^-1 at one time constant
    rho = np.corrcoef(x[:-lag], x[lag:])[0, 1]
    assert -lag / math.log(rho) == pytest.approx(tau, rel=0.1)


def test_bad_generator_parameters_are_named() -> None:
    with pytest.raises(TraceError, match="tau_s"):
        DriftParams(100.0, tau_s=0)
    with pytest.raises(TraceError, match="spread"):
        DriftParams(100.0, spread=-0.1)
    with pytest.raises(TraceError, match="mean_mbit"):
        DriftParams(float("inf"))
    with pytest.raises(TraceError, match="sample 1"):
        RateTrace((0.0, 0.0), (1.0, 1.0), "here")
