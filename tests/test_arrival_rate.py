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


def test_a_late_reader_times_the_link_not_its_own_backlog() -> None:
    """Frames sent every 2 ms while the receiving thread is held up: read later in a rush,
    they still measure the rate they arrived at, because the kernel stamped their arrival."""
    import socket
    import threading
    import time

    from crew.wire.frames import Frame, FrameCodec, FrameKind
    from crew.wire.transport import Transport

    run, frame_bytes, frames = 5, 64 * 1024, 30
    codec = FrameCodec(b"a" * 32, run)
    first = threading.Event()
    done = threading.Event()
    seen = []

    def on_frame(f: Frame) -> None:
        seen.append(f)
        if len(seen) == 1:
            first.set()
            time.sleep(0.5)  # the reader is busy while the rest arrive
        if len(seen) == frames + 1:
            done.set()

    b = Transport(1, ("127.0.0.1", 0), {}, codec, on_frame=on_frame)
    # Room for the whole backlog, as a long-lived connection's autotuned buffer has; with the
    # default first window, the sender would wait for the reader and arrive at its pace.
    b._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    a = Transport(0, ("127.0.0.1", 0), {1: b.address}, codec, lambda f: None)
    b.set_peer(0, a.address)
    with a, b:
        payload = b"x" * frame_bytes
        a.send(1, Frame(FrameKind.PAYLOAD, 0, run, payload=payload))
        assert first.wait(10)
        for _ in range(frames - 1):
            a.send(1, Frame(FrameKind.PAYLOAD, 0, run, payload=payload))
            time.sleep(0.002)
        time.sleep(0.6)  # a gap closes the burst
        a.send(1, Frame(FrameKind.PAYLOAD, 0, run, payload=payload))
        assert done.wait(10)
        nbytes, seconds = b.arrival_rates()[0]
    assert nbytes >= 10 * frame_bytes, (nbytes, seconds)
    rate = nbytes / seconds
    # Sent at about 30 MB/s (sleeps run long, never short), read from the backlog at several
    # hundred MB/s. Loopback's 64 KiB packets coalesce in the receive queue under one stamp
    # (the latest), a few frames to a stamp, which blurs the burst's ends by a few ms.
    assert 5e6 < rate < 1e8, rate
