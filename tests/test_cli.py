"""crew-lab (lab/cli.py): one name for the lab's commands, dispatching to their own main()."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import crew
from lab import cli

REPO = Path(__file__).resolve().parents[1]


def test_every_user_command_has_a_subcommand():
    """The modules at the top of lab/ are the user commands (tests/test_layers.py); crew-lab
    names each of them, and each subcommand's module has the main() it calls."""
    top = {f"lab.{p.stem}" for p in (REPO / "lab").glob("*.py")} - {"lab.__init__", "lab.cli"}
    top |= {f"lab.{p.parent.name}" for p in (REPO / "lab").glob("*/__main__.py")}  # lab.bench
    # A command that is a package (lab.bench) has its main() in the package's cli module.
    named = {c.module.removesuffix(".cli") for c in cli.COMMANDS.values()}
    assert top <= named, f"no crew-lab subcommand for {sorted(top - named)}"
    assert named - top == {"crew.sim.__main__", "dashboard.__main__"}
    for name, command in cli.COMMANDS.items():
        assert callable(importlib.import_module(command.module).main), name


def test_a_subcommand_is_its_module_with_the_same_arguments(capsys):
    small = str(REPO / "topologies" / "small.yaml")
    from lab import topology

    assert topology.main([small]) == 0
    direct = capsys.readouterr().out
    assert cli.main(["topology", small]) == 0
    assert capsys.readouterr().out == direct and "3" in direct
    with pytest.raises(SystemExit) as exc:  # the module's own argparse, its own help
        cli.main(["scenario", "--help"])
    assert exc.value.code == 0
    assert "usage: python -m lab.scenario" in capsys.readouterr().out


def test_a_bad_input_keeps_the_commands_exit_status(tmp_path, capsys):
    missing = str(tmp_path / "missing.yaml")
    assert cli.main(["topology", missing]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"crew-lab {crew.__version__}"
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    for name, command in cli.COMMANDS.items():
        assert f"  {name} " in out and command.module.removesuffix(".__main__") in out


@pytest.mark.parametrize("argv", [[], ["nosuch"], ["--bogus", "run"]])
def test_no_or_an_unknown_command_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert "usage: crew-lab" in capsys.readouterr().err
