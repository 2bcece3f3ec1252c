"""One source for every option: RunConfig's field metadata, the flags crew.cli_options builds from
it, and the commands that use them (lab.run, lab.bench, crew.sim, lab.simrun, planbench)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import runpy
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from crew import cli_options
from crew.config import OPTION, ConfigError, HostCpu, RunConfig
from crew.sim import __main__ as sim_cli
from lab import run as run_cli
from lab import simrun
from lab.bench import cli as bench_cli
from lab.orchestrate.runner import REPO, RunOptions
from lab.studies import planbench
from tests.test_readme import user_commands

PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "lab.run": run_cli.build_parser,
    "lab.bench": bench_cli.build_parser,
    "crew.sim": sim_cli.build_parser,
    "lab.simrun": simrun.build_parser,
    "lab.studies.planbench": planbench.build_parser,
}
COMPARED = ("option_strings", "dest", "type", "default", "help", "choices", "metavar", "nargs")


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return list(parser._actions)


def _signature(action: argparse.Action) -> dict[str, object]:
    return {k: getattr(action, k) for k in COMPARED} | {"kind": type(action).__name__}


def _reference(name: str) -> dict[str, object]:
    """The flag of field ``name`` as the registry builds it, on a parser of its own."""
    p = argparse.ArgumentParser()
    cli_options.add_config_flags(p, (name,))
    (action,) = [a for a in _actions(p) if getattr(a, "config_field", None) == name]
    return _signature(action)


# -- the metadata -----------------------------------------------------------------------------


def test_every_run_config_field_says_what_it_is() -> None:
    for f in dataclasses.fields(RunConfig):
        opt = f.metadata[OPTION]
        assert opt.help and not opt.help.endswith("."), f.name
        if opt.flag is not None:
            assert opt.flag.startswith("--") and opt.flag.strip() == opt.flag, f.name


def test_no_two_fields_share_a_flag() -> None:
    spellings = [
        s
        for f in dataclasses.fields(RunConfig)
        if (o := f.metadata[OPTION]).flag is not None
        for s in (o.flag, *o.aliases)
    ]
    assert len(spellings) == len(set(spellings))


def test_a_field_without_a_default_has_a_flag_default() -> None:
    assert RunConfig.default("p") == 3 and RunConfig.default("scheme") == "crew"
    assert RunOptions().p == RunConfig.default("p")
    with pytest.raises(KeyError):
        RunConfig.default("n")  # the lab sets it: no default anywhere


# -- every command's flags for the same field are the same flag --------------------------------


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_each_config_flag_is_the_registry_s(command: str) -> None:
    """Every flag that lands in a RunConfig field with a flag is built by the registry, exactly:
    no command writes its own --seed or --group-size beside it. (Fields the lab fills in, such
    as n, may have a command's own flag: crew.sim's --n sizes the network it generates.)"""
    fields = {f.name for f in dataclasses.fields(RunConfig) if f.metadata[OPTION].flag}
    parser = PARSERS[command]()
    tagged = [a for a in _actions(parser) if hasattr(a, "config_field")]
    assert tagged, f"{command} takes no RunConfig field from its command line"
    for action in _actions(parser):
        if action.dest in fields and action.help != argparse.SUPPRESS:
            name = getattr(action, "config_field", None)
            assert name == action.dest, f"{command}: {action.option_strings} is hand-written"
            assert _signature(action) == _reference(name), (command, name)


def test_the_same_field_has_the_same_flag_in_every_command() -> None:
    seen: dict[str, dict[str, tuple[str, dict[str, object]]]] = {}
    for command, build in PARSERS.items():
        for a in _actions(build()):
            if hasattr(a, "config_field"):
                seen.setdefault(a.config_field, {})[command] = _signature(a)  # type: ignore[assignment]
    shared = {name: by for name, by in seen.items() if len(by) > 1}
    # the group size, the seed and the host CPU are in four or five commands
    assert {"p", "seed", "host_cpu_s_per_gb"} <= set(shared)
    assert len(shared["p"]) == len(PARSERS)
    for name, by in shared.items():
        first = next(iter(by.values()))
        assert all(sig == first for sig in by.values()), (name, by)


def test_no_hand_written_flag_takes_a_registry_spelling() -> None:
    registry = {
        s
        for f in dataclasses.fields(RunConfig)
        if (o := f.metadata[OPTION]).flag is not None
        for s in (o.flag, *o.aliases)
    }
    for command, build in PARSERS.items():
        for a in _actions(build()):
            if not hasattr(a, "config_field"):
                clash = registry & set(a.option_strings)
                assert not clash, f"{command}: {clash} is not the registry's flag"


def test_the_group_size_is_one_flag_with_its_alias_and_one_default() -> None:
    for command, build in PARSERS.items():
        parser = build()
        (action,) = [a for a in _actions(parser) if getattr(a, "config_field", None) == "p"]
        assert action.option_strings == ["--group-size", "--p"], command
        assert action.default == 3, command


def test_the_group_size_alias_sets_the_same_field() -> None:
    parser = run_cli.build_parser()
    assert parser.parse_args(["--p", "2"]).p == parser.parse_args(["--group-size", "2"]).p == 2


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_flag_is_explained(command: str) -> None:
    undocumented = [
        a.option_strings or [a.dest]
        for a in _actions(PARSERS[command]())
        if not a.help and not isinstance(a, argparse._HelpAction)
    ]
    assert not undocumented, f"{command} --help leaves out: {undocumented}"


def test_the_help_states_unit_and_default() -> None:
    assert cli_options.flag_help("part_bytes").endswith("(bytes; default 0)")
    assert "default: the workload's" in cli_options.flag_help("lr")
    assert "default 65536" in cli_options.flag_help("hop_backlog_bytes")
    assert "default" not in cli_options.flag_help("staleness")  # a switch: off unless given
    assert "25%%" in cli_options.flag_help("capacity")  # escaped for argparse's % formatting


# -- values -------------------------------------------------------------------------------------


def test_host_cpu_takes_per_gb_and_optionally_cores() -> None:
    assert HostCpu.parse("12.5:2") == HostCpu(12.5, 2.0)
    assert HostCpu.parse("12.5") == HostCpu(12.5, float(os.cpu_count() or 1))
    assert HostCpu.parse("0") == HostCpu(0.0, 0.0)
    for bad in ("x", "-1", "12:0", "12:", "nan", "1:2:3"):
        with pytest.raises(ValueError, match="S_PER_GB"):
            HostCpu.parse(bad)


def test_one_host_cpu_syntax_in_the_lab_and_the_simulator() -> None:
    run_args = run_cli.build_parser().parse_args(["--host-cpu", "12:2"])
    opts = run_cli.options_from_args(run_args)
    assert (opts.host_cpu_s_per_gb, opts.host_cores) == (12.0, 2.0)
    sim_args = sim_cli.build_parser().parse_args(["--host-cpu", "12:2"])
    executor = sim_cli.executor_from(sim_args)
    assert executor.cpu_s_per_byte == pytest.approx(12e-9) and executor.host_cores == 2.0
    small = str(REPO / "topologies" / "small.yaml")
    bench_args = bench_cli.build_parser().parse_args(
        ["--topology", small, "--out", "/nonexistent", "--group-size", "2", "--host-cpu", "12"]
    )
    spec = bench_cli.spec_from_args(bench_args)
    assert (spec.host_cpu_s_per_gb, spec.host_cores) == (12.0, float(os.cpu_count() or 1))
    with pytest.raises(SystemExit):
        with contextlib.redirect_stderr(io.StringIO()) as err:
            run_cli.build_parser().parse_args(["--host-cpu", "12:0"])
    assert "--host-cpu" in err.getvalue() and "CORES > 0" in err.getvalue()


def test_a_config_error_names_the_flag() -> None:
    assert cli_options.flag_error(ConfigError("local_steps: an int >= 1, got 0")) == (
        "--local-steps",
        "an int >= 1, got 0",
    )
    assert cli_options.flag_error(ConfigError("p: must be between 1 and n=3, got 5"))[0] == (
        "--group-size"
    )
    assert cli_options.flag_error(ConfigError("n: must be at least 1"))[0] == "n"


def test_the_part_size_is_in_bytes_everywhere() -> None:
    for build in (run_cli.build_parser, bench_cli.build_parser):
        flags = {s for a in _actions(build()) for s in a.option_strings}
        assert "--part-bytes" in flags and "--part-kb" not in flags
    assert "--part-bytes" not in {
        s for a in _actions(planbench.build_parser()) for s in a.option_strings
    }
    assert planbench.build_parser().parse_args(["timing", "--hop-bytes", "8"]).hop_bytes == 8


def test_old_spellings_still_parse_but_are_not_shown() -> None:
    parser = run_cli.build_parser()
    args = parser.parse_args(["--run-dir", "x", "--summary-json", "s.json"])
    assert (args.out, args.json) == (Path("x"), "s.json")
    text = parser.format_help()
    assert "--run-dir" not in text and "--summary-json" not in text
    assert sim_cli.build_parser().parse_args(["--run-dir", "y"]).out == Path("y")


# -- --json PATH --------------------------------------------------------------------------------


def test_json_goes_to_a_file_or_to_standard_output(tmp_path: Path, capsys) -> None:
    cli_options.write_json(tmp_path / "a.json", {"x": 1})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}
    cli_options.write_json("-", {"y": [1, 2]})
    assert json.loads(capsys.readouterr().out) == {"y": [1, 2]}
    cli_options.write_json(None, {"z": 0})
    assert capsys.readouterr().out == ""


def test_every_json_flag_takes_a_path() -> None:
    for command, build in PARSERS.items():
        for a in _actions(build()):
            if "--json" in a.option_strings:
                assert a.nargs is None and a.const is None, f"{command}: --json is a switch"


def test_the_simulator_writes_its_figures_as_json(tmp_path: Path, capsys) -> None:
    out = tmp_path / "sim.json"
    argv = ["--n", "6", "--group-size", "3", "--duration", "5", "--size-mb", "4"]
    assert sim_cli.main([*argv, "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["n"] == 6 and figures["p"] == 3 and figures["completed"] > 0
    assert "rounds per worker" in capsys.readouterr().out
    assert sim_cli.main([*argv, "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == figures["completed"]


def test_the_simulator_refuses_gloo_by_name(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        sim_cli.main(["--n", "4", "--scheme", "gloo"])
    assert exit_.value.code == 2
    assert "--scheme: the simulator runs the partial-reduce schemes" in capsys.readouterr().err


# -- --version ----------------------------------------------------------------------------------


def _version_of(module: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """What ``python -m <module> --version`` prints, run in this process."""
    monkeypatch.setattr(sys, "argv", [module, "--version"])
    out = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is imported already
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert exit_.value.code in (0, None), module
    return out.getvalue()


@pytest.mark.parametrize("module", [*sorted(user_commands()), "crew.sim", "lab.studies.planbench"])
def test_every_command_prints_the_version(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli_options.version() in _version_of(module, monkeypatch)
    name = "crew-lab" if module == "lab.cli" else f"python -m {module}"  # the console script
    assert name in _version_of(module, monkeypatch)
