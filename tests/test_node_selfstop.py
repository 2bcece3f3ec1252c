"""A worker whose coordinator dies: it waits for a restarted one, and stops by itself when none
comes back within ``CONNECT_ATTEMPTS`` x 0.5 s (30 s). Real sockets on loopback, no root; the
coordinator is a listening socket that only answers the handshake, since only its presence
matters here."""

from __future__ import annotations

import queue
import socket
import threading
import time

import pytest

from crew.config import RunConfig
from crew.runtime import node as node_mod
from crew.runtime.node import Node
from crew.wire.frames import COORDINATOR, FrameCodec
from crew.wire.session import accept_session
from crew.wire.transport import FrameStream
from lab.studies.workerstart import free_ports

SECRET = b"selfstop-secret-0123456789abcdef"
ATTEMPTS = 4  # x 0.5 s: the test's stand-in for the 30 s window


def _cfg(coordinator_port: int) -> RunConfig:
    return RunConfig(
        run_id="selfstop",
        run_num=3,
        run_dir="/nonexistent",
        secret_path="/nonexistent",
        n=2,
        p=2,
        scheme="crew",
        coordinator_host="127.0.0.1",
        coordinator_port=coordinator_port,
        data_port=0,
        data_ports=tuple(free_ports(2)),
        identities=("127.0.0.1", "127.0.0.1"),
        bw_mbit=((0.0, 100.0), (100.0, 0.0)),
    )


class BareCoordinator:
    """Accepts connections and answers their handshakes, in a thread; nothing else."""

    def __init__(self) -> None:
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.srv.settimeout(0.2)
        self.accepted: queue.Queue[FrameStream] = queue.Queue()
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        codec = FrameCodec(SECRET, 3)
        while not self.closed.is_set():  # bounded by the test's close()
            try:
                sock, _ = self.srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            stream = FrameStream(sock, codec)
            try:
                accept_session(stream, COORDINATOR, 5.0, [codec], lambda *_: True)
            except OSError:
                stream.close()
                continue
            self.accepted.put(stream)

    def port(self) -> int:
        return int(self.srv.getsockname()[1])

    def next(self) -> FrameStream:
        return self.accepted.get(timeout=10.0)

    def close(self) -> None:
        self.closed.set()
        self.srv.close()
        self.thread.join(5.0)


@pytest.fixture
def coordinator(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(node_mod, "CONNECT_ATTEMPTS", ATTEMPTS)
    srv = BareCoordinator()
    yield srv
    srv.close()


def test_the_default_window_is_thirty_seconds() -> None:
    assert Node.connect.__defaults__ == (None,)  # read at the call, so it can be patched
    assert node_mod.CONNECT_ATTEMPTS * 0.5 == 30.0


def test_a_worker_stops_by_itself_when_the_coordinator_stays_away(
    coordinator: BareCoordinator,
) -> None:
    assert node_mod.CONNECT_ATTEMPTS == ATTEMPTS
    node = Node(_cfg(coordinator.port()), 0, 16, secret=SECRET)
    try:
        assert node.start()
        conn = coordinator.next()  # its registration
        coordinator.close()  # the coordinator dies and nothing listens any more
        conn.close()
        lost = time.monotonic()
        assert node.stop_event.wait(ATTEMPTS * 0.5 + 8.0), "the worker kept waiting"
        waited = time.monotonic() - lost
        assert waited >= ATTEMPTS * 0.5 * 0.8, f"it gave up after {waited:.1f} s"
        assert node.settle(timeout=1.0) is None  # a training loop waiting on it is released
    finally:
        node.close()


def test_a_worker_registers_again_with_a_coordinator_that_comes_back(
    coordinator: BareCoordinator,
) -> None:
    node = Node(_cfg(coordinator.port()), 0, 16, secret=SECRET)
    try:
        assert node.start()
        first = coordinator.next()
        first.close()  # the connection breaks; the listener (a restarted coordinator) is there
        again = coordinator.next()
        assert again.recv(idle_timeout=5.0).kind.name == "CONTROL", "no registration"
        again.close()
        assert not node.stop_event.is_set()
    finally:
        node.close()
