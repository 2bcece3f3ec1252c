"""``python -m lab.topology``: validate topology files and summarise each (lab/spec/topology.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from crew.cli_options import add_version_flag
from lab.spec.topology import TopologyError, TopologySpec, Uplinks, load_topology


def summarize(spec: TopologySpec) -> str:
    """A few lines for humans: size, clouds, inter-cloud rate spread, impairments, stragglers."""
    inter = np.array(
        [
            lk.rate_mbit
            for lk in spec.links
            if spec.workers[lk.src].cloud != spec.workers[lk.dst].cloud
        ]
    )
    n_intra = len(spec.links) - len(inter)
    bw = spec.bw_matrix()
    shape = "symmetric" if np.array_equal(bw, bw.T) else "asymmetric"
    spread = (
        f"min {inter.min():g} / median {np.median(inter):g} / max {inter.max():g}"
        if len(inter)
        else "none (a single cloud)"
    )
    wanted = sorted(i.value for i in spec.impairments_requested())
    stragglers = [f"{w.name} ({w.cloud}) {w.straggler}" for w in spec.workers if w.straggler]
    where = str(spec.source) if spec.source is not None else "<data>"
    out = [
        f"{where}: {spec.name}: n = {spec.n} workers in {len(spec.clouds)} clouds "
        f"({', '.join(c.name for c in spec.clouds)})",
        f"  inter-cloud rates (Mbit/s, {len(inter)} directed links, {shape}): {spread}",
    ]
    if n_intra:
        out.append(f"  intra-cloud: {n_intra} directed links at {spec.intra_cloud_mbit:g} Mbit/s")
    if spec.uplinks is Uplinks.SHARED:
        out.append(
            f"  uplinks: shared, {len(spec.shared_uplinks())} directed cloud-pair WAN links "
            "(each shared by all worker pairs crossing it)"
        )
    out += [
        f"  impairments requested: {', '.join(wanted) if wanted else 'none'}",
        f"  stragglers: {'; '.join(stragglers) if stragglers else 'none'}",
    ]
    return "\n".join(out)


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
    add_version_flag(parser)
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
