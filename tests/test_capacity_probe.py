"""The start-up probe's pure parts (no root, no sockets): the schedule of rounds and its cost
bounds, and how a receiver times a burst."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crew.runtime.capacity_probe import (
    MIN_ROUND_S,
    PROBE_FRAME_BYTES,
    REPORT_SLACK_S,
    ProbeReceiver,
    plan_probe,
)
from crew.wire.frames import Frame, FrameKind, wire_size

MIB = 1 << 20


@given(st.integers(2, 21))
def test_every_directed_link_once_one_burst_out_and_in_per_rank_and_never_both_ways(n):
    plan = plan_probe(n, 2 * MIB, 30.0)
    # uncapped up to 21 ranks: n - 1 rounds, and one more for even n (the n/2 shift split)
    assert len(plan.rounds) == (n - 1 if n % 2 else n)
    seen = []
    for r, bursts in enumerate(plan.rounds):
        srcs, dsts = [s for s, _ in bursts], [d for _, d in bursts]
        assert len(set(srcs)) == len(srcs) and len(set(dsts)) == len(dsts)
        assert all(s != d for s, d in bursts)
        assert not {(d, s) for s, d in bursts} & set(bursts)  # no reverse burst in the round
        for rank in range(n):  # what the host tells each rank
            send_to, time_from = plan.part(r, rank)
            assert ((rank, send_to) in bursts) == (send_to >= 0)
            assert ((time_from, rank) in bursts) == (time_from >= 0)
        seen += bursts
    assert sorted(seen) == [(s, d) for s in range(n) for d in range(n) if s != d]
    assert plan.links == n * (n - 1)


@given(st.integers(2, 400), st.floats(0.1, 120.0))
def test_the_cost_is_bounded_in_time_and_bytes_for_any_n(n, budget):
    plan = plan_probe(n, 4 * MIB, budget)
    cap = max(1, int(budget // MIN_ROUND_S))
    rounds = len(plan.rounds)
    assert rounds == min(n - 1 if n % 2 else n, cap)
    assert plan.bytes_per_worker == rounds * 4 * MIB <= cap * 4 * MIB
    assert plan.round_seconds * rounds == pytest.approx(budget)
    assert plan.seconds_bound <= budget + cap * REPORT_SLACK_S + 1e-9
    assert len(set(sum(plan.rounds, ()))) == plan.links <= rounds * n


def test_the_cap_past_21_ranks():
    small, big = plan_probe(21, 2 * MIB, 30.0), plan_probe(100, 2 * MIB, 30.0)
    assert (len(small.rounds), small.round_seconds, small.links) == (20, 1.5, 21 * 20)
    assert (len(big.rounds), big.round_seconds) == (20, 1.5)  # time and bytes stop growing
    assert big.links == 100 * 20 and big.bytes_per_worker == 20 * 2 * MIB


def test_no_probe_for_one_rank_or_zero_bytes_and_bad_input_is_named():
    assert plan_probe(1, MIB, 30.0).rounds == ()
    assert plan_probe(5, 0, 30.0).rounds == ()
    with pytest.raises(ValueError, match="probe_seconds"):
        plan_probe(4, MIB, 0.0)
    with pytest.raises(ValueError, match="n: must be at least 1"):
        plan_probe(0, MIB, 1.0)


def data(sender: int, k: int) -> Frame:
    return Frame(FrameKind.PAYLOAD, sender, 1, part=k, payload=bytes(PROBE_FRAME_BYTES))


def closing(sender: int, k: int) -> Frame:
    return Frame(FrameKind.PAYLOAD, sender, 1, part=k)


FRAME = wire_size(data(0, 0))


def test_a_steady_burst_is_timed_from_its_first_frame_to_its_last():
    rx = ProbeReceiver()
    for k in range(33):  # one frame every 10 ms
        rx.on_frame(data(3, k), now=100.0 + 0.01 * k)
    rx.on_frame(closing(3, 33), now=105.0)  # late closing frame: not part of the time
    assert rx.wait(3, 0.0)
    assert rx.take(3) == [3.0, 32.0 * FRAME, pytest.approx(0.32)]


def test_a_stall_then_a_flood_is_timed_as_one_burst():
    # A TCP loss repair: nothing is readable for 0.4 s, then the data queued behind the hole
    # arrives at once. The link delivered 40 frames in 0.8 s, whatever the reads look like.
    rx = ProbeReceiver()
    times = [0.01 * k for k in range(20)] + [0.6 + 0.001 * k for k in range(20)]
    times += [0.62 + 0.009 * k for k in range(1, 21)]
    for k, t in enumerate(times):
        rx.on_frame(data(1, k), now=t)
    rx.on_frame(closing(1, len(times)), now=times[-1])
    src, nbytes, seconds = rx.take(1)
    assert (src, nbytes) == (1.0, (len(times) - 1) * FRAME)
    assert seconds == pytest.approx(times[-1])  # not the flood's 19 ms


def test_frames_after_the_report_and_other_kinds_are_ignored_and_short_bursts_give_none():
    rx = ProbeReceiver()
    assert not rx.wait(2, 0.01)  # nothing came
    for k in range(3):
        rx.on_frame(data(2, k), now=float(k))
    assert rx.take(2) is None  # 2 frames after the first: too short to time
    rx.on_frame(data(2, 9), now=50.0)
    assert rx.take(2) is None
    rx.on_frame(Frame(FrameKind.HELLO, 4, 1), now=1.0)
    assert rx.take(4) is None
