"""Shared helpers for reduce-engine unit tests: engines joined by an in-memory frame queue (the
transport is tested elsewhere) and one group whose routes are a path and a tree."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from crew.control.clipping import ClipRule
from crew.plan.routes import Route
from crew.runtime.reduce import ReduceEngine
from crew.train.partcodec import PartCodec
from crew.wire.frames import Frame
from crew.wire.protocol import Assign

RUN = 11
N = 5
TOTAL = 3000


class Net:
    """N engines joined by an in-memory queue. ``codec_for(i)``: engine i's part codec (each
    Node builds its own: it holds the node's residual); ``check``: the engines' check vector
    (``ReduceEngine(check=)``); ``tamper``: applied to every frame sent; ``clip``: the engines'
    clipped aggregation (None: the mean)."""

    def __init__(
        self,
        codec_for: Callable[[int], PartCodec | None] = lambda i: None,
        check: np.ndarray | None = None,
        tamper: Callable[[Frame], Frame] | None = None,
        clip: ClipRule | None = None,
    ) -> None:
        self.queue: deque[tuple[int, Frame]] = deque()
        self.done: set[int] = set()
        self.tamper = tamper
        self.engines = [
            ReduceEngine(
                i, N, RUN, self._send, self._have_all(i), codec=codec_for(i), check=check, clip=clip
            )
            for i in range(N)
        ]

    def _send(self, dst: int, frame: Frame, priority: int = 0) -> None:
        if self.tamper is not None:
            frame = self.tamper(frame)
        self.queue.append((dst, frame))

    def _have_all(self, i: int) -> Callable[[int, int, int], None]:
        return lambda group, rev, nbytes: self.done.add(i)

    def run(self, assign: Assign, vectors: dict[int, np.ndarray]) -> None:
        for i, e in enumerate(self.engines):
            if i in assign.members or any(i in Route.from_list(r).nodes() for r in assign.routes):
                e.assign(assign, vectors.get(i))
        for _ in range(100_000):
            if not self.queue:
                return
            dst, frame = self.queue.popleft()
            self.engines[dst].on_frame(frame)
        raise AssertionError("frames still flowing")


ROUTES = [
    # [0, 1000): along 1 -> 2 -> 0, broadcast 0 -> 1 -> 2 (a path: member relays)
    Route(0, 1000, 0, up=((1, 2), (2, 0)), down=((0, 1), (1, 2))),
    # [1000, 3000): a tree through non-member 4 to non-member root 3
    Route(
        1000, 3000, 3, up=((0, 4), (2, 4), (4, 3), (1, 3)), down=((3, 4), (4, 0), (4, 2), (3, 1))
    ),
]
MEMBERS = (0, 1, 2)
WEIGHTS = (0.25, 0.25, 0.5)


def assign_routes(
    routes: Sequence[Route],
    total: int,
    group: int,
    members: Sequence[int],
    weights: Sequence[float],
    rev: int = 0,
    part_elems: int = 1000,
    pipelined: bool = True,
) -> Assign:
    """A test scheme's Assign of ``routes`` (no pre-scatter, every member at iteration 0)."""
    return Assign(
        group=group,
        rev=rev,
        scheme="test",
        members=list(members),
        weights=list(weights),
        routes=[r.to_list() for r in routes],
        pipelined=pipelined,
        total=total,
        part_elems=part_elems,
        prescatter=[],
        iterations=[0] * len(members),
        split_epoch=-1,
    )


def path_and_tree(pipelined: bool, group: int = 5) -> Assign:
    """Revision 0 of ``group``: MEMBERS with WEIGHTS over ROUTES, parts of 256 elements."""
    return assign_routes(
        ROUTES, TOTAL, group, MEMBERS, WEIGHTS, part_elems=256, pipelined=pipelined
    )


def vectors(seed: int = 3) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {m: rng.standard_normal(TOTAL).astype(np.float32) for m in MEMBERS}


def near_vectors(
    members: Sequence[int],
    size: int,
    *,
    seed: int,
    spread: float = 0.01,
    poisoned: int | None = None,
    scale: float = 100.0,
) -> dict[int, np.ndarray]:
    """Members' models of one base, each element off by ``spread`` (1% of its scale: honest
    members after a few steps apart); ``poisoned`` offers ``scale`` times its own."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(size)
    out = {m: (base + spread * rng.standard_normal(size)).astype(np.float32) for m in members}
    if poisoned is not None:
        out[poisoned] = out[poisoned] * np.float32(scale)
    return out
