"""The result check's projection: chunked float64 sums equal the whole-vector dot product, and
the reduce engine's part-by-part projection equals the projection of the whole result."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crew.control.verify import PROJECT_CHUNK, check_vector, project
from crew.plan.routes import Route
from crew.runtime.reduce import ReduceEngine
from crew.wire.frames import Frame
from crew.wire.protocol import Assign

RUN = 7
N = 5
TOTAL = 3000


@settings(max_examples=40, deadline=None)
@given(
    size=st.sampled_from([0, 1, 5, PROJECT_CHUNK - 1, PROJECT_CHUNK, 3 * PROJECT_CHUNK + 17]),
    seed=st.integers(0, 2**16),
)
def test_chunked_projection_equals_the_float64_dot(size: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    check = check_vector(RUN, size)
    v = (rng.standard_normal(size) * 1e3).astype(np.float32)
    exact = float(np.dot(check.astype(np.float64), v.astype(np.float64)))
    scale = float(np.dot(np.abs(check.astype(np.float64)), np.abs(v.astype(np.float64))))
    assert abs(project(check, v) - exact) <= 1e-12 * scale + 1e-300


def test_projection_of_mismatched_sizes_is_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        project(check_vector(RUN, 10), np.zeros(9, dtype=np.float32))


class Net:
    """Engines joined by an in-memory queue (the transport is tested elsewhere)."""

    def __init__(self, check: np.ndarray | None) -> None:
        self.queue: deque[tuple[int, Frame]] = deque()
        self.done: set[int] = set()
        self.engines = [
            ReduceEngine(i, N, RUN, self._send, self._have_all(i), check=check) for i in range(N)
        ]

    def _send(self, dst: int, frame: Frame, priority: int = 0) -> None:
        self.queue.append((dst, frame))

    def _have_all(self, i: int):
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


def _assign(pipelined: bool) -> Assign:
    return Assign(
        group=5,
        rev=0,
        scheme="test",
        members=list(MEMBERS),
        weights=[0.25, 0.25, 0.5],
        routes=[r.to_list() for r in ROUTES],
        pipelined=pipelined,
        total=TOTAL,
        part_elems=256,
        prescatter=[],
        iterations=[0] * len(MEMBERS),
        split_epoch=-1,
    )


@pytest.mark.parametrize("pipelined", [True, False])
def test_engine_projects_the_result_part_by_part(pipelined: bool) -> None:
    rng = np.random.default_rng(3)
    vectors = {m: rng.standard_normal(TOTAL).astype(np.float32) for m in MEMBERS}
    check = check_vector(RUN, TOTAL)
    net = Net(check)
    net.run(_assign(pipelined), vectors)
    assert net.done >= set(MEMBERS)
    for m in MEMBERS:
        result = net.engines[m].result(5)
        assert result is not None
        assert net.engines[m].result_projection(5) == pytest.approx(
            project(check, result), rel=1e-9
        )
    # Non-members hold no result and so no projection.
    assert net.engines[4].result_projection(5) is None


def test_engine_without_a_check_reports_no_projection() -> None:
    rng = np.random.default_rng(4)
    net = Net(None)
    net.run(_assign(True), {m: rng.standard_normal(TOTAL).astype(np.float32) for m in MEMBERS})
    assert net.done >= set(MEMBERS)
    assert net.engines[0].result(5) is not None
    assert net.engines[0].result_projection(5) is None
