"""lab.check's re-measurement policy: a transient shortfall is measured again, a lasting one
still fails, and nothing is measured more often than --retries allows."""

from __future__ import annotations

import pytest

from lab.check import LinkResult, any_out, build_parser, main, retried
from lab.net.probe import Row


def _results(*statuses: str):
    """A measure() that returns these statuses in turn, and the list of calls it got."""
    calls: list[int] = []

    def measure() -> str:
        calls.append(1)
        return statuses[len(calls) - 1]

    return measure, calls


def test_a_pass_is_measured_once() -> None:
    measure, calls = _results("ok")
    assert retried(measure, lambda s: s != "ok", 3) == ("ok", 1)
    assert len(calls) == 1


def test_a_transient_shortfall_passes_on_the_next_measurement() -> None:
    measure, calls = _results("LOW", "ok", "LOW")
    assert retried(measure, lambda s: s != "ok", 3) == ("ok", 2)
    assert len(calls) == 2


@pytest.mark.parametrize("retries", [0, 1, 2])
def test_a_lasting_shortfall_fails_after_retries_more_measurements(retries: int) -> None:
    measure, calls = _results(*["LOW"] * 5)
    assert retried(measure, lambda s: s != "ok", retries) == ("LOW", retries + 1)
    assert len(calls) == retries + 1


@pytest.mark.parametrize(
    ("status", "retry"),
    [("LOW", True), ("ERROR", True), ("WRONG PATH", False), ("ok", False)],
)
def test_only_shortfalls_are_retried_a_wrong_path_is_a_routing_fact(
    status: str, retry: bool
) -> None:
    r = LinkResult(0, 1, 20.0, 19.1, 5.0, 1, 1, status)
    assert r.retryable is retry
    assert r.attempts == 1


def test_retries_default_to_one_and_negative_is_refused(capsys) -> None:
    assert build_parser().parse_args([]).retries == 1
    assert main(["--retries", "-1"]) == 2
    assert "--retries >= 0" in capsys.readouterr().err


def test_a_pair_is_measured_again_when_any_of_its_figures_is_out() -> None:
    inside = Row("built", "w0<->w1", "RTT median", 25.0, 25.4, 21.0, 29.0, "ms", 500)
    outside = Row("built", "w0<->w1", "RTT p90", 25.0, 31.9, 21.0, 29.0, "ms", 500)
    assert not any_out([inside])
    assert any_out([inside, outside])
    batches = iter([[inside, outside], [inside, inside]])
    rows, attempts = retried(lambda: next(batches), any_out, 1)
    assert (rows, attempts) == ([inside, inside], 2)
