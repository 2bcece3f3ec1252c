"""lab.spec.shipped finds the shipped topologies and scenarios, and the commands take a shipped
topology by name. (tests/test_packaging.py checks the same lookup from an installed wheel.)"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lab.spec.shipped import (
    Shipped,
    ShippedFileError,
    default_topology,
    shipped_dir,
    shipped_file,
    topology_arg,
)

REPO = Path(__file__).resolve().parents[1]


def test_in_a_checkout_the_top_level_folders_are_used():
    assert shipped_dir(Shipped.TOPOLOGIES) == REPO / "topologies"
    assert shipped_dir(Shipped.SCENARIOS) == REPO / "scenarios"
    assert default_topology() == REPO / "topologies" / "default.yaml"
    assert shipped_file(Shipped.SCENARIOS, "chaos") == REPO / "scenarios" / "chaos.yaml"


def test_an_unknown_name_lists_the_shipped_ones():
    with pytest.raises(ShippedFileError, match="no shipped scenario named 'chaoss'") as err:
        shipped_file(Shipped.SCENARIOS, "chaoss")
    assert "chaos, " in str(err.value) and "worker-crash" in str(err.value)
    with pytest.raises(argparse.ArgumentTypeError, match="no shipped topology named 'smal'"):
        topology_arg("smal")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("small", REPO / "topologies" / "small.yaml"),
        ("mine.yaml", Path("mine.yaml")),  # a file, named for the loader's error if missing
        ("some/dir/topo", Path("some/dir/topo")),
        (str(REPO / "topologies" / "uniform.yaml"), REPO / "topologies" / "uniform.yaml"),
    ],
)
def test_a_topology_argument_is_a_path_or_a_shipped_name(value, expected):
    assert topology_arg(value) == expected


def test_the_commands_default_to_the_shipped_default_and_take_names(tmp_path, monkeypatch):
    from lab import run, soak

    monkeypatch.chdir(tmp_path)  # the default does not depend on where the command starts
    assert run.build_parser().parse_args([]).topology == default_topology()
    args = run.build_parser().parse_args(["--topology", "small"])
    assert args.topology == REPO / "topologies" / "small.yaml"
    assert soak.build_parser().parse_args([]).topology == default_topology()
    assert soak.SoakOptions().topology == default_topology()
