"""Link probes: whether each directed data link is alive, known without waiting for data.

Every worker sends a tiny authenticated UDP datagram (a ``PROBE`` frame, no payload) to every
peer every ``PROBE_INTERVAL_S``, over the same shaped and cut-able path as its data (to the
peer's identity address, the data port, UDP). The *receiver* decides: a link ``src -> me`` is
dead once no probe from ``src`` arrived for ``DEAD_AFTER_S``, alive again at the next one. A
one-way cut therefore shows as one dead direction; the coordinator takes both directions of a
TCP link out of plans (its ACKs need the other one). Probes decide dead against alive; data
progress (``crew.wire.transport``'s stall timeout, the groups' progress reports) decides slow
against fast.

Cost model: a probe is ``PROBE_WIRE_BYTES`` on the wire (frame header and tag, UDP, IP and
Ethernet headers). At ``1 / PROBE_INTERVAL_S`` probes a second that is
``PROBE_WIRE_BYTES * 8 / PROBE_INTERVAL_S`` = 3.6 kbit/s per directed link: 0.036% of the
slowest link the shipped topologies configure (10 Mbit/s), under the 0.5% budget.
Detection: a cut is declared between ``DEAD_AFTER_S`` and ``DEAD_AFTER_S + PROBE_INTERVAL_S``
after it; a probe may sit behind a full HTB queue (at most ~50 ms plus the configured delay,
``lab.net.shaping``) or be tail-dropped, so ``DEAD_AFTER_S`` spans several probes.

Authentication: the frame's MAC (the run's ``FrameCodec`` secret) proves the sender; the probe
names its receiver (``block``) so it cannot be reflected to another worker, and carries the
sender's clock in microseconds (``offset``) as a sequence number: a replayed probe (not newer
than the last one accepted from that sender) is refused, so a recording cannot make a dead link
look alive.

:class:`LinkWatch` is the pure part (probe arrivals and time in, link states out);
:class:`Prober` the socket shell around it.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from crew.wire.frames import HEADER_SIZE, TAG_SIZE, Frame, FrameCodec, FrameError, FrameKind

log = logging.getLogger("crew.wire.probes")

PROBE_INTERVAL_S = 0.25
DEAD_AFTER_S = 1.6  # > 6 probe intervals without a probe: the link is dead
UDP_IP_ETH_BYTES = 8 + 20 + 14
PROBE_WIRE_BYTES = HEADER_SIZE + TAG_SIZE + UDP_IP_ETH_BYTES  # 114
_RECV_POLL_S = 0.1
_DATAGRAM_BYTES = HEADER_SIZE + TAG_SIZE + 64  # a probe, with room to see an oversized one
# Bounds one drain (a receiver behind by seconds holds a few probes per peer); the rest are
# read at the next turn, after this one's expiry.
_DRAIN_MAX_PER_PEER = 16


class ProbeRefused(ValueError):
    """A probe datagram was not accepted; the message says why."""


@dataclass(frozen=True)
class LinkStateChange:
    """The directed link ``src -> dst`` (``dst``: the watching worker) became alive or dead."""

    src: int
    dst: int
    alive: bool
    silent_s: float  # time since the last probe from src when the change was decided


class LinkWatch:
    """The receiver's view of its incoming links. Pure: every call takes ``now``.

    Every peer counts as heard from at ``start`` (a link cut before the worker started is
    declared dead ``dead_after`` later)."""

    def __init__(
        self, me: int, peers: Iterable[int], start: float, *, dead_after: float = DEAD_AFTER_S
    ):
        self.me = me
        self.dead_after = dead_after
        self.last_heard = {p: start for p in peers if p != me}
        self.last_seq = dict.fromkeys(self.last_heard, -1)
        self.dead: set[int] = set()

    def observe(self, frame: Frame, now: float) -> list[LinkStateChange]:
        """A probe arrived (already authenticated by the codec); ``ProbeRefused`` if it is not a
        fresh probe for this worker from one of its peers."""
        if frame.kind is not FrameKind.PROBE:
            raise ProbeRefused(f"kind: {frame.kind.name} is not a probe")
        src = frame.sender
        if src not in self.last_heard:
            raise ProbeRefused(f"sender: {src} is not a peer of worker {self.me}")
        if frame.block != self.me:
            raise ProbeRefused(f"block: probe for worker {frame.block}, not {self.me}")
        if frame.offset <= self.last_seq[src]:
            raise ProbeRefused(f"offset: probe {frame.offset} from {src} is not newer (replay)")
        self.last_seq[src] = frame.offset
        silent = now - self.last_heard[src]
        self.last_heard[src] = now
        if src in self.dead:
            self.dead.discard(src)
            return [LinkStateChange(src, self.me, True, silent)]
        return []

    def expire(self, now: float) -> list[LinkStateChange]:
        """Links whose probes stopped arriving ``dead_after`` ago become dead."""
        out = []
        for src, heard in self.last_heard.items():
            if src not in self.dead and now - heard >= self.dead_after:
                self.dead.add(src)
                out.append(LinkStateChange(src, self.me, False, now - heard))
        return out

    def down(self) -> list[int]:
        """Peers whose links into this worker are dead, sorted."""
        return sorted(self.dead)


def probe_frame(me: int, dst: int, run: int, now: float) -> Frame:
    return Frame(FrameKind.PROBE, sender=me, run=run, block=dst, offset=int(now * 1e6))


class Prober:
    """Sends probes to every peer and watches the ones that arrive; two daemon threads.

    ``on_change`` is called (from the receiving thread) with every :class:`LinkStateChange`.
    Bad datagrams are counted in ``refused`` and dropped: no datagram stops the prober."""

    def __init__(
        self,
        me: int,
        listen: tuple[str, int],
        peers: dict[int, tuple[str, int]],
        codec: FrameCodec,
        on_change: Callable[[LinkStateChange], None],
        *,
        interval: float = PROBE_INTERVAL_S,
        dead_after: float = DEAD_AFTER_S,
    ):
        self.me = me
        self.peers = dict(peers)
        self.codec = codec
        self.on_change = on_change
        self.interval = interval
        self.watch = LinkWatch(me, peers, time.time(), dead_after=dead_after)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            self.sock.bind(listen)
        except OSError:
            self.sock.close()
            raise
        self.sock.settimeout(_RECV_POLL_S)
        self.address = self.sock.getsockname()[:2]
        self.sent = 0
        self.received = 0
        self.refused = 0
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        with self._lock:
            self.watch = LinkWatch(
                self.me, self.peers, time.time(), dead_after=self.watch.dead_after
            )
        for target, name in ((self._send_loop, "probe-send"), (self._recv_loop, "probe-recv")):
            t = threading.Thread(target=target, name=f"{name}-{self.me}", daemon=True)
            t.start()
            self._threads.append(t)

    def down(self) -> list[int]:
        with self._lock:
            return self.watch.down()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2.0)
        self.sock.close()

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            for dst, addr in self.peers.items():
                frame = probe_frame(self.me, dst, self.codec.run, time.time())
                try:
                    self.sock.sendto(self.codec.encode_bytes(frame), addr)
                    self.sent += 1
                except OSError as exc:  # no route yet, interface down: the receiver decides
                    log.debug("probe %d->%d not sent: %s", self.me, dst, exc)
            self._stop.wait(self.interval)

    def _recv_loop(self) -> None:
        while not self._stop.is_set():
            try:
                first, _ = self.sock.recvfrom(_DATAGRAM_BYTES)
            except TimeoutError:
                first = None
            except OSError:
                if self._stop.is_set():
                    return
                first = None
            with self._lock:
                # Every probe already waiting is read before any link is expired: a receiver
                # that did not run for a while (a busy host) finds its peers' probes queued in
                # the socket, and expiring after only the first of them would declare every
                # other link dead although its probes are right behind.
                batch = [first] if first is not None else []
                batch += self._queued(_DRAIN_MAX_PER_PEER * max(1, len(self.peers)))
                now = time.time()
                changes: list[LinkStateChange] = []
                for data in batch:
                    try:
                        changes += self.watch.observe(self.codec.decode(data), now)
                        self.received += 1
                    except (FrameError, ProbeRefused) as exc:
                        self.refused += 1
                        log.debug("worker %d: probe refused: %s", self.me, exc)
                changes += self.watch.expire(now)
            for change in changes:
                self.on_change(change)

    def _queued(self, limit: int) -> list[bytes]:
        """Up to ``limit`` datagrams already in the socket, without waiting: a socket with a
        timeout polls for up to that timeout before every receive, even with MSG_DONTWAIT, and
        with peers probing faster than that the drain would go on for seconds before any link
        is expired."""
        out: list[bytes] = []
        try:
            poller = select.poll()
            poller.register(self.sock, select.POLLIN)
            while len(out) < limit and poller.poll(0):
                data, _ = self.sock.recvfrom(_DATAGRAM_BYTES)
                out.append(data)
        except (OSError, ValueError):  # closed under us: the loop ends at its next turn
            pass
        return out
