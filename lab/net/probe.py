"""Ping probes on a running lab: RTT, its spread and loss, judged against the configuration.

Used by ``lab.studies.impairments`` (the in-VM impairment table) and ``lab.check`` (delay and
loss of every configured pair). ``ping`` (iputils) runs in host i against host j's identity
over the direct link:

- RTT = delay(i->j) + delay(j->i) plus processing; median and p90 must be within
  ``TOLERANCE`` (10%) of configured, plus ``RTT_FLOOR_MS`` of processing (a TCG guest answers a
  ping in about a millisecond). p90 of a jittered pair is judged against the normal quantile,
  mean + 1.2816 sigma.
- Jitter: netem's ``normal`` distribution makes jitter the standard deviation of the one-way
  delay, so the RTT's standard deviation is sqrt(J_ij^2 + J_ji^2); it must be within
  ``JITTER_TOLERANCE`` (25%: netem's table is coarse, and timer granularity adds spread). The
  measured one is estimated from the interquartile range (IQR / 1.349, which is the standard
  deviation of a normal distribution), not the sample standard deviation: a TCG guest now and
  then answers a ping tens of milliseconds late, and a few such outliers in 200 probes can put
  the sample deviation of a 5 ms jitter at 6.4 ms (docs/decisions/2026-12-03-jitter-by-iqr.md).
- Loss: a probe is lost if either direction drops it, so the expected round-trip loss is
  1 - (1 - l_ij)(1 - l_ji); the bound is the larger of 10% relative and 3 binomial standard
  deviations of the probe count (a few thousand probes at 20% loss make the 10% the bound).
"""

from __future__ import annotations

import math
import re
import statistics
import subprocess
from dataclasses import dataclass

from lab.net.mesh import LabNetwork, LinkState

TOLERANCE = 0.10
JITTER_TOLERANCE = 0.25
RTT_FLOOR_MS = 1.5
Z90 = 1.2816
IQR_PER_SD = 1.349  # a normal distribution's interquartile range, in standard deviations
PING_TIMEOUT_PAD_S = 15.0
_RTT_RE = re.compile(r"time=(\d+(?:\.\d+)?) ms")
_SUMMARY_RE = re.compile(r"(\d+) packets transmitted, (\d+) received")


@dataclass(frozen=True)
class PingStats:
    sent: int
    received: int
    rtts_ms: tuple[float, ...]

    @property
    def loss(self) -> float:
        return 1 - self.received / self.sent if self.sent else float("nan")

    @property
    def median_ms(self) -> float:
        return statistics.median(self.rtts_ms) if self.rtts_ms else float("nan")

    @property
    def p90_ms(self) -> float:
        if len(self.rtts_ms) < 2:
            return float("nan")
        return statistics.quantiles(self.rtts_ms, n=10)[-1]

    @property
    def spread_ms(self) -> float:
        """The standard deviation of the RTTs as a normal distribution's, from their
        interquartile range: robust to the few late answers of a busy guest."""
        if len(self.rtts_ms) < 4:
            return float("nan")
        q1, _, q3 = statistics.quantiles(self.rtts_ms, n=4)
        return (q3 - q1) / IQR_PER_SD


def parse_ping(text: str) -> PingStats:
    m = _SUMMARY_RE.search(text)
    if not m:
        raise ValueError(f"no ping summary in output: {text[-300:]!r}")
    rtts = tuple(float(x) for x in _RTT_RE.findall(text))
    return PingStats(int(m.group(1)), int(m.group(2)), rtts)


def ping(net: LabNetwork, src: int, dst: int, *, count: int, interval_s: float) -> PingStats:
    """``count`` echo requests from host ``src`` to ``dst``'s identity, ``interval_s`` apart.

    Each probe waits at most 2 s for its answer; the whole run is bounded."""
    argv = [
        "ping",
        "-n",
        "-c",
        str(count),
        "-i",
        f"{interval_s:g}",
        "-W",
        "2",
        "-I",
        net.identity_address(src),
        net.identity_address(dst),
    ]
    proc = net.popen(src, argv, label=f"ping {src}->{dst}", stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=count * interval_s * 1.5 + PING_TIMEOUT_PAD_S)
    finally:
        net.stop_process(proc, timeout=2.0)
    return parse_ping(out)


def expected_rtt(a: LinkState, b: LinkState) -> tuple[float, float, float]:
    """(mean RTT ms, RTT standard deviation ms, round-trip loss fraction) over the link ``a``
    and its reverse ``b``."""
    sd = math.hypot(a.jitter_ms, b.jitter_ms)
    loss = 1 - (1 - a.loss_pct / 100) * (1 - b.loss_pct / 100)
    return a.delay_ms + b.delay_ms, sd, loss


@dataclass(frozen=True)
class Row:
    """One measured quantity against its configuration."""

    when: str  # "built" or "changed at run time"
    link: str
    quantity: str
    configured: float
    measured: float
    low: float
    high: float
    unit: str
    samples: int

    @property
    def ok(self) -> bool:
        return self.low <= self.measured <= self.high

    @classmethod
    def within(
        cls,
        when: str,
        link: str,
        quantity: str,
        configured: float,
        measured: float,
        tol: float,
        unit: str,
        samples: int,
    ) -> Row:
        """A row whose bound is ``configured`` ± ``tol`` (never below zero)."""
        low = max(0.0, configured - tol)
        return cls(when, link, quantity, configured, measured, low, configured + tol, unit, samples)


def rtt_rows(when: str, a: LinkState, b: LinkState, stats: PingStats) -> list[Row]:
    """RTT median and p90 (and jitter, where configured) of pings over ``a`` and back ``b``."""
    mean, sd, _ = expected_rtt(a, b)
    link = f"w{a.src}<->w{a.dst}"
    tol = mean * TOLERANCE + RTT_FLOOR_MS
    samples = len(stats.rtts_ms)
    p90 = mean + Z90 * sd
    rows = [
        Row.within(when, link, "RTT median", mean, stats.median_ms, tol, "ms", samples),
        Row.within(when, link, "RTT p90", p90, stats.p90_ms, tol, "ms", samples),
    ]
    if sd > 0:
        jtol = sd * JITTER_TOLERANCE
        jitter = Row.within(when, link, "jitter (RTT sd)", sd, stats.spread_ms, jtol, "ms", samples)
        rows.append(jitter)
    return rows


def loss_row(when: str, a: LinkState, b: LinkState, stats: PingStats) -> Row:
    _, _, loss = expected_rtt(a, b)
    pct = 100 * loss
    sigma = 100 * math.sqrt(loss * (1 - loss) / stats.sent) if stats.sent else 0.0
    tol = max(pct * TOLERANCE, 3 * sigma)
    link = f"w{a.src}<->w{a.dst}"
    return Row.within(when, link, "loss", pct, 100 * stats.loss, tol, "%", stats.sent)
