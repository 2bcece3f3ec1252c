"""Non-blocking mode's pre-scatter, the sending side: a ready member's unweighted parts along
the coordinator's a2a split, sent before its group exists (the receiving side, which holds each
part to the split, is ``crew.runtime.reduce.ReduceEngine``)."""

from __future__ import annotations

import numpy as np

from crew.wire.frames import Frame, FrameKind
from crew.wire.protocol import Split


def prescatter_frames(
    me: int,
    run: int,
    vector: np.ndarray,
    segments: list[list[int]],
    epoch: int,
    iteration: int,
    part_elems: int,
) -> list[tuple[int, Frame]]:
    """Non-blocking mode: the unweighted parts a ready member sends along the a2a split.

    ``part`` carries the offered iteration and ``rev`` the split's epoch, so an aggregator can
    match them to the group that later forms."""
    out = []
    for agg, start, stop in segments:
        if agg == me:
            continue
        for s in range(start, stop, part_elems):
            e = min(s + part_elems, stop)
            out.append(
                (
                    agg,
                    Frame(
                        kind=FrameKind.PRESCATTER,
                        sender=me,
                        run=run,
                        rev=epoch,
                        block=agg,
                        part=iteration,
                        offset=s,
                        payload=np.ascontiguousarray(vector[s:e]).tobytes(),
                    ),
                )
            )
    return out


def prescatter_part_len(split: Split, me: int, offset: int) -> int | None:
    """The values of the split's part at ``offset`` of aggregator ``me``'s segments, as its
    sender cut them (:func:`prescatter_frames`); None: no part of ``me`` starts there."""
    step = split.part_elems
    for agg, start, stop in split.segments:
        if agg == me and offset in range(start, stop, step):
            return min(offset + step, stop) - offset
    return None
