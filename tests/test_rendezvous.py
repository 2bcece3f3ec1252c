"""The start-up exchange: the capacity matrix from the receivers' reports, the shapes named in a
refusal, and a refusal that reaches every rank even when the host is closed while sending it."""

from __future__ import annotations

import time

import pytest

from crew.control.capacity import TCP_GOODPUT
from crew.runtime.rendezvous import RendezvousHost, capacity_matrix, describe_shapes
from crew.wire import protocol as proto
from crew.wire.frames import FrameCodec, control_body, control_frame
from crew.wire.session import open_session
from crew.wire.transport import FrameStream


def test_capacity_matrix_is_indexed_src_dst_and_scaled_like_the_estimator():
    # worker 1 received 1 MB from worker 0 in 0.8 s; worker 0 received 1 MB from 1 in 0.4 s
    reports = {
        1: proto.LinkRates(1, [[0.0, 1e6, 0.8]]),
        0: proto.LinkRates(0, [[1.0, 1e6, 0.4]]),
    }
    bw = capacity_matrix(2, reports)
    assert bw[0][1] == pytest.approx(10 / TCP_GOODPUT)
    assert bw[1][0] == pytest.approx(20 / TCP_GOODPUT)
    assert bw[0][0] == 0.0


def test_links_without_a_sample_get_the_median():
    reports = {
        1: proto.LinkRates(1, [[0.0, 1e6, 0.8]]),
        0: proto.LinkRates(0, []),
        2: proto.LinkRates(2, [[0.0, 1e6, 0.4], [1.0, 1e6, 0.2]]),
    }
    bw = capacity_matrix(3, reports)
    measured = sorted([10 / TCP_GOODPUT, 20 / TCP_GOODPUT, 40 / TCP_GOODPUT])
    assert bw[1][0] == pytest.approx(measured[1])  # no sample: the median
    assert bw[2][1] == pytest.approx(measured[1])


def test_a_report_naming_itself_or_a_stranger_is_ignored():
    reports = {0: proto.LinkRates(0, [[0.0, 1e6, 1.0], [7.0, 1e6, 1.0], [1.0, 1e6, 0.0]])}
    bw = capacity_matrix(2, reports)
    assert bw[1][0] == pytest.approx(1000.0)  # nothing valid measured: the fallback


def test_describe_shapes_is_short_and_counts():
    text = describe_shapes([[64, 640], [640], [640, 10], [10], [3, 3]])
    assert text.startswith("[64x640, 640, 640x10, 10, ...]")
    assert "(5 tensors, 48,019 values)" in text


def _joined_client(host: RendezvousHost, codec: FrameCodec, rank: int, world: int) -> FrameStream:
    stream = FrameStream.connect(("127.0.0.1", host.port), codec, timeout=5.0)
    open_session(stream, rank, 5.0)
    join = proto.Join(rank, world, "127.0.0.1", 1, [[3]], 0)
    stream.send(control_frame(rank, codec.run, join.to_dict()))
    return stream


def test_closing_the_host_on_the_first_refusal_still_refuses_every_rank(monkeypatch):
    """Rank 0 hosts the rendezvous and closes it as soon as it reads its own refusal. The
    other ranks must still get theirs: a bare close reads as another secret (CI saw that)."""
    codec = FrameCodec(b"s" * 32, 7)
    host = RendezvousHost(
        codec, 3, ("127.0.0.1", 0), lambda *a: pytest.fail("no config"), join_timeout=1.0
    )
    sent = RendezvousHost._send

    def slow_send(self, conn, msg):  # widen the window between one rank's copy and the next
        sent(self, conn, msg)
        time.sleep(0.3)

    monkeypatch.setattr(RendezvousHost, "_send", slow_send)
    host.start()
    first, second = (_joined_client(host, codec, r, 3) for r in (0, 1))
    try:
        replies = []
        for stream in (first, second):
            replies.append(proto.decode(control_body(stream.recv(idle_timeout=10.0))))
            if stream is first:
                host.close()  # what the launcher does when rank 0 is refused
        assert all(isinstance(m, proto.Refused) for m in replies), replies
        assert all("ranks [2] did not join within 1 s" in m.reason for m in replies), replies
    finally:
        first.close()
        second.close()
        host.close()


def test_stopping_the_host_refuses_the_joined_ranks_at_once():
    """A stop (the coordinator's SIGTERM) ends the exchange well before the join timeout, and a
    rank that joined is told why instead of seeing its connection drop."""
    codec = FrameCodec(b"s" * 32, 7)
    host = RendezvousHost(
        codec, 3, ("127.0.0.1", 0), lambda *a: pytest.fail("no config"), join_timeout=600.0
    )
    host.start()
    first = _joined_client(host, codec, 0, 3)
    try:
        host.stop()
        reply = proto.decode(control_body(first.recv(idle_timeout=10.0)))
        host.join(10.0)
        assert isinstance(reply, proto.Refused), reply
        assert "stopped during start-up" in reply.reason, reply
        assert host.failure is not None and "stopped" in host.failure
        assert host._thread is not None and not host._thread.is_alive()
    finally:
        first.close()
        host.close()
