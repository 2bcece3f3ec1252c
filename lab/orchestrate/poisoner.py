"""A poisoning worker: the strongest tamper against the public result check, for the lab.

It runs the normal worker (``crew.runtime.worker``), but its reduce engine is a
:class:`PoisonEngine`: every partial sum it aggregates or relays (SCATTER frames) and every
result it broadcasts or relays (RESULT frames) of a group it is *not* a member of gets a tamper
``delta`` added before it is framed. ``delta`` is a steady bias (``scale`` on every element),
made orthogonal, part by part, to the slice of the run's public check vector
(``crew.control.verify.check_vector``) the part covers: every member's ``r . result`` still
equals the weighted sum of the offered ``r . v``, so the public check passes and the poisoned
average is applied. Under fp16/int8 the tamper is added to the values before they are encoded,
so the ``err`` header that comes out (``crew.train.partcodec``) accounts exactly for the encode
of the tampered values and the public check stays exact; a broadcast relay, which forwards
encoded bytes, decodes them, tampers and encodes again with the carried ``err``.

The secret check (``crew.control.secretcheck``) catches it: ``r_g`` is drawn after the data
moved, and ``r_g . delta`` is about ``||delta||`` in size.

What it did is in its log, at WARNING (the lab's lowest level): one line per group revision it
first tampers with, :data:`TAMPERED` (with its tampered part count so far), and when it ends
:data:`DONE` with the total. ``lab.orchestrate.poison_phase`` reads them.

Attack code lives in the lab, never in ``crew``: this module swaps the engine class the worker's
``Node`` builds (``crew.runtime.node.ReduceEngine``) in its own process only.

    python -m lab.orchestrate.poisoner --config RUN/config.json --id 3 [--scale 0.5]
    torchrun ... -m lab.orchestrate.poisoner [--scale 0.5] --script examples/train_digits.py ...

The second form runs a training script as a torchrun rank: the script's ``crew.Averager``
builds its ``Node``, and so the poisoning engine, in this process.
"""

from __future__ import annotations

import logging
import runpy
import sys
from typing import Any

import numpy as np

from crew.runtime import node as node_mod
from crew.runtime import worker as worker_mod
from crew.runtime.reduce import DTYPE, ReduceEngine
from crew.wire.frames import Frame, FrameKind

log = logging.getLogger(__name__)

TAMPERED = "poisoner {me}: tampered with group {group} revision {rev} ({parts} parts so far)"
DONE = "poisoner: done, {parts} parts tampered in all"

DEFAULT_SCALE = 0.5
"""The bias added to every element the poisoner forwards: of the order of the weights of a
small model, so one poisoned average is far from the true one."""


def orthogonal_tamper(check: np.ndarray, scale: float) -> np.ndarray:
    """``scale`` on every element, less its projection on ``check``: ``check . delta = 0``
    (in float64; float32 rounding of the sum it is added to leaves ``~1e-7`` of it)."""
    r = np.asarray(check, dtype=np.float64)
    u = np.full(r.size, scale, dtype=np.float64)
    rr = float(np.dot(r, r))
    if rr > 0:
        u -= (float(np.dot(r, u)) / rr) * r
    return u


class PoisonEngine(ReduceEngine):
    """A reduce engine that tampers with every group it carries without being a member."""

    scale = DEFAULT_SCALE
    total_parts = 0  # over every engine of this process (a worker rebuilds its Node)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._check is None:
            raise ValueError("the poisoner needs the run's check vector to hide its tamper")
        self.tampered_parts = 0
        self._told: set[tuple[int, int]] = set()

    def _frame(
        self,
        kind: FrameKind,
        g: Any,
        k: int,
        start: int,
        values: np.ndarray,
        err: float = 0.0,
        wire: bytes | None = None,
    ) -> Frame:
        if self.me in g.assign.members or kind not in (FrameKind.SCATTER, FrameKind.RESULT):
            return super()._frame(kind, g, k, start, values, err, wire)
        if wire is not None:  # a codec's broadcast bytes, forwarded as is: open them up
            assert self._codec is not None
            values, err = self._codec.decode(wire, start, values.size)
        assert self._check is not None
        delta = orthogonal_tamper(self._check[start : start + values.size], self.scale)
        tampered = (np.asarray(values, dtype=np.float64) + delta).astype(DTYPE)
        self.tampered_parts += 1
        PoisonEngine.total_parts += 1
        key = (int(g.assign.group), int(g.assign.rev))
        if key not in self._told:
            self._told.add(key)
            parts = PoisonEngine.total_parts
            log.warning(TAMPERED.format(me=self.me, group=key[0], rev=key[1], parts=parts))
        return super()._frame(kind, g, k, start, tampered, err, None)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--scale" in args:
        at = args.index("--scale")
        PoisonEngine.scale = float(args[at + 1])
        del args[at : at + 2]
    node_mod.ReduceEngine = PoisonEngine  # type: ignore[misc]  # this process's workers only
    try:
        if args[:1] == ["--script"]:
            # A torchrun rank: the user's script, whose crew.Averager builds its Node here.
            logging.basicConfig(level=logging.WARNING)
            sys.argv = args[1:]
            runpy.run_path(args[1], run_name="__main__")
            return 0
        return worker_mod.main(args)
    finally:
        log.warning(DONE.format(parts=PoisonEngine.total_parts))


if __name__ == "__main__":
    sys.exit(main())
