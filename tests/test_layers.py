"""The layering rules of docs/architecture.md §2, read from the imports of every module.

Each rule names what a layer may not import; a module that breaks one fails this test with the
file, the line and the rule. Imports inside functions count too (a lazy import is still a
dependency).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Pure modules: time and events in, decisions out. No I/O, no threads, no clocks, no torch.
PURE = frozenset(
    {
        "crew.planner",
        "crew.routes",
        "crew.baselines",
        "crew.schemes",
        "crew.grouping",
        "crew.verify",
        "crew.modelsize",
        "crew.lifecycle",
        "crew.capacity",
        "crew.rejections",
        "crew.worker_control",
        "crew.compress",
    }
)
IMPURE_FOR_PURE = (
    "socket",
    "threading",
    "subprocess",
    "sqlite3",
    "time",
    "torch",
    "crew.transport",
    "crew.rundb",
    "crew.coordinator",
    "crew.worker",
)
# The dashboard only reads the database and writes commands.
DASHBOARD_MAY_IMPORT = ("dashboard", "crew.rundb", "lab.commands", "lab.export")
DASHBOARD_MAY_NOT = ("subprocess", "socket")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # what it imports, dotted
    path: Path
    line: int


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[Import]:
    return imports_in(path.read_text(encoding="utf-8"), _module_name(path), path)


def imports_in(source: str, module: str, path: Path) -> list[Import]:
    tree = ast.parse(source, filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Import(module, a.name, path, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this package
                base = module.split(".")[: -node.level]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # "from crew import rundb" imports crew.rundb: count the submodule
            out += [Import(module, f"{target}.{a.name}", path, node.lineno) for a in node.names]
            out.append(Import(module, target, path, node.lineno))
    return out


def _all_imports(package: str) -> list[Import]:
    return [i for p in sorted((REPO / package).rglob("*.py")) for i in imports_of(p)]


def _under(target: str, prefix: str) -> bool:
    return target == prefix or target.startswith(prefix + ".")


def _violations(imports: list[Import], banned: tuple[str, ...], rule: str) -> list[str]:
    return [
        f"{i.path.relative_to(REPO)}:{i.line}: {i.module} imports {i.target} ({rule})"
        for i in imports
        if any(_under(i.target, b) for b in banned)
    ]


def test_crew_never_imports_the_lab_the_dashboard_or_mininet() -> None:
    bad = _violations(_all_imports("crew"), ("lab", "dashboard", "mininet"), "crew is a library")
    assert not bad, "\n".join(bad)


def test_the_lab_never_imports_the_dashboard() -> None:
    bad = _violations(_all_imports("lab"), ("dashboard",), "the lab does not depend on its UI")
    assert not bad, "\n".join(bad)


def test_the_dashboard_reads_the_database_and_writes_commands_only() -> None:
    imports = _all_imports("dashboard")
    project = [i for i in imports if i.target.split(".")[0] in ("crew", "lab", "dashboard")]
    bad = [
        f"{i.path.relative_to(REPO)}:{i.line}: {i.module} imports {i.target}"
        for i in project
        if not any(_under(i.target, ok) for ok in DASHBOARD_MAY_IMPORT)
        # "from crew import rundb" also records the bare package "crew": that is fine
        and i.target not in ("crew", "lab")
    ]
    bad += _violations(imports, DASHBOARD_MAY_NOT, "the dashboard runs no processes or sockets")
    assert not bad, "\n".join(bad)


def test_pure_modules_do_no_io_and_read_no_clock() -> None:
    imports = [i for i in _all_imports("crew") if i.module in PURE]
    assert {i.module for i in imports} == PURE, "a module listed as pure is missing"
    bad = _violations(imports, IMPURE_FOR_PURE, "a pure module: time and events in")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import lab.mesh", ["lab.mesh"]),
        ("from lab import mesh", ["lab.mesh", "lab"]),
        ("def f():\n    import mininet.net", ["mininet.net"]),
        ("from . import planner", ["crew.planner", "crew"]),
    ],
)
def test_the_reader_sees_every_kind_of_import(source: str, expected: list[str]) -> None:
    path = REPO / "crew" / "probe.py"
    found = imports_in(source, "crew.probe", path)
    assert [i.target for i in found] == expected
    banned = _violations(found, ("lab", "mininet"), "crew is a library")
    assert bool(banned) == (expected[0].split(".")[0] in ("lab", "mininet"))
