"""Framed, authenticated TCP transport for the CREW data plane (and FrameStream for control).

Threads, not asyncio: the worker's training loop is blocking torch code, and the transport must
keep moving bytes while it runs. Python threads suffice because socket I/O and the frame MAC over
large buffers (blake3) release the GIL.

Topology of one ``Transport``:

* one listening socket and an accept thread;
* one reader thread per inbound connection. It opens with the handshake of
  :mod:`crew.wire.session` (a HELLO from a known peer id, answered with a CHALLENGE; then keys
  of the connection's own); every later frame goes to ``on_frame`` in that thread, in arrival
  order;
* one sender thread per destination, which owns the outbound connection to that peer (connected
  lazily, with bounded retries) and a queue served in ``FlowOrder``.

So each ordered pair of workers uses its own TCP connection per direction. That mirrors the
capacity model: ``BW[i][j]`` is the rate of the directed connection i->j, and the sender of i->j
decides alone which queued frame goes next.

Failure model: a connect that fails until ``connect_timeout``, a reset, or a send that makes no
progress for ``stall_timeout`` fails the link. The sender then reports every frame it had not
finished sending through ``on_send_error(dst, err, frames)`` exactly once, drops the connection,
and reconnects on the next ``send``. A frame reported there may still have reached the peer (the
kernel may have sent it before the reset), so callers that fail over must tolerate duplicates;
conversely TCP may lose frames that were fully written to the kernel when the peer died, which
only a higher-level timeout can detect.

A frame that fails to decode poisons its connection (the byte stream is out of sync), so the
reader counts it, calls ``on_reject`` and closes that one connection; other connections go on.
"""

from __future__ import annotations

import collections
import enum
import errno
import heapq
import itertools
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from crew.wire.frames import (
    SEND_BACKLOG_BYTES,
    Frame,
    FrameCodec,
    FrameError,
    FrameKind,
    Oversized,
    control_frame,
    wire_size,
)
from crew.wire.listener import Address, accept_loop
from crew.wire.session import HELLO_BYTES, HandshakeError, accept_session, open_session

log = logging.getLogger(__name__)

OnFrame = Callable[[Frame], None]
OnSendError = Callable[[int, BaseException, list[Frame]], None]
OnReject = Callable[[Address, FrameError], None]

_ACCEPT_POLL_S = 0.25  # how often the accept thread checks for close()
_WAIT_POLL_S = 1.0  # idle sender threads re-check their state at this period
_JOIN_BUDGET_S = 5.0  # close() waits at most this long for all threads together
_CONNECT_BACKOFF_S = (0.05, 1.0)  # first and largest pause between connect attempts
_LOG_INTERVAL_S = 5.0  # at most one warning per reason and interval


class FrameTrace:
    """Per-frame timestamps for finding where an op's time goes (off unless asked for).

    ``CREW_FRAME_TRACE=<dir>`` makes every Transport append one line per event to
    ``<dir>/frames-w<me>.tsv``: monotonic time, event (``q`` queued, ``s`` send started,
    ``e`` send ended, ``r`` received), peer, kind, group, rev, block, offset, payload bytes.
    CLOCK_MONOTONIC is one clock for every namespace of the host, so lines of different
    workers compare directly."""

    def __init__(self, directory: str, me: int) -> None:
        os.makedirs(directory, exist_ok=True)
        self._file = open(  # noqa: SIM115 - lives as long as the transport
            os.path.join(directory, f"frames-w{me}.tsv"), "a", buffering=1 << 16
        )
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, me: int) -> FrameTrace | None:
        directory = os.environ.get("CREW_FRAME_TRACE")
        return cls(directory, me) if directory else None

    def event(self, what: str, peer: int, frame: Frame) -> None:
        line = (
            f"{time.monotonic():.6f}\t{what}\t{peer}\t{frame.kind.name}\t{frame.group}\t"
            f"{frame.rev}\t{frame.block}\t{frame.offset}\t{frame.nbytes}\n"
        )
        with self._lock:
            self._file.write(line)

    def close(self) -> None:
        with self._lock:
            self._file.close()


class FlowOrder(enum.Enum):
    """Which queued frame a sender puts on its link next."""

    FCFS = "fcfs"  # enqueue order
    EARLIEST_GROUP = "egf"  # lowest group id first, then enqueue order
    FAIR = "fair"  # round-robin between groups that have queued frames, one frame each


class StreamClosed(ConnectionError):
    """The peer closed the connection cleanly, between two frames."""


class StreamStalled(TimeoutError):
    """A send or a partly received frame made no progress within the stall timeout."""


class ImpersonationError(FrameError):
    """A frame named another sender than the peer whose connection carried it."""


class PeerUnreachable(ConnectionError):
    """Could not connect to a peer within the connect timeout."""


