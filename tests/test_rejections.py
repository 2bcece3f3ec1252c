"""The security events of rejected frames: a few each, then one summary per window."""

from __future__ import annotations

from crew.control.rejections import REJECT_EVENTS, SUMMARY_PEERS, RejectionLimiter


def test_a_flood_becomes_a_few_events_and_one_summary_per_window() -> None:
    lim = RejectionLimiter(window_s=5.0, per_window=3)
    notes = []
    for k in range(1000):
        notes += lim.rejected(2, "bad mac", f"10.0.{k // 250}.{k % 250}:4000", now=k * 0.001)
    assert len(notes) == 3 and all(n.count == 1 for n in notes)
    summary = lim.expire(now=5.0)
    assert len(summary) == 1
    assert summary[0].count == 997 and summary[0].worker == 2
    assert len(summary[0].peers) == SUMMARY_PEERS  # named peers are bounded, the count is not
    assert lim.expire(now=10.0) == []  # the window was flushed once


def test_windows_are_kept_per_worker_and_reason() -> None:
    lim = RejectionLimiter()
    assert len(lim.rejected(0, "bad mac", "a", 0.0)) == 1
    assert len(lim.rejected(1, "bad mac", "a", 0.0)) == 1
    assert len(lim.rejected(0, "wrong run", "a", 0.0)) == 1
    for _ in range(REJECT_EVENTS):
        lim.rejected(0, "bad mac", "b", 0.1)
    assert [(n.worker, n.reason, n.count) for n in lim.flush_all()] == [(0, "bad mac", 1)]
