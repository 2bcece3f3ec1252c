"""docs/results.md's generated tables are what ``python -m lab.studies.results`` makes from the
committed result files, and the generator reads those files (a changed figure changes the
table)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lab.studies import results

REPO = Path(__file__).resolve().parents[1]


def _copy_inputs(tmp: Path) -> Path:
    """A repository root under ``tmp`` holding only what the generator reads."""
    for sub in ("docs/bench", "docs/sim"):
        shutil.copytree(REPO / sub, tmp / sub)
    return tmp


def test_the_committed_tables_match_the_committed_files() -> None:
    text = (REPO / results.RESULTS_MD).read_text(encoding="utf-8")
    assert results.render(text) == text, "run: python -m lab.studies.results --write"


def test_every_table_is_in_the_document() -> None:
    text = (REPO / results.RESULTS_MD).read_text(encoding="utf-8")
    for name in results.TABLES:
        assert f"<!-- generated: {name} -->" in text


def test_the_check_mode_passes_on_the_committed_document() -> None:
    assert results.main(["--check"]) == 0


def test_a_changed_figure_changes_its_table(tmp_path: Path) -> None:
    root = _copy_inputs(tmp_path)
    path = root / "docs/bench/clouds-4x2-results.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    before = results.clouds_4x2(root)
    data["schemes"]["crew"]["median_s"] = 9.876
    path.write_text(json.dumps(data), encoding="utf-8")
    after = results.clouds_4x2(root)
    assert "9.876 s" in after and "9.876 s" not in before
    # the slowest scheme now: crew's row moves from first to last
    assert after.strip().splitlines()[-1].startswith("| crew |")


def test_the_paper_table_merges_its_files_in_order(tmp_path: Path) -> None:
    table = results.sim_paper(_copy_inputs(tmp_path))
    keys = [tuple(int(c) for c in row.split("|")[1:4]) for row in table.splitlines()[2:]]
    assert keys == sorted(keys) and len(keys) == len(set(keys))
    assert len(keys) == sum(
        len(json.loads((REPO / rel).read_text())["rows"]) for rel in results.SIM_TABLES
    )


def test_render_replaces_only_the_blocks() -> None:
    text = "intro\n<!-- generated: sim-scale -->\nstale\n<!-- end generated -->\noutro\n"
    out = results.render(text)
    assert out.startswith("intro\n<!-- generated: sim-scale -->\n| n |")
    assert out.endswith("<!-- end generated -->\noutro\n")
    assert "stale" not in out


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("<!-- generated: nosuch -->\n<!-- end generated -->\n", "'nosuch'"),
        ("<!-- generated: sim-scale -->\nno end\n", "'sim-scale'"),
        (
            "<!-- generated: sim-scale -->\n<!-- generated: sim-paper -->\n"
            "<!-- end generated -->\n",
            "'sim-scale'",
        ),
    ],
)
def test_a_bad_block_is_an_error_naming_it(text: str, named: str) -> None:
    with pytest.raises(results.ResultsError, match=named):
        results.render(text)
