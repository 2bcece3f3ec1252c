"""Where the shipped topologies and scenarios are, in a checkout and in an installed wheel.

The files live in the repository's top-level ``topologies/`` and ``scenarios/`` folders. A wheel
carries the same files as package data of this package (``pyproject.toml`` maps
``lab.spec.shipped.topologies`` and ``lab.spec.shipped.scenarios`` onto those folders), so
``importlib.resources`` finds them beside this file once installed. In a checkout (or an
editable install) they are not beside it, and the checkout's own folders are used. Every
command that needs a shipped file asks here, so both layouts work the same way.
"""

from __future__ import annotations

import argparse
import enum
from importlib import resources
from pathlib import Path

__all__ = [
    "Shipped",
    "ShippedFileError",
    "default_topology",
    "shipped_dir",
    "shipped_file",
    "topology_arg",
]

_CHECKOUT = Path(__file__).resolve().parents[3]


class Shipped(enum.Enum):
    """A folder of shipped input files; the value is its name, in the checkout and the wheel."""

    TOPOLOGIES = "topologies"
    SCENARIOS = "scenarios"

    @property
    def one(self) -> str:
        """What one file of the folder is: "topology", "scenario"."""
        return {Shipped.TOPOLOGIES: "topology", Shipped.SCENARIOS: "scenario"}[self]


class ShippedFileError(FileNotFoundError):
    """A shipped folder or file is not where the checkout or the installed package keeps it."""


def shipped_dir(kind: Shipped) -> Path:
    """The folder of ``kind``: the installed package's copy, else the checkout's."""
    packaged = resources.files(__name__).joinpath(kind.value)
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    checkout = _CHECKOUT / kind.value
    if checkout.is_dir():
        return checkout
    raise ShippedFileError(
        f"the shipped {kind.value} are missing: neither {packaged} (an installed package)"
        f" nor {checkout} (a checkout) exists"
    )


def shipped_file(kind: Shipped, name: str) -> Path:
    """``<name>.yaml`` in the folder of ``kind``; :class:`ShippedFileError` lists the names
    there when it is not one of them."""
    folder = shipped_dir(kind)
    path = folder / f"{name}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        raise ShippedFileError(f"no shipped {kind.one} named {name!r} (there are: {names})")
    return path


def topology_arg(value: str) -> Path:
    """A ``--topology`` value (an argparse ``type``): a YAML file's path, or the name of a
    shipped topology (``small`` is ``topologies/small.yaml``). A path that does not exist is
    returned as it is, for the loader to name; an unknown name is an argparse error."""
    path = Path(value)
    if path.suffix in (".yaml", ".yml") or path.exists() or len(path.parts) > 1:
        return path
    try:
        return shipped_file(Shipped.TOPOLOGIES, value)
    except ShippedFileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def default_topology() -> Path:
    """The topology the lab's commands use when none is given: the shipped ``default.yaml``."""
    return shipped_file(Shipped.TOPOLOGIES, "default")


def add_topology_flag(parser: argparse.ArgumentParser, help: str) -> None:
    """``--topology``: a YAML file or a shipped topology's name, :func:`default_topology` if
    none is given."""
    parser.add_argument("--topology", type=topology_arg, default=default_topology(), help=help)