class _LogLimiter:
    """Lets one message per key through per interval and counts the rest."""

    def __init__(self, interval: float = _LOG_INTERVAL_S) -> None:
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def allow(self, key: str) -> int | None:
        """None to stay silent, else the number of messages suppressed since the last one."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                self._suppressed[key] += 1
                return None
            self._last[key] = now
            return self._suppressed.pop(key, 0)


def _sendmsg_all(sock: socket.socket, parts: list[bytes | memoryview]) -> None:
    """Send every byte of ``parts`` with as few syscalls as the kernel allows (no joining copy)."""
    views = [memoryview(p) for p in parts if len(p)]
    while views:
        sent = sock.sendmsg(views)
        while sent and views:
            first = views[0].nbytes
            if sent >= first:
                sent -= first
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


# Congestion control of every data connection. Not BBR, which this machine's kernel uses by
# default: BBR caps its window at about twice bandwidth x *minimum* RTT, and on a lab link (no
# delay) that minimum is ~0.1 ms, so the window floors at 4 packets. When both directions of a
# pair carry data at once (every a2a-like plan does), the ACKs of i->j wait behind j->i's data
# in j->i's HTB queue (up to ~50 ms), and i->j then moves 4 packets per 50 ms: about 1 Mbit/s
# until the queue drains. Loss-based CUBIC grows its window past the inflated RTT instead
# (docs/decisions/2026-12-01-cubic-on-the-data-plane.md). ``CREW_TCP_CC`` overrides it (e.g.
# ``bbr``, or empty for the system default).
TCP_CONGESTION = "cubic"


def tcp_congestion() -> str:
    return os.environ.get("CREW_TCP_CC", TCP_CONGESTION)


_cc_warned = threading.Event()

# Unsent bytes a connection may hold in the kernel (TCP_NOTSENT_LOWAT). Without a cap the
# kernel's send buffer grows to megabytes, one first-come-first-served queue behind which the
# sender's priorities (``Transport.send``) mean nothing: a relay's forwarded part would wait
# there behind everything its node had queued for that link. 64 KiB is ~26 ms at 20 Mbit/s and
# 0.5 ms at 1 Gbit/s; bytes in flight (sent, not yet acknowledged) do not count, so the link
# still runs full. ``CREW_NOTSENT_LOWAT`` overrides it (0: the system default); the planner
# counts the default at every hop (``RunConfig.hop_backlog_bytes``), so set both.
NOTSENT_LOWAT = SEND_BACKLOG_BYTES
_TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)  # Linux's option number


def notsent_lowat() -> int:
    return int(os.environ.get("CREW_NOTSENT_LOWAT", NOTSENT_LOWAT))


# Pacing (SO_MAX_PACING_RATE): a socket with a maximum pacing rate is paced by TCP itself
# (sk_pacing_status "needed"), no fq qdisc required. On this lab's kernel (6.18), one CUBIC
# flow through an HTB class of 100 Mbit/s with a 50 ms pfifo, MTU 1500, no offloads:
# unpaced 95.5 Mbit/s with 68-136 KB standing in the HTB queue and an RTT of 16-27 ms; paced at
# 95 Mbit/s, 95.1 Mbit/s with the queue empty (<= 660 B) and an RTT of 3.9 ms. Pacing a little
# below a link's rate thus removes the per-hop queueing delay (and the ACK delay of the
# opposite direction) at a cost of the few percent below the rate. Off unless asked for.
_SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)  # Linux's option number


def set_pacing(sock: socket.socket, bytes_per_s: float | None) -> bool:
    """Cap ``sock``'s send rate at ``bytes_per_s`` (None or <= 0: no cap); False if the
    kernel refused (the socket then sends unpaced)."""
    value = 0xFFFF_FFFF if not bytes_per_s or bytes_per_s <= 0 else int(bytes_per_s)
    try:
        # An unsigned 32-bit value (~0U is "no cap"): as a Python int it would overflow C's int.
        packed = struct.pack("=I", min(value, 0xFFFF_FFFF))
        sock.setsockopt(socket.SOL_SOCKET, _SO_MAX_PACING_RATE, packed)
    except OSError:
        return False
    return True


def _tune(sock: socket.socket, stall_timeout: float | None) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):  # also usable over Unix sockets
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if stall_timeout is not None and hasattr(socket, "TCP_USER_TIMEOUT"):
            # A link that silently drops everything (a cut WAN link) leaves data unacknowledged
            # without ever filling the send buffer; the kernel then fails the socket for us.
            ms = max(1000, int(stall_timeout * 1000))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, ms)
        lowat = notsent_lowat()
        if lowat > 0:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, _TCP_NOTSENT_LOWAT, lowat)
            except OSError:
                pass  # not a Linux kernel: the sender's priorities act on its own queue only
        cc = tcp_congestion()
        if cc and hasattr(socket, "TCP_CONGESTION"):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
            except OSError as e:  # not built into this kernel: keep the system default
                if not _cc_warned.is_set():
                    _cc_warned.set()
                    log.warning("transport: TCP congestion control %r unavailable: %s", cc, e)
    sock.settimeout(stall_timeout)


# errno values that mean the peer's process, not the path to it, went away.
_PEER_RESTARTED = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})


def _pending_error(stream: FrameStream | None) -> OSError | None:
    """The error the kernel recorded on an idle connection (SO_ERROR), if any; a connection
    the peer closed counts as reset (``_peer_closed``)."""
    if stream is None:
        return None
    try:
        code = stream.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    except OSError as e:  # closed under us
        return e
    if code:
        return OSError(code, f"idle connection failed: {os.strerror(code)}")
    if _peer_closed(stream):
        return ConnectionResetError(errno.ECONNRESET, "the peer closed the connection")
    return None


def _peer_closed(stream: FrameStream) -> bool:
    """Whether the peer closed this outbound connection (its FIN arrived: the process exited).

    Why it matters: the kernel still accepts writes on such a connection until the peer's
    reset comes back, and the frames written meanwhile are lost without an error. A restarted
    worker would miss the first parts of its first group, which then stalls until revised."""
    try:
        # Poll first: with a socket timeout set, Python's recv waits for readability itself.
        poller = select.poll()
        poller.register(stream.sock, select.POLLIN)
        if not poller.poll(0):
            return False  # open, nothing to read: the usual case
        return stream.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except (OSError, ValueError):
        return True  # closed under us


class FrameStream:
    """A connected socket that carries frames both ways.

    ``send`` is thread-safe (one ``sendmsg`` of header, payload and tag per frame, under a lock);
    ``recv`` must be called from one thread at a time. The socket timeout is the stall timeout:
    a send, or a frame whose first bytes arrived, that makes no progress for that long raises
    StreamStalled. Waiting *between* frames is not a stall; ``recv(idle_timeout=...)`` bounds it.
    """

    def __init__(
        self, sock: socket.socket, codec: FrameCodec, stall_timeout: float | None = 30.0
    ) -> None:
        self.sock = sock
        self.codec = codec
        self._send_lock = threading.Lock()
        self._closed = False
        _tune(sock, stall_timeout)

    @classmethod
    def connect(
        cls,
        addr: Address,
        codec: FrameCodec,
        *,
        timeout: float = 5.0,
        stall_timeout: float | None = 30.0,
    ) -> FrameStream:
        """One connection attempt, bounded by ``timeout``."""
        sock = socket.create_connection(addr, timeout=timeout)
        return cls(sock, codec, stall_timeout)

    def set_stall_timeout(self, seconds: float | None) -> None:
        self.sock.settimeout(seconds)

    def send(self, frame: Frame) -> int:
        """Send one frame; returns its wire size. Raises StreamStalled or OSError."""
        with self._send_lock:
            # Encoded under the lock: a session numbers its frames in the order they go out.
            parts = self.codec.encode(frame)
            try:
                _sendmsg_all(self.sock, parts)
            except TimeoutError:
                raise StreamStalled(
                    f"send made no progress for {self.sock.gettimeout()} s"
                ) from None
        return wire_size(frame)

    def send_control(self, sender: int, run: int, body: dict, to: str) -> bool:
        """Send one control message; a failed send is logged, naming ``to``, and returns
        False (the reader of this stream sees the connection end and reports it)."""
        try:
            self.send(control_frame(sender, run, body))
        except OSError as exc:
            log.warning("send to %s failed: %s", to, exc)
            return False
        return True

    def recv(self, idle_timeout: float | None = None) -> Frame:
        """The next frame.

        Raises StreamClosed on a clean close between frames, TimeoutError if no frame starts
        within ``idle_timeout`` (None: wait indefinitely), StreamStalled if a started frame
        stalls, FrameError for a bad frame, OSError for a broken connection.
        """
        first = True

        def recv_exact(n: int) -> bytes | bytearray:
            nonlocal first
            at_boundary, first = first, False
            if at_boundary and idle_timeout is not None and not self._wait_readable(idle_timeout):
                raise TimeoutError(f"no frame within {idle_timeout} s")
            data = self._read(n, at_boundary)
            if at_boundary and not data:
                raise StreamClosed("peer closed the connection")
            return data

        return self.codec.read_frame(recv_exact)

    def recv_raw(self, n: int, idle_timeout: float | None = None) -> bytes:
        """Up to ``n`` bytes as they come (fewer only if the stream ended): a handshake's
        fixed-size first frame, read before it is known which key verifies it. Raises
        StreamClosed, TimeoutError, StreamStalled or OSError like ``recv``."""
        if idle_timeout is not None and not self._wait_readable(idle_timeout):
            raise TimeoutError(f"no frame within {idle_timeout} s")
        data = self._read(n, True)
        if not data:
            raise StreamClosed("peer closed the connection")
        return bytes(data)

    def _wait_readable(self, timeout: float) -> bool:
        if self.sock.fileno() < 0:  # closed by its owner under this reader
            raise OSError(errno.EBADF, "the stream was closed")
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout * 1000))))

    def _read(self, n: int, at_boundary: bool) -> bytes | bytearray:
        """n bytes, or fewer at end of stream. Timeouts before the first byte of a frame are idle
        time and are waited out; timeouts after it are stalls."""
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            try:
                k = self.sock.recv_into(view[got:], n - got)
            except TimeoutError:
                if at_boundary and got == 0:
                    continue
                raise StreamStalled(
                    f"frame stalled: no bytes for {self.sock.gettimeout()} s"
                ) from None
            if k == 0:
                break
            got += k
        view.release()
        del buf[got:]  # in place: a copy would briefly double a truncated maximum-size frame
        return buf

    def shutdown(self) -> None:
        """Wake up threads blocked in recv or send (they get EOF or an error) without
        releasing the descriptor under their feet; the owner calls close() afterwards."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already disconnected

    def close(self) -> None:
        """Idempotent. Call from the thread that uses the stream, or after shutdown() and
        once other users have returned."""
        if self._closed:
            return
        self._closed = True
        self.shutdown()
        self.sock.close()


