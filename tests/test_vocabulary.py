"""One vocabulary, read from the tree (docs/architecture.md §2): the run database is written
only through ``crew.runtime.rundb``'s typed methods, and group, command and worker statuses are
written as their enums.

A module that breaks either fails here with its file and line. Tests are not scanned: they
build database states on purpose.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

from crew.config import RunConfig, Scheme

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("crew", "lab", "dashboard")
# The run database layer: its writer, and the retention that folds its old rows in place.
DB_MODULES = (REPO / "crew" / "runtime" / "rundb.py", REPO / "crew" / "runtime" / "retention.py")

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
        if p not in DB_MODULES
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


# -- status words ------------------------------------------------------------------------------
# Group, command and worker statuses are written as their enums (GroupStatus, CommandStatus,
# WorkerState); their words appear as literals only in those enums' bodies.
STATUS_WORDS = frozenset(
    {"open", "completed", "abandoned", "pending", "applied", "rejected"}
    | {"absent", "training", "ready", "reducing", "dead"}
)
QUOTED_STATUS = re.compile("'({})'".format("|".join(sorted(STATUS_WORDS))))
# The same words meaning something else: (file, word) -> what it is there.
NOT_A_STATUS = {
    ("crew/runtime/coordinator.py", "rejected"): "the socket shell's event kind for a bad frame",
    ("crew/runtime/coordinator.py", "abandoned"): "a key of a recovery event's data",
    ("crew/runtime/node.py", "dead"): "a link probe's verdict in a log line",
    ("crew/wire/protocol.py", "ready"): "a wire message's type name",
    ("crew/wire/protocol.py", "rejected"): "a wire message's type name",
    ("lab/bench/train.py", "training"): "a progress label",
    ("lab/bench/report.py", "training"): "a table title",
    (
        "lab/report/benchrounds.py",
        "completed",
    ): "a count of ops in results.json (SchemeResult field)",
    (
        "lab/orchestrate/poison_phase.py",
        "completed",
    ): "a row label and a count of the poison phase's report (PoisonReport field)",
    (
        "lab/report/benchrounds.py",
        "abandoned",
    ): "a count of ops in results.json (SchemeResult field)",
    ("lab/studies/firstpaint.py", "training"): "a dashboard section's name",
}


def _enum_bodies(tree: ast.AST) -> set[int]:
    """ids of the nodes assigned in an Enum class's body (the vocabularies themselves)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(
            (isinstance(b, ast.Name) and b.id.endswith("Enum"))
            or (isinstance(b, ast.Attribute) and b.attr.endswith("Enum"))
            for b in node.bases
        ):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign):
                    inside |= {id(n) for n in ast.walk(stmt.value)}
    return inside


def status_literals(source: str) -> list[tuple[int, str]]:
    """Status words written as literals: a bare string, or quoted inside SQL. A subscript key
    (``row["completed"]``, a column alias) names a field, not a status."""
    tree = ast.parse(source)
    skip = _enum_bodies(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            skip |= {id(n) for n in ast.walk(node.slice)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.Constant):
            continue
        if not isinstance(node.value, str):
            continue
        if node.value in STATUS_WORDS:
            found.append((node.lineno, node.value))
        found += [(node.lineno, m) for m in QUOTED_STATUS.findall(node.value)]
    return found


def test_no_status_literal_outside_its_enum() -> None:
    bad = [
        f"{p.relative_to(REPO)}:{line}: {word!r}"
        for p in _sources()
        for line, word in status_literals(p.read_text(encoding="utf-8"))
        if (str(p.relative_to(REPO)), word) not in NOT_A_STATUS
    ]
    assert not bad, "use GroupStatus, CommandStatus or WorkerState:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ('done = [g for g in groups if g["status"] == "completed"]', ["completed"]),
        ("conn.execute(\"SELECT id FROM groups WHERE status='open'\")", ["open"]),
        ('db.set_worker_status(w, "dead")', ["dead"]),
        ('n = row["completed"]', []),
        ('class GroupStatus(enum.StrEnum):\n    OPEN = "open"', []),
        ('db.settle_command(i, CommandStatus.APPLIED, "done")', []),
    ],
)
def test_the_reader_sees_status_literals(source: str, found: list[str]) -> None:
    assert [w for _, w in status_literals(source)] == found


