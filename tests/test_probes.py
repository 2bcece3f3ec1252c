"""Link probes: the pure watch with a fake clock, and real UDP probes on loopback."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from crew.wire.frames import Frame, FrameCodec, FrameKind
from crew.wire.probes import (
    DEAD_AFTER_S,
    PROBE_INTERVAL_S,
    PROBE_WIRE_BYTES,
    PROBES_PER_S_MAX,
    LinkStateChange,
    LinkWatch,
    Prober,
    ProbeRefused,
    dead_after,
    probe_frame,
    probe_interval,
)

RUN = 7
SECRET = b"s" * 32


def test_probe_traffic_is_within_half_a_percent_of_the_slowest_link() -> None:
    slowest_mbit = 10.0  # topologies/generate.py clips every rate to >= 10 Mbit/s
    assert PROBE_WIRE_BYTES * 8 / PROBE_INTERVAL_S <= 0.005 * slowest_mbit * 1e6


def test_silence_kills_a_link_and_the_next_probe_revives_it() -> None:
    w = LinkWatch(1, [0, 1, 2], start=100.0)
    assert w.expire(100.0 + DEAD_AFTER_S - 0.01) == []
    assert w.observe(probe_frame(0, 1, RUN, 101.0), 101.0) == []
    (dead,) = w.expire(100.0 + DEAD_AFTER_S + 1e-6)  # 2 was never heard: dead after dead_after
    assert dead == LinkStateChange(2, 1, False, pytest.approx(DEAD_AFTER_S))
    assert w.down() == [2] and w.expire(100.0 + DEAD_AFTER_S + 0.1) == []
    (alive,) = w.observe(probe_frame(2, 1, RUN, 105.0), 105.0)
    assert alive.alive and alive.src == 2 and w.down() == []


def test_the_probe_budget_holds_at_any_n_and_keeps_six_intervals_of_silence() -> None:
    for peers in (1, 7, 10):  # up to 11 workers the budget does not bind
        assert probe_interval(peers) == PROBE_INTERVAL_S and dead_after(peers) == DEAD_AFTER_S
    for peers in (7, 19, 31, 59):
        assert peers / probe_interval(peers) <= PROBES_PER_S_MAX + 1e-9
        assert dead_after(peers) >= 6 * probe_interval(peers)
    assert probe_interval(31) > probe_interval(19) > PROBE_INTERVAL_S


def test_data_from_a_peer_keeps_its_link_alive_without_probes() -> None:
    w = LinkWatch(1, [0, 2], start=0.0, dead_after=1.0)
    for t in (0.5, 1.2, 1.9, 2.6):  # data frames from 0 only; no probe from anyone
        w.heard(0, t)
    assert [c.src for c in w.expire(3.0)] == [2]
    assert w.down() == [2]
    w.heard(2, 3.5)  # data cannot revive a dead link (a probe does, and reports it)
    assert w.down() == [2] and w.expire(3.59) == []  # 0 was heard 0.99 s ago
    assert [c.src for c in w.expire(3.61)] == [0]


def test_a_peer_never_heard_from_is_given_the_start_grace() -> None:
    w = LinkWatch(1, [0, 2], start=0.0, dead_after=1.0, first_grace=5.0)
    w.observe(probe_frame(0, 1, RUN, 0.5), 0.5)
    assert [c.src for c in w.expire(1.6)] == [0]  # heard once: the usual dead_after
    assert w.expire(4.9) == []  # 2 not heard yet: it may still be starting
    (late,) = w.expire(5.0)
    assert late.src == 2 and not late.alive


def test_replayed_reflected_and_foreign_probes_are_refused() -> None:
    w = LinkWatch(1, [0, 1, 2], start=0.0)
    p = probe_frame(0, 1, RUN, 5.0)
    w.observe(p, 5.0)
    with pytest.raises(ProbeRefused, match="replay"):
        w.observe(p, 5.5)
    with pytest.raises(ProbeRefused, match="block"):
        w.observe(probe_frame(0, 2, RUN, 6.0), 6.0)
    with pytest.raises(ProbeRefused, match="not a peer"):
        w.observe(probe_frame(9, 1, RUN, 6.0), 6.0)
    with pytest.raises(ProbeRefused, match="not a probe"):
        w.observe(Frame(FrameKind.SCATTER, sender=0, run=RUN, block=1, offset=10**9), 6.0)
    # A replay cannot revive a dead link.
    w.expire(5.0 + DEAD_AFTER_S + 1e-6)
    with pytest.raises(ProbeRefused):
        w.observe(p, 9.0)
    assert w.down() == [0, 2]


WAIT_S = 5.0  # for a prober thread on loopback: milliseconds, unless the machine is busy


def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    for _ in range(int(WAIT_S / 0.01) + 1):
        if predicate():
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    pytest.fail(f"timed out after {WAIT_S:.0f} s waiting for {what}")


def test_udp_probes_on_loopback_find_a_stopped_peer_and_survive_garbage() -> None:
    codec = FrameCodec(SECRET, RUN)
    changes: list[LinkStateChange] = []
    got = threading.Event()

    def on_change(c: LinkStateChange) -> None:
        changes.append(c)
        got.set()

    a = Prober(0, ("127.0.0.1", 0), {}, codec, on_change, interval=0.05, dead_after=0.4)
    b = Prober(1, ("127.0.0.1", 0), {0: a.address}, codec, lambda c: None, interval=0.05)
    a.peers = {1: b.address}
    a.watch.last_heard = {1: time.time()}
    a.watch.last_seq = {1: -1}
    a.start()
    b.start()
    try:
        _until(lambda: a.received > 0, "a's first probe from b")
        # Garbage and a forged probe are dropped, and do not stop the prober.
        bad = FrameCodec(b"x" * 32, RUN).encode_bytes(probe_frame(1, 0, RUN, time.time() + 1))
        for junk in (b"hello", bad):
            b.sock.sendto(junk, a.address)
        _until(lambda: a.refused >= 2, "a to refuse both bad datagrams")
        received = a.received
        _until(lambda: a.received > received, "a probe from b after the bad datagrams")
        assert a.down() == []
        b.close()  # its probes stop: a declares 1 -> 0 dead within dead_after (+ a poll)
        assert got.wait(2.0)
        assert changes == [LinkStateChange(1, 0, False, pytest.approx(0.45, abs=0.15))]
        assert a.down() == [1]
    finally:
        a.close()
        b.close()


@contextlib.contextmanager
def _watched_by_0(
    peers: int, interval: float
) -> Iterator[tuple[Prober, list[Prober], list[LinkStateChange]]]:
    """Worker 0 (dead after 0.4 s) watching ``peers`` probers that probe it every
    ``interval``; yields (0's prober, the peers' probers, 0's link changes), all running."""
    codec = FrameCodec(SECRET, RUN)
    changes: list[LinkStateChange] = []
    a = Prober(0, ("127.0.0.1", 0), {}, codec, changes.append, interval=interval, dead_after=0.4)
    senders = [
        Prober(k, ("127.0.0.1", 0), {0: a.address}, codec, lambda c: None, interval=interval)
        for k in range(1, peers + 1)
    ]
    a.peers = {s.me: s.address for s in senders}
    a.watch.last_heard = dict.fromkeys(a.peers, time.time())
    a.watch.last_seq = dict.fromkeys(a.peers, -1)
    a.start()
    for s in senders:
        s.start()
    try:
        yield a, senders, changes
    finally:
        a.close()
        for s in senders:
            s.close()


def test_a_receiver_that_did_not_run_for_a_while_reads_its_queued_probes_first() -> None:
    """A busy host may not run a worker's probe thread for longer than ``dead_after``; the
    probes that arrived meanwhile wait in its socket, and no link may be declared dead on
    their account."""
    with _watched_by_0(peers=3, interval=0.05) as (a, _, changes):
        _until(lambda: a.received >= 6, "a's first probes")
        with a._lock:  # a's receiving thread stalls here, as a starved thread would
            time.sleep(1.2)  # 3 x dead_after, every sender still probing
        received = a.received
        _until(lambda: a.received >= received + 6, "a to read on")
        assert [c for c in changes if not c.alive] == []
        assert a.down() == []


def test_a_stopped_peer_is_found_in_time_while_others_keep_probing() -> None:
    """Reading the queued probes first must not postpone expiry: peers that probe more often
    than the socket's poll interval keep the queue busy."""
    # Five peers every 0.1 s: a probe every 20 ms, sooner than the socket's 0.1 s poll.
    with _watched_by_0(peers=5, interval=0.1) as (a, senders, changes):
        _until(lambda: a.received >= 30, "a's first probes")
        for k, sender in enumerate(senders[:2], 1):  # 1, then 2, stop; the others go on
            sender.close()
            _until(lambda k=k: len([c for c in changes if not c.alive]) == k, f"{k} dead")
        dead = [c for c in changes if not c.alive]
        assert [c.src for c in dead] == [1, 2]
        # dead_after, plus a poll and the thread's turn; each, so that luck cannot pass it
        assert all(c.silent_s < 0.4 + 0.25 for c in dead), dead
