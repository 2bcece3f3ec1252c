"""Transport over loopback: delivery, authentication, rejection, flow order, failures."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, suppress

import pytest

import crew.wire.frames as wf
from crew.wire.frames import Frame, FrameCodec, FrameKind, control_body, control_frame, wire_size
from crew.wire.session import HELLO_PAYLOAD, accept_session, open_session
from crew.wire.transport import (
    TCP_CONGESTION,
    FlowOrder,
    FrameStream,
    HandshakeError,
    ImpersonationError,
    PeerUnreachable,
    StreamClosed,
    StreamStalled,
    Transport,
)

SECRET = b"s" * 32
RUN = 9
NONCE = b"n" * (HELLO_PAYLOAD - 1) + b"\x00"  # a HELLO's payload: nonce, mode
WAIT = 10.0  # generous upper bound for events; never a timing assertion
LOOPBACK = "127.0.0.1"


class Events:
    """Thread-safe collector of callback arguments."""

    def __init__(self) -> None:
        self.items: list = []
        self._cond = threading.Condition()

    def __call__(self, *args: object) -> None:
        self._add(args)

    def _add(self, item: object) -> None:
        with self._cond:
            self.items.append(item)
            self._cond.notify_all()

    def wait_for(self, n: int, timeout: float = WAIT) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.items) >= n, timeout)


class Inbox(Events):
    """Thread-safe collector of delivered frames."""

    @property
    def frames(self) -> list[Frame]:
        return self.items

    def __call__(self, frame: Frame) -> None:  # type: ignore[override]
        # Store bytes so assertions compare contents, whatever view type the reader hands out.
        self._add(dataclasses.replace(frame, payload=bytes(frame.payload)))


@pytest.fixture
def codec() -> FrameCodec:
    return FrameCodec(SECRET, RUN)


@pytest.fixture
def make() -> Iterator[Callable[..., Transport]]:
    """Factory of transports on loopback ports; all are closed at the end, even on failure."""
    made: list[Transport] = []

    def factory(me: int, codec: FrameCodec, on_frame: Callable[[Frame], None], **kw) -> Transport:
        t = Transport(me, (LOOPBACK, 0), kw.pop("peers", {}), codec, on_frame, **kw)
        made.append(t)
        return t

    try:
        yield factory
    finally:
        for t in made:
            t.close()


@pytest.fixture
def black_hole() -> Iterator[tuple[str, int]]:
    """A listening socket that never accepts or reads: senders fill the buffers and stall."""
    with closing(socket.socket()) as s:
        s.bind((LOOPBACK, 0))
        s.listen(1)
        yield s.getsockname()


@pytest.fixture
def stalled_peer(codec: FrameCodec) -> Iterator[tuple[str, int]]:
    """A peer that answers the handshake, then never reads: senders fill the buffers and
    stall."""
    done = threading.Event()
    with closing(socket.socket()) as s:
        s.bind((LOOPBACK, 0))
        s.listen(1)

        def serve() -> None:
            conn, _ = s.accept()
            stream = FrameStream(conn, codec)
            accept_session(stream, 5, WAIT, [codec], lambda *_: True)
            done.wait(WAIT)  # bounded: the test ends first
            stream.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        yield s.getsockname()
        done.set()
        thread.join(WAIT)


def dead_port() -> tuple[str, int]:
    with closing(socket.socket()) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()  # nothing listens there once closed


def link_all(ts: dict[int, Transport]) -> None:
    for t in ts.values():
        for peer, other in ts.items():
            t.set_peer(peer, (LOOPBACK, other.port))


def frame(sender: int, group: int = 0, part: int = 0, payload: bytes = b"") -> Frame:
    return Frame(FrameKind.SCATTER, sender, RUN, group=group, part=part, payload=payload)


# -- delivery ---------------------------------------------------------------------------------


def test_three_transports_exchange_frames(make, codec: FrameCodec) -> None:
    inboxes = {i: Inbox() for i in (1, 2, 3)}
    ts = {i: make(i, codec, inboxes[i]) for i in (1, 2, 3)}
    link_all(ts)
    for t in ts.values():
        t.start()
    sent: dict[tuple[int, int, int], bytes] = {}
    for src in ts:
        for dst in ts:
            if src == dst:
                continue
            for part, size in enumerate((17, 1 << 20)):
                payload = os.urandom(size)
                sent[(src, dst, part)] = payload
                ts[src].send(dst, frame(src, group=dst, part=part, payload=payload))
    for dst, inbox in inboxes.items():
        assert inbox.wait_for(4), f"worker {dst} got {len(inbox.frames)} of 4 frames"
        got = {(f.sender, f.group, f.part): f.payload for f in inbox.frames}
        assert got == {(s, d, p): v for (s, d, p), v in sent.items() if d == dst}
    for t in ts.values():
        assert t.flush(WAIT)
    stats = {i: t.stats() for i, t in ts.items()}
    for src in ts:
        assert stats[src].frames_sent == 4 and stats[src].frames_received == 4
        assert stats[src].rejected == 0
        for dst in ts:
            if src != dst:
                assert stats[src].bytes_sent[dst] == stats[dst].bytes_received[src]
                assert ts[src].queued_bytes(dst) == 0


def test_send_argument_errors(make, codec: FrameCodec) -> None:
    t = make(1, codec, Inbox(), peers={2: dead_port()})
    with pytest.raises(ValueError, match="self"):
        t.send(1, frame(1))
    with pytest.raises(KeyError, match="7"):
        t.send(7, frame(1))
    with pytest.raises(wf.Oversized):
        t.send(2, frame(1, payload=bytes(codec.max_payload + 1)))


def test_on_frame_exceptions_are_counted_not_fatal(make, codec: FrameCodec) -> None:
    inbox = Inbox()

    def on_frame(f: Frame) -> None:
        if f.group == 13:
            raise RuntimeError("handler bug")
        inbox(f)

    ts = {1: make(1, codec, Inbox()), 2: make(2, codec, on_frame)}
    link_all(ts)
    for t in ts.values():
        t.start()
    ts[1].send(2, frame(1, group=13))
    ts[1].send(2, frame(1, group=14))
    assert inbox.wait_for(1)
    assert [f.group for f in inbox.frames] == [14]
    assert ts[2].stats().handler_errors == 1


# -- authentication and rejection ------------------------------------------------------------


def test_unauthenticated_client_is_rejected_while_good_peer_works(make, codec) -> None:
    inbox, rejects = Inbox(), Events()
    ts = {1: make(1, codec, Inbox()), 2: make(2, codec, inbox, on_reject=rejects)}
    link_all(ts)
    for t in ts.values():
        t.start()
    ts[1].send(2, frame(1, payload=b"good-before"))
    assert inbox.wait_for(1)

    forger = FrameStream.connect((LOOPBACK, ts[2].port), FrameCodec(b"w" * 32, RUN))
    try:
        with pytest.raises((StreamClosed, ConnectionError, wf.FrameError)):
            open_session(forger, 1, WAIT)  # claims to be worker 1; the server closes on it
        assert rejects.wait_for(1)
        addr, err = rejects.items[0]
        assert isinstance(err, wf.BadMac) and addr[0] == LOOPBACK
    finally:
        forger.close()

    ts[1].send(2, frame(1, payload=b"good-after"))
    assert inbox.wait_for(2)
    assert [f.payload for f in inbox.frames] == [b"good-before", b"good-after"]
    stats = ts[2].stats()
    assert stats.rejected == 1 and stats.rejected_by_reason == {"BadMac": 1}
    assert stats.frames_received == 2


def test_garbage_client_is_rejected(make, codec: FrameCodec) -> None:
    inbox, rejects = Inbox(), Events()
    t = make(2, codec, inbox, peers={1: dead_port()}, on_reject=rejects)
    t.start()
    with closing(socket.create_connection((LOOPBACK, t.port), timeout=WAIT)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 64)
        assert rejects.wait_for(1)
    assert isinstance(rejects.items[0][1], wf.BadMagic)
    assert t.stats().rejected_by_reason == {"BadMagic": 1}
    assert inbox.frames == []


@pytest.mark.parametrize(
    ("first", "error", "reason"),
    [
        (Frame(FrameKind.SCATTER, 1, RUN, payload=NONCE), HandshakeError, "first frame is SCATTER"),
        (Frame(FrameKind.HELLO, 77, RUN, payload=NONCE), HandshakeError, "unknown peer id 77"),
        # Before the HELLO, only a HELLO's bytes are read: a frame of another size is refused
        # from those alone, the rest of its payload never read into memory.
        (Frame(FrameKind.SCATTER, 1, RUN, payload=b"x" * 4000), HandshakeError, "not a HELLO"),
    ],
)
def test_connection_must_start_with_hello_from_known_peer(
    make, codec, first, error, reason
) -> None:
    inbox, rejects = Inbox(), Events()
    t = make(2, codec, inbox, peers={1: dead_port()}, on_reject=rejects)
    t.start()
    client = FrameStream.connect((LOOPBACK, t.port), codec)
    try:
        client.send(first)
        # The listener may already have rejected and closed: then this
        # send fails, which is as good as it being ignored.
        with suppress(OSError):
            client.send(frame(1, payload=b"after"))
        assert rejects.wait_for(1)
    finally:
        client.close()
    err = rejects.items[0][1]
    assert isinstance(err, error) and reason in str(err)
    assert t.stats().rejected_by_reason == {error.__name__: 1}
    assert inbox.frames == []


def test_a_frame_in_another_peers_name_is_refused(make, codec) -> None:
    inbox, rejects = Inbox(), Events()
    t = make(2, codec, inbox, peers={1: dead_port(), 3: dead_port()}, on_reject=rejects)
    t.start()
    client = FrameStream.connect((LOOPBACK, t.port), codec)
    try:
        open_session(client, 1, WAIT)  # peer 1 says who it is ...
        client.send(frame(3, payload=b"as 3"))  # ... then speaks for peer 3
        assert rejects.wait_for(1)
    finally:
        client.close()
    assert isinstance(rejects.items[0][1], ImpersonationError)
    assert inbox.frames == []


def test_a_handshake_dribbled_byte_by_byte_is_cut_at_its_deadline(make, codec) -> None:
    inbox, rejects = Inbox(), Events()
    t = make(2, codec, inbox, peers={1: dead_port()}, on_reject=rejects, connect_timeout=1.0)
    t.start()
    hello = codec.encode_bytes(Frame(FrameKind.HELLO, 1, RUN, payload=NONCE))
    started = time.monotonic()
    with socket.create_connection((LOOPBACK, t.port)) as sock:
        sock.settimeout(10.0)
        closed_at = None
        for byte in hello[:-1]:  # never the whole HELLO: one byte every 0.2 s
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed_at = time.monotonic()
                break
            time.sleep(0.2)
            if rejects.items:
                closed_at = time.monotonic()
                break
        assert closed_at is not None, "the server held the connection for the whole handshake"
    assert closed_at - started < 3.0
    assert inbox.frames == []


# -- flow order -------------------------------------------------------------------------------

ENQUEUED = [(3, 0), (3, 1), (1, 0), (2, 0), (1, 1), (2, 1), (3, 2)]  # (group, part)
EXPECTED = {
    FlowOrder.FCFS: ENQUEUED,
    FlowOrder.EARLIEST_GROUP: [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)],
    # Groups take turns in the order they first appeared: 3, 1, 2.
    FlowOrder.FAIR: [(3, 0), (1, 0), (2, 0), (3, 1), (1, 1), (2, 1), (3, 2)],
}


def sender_and_receiver(
    make, codec: FrameCodec, order: FlowOrder
) -> tuple[dict[int, Transport], Inbox]:
    """Transport 1 (sending in ``order``, not started) and transport 2 (started); 2's inbox."""
    inbox = Inbox()
    ts = {1: make(1, codec, Inbox(), flow_order=order), 2: make(2, codec, inbox)}
    link_all(ts)
    ts[2].start()
    return ts, inbox


