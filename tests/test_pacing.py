"""Pacing of data connections: the configured rate reaches the socket; the node's rates."""

from __future__ import annotations

import socket
import threading

import pytest

from crew.runtime.node import link_pacing, pace_fraction
from crew.wire.frames import Frame, FrameCodec, FrameKind
from crew.wire.transport import _SO_MAX_PACING_RATE, Transport

RUN = 3
SECRET = b"p" * 32


def test_transport_paces_its_connection_at_the_given_rate() -> None:
    codec = FrameCodec(SECRET, RUN)
    got = threading.Event()
    b = Transport(1, ("127.0.0.1", 0), {}, codec, on_frame=lambda f: got.set())
    a = Transport(0, ("127.0.0.1", 0), {1: b.address}, codec, lambda f: None, pacing={1: 1.25e6})
    b.set_peer(0, a.address)  # b accepts HELLOs from known peers only
    with a, b:
        a.send(1, Frame(FrameKind.PAYLOAD, 0, RUN, payload=b"x" * 1000))
        assert got.wait(10)
        stream = a._links[1].stream
        assert stream is not None
        rate = stream.sock.getsockopt(socket.SOL_SOCKET, _SO_MAX_PACING_RATE)
        assert rate == 1_250_000
        a.pace(1, None)
        unpaced = stream.sock.getsockopt(socket.SOL_SOCKET, _SO_MAX_PACING_RATE)
        assert unpaced & 0xFFFF_FFFF == 0xFFFF_FFFF  # ~0U, read back as a signed int


def test_link_pacing_is_a_fraction_of_each_known_link_rate() -> None:
    bw = ((0.0, 100.0, 0.0), (8.0, 0.0, 16.0), (1.0, 1.0, 0.0))
    assert link_pacing(1, bw, 0.5) == {0: 0.5e6, 2: 1e6}
    assert link_pacing(0, bw, 0.95) == {1: pytest.approx(0.95 * 12.5e6)}  # 0 Mbit/s: unknown
    assert link_pacing(1, bw, 0.0) == {}


def test_pace_fraction_rejects_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CREW_PACE", "0.9")
    assert pace_fraction() == 0.9
    monkeypatch.setenv("CREW_PACE", "fast")
    with pytest.raises(ValueError, match="CREW_PACE"):
        pace_fraction()
    monkeypatch.setenv("CREW_PACE", "2")
    with pytest.raises(ValueError, match="between 0 and 1"):
        pace_fraction()
