"""The start-up exchange's pure parts: the capacity matrix from the receivers' reports, and
the shapes named in a refusal."""

from __future__ import annotations

import pytest

from crew.control.capacity import TCP_GOODPUT
from crew.runtime.rendezvous import capacity_matrix, describe_shapes
from crew.wire import protocol as proto


def test_capacity_matrix_is_indexed_src_dst_and_scaled_like_the_estimator():
    # worker 1 received 1 MB from worker 0 in 0.8 s; worker 0 received 1 MB from 1 in 0.4 s
    reports = {
        1: proto.LinkRates(1, [[0.0, 1e6, 0.8]]),
        0: proto.LinkRates(0, [[1.0, 1e6, 0.4]]),
    }
    bw = capacity_matrix(2, reports)
    assert bw[0][1] == pytest.approx(10 / TCP_GOODPUT)
    assert bw[1][0] == pytest.approx(20 / TCP_GOODPUT)
    assert bw[0][0] == 0.0


def test_links_without_a_sample_get_the_median():
    reports = {
        1: proto.LinkRates(1, [[0.0, 1e6, 0.8]]),
        0: proto.LinkRates(0, []),
        2: proto.LinkRates(2, [[0.0, 1e6, 0.4], [1.0, 1e6, 0.2]]),
    }
    bw = capacity_matrix(3, reports)
    measured = sorted([10 / TCP_GOODPUT, 20 / TCP_GOODPUT, 40 / TCP_GOODPUT])
    assert bw[1][0] == pytest.approx(measured[1])  # no sample: the median
    assert bw[2][1] == pytest.approx(measured[1])


def test_a_report_naming_itself_or_a_stranger_is_ignored():
    reports = {0: proto.LinkRates(0, [[0.0, 1e6, 1.0], [7.0, 1e6, 1.0], [1.0, 1e6, 0.0]])}
    bw = capacity_matrix(2, reports)
    assert bw[1][0] == pytest.approx(1000.0)  # nothing valid measured: the fallback


def test_describe_shapes_is_short_and_counts():
    text = describe_shapes([[64, 640], [640], [640, 10], [10], [3, 3]])
    assert text.startswith("[64x640, 640, 640x10, 10, ...]")
    assert "(5 tensors, 48,019 values)" in text
