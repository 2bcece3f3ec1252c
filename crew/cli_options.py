"""Every command's flags for ``RunConfig`` fields, from one source: the fields' metadata.

Each ``RunConfig`` field carries an :class:`~crew.config.Option` (its help, unit, flag and, for
a few, the flag's own default). :func:`add_config_flags` turns the fields a command takes into
argparse flags, so ``lab.run``, ``lab.bench``, ``crew.sim`` (and ``lab.simrun``) and
``lab.studies.planbench`` spell, type, default and explain each one the same way (a test
compares their parsers); :func:`config_values` reads them back as field values.

The flags every command shares beyond the config live here too: ``--version``, ``--json PATH``
(``-`` for standard output) and ``--out DIR``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import sys
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from crew.config import OPTION, ConfigError, HostCpu, Option, RunConfig
from crew.config_checks import check_training

TRAINING = (
    "workload",
    "model_mb",
    "sync",
    "local_steps",
    "outer_lr",
    "outer_momentum",
    "overlap",
    "min_iteration_s",
    "compress",
    "lr",
    "batch_size",
)
"""The training-mode flags (docs/training.md), which lab.run and lab.bench --train share."""

# metavars for units; a flag whose unit is not here shows argparse's (its name in capitals)
UNIT_METAVARS = {"bytes": "BYTES", "s": "SECONDS", "ms": "MS", "workers": "N"}


def _fields() -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(RunConfig)}


def _types() -> dict[str, Any]:
    return typing.get_type_hints(RunConfig)


def option(name: str) -> Option:
    """Field ``name``'s Option; KeyError when RunConfig has no such field, ValueError when no
    command line sets it."""
    opt: Option = _fields()[name].metadata[OPTION]
    if opt.flag is None:
        raise ValueError(f"RunConfig.{name} has no flag: the lab sets it")
    return opt


def config_flag(name: str) -> str:
    """The flag that sets field ``name`` (``p``: ``--group-size``)."""
    flag = option(name).flag
    assert flag is not None
    return flag


def flag_default(name: str) -> Any:
    """What the flag of field ``name`` defaults to, in every command: ``RunConfig.default``, or
    the Option's own where it has one (None for lr, batch_size and sync: decided later)."""
    opt = option(name)
    if opt.has_cli_default:
        return opt.cli_default
    if name == "host_cpu_s_per_gb":
        return HostCpu()
    return RunConfig.default(name)


def flag_help(name: str) -> str:
    """The --help text of field ``name``'s flag: its meaning, unit and default."""
    opt = option(name)
    default = flag_default(name)
    notes = [opt.unit] if opt.unit else []
    if _types()[name] is not bool:  # a switch's default is to be off (or on, for --no-...)
        notes.append(f"default: {opt.default_text}" if default is None else f"default {default}")
    text = opt.help + (f" ({'; '.join(notes)})" if notes else "")
    return text.replace("%", "%%")  # argparse formats help with %


def add_config_flags(parser: argparse.ArgumentParser | Any, names: Iterable[str]) -> None:
    """Add the flags of the RunConfig fields ``names`` to ``parser`` (or an argument group).
    Each flag's value lands in ``args.<field name>``; a flag that turns a default-on field off
    (``--no-plan-ahead``) stores False there."""
    types = _types()
    for name in names:
        opt = option(name)
        kind = types[name]
        flags = [config_flag(name), *opt.aliases]
        kw: dict[str, Any] = {"dest": name, "default": flag_default(name), "help": flag_help(name)}
        if kind is bool:
            kw["action"] = "store_false" if flag_default(name) else "store_true"
        else:
            if name == "host_cpu_s_per_gb":
                kw["type"] = host_cpu
            elif opt.choices:
                kw["type"] = kind if isinstance(kind, type) and kind is not str else str
                kw["choices"] = list(opt.choices)
            else:
                kw["type"] = kind
            metavar = opt.metavar or UNIT_METAVARS.get(opt.unit)
            if metavar and not opt.choices:
                kw["metavar"] = metavar
        action = parser.add_argument(*flags, **kw)
        # what tests/test_cli_options.py compares across commands
        setattr(action, "config_field", name)  # noqa: B010


