"""The README's commands table lists exactly the lab's user commands, and every one runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _section(text: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README has no '## {heading}' section"
    return match.group(1)


def readme_commands(text: str) -> set[str]:
    """The ``python -m lab.X`` commands named in the first cell of the commands table's rows."""
    rows = [ln for ln in _section(text, "Commands").splitlines() if ln.startswith("| ")]
    firsts = [row.split("|")[1] for row in rows]
    return {m for cell in firsts for m in re.findall(r"python -m (lab\.[a-z_.]+)", cell)}


def user_commands() -> set[str]:
    """Every module at the top of lab/, and every package there with a ``__main__.py``
    (tests/test_layers.py checks each is a command)."""
    modules = {f"lab.{p.stem}" for p in (REPO / "lab").glob("*.py") if p.stem != "__init__"}
    return modules | {f"lab.{p.parent.name}" for p in (REPO / "lab").glob("*/__main__.py")}


def test_the_commands_table_lists_exactly_the_user_commands() -> None:
    listed = readme_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert listed == user_commands(), (
        f"missing from the table: {sorted(user_commands() - listed)}; "
        f"listed but not a user command: {sorted(listed - user_commands())}"
    )


def test_the_table_reader_sees_a_missing_and_an_extra_command() -> None:
    text = (
        "## Commands\n\n| command | what |\n|---|---|\n"
        "| `python -m lab.run` | the lab |\n| `python -m lab.studies.datapath` | a study |\n"
        "## Next\n| `python -m lab.bench` | outside the table |\n"
    )
    assert readme_commands(text) == {"lab.run", "lab.studies.datapath"}
