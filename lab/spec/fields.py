"""Reading YAML documents field by field, with errors that name the field.

Shared by the topology and scenario loaders: a YAML loader that refuses duplicate keys, typed
readers that raise the caller's own error type (``TopologyError``, ``ScenarioError``), and
``FieldError``, the base of those types, carrying the file, the dotted field and the problem.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml


class FieldError(ValueError):
    """A document is invalid at ``field``: a dotted path into it, or ``(document)`` for
    problems with the file as a whole. Each loader subclasses it to name its kind of document."""

    def __init__(self, path: str | Path | None, field: str, message: str) -> None:
        self.path = Path(path) if path is not None else None
        self.field = field
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = str(self.path) if self.path is not None else "<data>"
        return f"{where}: {self.field}: {self.message}"


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML would silently keep the last one)."""


def _mapping_no_duplicates(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        out[key] = loader.construct_object(value_node, deep=True)
    return out


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_no_duplicates)


def read_yaml(
    path: Path, error: Callable[[Path | None, str, str], Exception], field: str
) -> object:
    """The one YAML document in ``path``; ``error(path, field, message)`` names what is wrong
    (unreadable, syntax with line and column, duplicate key, empty)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise error(path, field, f"cannot read file: {e}") from None
    try:
        data = yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = e.problem or e.context or "invalid YAML"
        # Duplicate keys are valid syntax but rejected by our loader's constructor.
        kind = "error" if isinstance(e, yaml.constructor.ConstructorError) else "syntax error"
        raise error(path, field, f"YAML {kind} at {at}{problem}") from None
    except yaml.YAMLError as e:
        raise error(path, field, f"YAML error: {e}") from None
    if data is None:
        raise error(path, field, "file is empty (no YAML document)")
    return data


def describe(value: object) -> str:
    """A short, quoted rendering of a bad value for an error message."""
    if value is None:
        return "null"
    return f"{type(value).__name__} {value!r}"[:80]


def suggest(key: str, allowed: Sequence[str], aliases: Mapping[str, str] | None = None) -> str:
    """ "; did you mean 'x'?" for a misspelt key, or ""."""
    alias = (aliases or {}).get(key.lower())
    if alias in allowed:
        return f"; did you mean {alias!r}?"
    near = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


class FieldReader:
    """Typed field readers; ``error(source, field, message)`` builds the exception raised."""

    def __init__(self, source: Path | None, error: Callable[[Path | None, str, str], Exception]):
        self.source = source
        self._error = error

    def fail(self, field: str, message: str) -> Exception:
        return self._error(self.source, field, message)

    def number(self, value: object, field: str, lo: float, hi: float, *, lo_open: bool) -> float:
        """A finite int/float in [lo, hi] (or (lo, hi] when lo_open); bools are not numbers."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(field, f"must be a number, got {describe(value)}")
        x = float(value)
        if not math.isfinite(x):
            raise self.fail(field, f"must be finite, got {value}")
        if x < lo or (lo_open and x == lo) or x > hi:
            low = f"> {lo:g}" if lo_open else f">= {lo:g}"
            raise self.fail(field, f"{value} is out of range (must be {low} and <= {hi:g})")
        return x

    def integer(self, value: object, field: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(field, f"must be an integer, got {describe(value)}")
        if not lo <= value <= hi:
            raise self.fail(field, f"{value} is out of range (must be {lo}..{hi})")
        return value

    def boolean(self, value: object, field: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(field, f"must be true or false, got {describe(value)}")
        return value