@dataclass(frozen=True)
class TransportStats:
    """Counters since start. Bytes are wire bytes (header + payload + tag, HELLOs included);
    frame counts exclude HELLOs. ``rejected_by_reason`` is keyed by FrameError class name."""

    bytes_sent: Mapping[int, int]
    bytes_received: Mapping[int, int]
    frames_sent: int
    frames_received: int
    rejected: int
    rejected_by_reason: Mapping[str, int]
    handler_errors: int = 0  # exceptions raised by on_frame
    send_failures: int = 0  # link failures reported through on_send_error


class _OrderQueue:
    """Queued frames of one destination and priority, popped in a FlowOrder. Not thread-safe."""

    def __init__(self, order: FlowOrder) -> None:
        self.order = order
        self._seq = itertools.count()
        self._fifo: collections.deque[Frame] = collections.deque()
        self._heap: list[tuple[int, int, Frame]] = []
        self._by_group: dict[int, collections.deque[Frame]] = {}
        self._rotation: collections.deque[int] = collections.deque()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, frame: Frame) -> None:
        self._len += 1
        if self.order is FlowOrder.FCFS:
            self._fifo.append(frame)
        elif self.order is FlowOrder.EARLIEST_GROUP:
            heapq.heappush(self._heap, (frame.group, next(self._seq), frame))
        else:
            q = self._by_group.get(frame.group)
            if q is None:
                q = self._by_group[frame.group] = collections.deque()
                self._rotation.append(frame.group)
            q.append(frame)

    def pop(self) -> Frame:
        if not self._len:
            raise IndexError("pop from an empty flow queue")
        self._len -= 1
        if self.order is FlowOrder.FCFS:
            return self._fifo.popleft()
        if self.order is FlowOrder.EARLIEST_GROUP:
            return heapq.heappop(self._heap)[2]
        group = self._rotation.popleft()
        q = self._by_group[group]
        frame = q.popleft()
        if q:
            self._rotation.append(group)
        else:
            del self._by_group[group]
        return frame

    def drain(self) -> list[Frame]:
        """Remove and return everything, in the order it would have been sent."""
        return [self.pop() for _ in range(self._len)]


