"""Arrival-rate estimation: what the coordinator's "measured" capacity is built from."""

from __future__ import annotations

import pytest

from crew.wire.transport import ArrivalRate


def test_back_to_back_frames_give_the_pacing_rate() -> None:
    r = ArrivalRate(gap_s=0.05, min_bytes=100_000)
    # 20 frames of 100 kB paced at 10 ms: 10 MB/s after the first frame.
    for k in range(20):
        r.add(1.0 + 0.01 * k, 100_000)
    assert r.take() == (0, 0.0)  # the burst is still open
    r.add(5.0, 100_000)  # a gap closes it
    nbytes, seconds = r.take()
    assert nbytes == 19 * 100_000
    assert seconds == pytest.approx(0.19)
    assert nbytes / seconds == pytest.approx(10e6)
    assert r.take() == (0, 0.0)  # taken once


def test_short_bursts_and_lone_frames_are_ignored() -> None:
    r = ArrivalRate(gap_s=0.05, min_bytes=300_000)
    for start in (0.0, 1.0, 2.0):  # three bursts of 3 frames: 200 kB after the first
        for k in range(3):
            r.add(start + 0.001 * k, 100_000)
    r.add(10.0, 1)
    assert r.take() == (0, 0.0)
