"""Returning freed heap pages: a fragmented arena shrinks, and the trimmer keeps its period."""

from __future__ import annotations

import threading

import pytest

from crew.runtime import heap


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_trim_returns_the_free_pages_between_live_frames() -> None:
    if heap.trim() is None:
        pytest.skip("this C library has no malloc_trim")
    kept: list[bytes] = []
    base = _rss_mb()

    def fragment() -> None:
        # 64 KiB frames (below glibc's mmap threshold: they come from this thread's arena),
        # every 16th kept alive, so the freed ones sit between live chunks and are not at the
        # top of the arena, where free() alone would give them back.
        # Filled, not zeroed: calloc's fresh pages would never be touched, so never resident.
        frames = [b"\x01" * (64 * 1024) for _ in range(2048)]
        kept.extend(frames[::16])
        del frames

    t = threading.Thread(target=fragment)
    t.start()
    t.join()
    before = _rss_mb() - base
    assert heap.trim() is True
    after = _rss_mb() - base
    # 128 MiB were touched and 8 MiB are alive: without trimming, most of the freed 120 MiB
    # stays resident; trimmed, what stays is about the live 8 MiB.
    assert before > 60, (before, after)
    assert after < 30, (before, after)
    assert len(kept) == 128


def test_the_trimmer_trims_once_a_period() -> None:
    now = [100.0]
    trimmer = heap.Trimmer(every_s=60.0, clock=lambda: now[0])
    assert trimmer.maybe() is True  # the first tick trims
    now[0] = 159.0
    assert trimmer.maybe() is False
    now[0] = 160.0
    assert trimmer.maybe() is True
    now[0] = 161.0
    assert trimmer.maybe() is False
    assert trimmer.calls == 2
