"""Markdown tables, as the docs and the studies print them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table: ``header``, the separator line, one line per row (no trailing
    newline)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