@pytest.mark.parametrize("order", list(FlowOrder))
def test_flow_order(make, codec: FrameCodec, order: FlowOrder) -> None:
    ts, inbox = sender_and_receiver(make, codec, order)
    for group, part in ENQUEUED:  # all queued before the sender runs, so the order is decided
        ts[1].send(2, frame(1, group, part))
    ts[1].start()
    assert inbox.wait_for(len(ENQUEUED))
    assert [(f.group, f.part) for f in inbox.frames] == EXPECTED[order]


@pytest.mark.parametrize("order", list(FlowOrder))
def test_cancel_removes_queued_frames(make, codec: FrameCodec, order: FlowOrder) -> None:
    ts, inbox = sender_and_receiver(make, codec, order)
    queued = [frame(1, g, p, payload=b"x" * (10 * g + p)) for g, p in ENQUEUED]
    for f in queued:
        ts[1].send(2, f)
    assert ts[1].queued_bytes(2) == sum(wire_size(f) for f in queued)
    assert ts[1].cancel(lambda f: f.group == 3) == 3
    assert ts[1].cancel(lambda f: f.group == 3) == 0
    assert ts[1].queued_bytes(2) == sum(wire_size(f) for f in queued if f.group != 3)
    ts[1].start()
    assert inbox.wait_for(4)
    assert ts[1].flush(WAIT)
    expected = [gp for gp in EXPECTED[order] if gp[0] != 3]
    assert [(f.group, f.part) for f in inbox.frames] == expected
    assert ts[1].stats().frames_sent == 4


