"""tracemalloc snapshots on demand: the setting is checked, and a growth is found by its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from crew.runtime import memprofile


def test_the_setting_is_a_directory_and_an_optional_period(tmp_path: Path) -> None:
    assert memprofile.parse(f"{tmp_path}") == memprofile.ProfileSpec(tmp_path, 300.0)
    assert memprofile.parse(f"{tmp_path},60").every_s == 60.0
    for bad in ("", ",60", f"{tmp_path},soon", f"{tmp_path},0", f"{tmp_path},-5"):
        with pytest.raises(memprofile.ProfileError, match="CREW_TRACEMALLOC"):
            memprofile.parse(bad)
    assert memprofile.from_env("w0", env={}) is None


def _grow(kept: list[bytearray]) -> None:
    kept.extend(bytearray(10_000) for _ in range(300))  # 3 MB held from this line


def test_a_growth_between_two_snapshots_names_the_line_that_holds_it(tmp_path: Path) -> None:
    profiler = memprofile.from_env("w3", env={memprofile.ENV: f"{tmp_path},3600"})
    assert profiler is not None
    kept: list[bytearray] = []
    try:
        first = profiler.dump()
        _grow(kept)
    finally:
        profiler.stop()
    last = profiler.dumped[-1]
    assert first.name == "w3-0.snap" and last.name == "w3-1.snap"
    report = memprofile.growth(first, last, top=3)
    total_mb = float(report[0].split()[1])
    assert total_mb >= 2.9, report[0]
    assert "kept.extend(bytearray(10_000)" in "\n".join(report[:12])
    assert memprofile.main([str(first), str(last), "--top", "1"]) == 0
