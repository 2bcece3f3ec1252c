"""The result check's projection: chunked float64 sums equal the whole-vector dot product, and
the reduce engine's part-by-part projection equals the projection of the whole result."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reduce_kit import MEMBERS, RUN, TOTAL, Net, path_and_tree, vectors

from crew.control.verify import PROJECT_CHUNK, check_vector, project


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


@pytest.mark.parametrize("pipelined", [True, False])
def test_engine_projects_the_result_part_by_part(pipelined: bool) -> None:
    check = check_vector(RUN, TOTAL)
    net = Net(check=check)
    net.run(path_and_tree(pipelined), vectors(3))
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
    net = Net()
    net.run(path_and_tree(True), vectors(4))
    assert net.done >= set(MEMBERS)
    assert net.engines[0].result(5) is not None
    assert net.engines[0].result_projection(5) is None