@pytest.mark.parametrize("order", list(FlowOrder))
def test_lower_priority_goes_first_and_cancel_keeps_priorities(
    make, codec: FrameCodec, order: FlowOrder
) -> None:
    # A relay's forwarded part (priority -1) must overtake the node's own queued first-hop data
    # (priority 0), whatever the order among equals; cancelling other frames keeps that.
    ts, inbox = sender_and_receiver(make, codec, order)
    for group, part in ENQUEUED:
        ts[1].send(2, frame(1, group, part))
    ts[1].send(2, frame(1, 9, 0), -1)
    ts[1].send(2, frame(1, 8, 0), -2)
    ts[1].send(2, frame(1, 9, 1), -1)
    assert ts[1].cancel(lambda f: f.group == 3) == 3
    ts[1].start()
    assert inbox.wait_for(7)
    got = [(f.group, f.part) for f in inbox.frames]
    assert got[:3] == [(8, 0), (9, 0), (9, 1)]
    assert got[3:] == [gp for gp in EXPECTED[order] if gp[0] != 3]


def test_a_frame_arriving_in_pieces_is_read_whole(codec: FrameCodec) -> None:
    # A frame that trickles in over a connection capped by TCP_NOTSENT_LOWAT is read whole.
    with closing(socket.create_server((LOOPBACK, 0))) as server:
        raw = socket.create_connection(server.getsockname(), timeout=WAIT)
        accepted, _ = server.accept()
        inbound = FrameStream(accepted, codec, stall_timeout=WAIT)
        try:
            data = codec.encode_bytes(frame(1, 4, 2, payload=bytes(range(256)) * 1024))
            got: list[Frame] = []
            reader = threading.Thread(target=lambda: got.append(inbound.recv()))
            reader.start()
            for k in range(0, len(data), 50_000):  # several pieces, each below the threshold
                raw.sendall(data[k : k + 50_000])
                threading.Event().wait(0.02)
            reader.join(WAIT)
            assert got and got[0].payload == bytes(range(256)) * 1024 and got[0].part == 2
        finally:
            raw.close()
            inbound.close()


