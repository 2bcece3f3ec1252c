"""The first-paint benchmark's bookkeeping (the browser part runs in tests/integration)."""

from __future__ import annotations

import pytest

from lab.studies.firstpaint import (
    DATA,
    PANELS,
    RunTimes,
    address_in,
    build_parser,
    main,
    median_or_none,
)
from lab.studies.firstpaint import milestones as table_of


def test_the_address_is_found_in_lab_runs_announcement() -> None:
    assert address_in("dashboard: http://127.0.0.1:8501\n") == "http://127.0.0.1:8501"
    assert address_in("  dashboard: http://0.0.0.0:9000 ") == "http://0.0.0.0:9000"
    assert address_in("dashboard           http://127.0.0.1:8501") is None  # the summary row
    assert address_in("the dashboard does not answer on http://127.0.0.1:8501 yet") is None


def _run(**seen: float) -> RunTimes:
    return RunTimes(run_dir="r", address_printed=2.0, page_loads=1, seen=dict(seen))


def test_all_panels_is_the_last_panel_and_needs_every_panel() -> None:
    full = _run(**{p: float(i) for i, p in enumerate(PANELS)}, traffic=99.0)
    assert full.all_panels == float(len(PANELS) - 1)  # data milestones do not count
    missing = _run(**{p: 1.0 for p in PANELS[1:]})
    assert missing.all_panels is None


def test_median_needs_every_run() -> None:
    assert median_or_none([3.0, 1.0, 2.0]) == 2.0
    assert median_or_none([1.0, None]) is None
    assert median_or_none([]) is None


def test_milestones_list_every_panel_and_datum_per_run() -> None:
    a = _run(**{p: 1.0 for p in PANELS}, traffic=5.0)
    b = _run(**{p: 2.0 for p in PANELS})
    t = table_of([a, b])
    assert list(t) == ["address printed", *PANELS, "all panels", *DATA]
    assert t["all panels"] == [1.0, 2.0]
    assert t["traffic"] == [5.0, None]
    assert t["first plan"] == [None, None]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runs", "0"], "--runs must be at least 1"),
        (["--timeout", "-1"], "--timeout must be positive"),
        (["--topology", "/nonexistent.yaml"], "--topology: no file /nonexistent.yaml"),
    ],
)
def test_bad_options_are_refused_by_name(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_help_explains_the_milestones() -> None:
    text = build_parser().format_help()
    for word in ("new user", "network map", "first plan", "--runs", "--screenshots"):
        assert word in text
