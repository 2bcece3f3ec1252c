"""A connection's outbox: ordered sends that never block the caller, and a bounded queue."""

from __future__ import annotations

import socket
import time

from crew.wire.frames import FrameCodec, control_body, control_frame
from crew.wire.outbox import Outbox
from crew.wire.transport import FrameStream

CODEC = FrameCodec(b"outbox test secret", 7)


def _pair(stall_timeout: float | None = 30.0) -> tuple[FrameStream, FrameStream]:
    a, b = socket.socketpair()
    return FrameStream(a, CODEC, stall_timeout), FrameStream(b, CODEC, stall_timeout)


def test_frames_arrive_in_order_and_flush_waits_for_them() -> None:
    sender, receiver = _pair()
    box = Outbox(sender, "test")
    for k in range(20):
        assert box.put(control_frame(0, 7, {"k": k}))
    assert box.flush(5.0)
    got = [control_body(receiver.recv())["k"] for _ in range(20)]
    assert got == list(range(20))
    box.close(wait_s=5.0)
    assert not box.put(control_frame(0, 7, {"k": 99}))  # closed
    sender.close()
    receiver.close()


def test_a_peer_that_never_reads_fills_the_queue_and_is_dropped_without_blocking() -> None:
    sender, receiver = _pair(stall_timeout=None)
    box = Outbox(sender, "stalled", max_frames=8)
    big = {"pad": "x" * 200_000}  # a few of these fill the socket buffers; the peer never reads
    results = [box.put(control_frame(0, 7, big)) for _ in range(64)]
    # put() never waited for the network: the queue filled, the peer was dropped...
    assert results.count(False) > 0 and box.overflowed
    # ...and its connection shut down, so its reader sees the end.
    receiver.sock.settimeout(5.0)
    seen = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            chunk = receiver.sock.recv(1 << 20)
        except OSError:
            break
        if not chunk:
            break
        seen += len(chunk)
    assert seen < 64 * 200_000  # not everything was sent: the rest was dropped with the peer
    box.close(wait_s=5.0)
    sender.close()
    receiver.close()