# -- failures ---------------------------------------------------------------------------------


def test_send_to_dead_port_reports_unsent_frames_then_retries(make, codec) -> None:
    errors = Events()
    t = make(1, codec, Inbox(), peers={9: dead_port()}, on_send_error=errors, connect_timeout=0.3)
    t.start()
    first = [frame(1, group=g, payload=bytes([g])) for g in range(3)]
    for f in first:
        t.send(9, f)
    assert errors.wait_for(1)
    dst, err, unsent = errors.items[0]
    assert dst == 9 and isinstance(err, PeerUnreachable) and "peer 9" in str(err)
    assert unsent == first
    assert t.queued_bytes(9) == 0
    later = frame(1, group=7)
    t.send(9, later)  # a new attempt, reported on its own
    assert errors.wait_for(2)
    assert errors.items[1][0] == 9 and errors.items[1][2] == [later]
    assert t.stats().send_failures == 2 and t.stats().frames_sent == 0


def test_fail_peer_reports_the_frames_not_yet_sent(make, codec, black_hole) -> None:
    errors = Events()
    t = make(1, codec, Inbox(), peers={5: black_hole}, on_send_error=errors)
    t.start()
    big = b"\xab" * (4 << 20)
    sent = [frame(1, group=g, payload=big) for g in range(12)]  # far beyond socket buffers
    for f in sent:
        t.send(5, f)
    t.fail_peer(5)
    assert errors.wait_for(1)
    dst, err, unsent = errors.items[0]
    assert dst == 5 and isinstance(err, ConnectionAbortedError)
    assert 1 <= len(unsent) and unsent == sent[len(sent) - len(unsent) :]
    assert t.queued_bytes(5) == 0


