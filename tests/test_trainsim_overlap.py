"""lab.studies.trainsim's overlapped rounds and its mean-model evaluation, on the MLP."""

from __future__ import annotations

import re

import pytest

from lab.studies import trainsim


def _one_round(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[float, float]:
    """(the workers' mean loss, the mean model's loss) after one every-step round of 2 in a
    group of 2."""
    argv = ["--n", "2", "--p", "2", "--steps", "1", "--eval-rounds", "1", "--eval-mean"]
    argv += ["--lr", "1.0", *extra]  # one large step: the workers' models differ visibly
    assert trainsim.main(argv) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("round"))
    loss = float(re.search(r" loss (\S+) acc", line).group(1))
    mean = float(re.search(r"mean-model loss (\S+)", line).group(1))
    return loss, mean


def test_a_blocking_round_leaves_both_workers_on_the_mean_model(capsys) -> None:
    loss, mean = _one_round(capsys)
    assert mean == pytest.approx(loss, abs=1e-4)  # both hold the average: it is their mean


def test_an_overlapped_round_is_applied_one_round_late(capsys) -> None:
    # The round's result has not arrived yet: each worker still holds its own step, and
    # their losses differ from their mean model's.
    loss, mean = _one_round(capsys, "--overlap")
    assert abs(mean - loss) > 1e-3


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--overlap-steps", "1"], "needs --overlap"),
        (["--overlap", "--local-steps", "2", "--overlap-steps", "3"], "1 to --local-steps"),
        (["--overlap", "--overlap-steps", "0"], "1 to --local-steps"),
    ],
)
def test_a_bad_arrival_step_is_refused(capsys, argv: list[str], fragment: str) -> None:
    with pytest.raises(SystemExit) as exc:
        trainsim.main(argv)
    assert exc.value.code == 2
    assert fragment in capsys.readouterr().err
