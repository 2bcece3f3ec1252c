"""The shared accept loop survives running out of file descriptors, and ends when stopped."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from crew.wire.listener import REFUSED_SOURCES_KEPT, ConnectionLimit, accept_loop

# A child process with a small descriptor limit: a flood of connections exhausts it, so
# accept() fails with EMFILE. Once the flood's sockets close, a new client must still be
# accepted: the loop backed off instead of ending.
CHILD = textwrap.dedent(
    """
    import os, resource, socket, threading, time
    from crew.wire.listener import accept_loop

    FLOOD = 20
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    port = listener.getsockname()[1]
    accepted, stop = [], threading.Event()
    flood = [socket.create_connection(("127.0.0.1", port)) for _ in range(FLOOD)]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Room for 6 accepted sockets: the 7th accept() fails with EMFILE, and keeps failing.
    top = max(int(fd) for fd in os.listdir("/proc/self/fd"))  # the limit is on fd numbers
    resource.setrlimit(resource.RLIMIT_NOFILE, (top + 7, hard))
    def on_accept(sock, addr):
        accepted.append(sock)

    t = threading.Thread(target=lambda: accept_loop(listener, stop.is_set, on_accept, name="t"))
    t.start()
    deadline = time.monotonic() + 10
    while len(accepted) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    exhausted = len(accepted)
    for s in flood + accepted:
        s.close()
    accepted.clear()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    late = socket.create_connection(("127.0.0.1", port))
    want = FLOOD - exhausted + 1  # the flood's queued rest, then the late client
    deadline = time.monotonic() + 10
    while len(accepted) < want and time.monotonic() < deadline:
        time.sleep(0.01)
    print(exhausted, len(accepted) - want + 1, t.is_alive())
    stop.set()
    t.join(5)
    print(t.is_alive())
    """
)


def test_the_loop_goes_on_after_the_descriptor_table_was_full() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    exhausted, late_accepted, alive_after_flood, alive_after_stop = out
    assert 0 < int(exhausted) < 20  # the table did fill: not every flood socket was accepted
    assert int(late_accepted) >= 1  # a client after the flood is accepted
    assert alive_after_flood == "True"
    assert alive_after_stop == "False"


def test_the_loop_ends_when_the_listener_is_closed() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    t = threading.Thread(
        target=lambda: accept_loop(listener, lambda: False, lambda s, a: s.close(), name="t"),
        daemon=True,
    )
    t.start()
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    t.join(5)
    assert not t.is_alive()


def _serve(
    limit: ConnectionLimit,
) -> tuple[int, list[socket.socket], threading.Event, threading.Thread]:
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    accepted: list[socket.socket] = []
    stop = threading.Event()
    t = threading.Thread(
        target=lambda: accept_loop(
            listener, stop.is_set, lambda s, a: accepted.append(s), name="t", limit=limit
        ),
        daemon=True,
    )
    t.start()
    return listener.getsockname()[1], accepted, stop, t


def _refused(client: socket.socket) -> bool:
    """The server closed this connection at once (read returns EOF or a reset)."""
    client.settimeout(5.0)
    try:
        return client.recv(1) == b""
    except ConnectionResetError:
        return True


def test_connections_over_the_per_source_cap_are_closed_at_once_and_a_slot_frees() -> None:
    limit = ConnectionLimit(max_total=10, max_per_source=2)
    port, accepted, stop, t = _serve(limit)
    try:
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        assert all(_refused(c) for c in clients[2:])
        deadline = time.monotonic() + 5
        while len(accepted) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(accepted) == 2 and limit.refused == {"127.0.0.1": 2}
        accepted[0].close()  # its owner closed it: the source has a free slot again
        late = socket.create_connection(("127.0.0.1", port))
        deadline = time.monotonic() + 5
        while len(accepted) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(accepted) == 3
        for c in [*clients, late]:
            c.close()
    finally:
        stop.set()
        t.join(5)


def test_the_total_cap_counts_every_source_and_refusals_are_kept_bounded() -> None:
    limit = ConnectionLimit(max_total=1, max_per_source=5)
    a, b = socket.socket(), socket.socket()
    assert limit.admit(a, "10.0.0.1")
    assert not limit.admit(b, "10.0.0.2")  # another source, but the listener is full
    for k in range(REFUSED_SOURCES_KEPT + 10):
        limit.admit(socket.socket(), f"10.1.0.{k}")
    assert len(limit.refused) == REFUSED_SOURCES_KEPT
    a.close()
    assert limit.admit(b, "10.0.0.2")
    b.close()
    with pytest.raises(ValueError, match="limits must be >= 1"):
        ConnectionLimit(max_total=0)