class _FlowQueue:
    """Queued frames of one destination: lowest priority first, each priority in a FlowOrder.
    Not thread-safe."""

    def __init__(self, order: FlowOrder) -> None:
        self.order = order
        self._levels: dict[int, _OrderQueue] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, frame: Frame, priority: int = 0) -> None:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = _OrderQueue(self.order)
        level.push(frame)
        self._len += 1

    def pop(self) -> Frame:
        if not self._len:
            raise IndexError("pop from an empty flow queue")
        priority = min(self._levels)  # a handful of levels: a scan is cheapest
        level = self._levels[priority]
        frame = level.pop()
        if not len(level):
            del self._levels[priority]
        self._len -= 1
        return frame

    def drain(self) -> list[Frame]:
        """Remove and return everything, in the order it would have been sent."""
        return [f for _, f in self._drain_with_priority()]

    def _drain_with_priority(self) -> list[tuple[int, Frame]]:
        out = [(p, f) for p in sorted(self._levels) for f in self._levels[p].drain()]
        self._levels.clear()
        self._len = 0
        return out

    def remove_if(self, predicate: Callable[[Frame], bool]) -> list[Frame]:
        kept: list[tuple[int, Frame]] = []
        removed: list[Frame] = []
        for priority, frame in self._drain_with_priority():
            if predicate(frame):
                removed.append(frame)
            else:
                kept.append((priority, frame))
        # Re-pushing in pop order keeps the relative order (and FAIR's rotation) intact.
        for priority, frame in kept:
            self.push(frame, priority)
        return removed


class _Link:
    """State of one destination: queue, connection, sender thread. Guarded by ``cond``."""

    def __init__(self, dst: int, order: FlowOrder) -> None:
        self.dst = dst
        self.cond = threading.Condition()
        self.queue = _FlowQueue(order)
        self.queued_bytes = 0  # queued + in flight
        self.inflight: Frame | None = None
        self.stream: FrameStream | None = None
        self.failure: BaseException | None = None  # set by fail_peer, consumed by the sender
        self.thread: threading.Thread | None = None


class ArrivalRate:
    """The rate frames arrive at from one peer while it is sending back to back.

    Arrivals closer than ``gap_s`` apart form a burst; a burst's rate is the bytes after its
    first frame over the time from its first to its last frame, so the time the first frame
    waited in queues does not count. Only bursts of at least ``min_bytes`` are kept: a short
    one says more about socket buffers than about the link."""

    def __init__(self, gap_s: float = 0.05, min_bytes: int = 256 << 10):
        self.gap_s = gap_s
        self.min_bytes = min_bytes
        self._first = self._last = -1.0
        self._bytes = 0  # after the first frame of the current burst
        self._done_bytes = 0
        self._done_s = 0.0

    def add(self, now: float, nbytes: int) -> None:
        if self._last < 0 or now - self._last > self.gap_s:
            self._close_burst()
            self._first = now
            self._bytes = 0
        else:
            self._bytes += nbytes
        self._last = now

    def _close_burst(self) -> None:
        if self._bytes >= self.min_bytes and self._last > self._first:
            self._done_bytes += self._bytes
            self._done_s += self._last - self._first

    def take(self) -> tuple[int, float]:
        """Bytes and seconds of the bursts completed since the last call."""
        out = (self._done_bytes, self._done_s)
        self._done_bytes, self._done_s = 0, 0.0
        return out


