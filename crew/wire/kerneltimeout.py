"""Stall timeouts kept by the kernel (SO_RCVTIMEO, SO_SNDTIMEO) on a blocking socket.

Why not Python's own ``settimeout``: it makes the descriptor non-blocking and waits in
``poll()`` before each call, so every partial send or receive (a loopback or WAN socket
returns a frame in pieces of a few KB to 64 KB) comes back into Python, drops and retakes the
GIL, and wakes whichever thread waits for it. With the timeout in the kernel, one blocking
``sendmsg`` queues a whole frame and one ``recv_into(..., MSG_WAITALL)`` fills a whole
payload, each a single trip through Python. On the data path's loopback study the futex
wake-ups of those hand-offs were a quarter of the process's CPU.

Semantics kept: a call that moves no byte for ``seconds`` fails with ``TimeoutError``; a call
that moved some bytes and then stalled returns them (the caller loops and the next call
times out). ``None`` waits indefinitely.
"""

from __future__ import annotations

import socket
import struct


def _timeval(seconds: float | None) -> bytes:
    if seconds is None:
        return struct.pack("ll", 0, 0)  # 0: no timeout
    if seconds <= 0:
        raise ValueError(f"a stall timeout must be > 0 s, got {seconds}")
    whole = int(seconds)
    micros = min(int(round((seconds - whole) * 1e6)), 999_999)
    if whole == micros == 0:  # below a microsecond: 0 would mean "no timeout"
        micros = 1
    return struct.pack("ll", whole, micros)


def set_kernel_timeout(sock: socket.socket, seconds: float | None) -> None:
    """Make ``sock`` blocking with a kernel stall timeout of ``seconds`` both ways."""
    sock.settimeout(None)
    tv = _timeval(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def kernel_timeout(sock: socket.socket) -> float | None:
    """The receive stall timeout set by :func:`set_kernel_timeout` (None: none)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.calcsize("ll"))
    whole, micros = struct.unpack("ll", raw)
    return None if whole == micros == 0 else whole + micros / 1e6


def recv_into_all(sock: socket.socket, view: memoryview, n: int) -> int:
    """Up to ``n`` bytes into ``view`` in one call that waits for all of them; fewer when the
    peer closed (0 at once) or the kernel's stall timeout ran out after some bytes. Raises
    ``TimeoutError`` when the timeout ran out before any byte."""
    try:
        return sock.recv_into(view, n, socket.MSG_WAITALL)
    except BlockingIOError as exc:  # EAGAIN: SO_RCVTIMEO ran out with nothing received
        raise TimeoutError(exc.errno, "no bytes before the stall timeout") from None


def sendmsg_some(sock: socket.socket, views: list[memoryview]) -> int:
    """Bytes of ``views`` queued by one blocking ``sendmsg``; ``TimeoutError`` when the
    kernel's stall timeout ran out before any byte was."""
    try:
        return sock.sendmsg(views)
    except BlockingIOError as exc:  # EAGAIN: SO_SNDTIMEO ran out with nothing sent
        raise TimeoutError(exc.errno, "no bytes sent before the stall timeout") from None
