"""A peer's new connection ends its older one, which a cut link can leave half-open."""

from __future__ import annotations

import socket
import threading
import time

from crew.wire.frames import Frame, FrameCodec, FrameKind
from crew.wire.session import open_session
from crew.wire.transport import FrameStream, Transport

RUN = 11
SECRET = b"s" * 32


def test_a_peers_new_connection_shuts_its_idle_older_one() -> None:
    codec = FrameCodec(SECRET, RUN)
    got = threading.Event()
    b = Transport(1, ("127.0.0.1", 0), {}, codec, on_frame=lambda f: got.set())
    a = Transport(0, ("127.0.0.1", 0), {1: b.address}, codec, lambda f: None)
    b.set_peer(0, a.address)
    with a, b:
        # Peer 0's earlier connection: authenticated, then silent, as one whose link was cut
        # while idle (its peer's FIN or reset never arrives).
        stale = FrameStream(socket.create_connection(b.address, timeout=5), codec)
        open_session(stale, 0, 5.0)
        deadline = time.monotonic() + 5
        while len(b._inbound) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        a.send(1, Frame(FrameKind.PAYLOAD, 0, RUN, payload=b"x" * 100))
        assert got.wait(10)
        stale.sock.settimeout(5.0)
        assert stale.sock.recv(1) == b""  # shut down by b, not left waiting
        deadline = time.monotonic() + 5
        while len(b._inbound) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(b._inbound) == 1  # the old reader thread ended and let go of its socket
        stale.close()
