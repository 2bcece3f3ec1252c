"""crew.wire.kerneltimeout: stall timeouts kept by the kernel on blocking sockets."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from crew.wire.kerneltimeout import (
    kernel_timeout,
    recv_into_all,
    sendmsg_some,
    set_kernel_timeout,
)


@pytest.fixture
def pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_the_timeout_is_kept_by_the_kernel_and_the_socket_blocks(pair) -> None:
    a, _ = pair
    set_kernel_timeout(a, 1.25)
    assert a.gettimeout() is None  # blocking: Python no longer polls before each call
    assert kernel_timeout(a) == pytest.approx(1.25, abs=0.01)  # kept in jiffies
    set_kernel_timeout(a, None)
    assert kernel_timeout(a) is None
    with pytest.raises(ValueError, match="must be > 0"):
        set_kernel_timeout(a, 0)


def test_a_payload_sent_in_pieces_arrives_in_one_call(pair) -> None:
    a, b = pair
    set_kernel_timeout(b, 5.0)
    data = bytes(range(256)) * 64

    def dribble() -> None:
        for k in range(0, len(data), 4096):
            a.sendall(data[k : k + 4096])
            time.sleep(0.01)

    sender = threading.Thread(target=dribble)
    sender.start()
    buf = bytearray(len(data))
    got = recv_into_all(b, memoryview(buf), len(data))
    sender.join(10)
    assert got == len(data) and bytes(buf) == data


def test_a_stall_before_any_byte_times_out(pair) -> None:
    _, b = pair
    set_kernel_timeout(b, 0.2)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        recv_into_all(b, memoryview(bytearray(10)), 10)
    assert 0.15 <= time.monotonic() - started < 5.0


def test_a_stall_after_some_bytes_returns_them(pair) -> None:
    a, b = pair
    set_kernel_timeout(b, 0.2)
    a.sendall(b"abc")
    buf = bytearray(10)
    assert recv_into_all(b, memoryview(buf), 10) == 3
    assert bytes(buf[:3]) == b"abc"


def test_a_closed_peer_reads_as_zero_bytes(pair) -> None:
    a, b = pair
    set_kernel_timeout(b, 5.0)
    a.close()
    assert recv_into_all(b, memoryview(bytearray(4)), 4) == 0


def test_a_send_to_a_peer_that_never_reads_times_out(pair) -> None:
    a, _ = pair
    set_kernel_timeout(a, 0.2)
    chunk = [memoryview(bytes(1 << 16))]
    with pytest.raises(TimeoutError):
        for _ in range(10_000):  # the buffers hold a few MB at most
            sendmsg_some(a, chunk)
