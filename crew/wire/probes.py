"""Link probes: whether each directed data link is alive, known without waiting for data.

Every worker sends a tiny authenticated UDP datagram (a ``PROBE`` frame, no payload) to every
peer every :func:`probe_interval` (``PROBE_INTERVAL_S`` while the worker's budget of
``PROBES_PER_S_MAX`` probes a second allows it), over the same shaped and cut-able path as its
data (to the peer's identity address, the data port, UDP). The *receiver* decides: a link ``src
-> me`` is dead once nothing from ``src`` arrived for :func:`dead_after` (``DEAD_AFTER_S``, or
``DEAD_AFTER_INTERVALS`` intervals where the budget stretches them), alive again at the next
probe. Where the budget stretches the interval, data frames from ``src`` (:meth:`Prober.heard`)
count as hearing from it too, so a busy link stays alive whether or not its probes keep up (at
the unstretched interval they do not: a cut is then timed from the last probe, as before). A
peer never heard from since the watch started gets ``START_GRACE_S`` at least (workers start
seconds apart on a busy host). A one-way cut therefore shows as one dead direction; the
coordinator takes both directions of a TCP link out of plans (its ACKs need the other one).
Probes decide dead against alive; data progress (``crew.wire.transport``'s stall timeout, the
groups' progress reports) decides slow against fast.

Cost model: a probe is ``PROBE_WIRE_BYTES`` on the wire (frame header and tag, UDP, IP and
Ethernet headers). At ``1 / PROBE_INTERVAL_S`` probes a second that is
``PROBE_WIRE_BYTES * 8 / PROBE_INTERVAL_S`` = 3.6 kbit/s per directed link: 0.036% of the
slowest link the shipped topologies configure (10 Mbit/s), under the 0.5% budget; a stretched
interval only lowers it. CPU: each worker sends and receives at most ``PROBES_PER_S_MAX``
probes a second (an encode or a decode with its MAC each, some 20-40 us), whatever n is, so
the whole lab's probe work grows as n, not n^2: with the budget binding from n = 12 on, n = 32
sends 1,280 probes a second instead of 3,968. The receiver expires links on a fixed cadence
(``EXPIRE_EVERY_S``), not on every wake, so a wake costs its datagrams and nothing per peer.
Detection: a cut is declared ``dead_after`` after the last probe (or, stretched, data frame)
that crossed it, so ``dead_after - interval`` to ``dead_after`` after the cut, plus up to
``EXPIRE_EVERY_S`` and the receiver's wake: about 1.35-1.65 s up to n = 11, 4.2-5.0 s at
n = 32 (``docs/results.md`` has the measured figures); a probe may sit
behind a full HTB queue (at most ~50 ms plus the configured delay, ``lab.net.shaping``) or be
tail-dropped, so ``dead_after`` spans several probes.

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

PROBE_INTERVAL_S = 0.25  # the interval between a worker's probes to one peer, budget allowing
DEAD_AFTER_S = 1.6  # > 6 probe intervals without a probe: the link is dead
PROBES_PER_S_MAX = 40.0  # per worker, to all its peers together: binds from 11 peers on
DEAD_AFTER_INTERVALS = DEAD_AFTER_S / PROBE_INTERVAL_S  # 6.4: dead_after in intervals
START_GRACE_S = 15.0  # a peer never heard from: its prober may start this much later
EXPIRE_EVERY_S = 0.02  # the receiver's cadence of expiring silent links
UDP_IP_ETH_BYTES = 8 + 20 + 14
PROBE_WIRE_BYTES = HEADER_SIZE + TAG_SIZE + UDP_IP_ETH_BYTES  # 114
_RECV_POLL_S = 0.1
_DATAGRAM_BYTES = HEADER_SIZE + TAG_SIZE + 64  # a probe, with room to see an oversized one
# Bounds one drain (a receiver behind by seconds holds a few probes per peer); the rest are
# read at the next turn, after this one's expiry.
_DRAIN_MAX_PER_PEER = 16


def probe_interval(peers: int) -> float:
    """A worker's interval between two probes to one peer: ``PROBE_INTERVAL_S``, stretched so
    that it sends at most ``PROBES_PER_S_MAX`` probes a second to its ``peers`` together."""
    return max(PROBE_INTERVAL_S, peers / PROBES_PER_S_MAX)


def dead_after(peers: int) -> float:
    """How long a link of a worker with ``peers`` peers may be silent before it is dead:
    ``DEAD_AFTER_S`` at the unstretched interval, ``DEAD_AFTER_INTERVALS`` intervals beyond."""
    return DEAD_AFTER_INTERVALS * probe_interval(peers)


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

    Every peer counts as heard from at ``start``; one never heard from since is declared dead
    ``max(dead_after, first_grace)`` after it (a link cut before the worker started, or a peer
    that never came), one heard from ``dead_after`` after the last time."""

    def __init__(
        self,
        me: int,
        peers: Iterable[int],
        start: float,
        *,
        dead_after: float = DEAD_AFTER_S,
        first_grace: float = 0.0,
    ):
        self.me = me
        self.dead_after = dead_after
        self.first_grace = first_grace
        self.last_heard = {p: start for p in peers if p != me}
        self.last_seq = dict.fromkeys(self.last_heard, -1)
        self.never_heard = set(self.last_heard)
        self.dead: set[int] = set()

    def heard(self, src: int, now: float) -> None:
        """Something authenticated (a data frame) arrived from ``src``: its link is alive, as a
        probe would say. It does not revive a dead link (a probe does, and reports it)."""
        if src in self.last_heard and src not in self.dead and now > self.last_heard[src]:
            self.last_heard[src] = now
            self.never_heard.discard(src)

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
        self.last_heard[src] = max(now, self.last_heard[src])
        self.never_heard.discard(src)
        if src in self.dead:
            self.dead.discard(src)
            return [LinkStateChange(src, self.me, True, silent)]
        return []

    def expire(self, now: float) -> list[LinkStateChange]:
        """Links whose probes stopped arriving ``dead_after`` ago become dead."""
        out = []
        first = max(self.dead_after, self.first_grace)
        for src, heard in self.last_heard.items():
            limit = first if src in self.never_heard else self.dead_after
            if src not in self.dead and now - heard >= limit:
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
        interval: float | None = None,
        dead_after: float | None = None,
        first_grace: float = 0.0,
    ):
        self.me = me
        self.peers = dict(peers)
        self.codec = codec
        self.on_change = on_change
        self.interval = probe_interval(len(self.peers)) if interval is None else interval
        if dead_after is None:
            dead_after = DEAD_AFTER_INTERVALS * self.interval
        self.watch = LinkWatch(
            me, peers, time.time(), dead_after=dead_after, first_grace=first_grace
        )
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
                self.me,
                self.peers,
                time.time(),
                dead_after=self.watch.dead_after,
                first_grace=self.watch.first_grace,
            )
        for target, name in ((self._send_loop, "probe-send"), (self._recv_loop, "probe-recv")):
            t = threading.Thread(target=target, name=f"{name}-{self.me}", daemon=True)
            t.start()
            self._threads.append(t)

    def down(self) -> list[int]:
        with self._lock:
            return self.watch.down()

    def heard(self, src: int) -> None:
        """A data frame from ``src`` arrived (called from the transport's reader threads): the
        link ``src -> me`` is alive. Lock-free: a dict store; at worst a racing expiry reads
        the previous time, as it would have a moment earlier. Only where the budget stretches
        the interval (module docstring)."""
        if self.interval > PROBE_INTERVAL_S:
            self.watch.heard(src, time.time())

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
        next_expiry = 0.0
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
                if now >= next_expiry:
                    changes += self.watch.expire(now)
                    next_expiry = now + EXPIRE_EVERY_S
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
