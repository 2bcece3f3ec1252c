"""The README's quick test command: the fenced code block right after the line
``<!-- quick-tests -->``, so the check runs what the README tells a newcomer to run."""

from __future__ import annotations

import re
from pathlib import Path

MARKER = "<!-- quick-tests -->"
# When the README has no marked block: the suite without the tests marked slow.
FALLBACK_COMMAND = 'python -m pytest -q -m "not slow"'
_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)\s*$")


class ReadmeError(ValueError):
    """The README's marked block is malformed (the message says how)."""


def quick_test_command(text: str) -> str | None:
    """The command in the block after the marker, or None when the README has no marker.

    The block's lines are returned as they stand (a shell runs them, so ``\\`` continuations and
    several commands work); a leading ``$ `` prompt is removed from each command line."""
    lines = text.splitlines()
    marks = [k for k, s in enumerate(lines) if s.strip() == MARKER]
    if not marks:
        return None
    if len(marks) > 1:
        raise ReadmeError(f"README has {len(marks)} {MARKER} lines (lines {marks}); keep one")
    k = marks[0] + 1
    while k < len(lines) and not lines[k].strip():
        k += 1
    fence = _FENCE.match(lines[k]) if k < len(lines) else None
    if fence is None:
        raise ReadmeError(
            f"README line {marks[0] + 1}: {MARKER} must be followed by a fenced code block "
            "(``` ... ```) holding the command"
        )
    opener = fence.group(1)
    body: list[str] = []
    for s in lines[k + 1 :]:
        if s.strip().startswith(opener[0] * len(opener)) and not s.strip().strip(opener[0]):
            break
        body.append(s[2:] if s.startswith("$ ") else s)
    else:
        raise ReadmeError(f"README line {k + 1}: the code block after {MARKER} is not closed")
    command = "\n".join(body).strip()
    if not command:
        raise ReadmeError(f"README line {k + 1}: the code block after {MARKER} is empty")
    return command


def load_quick_test_command(readme: Path) -> tuple[str, bool]:
    """(command, from the README?): the marked command, or the fallback when there is none."""
    try:
        text = readme.read_text()
    except OSError as e:
        raise ReadmeError(f"cannot read {readme}: {e}") from e
    command = quick_test_command(text)
    return (command, True) if command is not None else (FALLBACK_COMMAND, False)
