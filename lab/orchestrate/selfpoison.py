"""A worker that poisons its own vector: the fault clipped aggregation bounds, for the lab.

It runs the normal worker (``crew.runtime.worker``), but every vector it offers to a group is
``scale`` times its model (``Node.offer``, patched in its own process only). It does so
consistently: its ``Ready`` projection and its secret-check proof are of the scaled vector, so
no result check can tell it from an honest member; only the aggregation rule decides what it
does to the group. Under ``aggregate mean`` its weight times ``scale`` lands in every member's
model; under ``aggregate clip`` (``crew.control.clipping``) it pulls by its weight times the
radius at most. Its own model is not scaled: an abandoned group leaves it as it trained.

Attack code lives in the lab, never in ``crew``.

    python -m lab.orchestrate.selfpoison --config RUN/config.json --id 3 [--scale 100]
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from crew.runtime import node as node_mod
from crew.runtime import worker as worker_mod

DEFAULT_SCALE = 100.0


def poison_offers(scale: float) -> None:
    """Make every ``Node`` of this process offer ``scale`` times the vector it is given."""
    offer = node_mod.Node.offer

    def scaled(self: node_mod.Node, vector: np.ndarray, *args: Any, **kwargs: Any) -> None:
        offer(self, vector * np.float32(scale), *args, **kwargs)

    node_mod.Node.offer = scaled  # type: ignore[method-assign]  # this process's workers only


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    scale = DEFAULT_SCALE
    if "--scale" in args:
        at = args.index("--scale")
        scale = float(args[at + 1])
        del args[at : at + 2]
    poison_offers(scale)
    return worker_mod.main(args)


if __name__ == "__main__":
    sys.exit(main())
