"""lab.net.probe: ping output parsing and the bounds RTT, jitter and loss are judged by."""

from __future__ import annotations

import statistics
from statistics import NormalDist

import pytest

from lab.net.mesh import LinkState
from lab.net.probe import PingStats, expected_rtt, loss_row, parse_ping, rtt_rows

PING_OUTPUT = """\
PING 198.18.0.2 (198.18.0.2) from 198.18.0.1 : 56(84) bytes of data.
64 bytes from 198.18.0.2: icmp_seq=1 ttl=64 time=40.7 ms
64 bytes from 198.18.0.2: icmp_seq=2 ttl=64 time=41.0 ms
64 bytes from 198.18.0.2: icmp_seq=4 ttl=64 time=40.2 ms

--- 198.18.0.2 ping statistics ---
4 packets transmitted, 3 received, 25% packet loss, time 15ms
rtt min/avg/max/mdev = 40.2/40.6/41.0/0.3 ms
"""


def test_parse_ping_reads_every_rtt_and_the_counts() -> None:
    stats = parse_ping(PING_OUTPUT)
    assert stats.rtts_ms == (40.7, 41.0, 40.2)
    assert (stats.sent, stats.received) == (4, 3)
    assert stats.loss == pytest.approx(0.25)
    assert stats.median_ms == pytest.approx(40.7)


def test_parse_ping_without_a_summary_is_an_error() -> None:
    with pytest.raises(ValueError, match="no ping summary"):
        parse_ping("ping: connect: Network is unreachable\n")


def test_round_trip_figures_add_delays_jitters_in_quadrature_and_losses() -> None:
    a = LinkState(0, 1, 20.0, delay_ms=30, jitter_ms=3, loss_pct=10)
    b = LinkState(1, 0, 20.0, delay_ms=10, jitter_ms=4, loss_pct=20)
    mean, sd, loss = expected_rtt(a, b)
    assert (mean, sd) == (pytest.approx(40.0), pytest.approx(5.0))
    assert loss == pytest.approx(1 - 0.9 * 0.8)


def test_rtt_rows_fail_a_measured_rtt_more_than_10_percent_off() -> None:
    a, b = LinkState(0, 1, 20.0, delay_ms=50), LinkState(1, 0, 20.0, delay_ms=50)
    ok = parse_ping(PING_OUTPUT.replace("time=4", "time=10"))  # ~100 ms
    far = parse_ping(PING_OUTPUT.replace("time=4", "time=12"))  # ~120 ms
    assert all(r.ok for r in rtt_rows("t", a, b, ok))
    assert not any(r.ok for r in rtt_rows("t", a, b, far))
    assert [r.quantity for r in rtt_rows("t", a, b, ok)] == ["RTT median", "RTT p90"]


def test_loss_bound_is_10_percent_or_three_binomial_sigmas_whichever_is_wider() -> None:
    a, b = LinkState(0, 1, 20.0, loss_pct=20), LinkState(1, 0, 20.0)
    many = parse_ping(f"4000 packets transmitted, {4000 - 840} received")  # 21% lost
    assert loss_row("t", a, b, many).ok
    worse = parse_ping(f"4000 packets transmitted, {4000 - 900} received")  # 22.5%
    assert not loss_row("t", a, b, worse).ok
    few = parse_ping("100 packets transmitted, 75 received")  # 25% of 100: within 3 sigma
    row = loss_row("t", a, b, few)
    assert row.ok and row.high - row.configured == pytest.approx(3 * 100 * (0.2 * 0.8 / 100) ** 0.5)


def test_jitter_is_judged_by_a_spread_a_few_late_answers_do_not_inflate() -> None:
    """200 RTTs normal around 40 ms with sd 5 (by their quantiles), four of them answered
    60 ms late by a busy guest: the sample deviation is far outside the 25% bound, the spread
    from the interquartile range is not; without the late answers both are about 5."""
    normal = NormalDist(40.0, 5.0)
    rtts = [normal.inv_cdf((k + 0.5) / 200) for k in range(200)]
    late = rtts[:196] + [100.0] * 4
    stats = PingStats(200, 200, tuple(late))
    assert stats.spread_ms == pytest.approx(5.0, rel=0.05)
    assert statistics.stdev(late) > 5.0 * 1.25  # what the bound used to be judged on
    a = LinkState(0, 1, 20.0, delay_ms=20, jitter_ms=3)
    b = LinkState(1, 0, 20.0, delay_ms=20, jitter_ms=4)
    (jitter,) = [r for r in rtt_rows("built", a, b, stats) if r.quantity == "jitter (RTT sd)"]
    assert jitter.ok
    narrow = PingStats(200, 200, tuple(40.0 + (r - 40.0) / 2 for r in rtts))
    (jitter,) = [r for r in rtt_rows("built", a, b, narrow) if r.quantity == "jitter (RTT sd)"]
    assert not jitter.ok  # half the configured jitter still fails
