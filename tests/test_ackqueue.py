"""lab.studies.ackqueue's inputs: the pair it shapes and the arguments it refuses (no root)."""

from __future__ import annotations

import pytest

from lab.studies.ackqueue import main, pair_topology


def test_the_pair_is_shaped_at_the_two_rates_given() -> None:
    topo = pair_topology(8.0, 1.0)
    assert topo.n == 2
    assert topo.link(0, 1).rate_mbit == 8.0 and topo.link(1, 0).rate_mbit == 1.0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--runs", "0"], "--runs must be 1 to 100, got 0"),
        (["--forward-mbit", "-8"], "--forward-mbit must be a positive number"),
        (["--reverse-mb", "nan"], "--reverse-mb must be a positive number"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)  # the checks come before any network is built
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    assert says in capsys.readouterr().err
