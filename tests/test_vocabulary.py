"""One vocabulary, read from the tree: the run database is written only through
``crew.runtime.rundb``'s typed methods (docs/architecture.md §2).

A module that writes SQL by hand fails here with its file and line. Tests are not scanned: they
build database states on purpose.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("crew", "lab", "dashboard")
DB_MODULE = REPO / "crew" / "runtime" / "rundb.py"

SQL_WRITE = re.compile(
    r"\b(INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|REPLACE\s+INTO)\b"
)


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((REPO / package).rglob("*.py"))


def string_constants(source: str) -> Iterator[tuple[int, str]]:
    """Every string literal with its line, the literal parts of f-strings included."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def sql_writes(source: str) -> list[tuple[int, str]]:
    return [(line, s) for line, s in string_constants(source) if SQL_WRITE.search(s)]


def test_no_sql_write_outside_the_run_database_module() -> None:
    bad = [
        f"{p.relative_to(REPO)}:{line}: {s.strip()[:60]!r}"
        for p in _sources()
        if p != DB_MODULE
        for line, s in sql_writes(p.read_text(encoding="utf-8"))
    ]
    assert not bad, "write through crew.runtime.rundb.RunDB instead:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ('db.execute("INSERT INTO groups (id) VALUES (?)", (1,))', True),
        ('c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)")', True),
        ('q = f"UPDATE commands SET status=? WHERE id={i}"', True),
        ('x = ("DELETE FROM group_members"\n     " WHERE group_id=?")', True),
        ('db.query("SELECT id FROM groups WHERE status=?")', False),
        ('"""Insert into the table, then update the row set."""', False),
    ],
)
def test_the_reader_sees_sql_writes(source: str, found: bool) -> None:
    assert bool(sql_writes(source)) is found