def listen_on(host: str, ports: Iterable[int]) -> socket.socket:
    """A TCP socket listening at ``host`` on the first of ``ports`` not in use (0: any free
    port). Several processes on one host may race for the same ports: the kernel gives each
    port to one of them and the others move on. ``OSError`` (``EADDRINUSE`` when every port was
    taken) if none could be listened on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    tried: list[int] = []
    for port in ports:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            tried.append(port)
            continue
        return sock
    span = f"{tried[0]}-{tried[-1]}" if len(tried) > 1 else "".join(map(str, tried))
    raise OSError(errno.EADDRINUSE, f"every port in {span or 'an empty list'} is in use at {host}")


class Transport:
    """Peer-to-peer frame transport of one worker. See the module docstring for the model."""

    def __init__(
        self,
        me: int,
        listen: Address,
        peers: Mapping[int, Address],
        codec: FrameCodec,
        on_frame: OnFrame,
        on_send_error: OnSendError | None = None,
        on_reject: OnReject | None = None,
        flow_order: FlowOrder = FlowOrder.FCFS,
        connect_timeout: float = 5.0,
        stall_timeout: float = 30.0,
        pacing: Mapping[int, float] | None = None,
        listen_ports: Iterable[int] | None = None,
    ) -> None:
        """``pacing``: per destination, the rate (bytes/s) its connection is paced at
        (``set_pacing``); destinations not in it are not paced. ``listen_ports``: listen on the
        first of these that is free at ``listen``'s host, instead of ``listen``'s port."""
        if connect_timeout <= 0:
            raise ValueError(f"connect_timeout={connect_timeout} must be > 0")
        if stall_timeout <= 0:
            raise ValueError(f"stall_timeout={stall_timeout} must be > 0")
        self.me = me
        self.codec = codec
        self.flow_order = FlowOrder(flow_order)
        self.connect_timeout = connect_timeout
        self._stall_timeout = stall_timeout
        self._on_frame = on_frame
        self._on_send_error = on_send_error
        self._on_reject = on_reject
        self._lock = threading.Lock()  # peers, links, inbound set, stats
        self._peers: dict[int, Address] = dict(peers)
        self._pacing: dict[int, float] = dict(pacing or {})
        self._links: dict[int, _Link] = {}
        self._inbound: dict[socket.socket, threading.Thread] = {}
        self._inbound_from: dict[int, socket.socket] = {}  # peer -> its newest connection
        self._started = False
        self._closing = threading.Event()
        self._accept_thread: threading.Thread | None = None
        self._logs = _LogLimiter()
        self._bytes_sent: collections.Counter[int] = collections.Counter()
        self._bytes_received: collections.Counter[int] = collections.Counter()
        self._frames_sent = 0
        self._frames_received = 0
        self._rejected: collections.Counter[str] = collections.Counter()
        self._handler_errors = 0
        self._send_failures = 0
        self._arrivals: dict[int, ArrivalRate] = {}
        self._trace = FrameTrace.from_env(me)

        host, port = listen
        self._listener = listen_on(host, (port,) if listen_ports is None else listen_ports)
        self._listener.settimeout(_ACCEPT_POLL_S)
        self.address: Address = self._listener.getsockname()[:2]
        self.port: int = self.address[1]

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._started:
                raise RuntimeError("transport already started")
            if self._closing.is_set():
                raise RuntimeError("transport is closed")
            self._started = True
            links = list(self._links.values())
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"crew-accept-{self.me}", daemon=True
        )
        self._accept_thread.start()
        for link in links:
            self._start_sender(link)

    def close(self) -> None:
        """Stop all threads (bounded wait) and close every socket. Queued frames are dropped."""
        if self._closing.is_set():
            return
        self._closing.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept() on Linux at once
        except OSError:
            pass  # not supported here: the accept loop polls the closing flag instead
        with self._lock:
            links = list(self._links.values())
            inbound = list(self._inbound.items())
        for link in links:
            with link.cond:
                stream = link.stream
                link.cond.notify_all()
            if stream is not None:
                stream.shutdown()
        for sock, _ in inbound:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already disconnected
        threads = [link.thread for link in links] + [t for _, t in inbound]
        threads.append(self._accept_thread)
        deadline = time.monotonic() + _JOIN_BUDGET_S
        for t in threads:
            if t is not None and t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
                if t.is_alive():
                    log.warning("transport %d: thread %s did not stop in time", self.me, t.name)
        # Descriptors are released only now, when no thread of ours can still be using them.
        self._listener.close()
        for link in links:
            with link.cond:
                stream, link.stream = link.stream, None
            if stream is not None:
                stream.close()
        if self._trace is not None:
            self._trace.close()

    def __enter__(self) -> Transport:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public operations -------------------------------------------------------------------

    def set_peer(self, peer: int, addr: Address) -> None:
        """Add or move a peer (e.g. a worker that rejoined on a new port). The next connection
        to it uses the new address; an open one is kept."""
        with self._lock:
            self._peers[peer] = addr

    def peers(self) -> dict[int, Address]:
        with self._lock:
            return dict(self._peers)

    def adopt(self, codec: FrameCodec) -> None:
        """Speak ``codec`` from now on, and nothing else.

        For a transport started before its run number was agreed (a launched job's, which
        carries the start-up probe under the rendezvous' codec). A connection's keys and run
        are fixed at its handshake, so every connection opened before is closed here, and
        frames still queued (they carry the old run) are dropped: a frame in flight gets at
        most ``connect_timeout`` to finish. Once this returns, a HELLO or frame of the old run
        is refused (``WrongRun``); peers reconnect under ``codec`` on their next send. Call it
        while nothing else sends on this transport."""
        with self._lock:
            links = list(self._links.values())
        for link in links:
            with link.cond:
                link.queued_bytes -= sum(wire_size(f) for f in link.queue.drain())
                link.cond.notify_all()
        self.flush(self.connect_timeout)
        with self._lock:
            # Swapped with the inbound set read under one lock: a reader registered before
            # the swap is shut down below, one registered after reads the new codec.
            self.codec = codec
            links = list(self._links.values())
            inbound = list(self._inbound)
        for link in links:
            with link.cond:
                stream = link.stream
            if stream is not None:
                stream.shutdown()  # its sender sees a closed peer and reconnects, as a restart
        for sock in inbound:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # its reader ends and closes it
            except OSError:
                pass  # already disconnected

    def send(self, dst: int, frame: Frame, priority: int = 0) -> None:
        """Queue ``frame`` for ``dst``; never blocks on the network.

        Frames of a lower ``priority`` go before any queued frame of a higher one (the frame
        already being sent finishes first); within a priority, the transport's FlowOrder.

        Raises ValueError for dst == me (callers deliver to themselves), KeyError for an
        unknown dst, Oversized if the payload exceeds the codec's limit, RuntimeError after
        close(). A memoryview payload must stay unchanged until the frame is sent.
        """
        if dst == self.me:
            raise ValueError(f"send to self (worker {dst}): deliver locally instead")
        if frame.nbytes > self.codec.max_payload:
            raise Oversized(
                f"frame length {frame.nbytes} exceeds the maximum {self.codec.max_payload}"
            )
        if self._closing.is_set():
            raise RuntimeError("transport is closed")
        link = self._link(dst)
        with link.cond:
            link.queue.push(frame, priority)
            link.queued_bytes += wire_size(frame)
            link.cond.notify()
        if self._trace is not None:
            self._trace.event("q", dst, frame)

    def cancel(self, predicate: Callable[[Frame], bool]) -> int:
        """Drop queued frames (not the one being sent) matching ``predicate``; returns how many."""
        with self._lock:
            links = list(self._links.values())
        count = 0
        for link in links:
            with link.cond:
                removed = link.queue.remove_if(predicate)
                link.queued_bytes -= sum(wire_size(f) for f in removed)
                count += len(removed)
        return count

    def arrival_rates(self) -> dict[int, tuple[int, float]]:
        """Per peer, bytes and seconds of back-to-back arrivals since the last call; the ratio
        estimates the capacity of the link peer -> here (see ArrivalRate)."""
        with self._lock:
            return {peer: r.take() for peer, r in self._arrivals.items()}

    def queued_bytes(self, dst: int) -> int:
        """Wire bytes queued for ``dst``, including the frame being sent."""
        with self._lock:
            link = self._links.get(dst)
        if link is None:
            return 0
        with link.cond:
            return link.queued_bytes

    def flush(self, timeout: float) -> bool:
        """Wait until every queue is empty and nothing is in flight (sent, or reported through
        on_send_error); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            links = list(self._links.values())
        for link in links:
            with link.cond:
                while link.queued_bytes:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._closing.is_set():
                        return False
                    link.cond.wait(min(remaining, _WAIT_POLL_S))
        return True

    def set_stall_timeout(self, seconds: float) -> None:
        """A send that makes no progress for ``seconds`` fails its link. Applies at once."""
        if seconds <= 0:
            raise ValueError(f"stall_timeout={seconds} must be > 0")
        with self._lock:
            self._stall_timeout = seconds
            links = list(self._links.values())
            inbound = list(self._inbound)
        for link in links:
            with link.cond:
                if link.stream is not None:
                    link.stream.set_stall_timeout(seconds)
        for sock in inbound:
            try:
                sock.settimeout(seconds)
            except OSError:
                pass  # closed meanwhile

    def pace(self, dst: int, bytes_per_s: float | None) -> None:
        """Pace the connection to ``dst`` at ``bytes_per_s`` (None: unpaced), now and after
        reconnects."""
        with self._lock:
            if bytes_per_s is None:
                self._pacing.pop(dst, None)
            else:
                self._pacing[dst] = bytes_per_s
            link = self._links.get(dst)
        if link is not None:
            with link.cond:
                stream = link.stream
            if stream is not None:
                set_pacing(stream.sock, bytes_per_s)

    def fail_peer(self, dst: int) -> None:
        """Drop the outbound connection to ``dst``; its sender thread reports the in-flight and
        queued frames through on_send_error (asynchronously), then reconnects on the next send."""
        link = self._link(dst)
        with link.cond:
            link.failure = ConnectionAbortedError(f"link to peer {dst} failed on request")
            stream = link.stream
            link.cond.notify_all()
        if stream is not None:
            stream.shutdown()  # unblocks a sender stuck in sendmsg; the sender closes it

    def stats(self) -> TransportStats:
        with self._lock:
            return TransportStats(
                bytes_sent=dict(self._bytes_sent),
                bytes_received=dict(self._bytes_received),
                frames_sent=self._frames_sent,
                frames_received=self._frames_received,
                rejected=sum(self._rejected.values()),
                rejected_by_reason=dict(self._rejected),
                handler_errors=self._handler_errors,
                send_failures=self._send_failures,
            )

    # -- sending -----------------------------------------------------------------------------

    def _link(self, dst: int) -> _Link:
        with self._lock:
            link = self._links.get(dst)
            if link is not None:
                return link
            if dst not in self._peers:
                raise KeyError(f"no address for peer {dst}")
            link = self._links[dst] = _Link(dst, self.flow_order)
            started = self._started and not self._closing.is_set()
        if started:
            self._start_sender(link)
        return link

    def _start_sender(self, link: _Link) -> None:
        link.thread = threading.Thread(
            target=self._sender_loop,
            args=(link,),
            name=f"crew-send-{self.me}-{link.dst}",
            daemon=True,
        )
        link.thread.start()

    def _next_frame(self, link: _Link) -> Frame | BaseException | None:
        """Block until there is a frame to send (returned, and marked in flight), a requested
        failure (returned), or close (None)."""
        with link.cond:
            while not self._closing.is_set():
                if link.failure is not None:
                    err, link.failure = link.failure, None
                    return err
                if len(link.queue):
                    link.inflight = link.queue.pop()
                    return link.inflight
                link.cond.wait(_WAIT_POLL_S)
                # Frames already handed to the kernel may never be acknowledged (a cut link):
                # TCP_USER_TIMEOUT then aborts the socket, but only a send would notice, and an
                # idle sender never sends again. Report the abort now, so the group re-plans in
                # about stall_timeout instead of waiting for its deadline.
                err = _pending_error(link.stream)
                if err is not None and err.errno in _PEER_RESTARTED:
                    # The peer process went away (a reset, not silence): the link itself may be
                    # fine. Drop the connection; the next send reconnects, and only a failed
                    # reconnect counts as a link failure.
                    stale, link.stream = link.stream, None
                    if stale is not None:
                        stale.close()
                elif err is not None:
                    return err
            return None

    def _sender_loop(self, link: _Link) -> None:
        while True:
            item = self._next_frame(link)
            if item is None:
                return
            if isinstance(item, BaseException):
                self._fail_link(link, item)
                continue
            try:
                if link.stream is not None and _peer_closed(link.stream):
                    with link.cond:  # the peer restarted: a new connection, not lost writes
                        stale, link.stream = link.stream, None
                    if stale is not None:
                        stale.close()
                stream = link.stream or self._connect(link)
                if self._trace is not None:
                    self._trace.event("s", link.dst, item)
                try:
                    n = stream.send(item)
                except OSError as e:
                    if e.errno not in _PEER_RESTARTED or link.failure is not None:
                        raise
                    # A reset on a connection that worked: the peer restarted. Retry once on a
                    # new connection before calling the link failed.
                    with link.cond:
                        link.stream = None
                    stream.close()
                    stream = self._connect(link)
                    n = stream.send(item)
            except (OSError, FrameError) as e:
                if self._closing.is_set():
                    return
                with link.cond:
                    requested, link.failure = link.failure, None
                self._fail_link(link, requested or e)
                continue
            if self._trace is not None:
                self._trace.event("e", link.dst, item)
            with link.cond:
                link.inflight = None
                link.queued_bytes -= n
                link.cond.notify_all()  # flush() waiters
            with self._lock:
                self._bytes_sent[link.dst] += n
                self._frames_sent += 1

    def _connect(self, link: _Link) -> FrameStream:
        """Connect with retries until connect_timeout and say HELLO. Raises PeerUnreachable."""
        with self._lock:
            addr = self._peers[link.dst]
            stall = self._stall_timeout
        deadline = time.monotonic() + self.connect_timeout
        pause = _CONNECT_BACKOFF_S[0]
        last: OSError | None = None
        while not self._closing.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                stream = FrameStream.connect(
                    addr, self.codec, timeout=remaining, stall_timeout=stall
                )
            except OSError as e:
                last = e
                self._closing.wait(min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(pause * 2, _CONNECT_BACKOFF_S[1])
                continue
            with self._lock:
                rate = self._pacing.get(link.dst)
            if rate is not None:
                set_pacing(stream.sock, rate)
            with link.cond:
                link.stream = stream
                if link.failure is not None:
                    stream.shutdown()  # fail_peer() came while we connected: fail the HELLO
            # A failed handshake raises: the sender fails the link, which closes the stream.
            n = open_session(stream, self.me, max(0.1, deadline - time.monotonic()))
            with self._lock:
                self._bytes_sent[link.dst] += n
            log.debug("transport %d: connected to peer %d at %s", self.me, link.dst, addr)
            return stream
        raise PeerUnreachable(
            f"could not connect to peer {link.dst} at {addr[0]}:{addr[1]} "
            f"within {self.connect_timeout} s: {last}"
        ) from last

    def _fail_link(self, link: _Link, err: BaseException) -> None:
        """Drop the connection and hand every unsent frame to on_send_error, once."""
        with link.cond:
            stream, link.stream = link.stream, None
            unsent = ([link.inflight] if link.inflight is not None else []) + link.queue.drain()
            link.inflight = None
            link.queued_bytes = 0
            link.cond.notify_all()
        if stream is not None:
            stream.close()
        with self._lock:
            self._send_failures += 1
        suppressed = self._logs.allow(f"send-{link.dst}")
        if suppressed is not None:
            log.warning(
                "transport %d: link to peer %d failed (%s); %d frames unsent%s",
                self.me,
                link.dst,
                err,
                len(unsent),
                f" ({suppressed} similar suppressed)" if suppressed else "",
            )
        if self._on_send_error is None:
            return
        try:
            self._on_send_error(link.dst, err, unsent)
        except Exception:
            log.exception("transport %d: on_send_error raised", self.me)

    # -- receiving ---------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        accept_loop(
            self._listener,
            self._closing.is_set,
            self._accepted,
            name=f"transport {self.me}",
            poll_s=_ACCEPT_POLL_S,
        )

    def _accepted(self, sock: socket.socket, addr: Address) -> None:
        thread = threading.Thread(
            target=self._reader_loop,
            args=(sock, addr),
            name=f"crew-recv-{self.me}-{addr[1]}",
            daemon=True,
        )
        with self._lock:
            if self._closing.is_set():
                sock.close()
                return
            self._inbound[sock] = thread
        thread.start()

    def _reader_loop(self, sock: socket.socket, addr: Address) -> None:
        with self._lock:
            stall = self._stall_timeout
        stream = FrameStream(sock, self.codec, stall)
        try:
            # Until the HELLO checks out, the session reads one HELLO's bytes, and the whole
            # handshake has connect_timeout: a peer without the key holds nothing longer.
            peer = self._handshake(stream)
            self._supersede(peer, sock)
            for frame in self._frames(stream, peer):
                try:
                    self._on_frame(frame)
                except Exception:
                    with self._lock:
                        self._handler_errors += 1
                    if self._logs.allow("on_frame") is not None:
                        log.exception("transport %d: on_frame raised on %r", self.me, frame)
        except FrameError as e:
            if not self._closing.is_set():
                self._reject(addr, e)
        except StreamClosed:
            pass
        except OSError as e:  # reset, stall, or our own close()
            if not self._closing.is_set():
                log.info("transport %d: inbound connection from %s ended: %s", self.me, addr, e)
        finally:
            stream.close()
            with self._lock:
                self._inbound.pop(sock, None)
                for peer_id, newest in list(self._inbound_from.items()):
                    if newest is sock:
                        del self._inbound_from[peer_id]

    def _supersede(self, peer: int, sock: socket.socket) -> None:
        """``sock`` is now ``peer``'s connection: shut its older one down. A peer sends on one
        connection at a time (its sender reconnects only after dropping the last), so an older
        one is dead: typically half-open behind a link that was cut while it was idle, whose
        reset or FIN never arrived. Its reader would wait for a frame forever, keeping a thread,
        a descriptor and the thread's heap arena, one more per cut."""
        with self._lock:
            old = self._inbound_from.get(peer)
            self._inbound_from[peer] = sock
        if old is not None and old is not sock:
            try:
                old.shutdown(socket.SHUT_RDWR)  # its reader sees the end and closes it
            except OSError:
                pass  # closed meanwhile

    def _handshake(self, stream: FrameStream) -> int:
        def known(sender: int, _key: int) -> bool:
            with self._lock:
                return sender in self._peers and sender != self.me

        try:
            peer = accept_session(stream, self.me, self.connect_timeout, [self.codec], known)
        except StreamClosed:
            raise HandshakeError("connection closed before HELLO") from None
        with self._lock:
            self._bytes_received[peer.id] += HELLO_BYTES
        return peer.id

    def _frames(self, stream: FrameStream, peer: int) -> Iterator[Frame]:
        """Frames after the handshake, until the connection ends (exceptions propagate)."""
        while not self._closing.is_set():
            frame = stream.recv()
            if frame.sender != peer:  # a connection speaks for the peer that said HELLO only
                raise ImpersonationError(
                    f"frame claims sender {frame.sender} on peer {peer}'s connection"
                )
            if frame.kind in (FrameKind.HELLO, FrameKind.CHALLENGE):
                raise HandshakeError(f"{frame.kind.name} after the handshake")
            now = time.monotonic()
            with self._lock:
                self._bytes_received[peer] += wire_size(frame)
                self._arrivals.setdefault(peer, ArrivalRate()).add(now, wire_size(frame))
                self._frames_received += 1
            if self._trace is not None:
                self._trace.event("r", peer, frame)
            yield frame

    def _reject(self, addr: Address, err: FrameError) -> None:
        reason = type(err).__name__
        with self._lock:
            self._rejected[reason] += 1
        suppressed = self._logs.allow(f"reject-{reason}")
        if suppressed is not None:
            log.warning(
                "transport %d: rejected connection from %s:%s: %s%s",
                self.me,
                addr[0],
                addr[1],
                err,
                f" ({suppressed} similar suppressed)" if suppressed else "",
            )
        if self._on_reject is None:
            return
        try:
            self._on_reject(addr, err)
        except Exception:
            log.exception("transport %d: on_reject raised", self.me)


__all__ = [
    "Address",
    "FlowOrder",
    "FrameStream",
    "HandshakeError",
    "PeerUnreachable",
    "StreamClosed",
    "StreamStalled",
    "Transport",
    "TransportStats",
    "set_pacing",
]
