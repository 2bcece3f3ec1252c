"""``python -m lab.topology``: validate topology files and summarise each (lab/spec/topology.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from lab.spec.topology import TopologyError, load_topology, summarize


def _build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="python -m lab.topology",
        description=(
            "Validate CREW Lab topology files and print a summary of each: number of "
            "workers, clouds, min/median/max inter-cloud link rate, and which impairments "
            "(delay, jitter, loss) they request. The format is described in "
            "topologies/README.md."
        ),
        epilog="Exit status: 0 if every file is valid, 2 if any is not (errors go to stderr).",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    parser.add_argument("paths", nargs="+", metavar="PATH", type=Path, help="topology YAML file")
    args = parser.parse_args(argv)
    status = 0
    for path in _unique(args.paths):
        try:
            spec = load_topology(path)
        except TopologyError as e:
            print(f"error: {e}", file=sys.stderr)
            status = 2
            continue
        print(summarize(spec))
    return status


def _unique(paths: Iterable[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


if __name__ == "__main__":
    sys.exit(main())
