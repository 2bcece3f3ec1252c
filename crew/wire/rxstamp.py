"""When the kernel received the bytes a read returns, for timing a link from its receiver.

A receiver learns a link's rate from how fast a peer's frames arrive back to back
(``crew.wire.transport.ArrivalRate``). Timed when a Python thread has read each frame, that
rate measures the thread's scheduling as much as the link: eight workers with a few hundred
threads on two cores wake a reader tens of milliseconds late, then it reads a backlog in a
burst, and a group's few hundred KB on a link last about that long. The kernel timestamps each
packet as it is received (``SO_TIMESTAMPING`` with ``SOF_TIMESTAMPING_RX_SOFTWARE``) and a TCP
read reports the stamp of the last packet it copied, so a frame's arrival time is when its last
byte reached this host, however late the reader runs.

Stamps are ``CLOCK_REALTIME`` seconds; only differences between stamps of one connection are
used. Where the socket option is missing (not Linux), :func:`enable` says so and callers time
reads themselves with :func:`time.time`, in the same clock.

Granularity: packets that queue unread are coalesced in the receive queue, and a coalesced
packet keeps the latest stamp; a read then reports when the last of them arrived. Over the
lab's links (MTU 1500, offloads off) that is at most a few tens of KB; over loopback's 64 KiB
packets, a few frames.

Cost model: one ``recvmsg_into`` instead of ``recv_into`` per read of a frame's body (headers
are read as before), with a 64-byte ancillary buffer to parse: about a microsecond per frame of
up to 64 KiB.
"""

from __future__ import annotations

import socket
import struct

SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)  # Linux's number on every arch
_SOF_RX_SOFTWARE = 1 << 3  # stamp packets as the stack receives them
_SOF_SOFTWARE = 1 << 4  # report software stamps
_ANCILLARY_BYTES = socket.CMSG_SPACE(3 * 16)  # struct scm_timestamping: three timespecs
_TIMESPEC = struct.Struct("qq")


def enable(sock: socket.socket) -> bool:
    """Ask the kernel to stamp what ``sock`` receives; False where it cannot."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _SOF_RX_SOFTWARE | _SOF_SOFTWARE)
    except OSError:
        return False
    return True


def recv_into_stamped(sock: socket.socket, view: memoryview, n: int) -> tuple[int, float | None]:
    """Up to ``n`` bytes into ``view`` (as ``recv_into``), and the kernel's receive time of the
    last packet they came from, or None when the read carried no stamp."""
    k, ancillary, _flags, _addr = sock.recvmsg_into([view[:n]], _ANCILLARY_BYTES)
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(data)
            if sec or nsec:
                return k, sec + nsec * 1e-9
    return k, None