def test_stalled_send_fails_the_link(make, codec, stalled_peer) -> None:
    errors = Events()
    t = make(1, codec, Inbox(), peers={5: stalled_peer}, on_send_error=errors)
    t.set_stall_timeout(0.3)
    t.start()
    big = b"\xcd" * (4 << 20)
    sent = [frame(1, group=g, payload=big) for g in range(12)]
    for f in sent:
        t.send(5, f)
    assert errors.wait_for(1)
    dst, err, unsent = errors.items[0]
    assert dst == 5 and isinstance(err, StreamStalled)
    assert 1 <= len(unsent) and unsent == sent[len(sent) - len(unsent) :]


# -- FrameStream (control plane) -------------------------------------------------------------


def test_frame_stream_control_round_trip_and_clean_close(codec: FrameCodec) -> None:
    a, b = socket.socketpair()
    left, right = FrameStream(a, codec), FrameStream(b, codec)
    try:
        msg = {"type": "ready", "worker": 3, "iteration": 12}
        left.send(control_frame(3, RUN, msg))
        assert control_body(right.recv(idle_timeout=WAIT)) == msg
        with pytest.raises(TimeoutError):
            right.recv(idle_timeout=0.01)  # nothing sent: idle, not an error of the stream
        left.close()
        with pytest.raises(StreamClosed):
            right.recv(idle_timeout=WAIT)
    finally:
        left.close()
        right.close()


def test_frame_stream_mid_frame_close_is_truncated(codec: FrameCodec) -> None:
    a, b = socket.socketpair()
    stream = FrameStream(b, codec)
    try:
        data = codec.encode_bytes(frame(1, payload=b"0123456789"))
        a.sendall(data[:-5])
        a.close()
        with pytest.raises(wf.Truncated, match="tag"):
            stream.recv(idle_timeout=WAIT)
    finally:
        a.close()
        stream.close()


def test_inbound_frame_that_stalls_drops_the_connection(make, codec: FrameCodec) -> None:
    inbox = Inbox()
    t = make(2, codec, inbox, peers={1: dead_port()}, stall_timeout=0.2)
    t.start()
    with closing(socket.create_connection((LOOPBACK, t.port), timeout=WAIT)) as s:
        s.sendall(codec.encode_bytes(Frame(FrameKind.HELLO, 1, RUN, payload=NONCE))[:10])
        assert s.recv(1) == b""  # the server gave up on the half frame and closed
    assert inbox.frames == [] and t.stats().frames_received == 0


