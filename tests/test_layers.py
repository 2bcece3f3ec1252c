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
        "crew.plan.planner",
        "crew.plan.inputs",
        "crew.plan.plantypes",
        "crew.plan.stars",
        "crew.plan.starcost",
        "crew.plan.rounding",
        "crew.plan.bound",
        "crew.plan.highs",
        "crew.plan.trees",
        "crew.plan.ringorder",
        "crew.plan.routelp.settings",
        "crew.plan.routelp.shapes",
        "crew.plan.routelp.master",
        "crew.plan.routelp.levels",
        "crew.plan.routelp.pricing",
        "crew.plan.routelp.seeds",
        "crew.plan.routelp.cost",
        "crew.plan.routelp.result",
        "crew.plan.routes",
        "crew.plan.baselines",
        "crew.plan.schemes",
        "crew.control.grouping",
        "crew.control.verify",
        "crew.plan.modelsize",
        "crew.control.lifecycle",
        "crew.control.records",
        "crew.control.opengroup",
        "crew.control.groupplanning",
        "crew.control.linkhealth",
        "crew.control.former",
        "crew.control.traceformer",
        "crew.control.capacity",
        "crew.control.rejections",
        "crew.control.worker_control",
        "crew.control.assignment",
        "crew.control.admin",
        "crew.control.secretcheck",
        "crew.train.compress",
        "crew.train.partcodec",
    }
)
IMPURE_FOR_PURE = (
    "socket",
    "threading",
    "subprocess",
    "sqlite3",
    "time",
    "torch",
    "crew.wire.transport",
    "crew.runtime.rundb",
    "crew.runtime.coordinator",
    "crew.runtime.worker",
)
# The dashboard only reads the database and writes commands.
DASHBOARD_MAY_IMPORT = (
    "dashboard",
    "crew.runtime.rundb",
    "lab.orchestrate.commands",
    "lab.export",
    "lab.report.pace",  # pure: a run database's groups and commands in, the pace figures out
)
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
            # "from crew import rundb" imports crew.runtime.rundb: count the submodule
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
        # "from crew.runtime import rundb" also records the bare package: that is fine
        and not any(ok.startswith(i.target + ".") for ok in DASHBOARD_MAY_IMPORT)
    ]
    bad += _violations(imports, DASHBOARD_MAY_NOT, "the dashboard runs no processes or sockets")
    assert not bad, "\n".join(bad)


def test_pure_modules_do_no_io_and_read_no_clock() -> None:
    imports = [i for i in _all_imports("crew") if i.module in PURE]
    assert {i.module for i in imports} == PURE, "a module listed as pure is missing"
    bad = _violations(imports, IMPURE_FOR_PURE, "a pure module: time and events in")
    assert not bad, "\n".join(bad)


def _module_file(dotted: str) -> Path | None:
    """The file of a project module (a package's __init__), or None if ``dotted`` is none."""
    base = REPO.joinpath(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def private_uses_in(source: str, path: Path) -> list[str]:
    """Where ``source`` takes another module's underscore name: ``from m import _x``, or
    ``m._x`` with ``m`` bound to a project module (dunders are public)."""

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    tree = ast.parse(source, filename=str(path))
    modules: dict[str, str] = {}  # local name -> project module it is bound to
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if _module_file(node.module) and private(a.name):
                    out.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.module}.{a.name}")
                if _module_file(f"{node.module}.{a.name}"):
                    modules[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and _module_file(a.name):
                    modules[a.asname] = a.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and private(node.attr)
        ):
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            out.append(f"{where}: {modules[node.value.id]}.{node.attr}")
    return out


def test_crew_modules_use_only_each_others_public_names() -> None:
    bad = [u for p in sorted((REPO / "crew").rglob("*.py")) for u in private_uses_in(
        p.read_text(encoding="utf-8"), p)]  # fmt: skip
    assert not bad, "\n".join(bad)


def test_the_private_name_reader_sees_both_forms() -> None:
    path = REPO / "crew" / "probe.py"
    source = (
        "from crew.plan.planner import _hidden, lower_bound\n"
        "from crew.plan import routelp\n"
        "import crew.plan.bound as bound\n"
        "routelp._secret\nbound._memo\nroutelp.__name__\nlower_bound._x\n"
    )
    found = private_uses_in(source, path)
    assert [f.split(": ")[1] for f in found] == [
        "crew.plan.planner._hidden",
        "crew.plan.routelp._secret",
        "crew.plan.bound._memo",
    ]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import lab.net.mesh", ["lab.net.mesh"]),
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


