"""``crew-lab COMMAND [ARGS...]``: the lab's user commands under one name.

``crew-lab run --duration 30`` is ``python -m lab.run --duration 30``: the command's module is
imported and its own ``main`` gets every argument after the command's name, so flags, help and
exit statuses are the module's. ``crew-lab --help`` lists the commands, ``crew-lab --version``
prints crew's version. ``python -m lab.cli`` is the same program.

A command whose module needs an extra that is not installed (the lab's or the dashboard's, see
``pyproject.toml``) says which one to install instead of failing with a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import crew

PROG = "crew-lab"
PROJECT_PACKAGES = ("crew", "lab", "dashboard")


@dataclass(frozen=True)
class Command:
    """One subcommand: the module run as ``python -m <module>`` and the extra it needs."""

    module: str
    summary: str
    extra: str | None = "lab"


# Every module at the top of lab/ is a user command (tests/test_cli.py keeps this complete),
# plus the library's simulator and the dashboard, which live outside lab/. They are named by
# module and imported only to run one: the lab's code does not depend on the dashboard.
COMMANDS: dict[str, Command] = {
    "run": Command("lab.run", "the lab: network, coordinator, workers, monitor, dashboard"),
    "check": Command("lab.check", "measure every emulated link against its configured rate"),
    "bench": Command("lab.bench.cli", "every scheme on one network and one trace of groups"),
    "audit": Command("lab.audit", "check a finished run's database"),
    "scenario": Command("lab.scenario", "validate a fault scenario, print its timeline"),
    "topology": Command("lab.topology", "validate topology files and summarise them"),
    "vm": Command("lab.vm", "run a command in a throwaway VM with Debian's stock kernel"),
    "soak": Command("lab.soak", "a long run under random faults: recoveries and leaks"),
    "fuzz": Command("lab.fuzz", "fuzz the frame decoder"),
    "hostile": Command("lab.hostile", "attack a running lab: floods, replays; did it keep going"),
    "simrun": Command("lab.simrun", "simulate a run on a topology YAML, with a scenario"),
    "torchrun": Command("lab.torchrun", "the example under torchrun in every emulated cloud"),
    "export": Command("lab.export", "a run's database as CSV files"),
    "freshcheck": Command(
        "lab.freshcheck", "prove vagrant up on a fresh Debian 12 VM, step by step"
    ),
    "sim": Command("crew.sim.__main__", "simulate a run on a generated topology", extra=None),
    "dashboard": Command("dashboard.__main__", "serve the dashboard for a run", "dashboard"),
}


def build_parser() -> argparse.ArgumentParser:
    width = max(len(name) for name in COMMANDS)
    listing = "\n".join(
        f"  {name:<{width}}  {cmd.summary}  (python -m {cmd.module.removesuffix('.__main__')})"
        for name, cmd in COMMANDS.items()
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [--version] [--help] COMMAND [ARGS...]",
        description="The CREW Lab's commands. `crew-lab COMMAND --help` shows a command's own"
        " options.",
        epilog=f"commands:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {crew.__version__}")
    parser.add_argument(
        "command", choices=sorted(COMMANDS), metavar="COMMAND", help="one of the commands below"
    )
    return parser


def load(name: str) -> Callable[[list[str]], int | None]:
    """The ``main`` of command ``name``; SystemExit(2) naming the extra to install when the
    module needs a package that is not there."""
    cmd = COMMANDS[name]
    try:
        module = importlib.import_module(cmd.module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if cmd.extra is None or not missing or missing in PROJECT_PACKAGES:
            raise
        print(
            f"{PROG} {name}: needs the {cmd.extra!r} extra ({missing} is not installed):"
            f" pip install 'crew-lab[{cmd.extra}]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    main: Callable[[list[str]], int | None] = module.main
    return main


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Options before the command are crew-lab's own; everything after it is the command's.
    split = next((i for i, a in enumerate(args) if not a.startswith("-")), len(args))
    ours = parser.parse_args(args[: split + 1])
    status = load(ours.command)(args[split + 1 :])
    return 0 if status is None else int(status)


if __name__ == "__main__":
    sys.exit(main())