# -- schemes -----------------------------------------------------------------------------------
# One Scheme enum (crew.config.Scheme): no other enum, and no tuple, list or set of scheme names
# written as strings, names the schemes again.
SCHEME_NAMES = frozenset(
    {"crew", "crew-star", "crew-relay", "crew-paper", "preduce", "ps", "ring", "a2a"}
    | {"blink", "blink-pipe", "topoadopt", "gloo"}
)
SCHEME_MODULE = REPO / "crew" / "config.py"


def scheme_vocabularies(source: str) -> list[tuple[int, str]]:
    """Enums and collection literals that list two or more scheme names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            values = [
                n.value
                for stmt in node.body
                if isinstance(stmt, ast.Assign)
                for n in ast.walk(stmt.value)
                if isinstance(n, ast.Constant)
            ]
            if len(SCHEME_NAMES.intersection(values)) >= 2:
                found.append((node.lineno, f"class {node.name}"))
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if len(SCHEME_NAMES.intersection(names)) >= 2:
                found.append((node.lineno, repr(names)))
    return found


def test_one_scheme_vocabulary() -> None:
    bad = [
        f"{p.relative_to(REPO)}:{line}: {what}"
        for p in _sources()
        for line, what in scheme_vocabularies(p.read_text(encoding="utf-8"))
        if not (p == SCHEME_MODULE and what == "class Scheme")
    ]
    assert not bad, "name schemes through crew.config.Scheme:\n" + "\n".join(bad)


def test_the_one_scheme_vocabulary_is_the_cli_and_database_one() -> None:
    from crew.plan.schemes import ALL_SCHEMES, GROUP_SCHEMES

    assert {s.value for s in Scheme} == SCHEME_NAMES
    assert set(ALL_SCHEMES) == set(Scheme) and Scheme.GLOO not in GROUP_SCHEMES
    assert all(isinstance(s, Scheme) for s in GROUP_SCHEMES)
    assert Scheme("crew-star") is Scheme.CREW_STAR and Scheme.CREW_STAR == "crew-star"


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ('STAR = ("crew", "crew-paper", "preduce")', 1),
        ('class S(enum.StrEnum):\n    PS = "ps"\n    RING = "ring"', 1),
        ('parser.add_argument("--schemes", default=["crew", "ring"])', 1),
        ("STAR = (Scheme.CREW, Scheme.CREW_PAPER)", 0),
        ('x = ("crew", "lab")', 0),
    ],
)
def test_the_reader_sees_scheme_vocabularies(source: str, found: int) -> None:
    assert len(scheme_vocabularies(source)) == found


# -- run defaults ------------------------------------------------------------------------------


def test_the_cli_defaults_are_the_run_options_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from lab.orchestrate.runner import RunOptions
    from lab.run import build_parser, options_from_args

    monkeypatch.delenv("CREW_LAB_DASHBOARD_HOST", raising=False)
    assert options_from_args(build_parser().parse_args([])) == RunOptions()
    changed = options_from_args(build_parser().parse_args(["--scheme", "ring", "--width", "64"]))
    assert changed.scheme is Scheme.RING and changed.width == 64


def test_run_options_take_the_run_config_defaults() -> None:
    from lab.orchestrate.runner import RunOptions

    opts = RunOptions()
    shared = {f.name for f in fields(RunConfig)} & {f.name for f in fields(RunOptions)}
    # lr and batch_size default per workload (None: crew.train.workloads.DEFAULTS decides),
    # helpers per n (None: crew.plan.candidates.default_helpers decides)
    decided_later = ("lr", "batch_size", "helpers")
    with_default = [n for n in sorted(shared) if n not in ("p", "scheme", "extra", *decided_later)]
    assert len(with_default) >= 10
    for name in with_default:
        assert getattr(opts, name) == RunConfig.default(name), name
    assert all(getattr(opts, name) is None for name in decided_later)
    with pytest.raises(KeyError, match="n"):
        RunConfig.default("n")