# Inside crew, each sub-package may lean only on the ones below it: plan (pure planning) on
# nothing; wire (formats, sockets) on nothing; control (pure state machines) on plan and the
# wire's message vocabulary; train on plan (model sizes); runtime and sim on everything.
CREW_PACKAGE_MAY_NOT = {
    "crew.plan": ("crew.control", "crew.wire", "crew.runtime", "crew.train", "crew.sim"),
    "crew.wire": ("crew.plan", "crew.control", "crew.runtime", "crew.train", "crew.sim"),
    "crew.control": ("crew.runtime", "crew.train", "crew.sim", "crew.averager"),
    "crew.train": ("crew.control", "crew.wire", "crew.runtime", "crew.sim", "crew.averager"),
}


@pytest.mark.parametrize("package", sorted(CREW_PACKAGE_MAY_NOT))
def test_crew_sub_packages_depend_only_downwards(package: str) -> None:
    imports = _all_imports(package.replace(".", "/"))
    bad = _violations(imports, CREW_PACKAGE_MAY_NOT[package], f"{package} is below them")
    assert not bad, "\n".join(bad)


def _lab_commands() -> tuple[str, ...]:
    """The user commands (python -m lab.<name>): every module at the top of lab/, and every
    package at the top of lab/ that has a ``__main__.py``."""
    modules = [p.stem for p in (REPO / "lab").glob("*.py") if p.stem != "__init__"]
    packages = [p.parent.name for p in (REPO / "lab").glob("*/__main__.py")]
    return tuple(f"lab.{name}" for name in sorted(modules + packages))


def _command_file(name: str) -> Path:
    """The file ``python -m <name>`` runs: the module, or the package's ``__main__.py``."""
    path = REPO / name.replace(".", "/")
    return path / "__main__.py" if path.is_dir() else path.with_suffix(".py")


def runs_a_main(source: str) -> bool:
    """Whether a command's file runs a main() when run as __main__: it defines or imports one,
    and calls it under ``if __name__ == "__main__":``."""
    tree = ast.parse(source)
    has_main = any(
        (isinstance(node, ast.FunctionDef) and node.name == "main")
        or (isinstance(node, ast.ImportFrom) and any(a.name == "main" for a in node.names))
        for node in tree.body
    )
    guarded = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
    ]
    calls_main = any(
        isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "main"
        for guard in guarded
        for call in ast.walk(guard)
    )
    return has_main and calls_main


def test_every_module_at_the_top_of_lab_is_a_command() -> None:
    """Libraries live in lab.net, lab.orchestrate, lab.spec and lab.report; studies in
    lab.studies. A module at the top of lab/ is a command: it has a main() it runs as __main__;
    so is a package there, through its __main__.py. A package without one is not allowed."""
    commands = _lab_commands()
    assert "lab.bench" in commands  # the one command that is a package
    not_commands = [name for name in commands if not runs_a_main(_command_file(name).read_text())]
    assert not not_commands, f"not runnable as python -m: {not_commands}"
    libraries = {"net", "orchestrate", "spec", "report", "studies", "fresh"}
    packages = {p.name for p in (REPO / "lab").iterdir() if (p / "__init__.py").exists()}
    stray = sorted(packages - libraries - {c.removeprefix("lab.") for c in commands})
    assert not stray, (
        f"packages at the top of lab/ that are neither a library nor a command: {stray}"
    )


@pytest.mark.parametrize(
    ("source", "runs"),
    [
        ('def main():\n    pass\nif __name__ == "__main__":\n    main()\n', True),
        (
            'from lab.bench.cli import main\nif __name__ == "__main__":\n    sys.exit(main())\n',
            True,
        ),
        ("from lab.bench.cli import main\n", False),  # imports it, never runs it
        ('if __name__ == "__main__":\n    main()\n', False),  # runs a main it does not have
        ('def main():\n    pass\nif __name__ == "__main__":\n    run()\n', False),
    ],
)
def test_the_command_check_sees_a_main_that_is_not_run(source: str, runs: bool) -> None:
    assert runs_a_main(source) is runs


def test_only_studies_and_tests_import_the_studies() -> None:
    """lab.studies holds one-off measurements; the product (crew, lab, dashboard) never depends
    on them, so a study can be deleted without breaking a command."""
    imports = [
        i
        for package in ("crew", "lab", "dashboard")
        for i in _all_imports(package)
        if not _under(i.module, "lab.studies")
    ]
    bad = _violations(imports, ("lab.studies",), "studies are imported by tests and studies only")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", ["lab.net", "lab.orchestrate", "lab.spec", "lab.report"])
def test_lab_internals_never_import_a_command(package: str) -> None:
    imports = _all_imports(package.replace(".", "/"))
    banned = _lab_commands() + (("lab.orchestrate",) if package == "lab.net" else ())
    bad = _violations(imports, banned, f"{package} is used by the commands, not the reverse")
    assert not bad, "\n".join(bad)