def host_cpu(text: str) -> HostCpu:
    """``--host-cpu``'s value; argparse shows the reason of a bad one."""
    try:
        return HostCpu.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def config_values(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The RunConfig field values of ``add_config_flags(parser, names)``'s flags. ``--host-cpu``
    sets two fields: ``host_cpu_s_per_gb`` and ``host_cores``."""
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(args, name)
        if isinstance(value, HostCpu):
            out["host_cpu_s_per_gb"], out["host_cores"] = value.s_per_gb, value.cores
        else:
            out[name] = value
    return out


def add_training_flags(parser: argparse.ArgumentParser | Any) -> None:
    """The training-mode flags of ``lab.run`` and ``lab.bench --train`` (docs/training.md)."""
    add_config_flags(parser, TRAINING)


def training_options(args: argparse.Namespace, *, scheme: str, nonblocking: bool) -> dict[str, Any]:
    """The training fields of :func:`add_training_flags`' flags, checked: ``sync`` left out is
    every-step, or local-sgd with ``--local-steps`` > 1; ``lr`` and ``batch_size`` None are the
    workload's. ConfigError names the first bad field."""
    sync = args.sync or ("local-sgd" if args.local_steps > 1 else "every-step")
    out = {
        "workload": args.workload,
        "sync": sync,
        "local_steps": args.local_steps,
        "outer_lr": args.outer_lr,
        "outer_momentum": args.outer_momentum,
        "compress": args.compress,
        "model_mb": args.model_mb,
        "overlap": args.overlap,
        "min_iteration_s": args.min_iteration_s,
    }
    check_training(scheme=scheme, nonblocking=nonblocking, **out)
    if args.lr is not None and not args.lr > 0:
        raise ConfigError(f"lr: must be > 0, got {args.lr}")
    if args.batch_size is not None and args.batch_size < 1:
        raise ConfigError(f"batch_size: must be >= 1, got {args.batch_size}")
    return out | {"lr": args.lr, "batch_size": args.batch_size}


def flag_error(exc: ConfigError) -> tuple[str, str]:
    """A ConfigError ("field: why") as the user typed it: (the field's flag, why). A field
    without a flag keeps its name."""
    name, _, why = str(exc).partition(":")
    try:
        return config_flag(name.strip()), why.strip()
    except (KeyError, ValueError):
        return name.strip(), why.strip()


# -- the flags every command has ---------------------------------------------------------------


def version() -> str:
    """The installed crew-lab's version."""
    try:
        return importlib.metadata.version("crew-lab")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s (crew-lab {version()})")


def command_parser(prog: str, doc: str | None, **kwargs: Any) -> argparse.ArgumentParser:
    """The parser of one command: ``prog``, its module docstring as the description (line
    breaks kept), ``--version``; ``kwargs`` go to ``ArgumentParser`` (``epilog``...)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs
    )
    add_version_flag(parser)
    return parser


def add_json_flag(parser: argparse.ArgumentParser, what: str, *, old: Iterable[str] = ()) -> None:
    """``--json PATH``: also write ``what`` as JSON to PATH; ``-`` writes it to standard output
    instead of the command's tables. ``old``: earlier spellings, accepted but not shown."""
    parser.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help=f"also write {what} as JSON to PATH; '-': to standard output, instead of tables",
    )
    for flag in old:
        parser.add_argument(flag, dest="json", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def write_json(path: str | Path | None, data: Any, **dumps: Any) -> bool:
    """Write ``data`` as JSON to ``path`` (``-``: standard output; None: nowhere). Returns
    whether the command should still print its tables: not when the JSON took standard
    output."""
    if path is None:
        return True
    text = json.dumps(data, indent=1, **dumps)
    if str(path) == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return False
    Path(path).write_text(text + "\n")
    return True


def add_out_flag(
    parser: argparse.ArgumentParser,
    help: str,
    *,
    required: bool = False,
    old: Iterable[str] = (),
) -> None:
    """``--out DIR``: where the command writes what it makes. ``old``: earlier spellings,
    accepted but not shown (not with ``required``: argparse would ask for --out itself)."""
    if required and old:
        raise ValueError("add_out_flag: a required --out takes no old spellings")
    parser.add_argument(
        "--out", type=Path, metavar="DIR", required=required, default=None, help=help
    )
    for flag in old:
        parser.add_argument(
            flag, dest="out", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