def test_data_connections_use_the_transports_congestion_control(codec: FrameCodec) -> None:
    # BBR (this kernel's default) starves one direction of a pair whose other direction is
    # busy (see crew.wire.transport.TCP_CONGESTION); every connection must carry the chosen one.
    available = open("/proc/sys/net/ipv4/tcp_available_congestion_control").read().split()
    if TCP_CONGESTION not in available:
        pytest.skip(f"{TCP_CONGESTION} not in this kernel")
    with closing(socket.create_server((LOOPBACK, 0))) as server:
        stream = FrameStream.connect(server.getsockname(), codec, timeout=WAIT)
        accepted, _ = server.accept()
        inbound = FrameStream(accepted, codec)
        try:
            for s in (stream.sock, inbound.sock):
                cc = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
                assert cc.rstrip(b"\0").decode() == TCP_CONGESTION
        finally:
            stream.close()
            inbound.close()


TCP_ESTABLISHED = "01"  # the state column of /proc/net/tcp


def _established_to(port: int) -> bool:
    """Whether a loopback TCP connection to ``port`` is still established (/proc/net/tcp)."""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return any(r[2] == f"0100007F:{port:04X}" and r[3] == TCP_ESTABLISHED for r in rows)


def test_a_restarted_peer_gets_every_frame_sent_after_its_restart(make, codec) -> None:
    """The peer process exits (its kernel closes the connection) and a new one listens on the
    same port: frames sent afterwards must reach the new one, not vanish into the old
    connection, whose first writes the kernel still accepts before the peer's reset comes."""
    inbox = Inbox()
    a = make(1, codec, Inbox())
    b = make(2, codec, inbox)
    a.set_peer(2, (LOOPBACK, b.port))
    b.set_peer(1, (LOOPBACK, a.port))
    a.start()
    b.start()
    a.send(2, frame(1, group=0))
    assert inbox.wait_for(1)
    port = b.port
    b.close()
    # Until the old connection is half-closed (the peer's FIN arrived at a's end).
    deadline = time.monotonic() + WAIT
    for _ in range(int(WAIT / 0.01) + 1):
        if not _established_to(port):
            break
        assert time.monotonic() < deadline, f"a's connection to port {port} never saw a FIN"
        time.sleep(0.01)
    again = Inbox()
    b2 = Transport(2, (LOOPBACK, port), {1: (LOOPBACK, a.port)}, codec, again)
    try:
        b2.start()
        for g in range(1, 6):
            a.send(2, frame(1, group=g, payload=b"x" * 1000))
        assert again.wait_for(5), f"the restarted peer got {len(again.frames)} of 5 frames"
    finally:
        b2.close()


def test_an_adopted_codec_closes_the_old_connections_and_refuses_the_old_run(make, codec) -> None:
    """A launched job's transport starts under the rendezvous' run (the start-up probe) and
    adopts the job's own: what was connected before is closed, a HELLO of the old run is
    refused, and a peer of the new run gets through."""
    job = FrameCodec(SECRET, RUN + 1)
    inbox, rejects = Inbox(), Events()
    t = make(2, codec, inbox, peers={1: dead_port()}, on_reject=rejects)
    peer = make(1, job, Inbox(), peers={2: (LOOPBACK, t.port)})
    t.start()
    peer.start()
    before = FrameStream.connect((LOOPBACK, t.port), codec)
    try:
        open_session(before, 1, WAIT)
        before.send(frame(1, payload=b"probe"))
        assert inbox.wait_for(1)  # the old run is spoken until the new one is adopted
        t.adopt(job)
        with pytest.raises((StreamClosed, ConnectionError)):
            before.recv(idle_timeout=WAIT)  # closed by adopt, not left speaking the old run
    finally:
        before.close()
    with closing(FrameStream.connect((LOOPBACK, t.port), codec)) as again:
        with pytest.raises((StreamClosed, ConnectionError, wf.FrameError)):
            open_session(again, 1, WAIT)
        assert rejects.wait_for(1)
    assert isinstance(rejects.items[0][1], wf.WrongRun)

    peer.send(2, Frame(FrameKind.SCATTER, 1, job.run, payload=b"job"))
    assert inbox.wait_for(2)
    assert [bytes(f.payload) for f in inbox.frames] == [b"probe", b"job"]
    assert t.stats().rejected_by_reason == {"WrongRun": 1}
