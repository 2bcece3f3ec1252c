"""Modules small enough to hold in one's head: at most 800 lines each, and the life cycle's
class at most 30 methods. The one exception is named, with its reason, in
docs/architecture.md ("Modules over 800 lines")."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 800
MAX_LIFECYCLE_METHODS = 30
# Justified in docs/architecture.md: the transport's framing, flow control and connection
# handling share one socket loop's state.
OVER_THE_LIMIT = frozenset({"crew/wire/transport.py"})


def test_no_module_is_over_the_limit_but_the_justified_one() -> None:
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines())
        for package in ("crew", "lab", "dashboard")
        for p in (REPO / package).rglob("*.py")
    }
    over = {path: n for path, n in sizes.items() if n > MAX_LINES}
    assert set(over) <= OVER_THE_LIMIT, f"over {MAX_LINES} lines: {over}"
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert all(path in doc for path in OVER_THE_LIMIT), "an exception is not justified in the doc"


def test_the_group_life_cycle_has_at_most_thirty_methods() -> None:
    tree = ast.parse((REPO / "crew/control/lifecycle.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GroupLifecycle"]
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    assert len(methods) <= MAX_LIFECYCLE_METHODS, [m.name for m in methods]
