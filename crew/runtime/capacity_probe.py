"""The start-up capacity probe: which links are measured when, and how one burst is timed.

A launched job has no topology file, so before training the ranks measure the capacity of
every directed link ``src -> dst`` (``crew.runtime.rendezvous`` runs the rounds).

Schedule (:func:`plan_probe`). Round ``r`` has a *shift* ``s``: every rank ``i`` sends one
burst of ``probe_bytes`` to rank ``(i + s) mod n`` and times the burst from ``(i - s) mod n``.
So in every round each rank sends at most one burst and receives at most one: no two bursts
share a sender's uplink or a receiver's downlink, and what is measured is the path, not a
share of a machine's NIC. Shifts ``1 .. n - 1`` cover all ``n (n - 1)`` directed links once.
For even ``n`` the shift ``n / 2`` pairs ranks both ways (``i -> i + n/2 -> i``): the
acknowledgements of each burst would queue behind the other burst on the reverse link, and
the lab measured such links up to 35% low, so that shift runs as two rounds, one direction
each. That makes ``n - 1`` rounds for odd ``n`` and ``n`` for even ``n``; the rounds run one
after the other (the host starts the next when every rank has reported). The host tells each
rank its part of a round (``Probe(send_to, time_from)``).

Cost model, for ``n`` ranks, burst ``B = probe_bytes`` and budget ``T = probe_seconds``:

* rounds ``R = min(full, floor(T / MIN_ROUND_S))`` (at least 1), ``full`` being ``n - 1``
  (odd ``n``) or ``n`` (even ``n``): the cap. Up to 21 ranks with the defaults (20 rounds)
  every link is measured; beyond that, only the first ``R`` rounds run (each rank measures
  its links to the ranks just after it and from those just before it, modulo ``n``); the
  other links start at the median of the measured ones, and the coordinator's online
  estimator corrects them from training traffic;
* each round's bursts are cut at ``round_seconds = T / R`` (never below ``MIN_ROUND_S``
  unless ``T`` is), and a receiver reports at its burst's closing frame or ``REPORT_SLACK_S``
  after the cut, so the probe takes at most ``R (T / R + REPORT_SLACK_S) = T + R *
  REPORT_SLACK_S`` plus one control round trip per round; typically ``R`` times the slowest
  link's ``B / rate`` in each round;
* bytes: each rank sends and receives at most ``R B``; the job moves ``n (n - 1) B`` while
  uncapped, ``O(n B T / MIN_ROUND_S)`` once capped.

Timing (:class:`ProbeReceiver`). A burst's rate is the bytes after its first frame over the
time from the first frame's arrival to the last one's, up to the sender's empty closing frame.
No gap splits the burst: a TCP loss repair stalls delivery, then hands over everything queued
behind the hole at once; timing only the bursts between stalls over-reads a link (the 2.5x
error of the first version). The first frame is excluded because its arrival includes the
connection's start.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from crew.wire.frames import Frame, FrameKind, wire_size
from crew.wire.transport import Transport

log = logging.getLogger("crew.runtime.capacity_probe")

PROBE_FRAME_BYTES = 64 << 10
DEFAULT_PROBE_BYTES = 2 << 20
DEFAULT_PROBE_SECONDS = 30.0  # the whole probe's budget (see the cost model)
MIN_ROUND_S = 1.5  # a round's cut is not made shorter than this: fewer rounds instead
REPORT_SLACK_S = 2.0  # a receiver waits this long after the cut for the closing frame
MIN_SAMPLE_FRAMES = 4  # frames after the first one: fewer time socket buffers, not the link


Burst = tuple[int, int]  # (src, dst)


@dataclass(frozen=True)
class ProbePlan:
    """The rounds of one job's start-up probe (see the module doc): the bursts of each."""

    n: int
    rounds: tuple[tuple[Burst, ...], ...]
    probe_bytes: int
    round_seconds: float

    def part(self, r: int, rank: int) -> tuple[int, int]:
        """``(send_to, time_from)`` of ``rank`` in round ``r``; -1 where it has none."""
        send_to = next((d for s, d in self.rounds[r] if s == rank), -1)
        time_from = next((s for s, d in self.rounds[r] if d == rank), -1)
        return send_to, time_from

    @property
    def links(self) -> int:
        """Directed links measured (``n (n - 1)`` unless capped)."""
        return sum(len(bursts) for bursts in self.rounds)

    @property
    def bytes_per_worker(self) -> int:
        """Bytes each rank sends (and receives) at most."""
        return len(self.rounds) * self.probe_bytes

    @property
    def seconds_bound(self) -> float:
        """The probe's duration at most, control round trips aside."""
        return len(self.rounds) * (self.round_seconds + REPORT_SLACK_S)


def schedule(n: int) -> list[tuple[Burst, ...]]:
    """Every directed link of ``n`` ranks once, in rounds where each rank sends at most one
    burst and receives at most one, and no round has both ``a -> b`` and ``b -> a``."""
    rounds: list[tuple[Burst, ...]] = []
    for shift in range(1, n):
        bursts = [(i, (i + shift) % n) for i in range(n)]
        if 2 * shift == n:  # both ways between the same ranks: one direction per round
            rounds += [tuple(bursts[: n // 2]), tuple(bursts[n // 2 :])]
        else:
            rounds.append(tuple(bursts))
    return rounds


def plan_probe(n: int, probe_bytes: int, probe_seconds: float) -> ProbePlan:
    """The probe for ``n`` ranks: bursts of ``probe_bytes``, within ``probe_seconds``."""
    if n < 1:
        raise ValueError(f"n: must be at least 1, got {n}")
    if probe_bytes < 0:
        raise ValueError(f"probe_bytes: must be >= 0, got {probe_bytes}")
    if not probe_seconds > 0:
        raise ValueError(f"probe_seconds: must be > 0, got {probe_seconds}")
    if n == 1 or probe_bytes == 0:
        return ProbePlan(n, (), probe_bytes, 0.0)
    full = schedule(n)
    rounds = max(1, min(len(full), int(probe_seconds // MIN_ROUND_S)))
    return ProbePlan(n, tuple(full[:rounds]), probe_bytes, probe_seconds / rounds)


def send_burst(
    transport: Transport, me: int, run_num: int, dst: int, probe_bytes: int, seconds: float
) -> None:
    """Queue ``probe_bytes`` of PAYLOAD frames to ``dst``, then the empty frame that closes the
    burst; frames not handed to the kernel within ``seconds`` are dropped (the closing frame
    still goes)."""
    chunk = bytes(PROBE_FRAME_BYTES)
    frames = max(1, probe_bytes // PROBE_FRAME_BYTES)
    for k in range(frames):
        transport.send(dst, Frame(FrameKind.PAYLOAD, me, run_num, part=k, payload=chunk))
    transport.send(dst, Frame(FrameKind.PAYLOAD, me, run_num, part=frames))
    if not transport.flush(seconds):
        dropped = transport.cancel(lambda f: f.kind == FrameKind.PAYLOAD and f.nbytes > 0)
        log.warning("probe: burst to %d cut at %.1f s, %d frames not sent", dst, seconds, dropped)


@dataclass
class _Burst:
    first: float = -1.0
    last: float = -1.0
    bytes_after_first: int = 0
    frames: int = 0
    closed: bool = False
    taken: bool = False


class ProbeReceiver:
    """Times the probe burst from each peer (see the module doc). Fed every data-plane frame
    during start-up, from the transport's reader threads; each peer sends it one burst."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._bursts: dict[int, _Burst] = {}

    def on_frame(self, frame: Frame, now: float | None = None) -> None:
        if frame.kind != FrameKind.PAYLOAD:
            return
        now = time.monotonic() if now is None else now
        with self._cond:
            burst = self._bursts.setdefault(frame.sender, _Burst())
            if burst.closed or burst.taken:
                return  # the rest of a burst already reported
            if not frame.nbytes:
                burst.closed = True
                self._cond.notify_all()
                return
            if burst.frames:
                burst.bytes_after_first += wire_size(frame)
            else:
                burst.first = now
            burst.last = now
            burst.frames += 1

    def wait(self, src: int, timeout: float) -> bool:
        """Until ``src``'s closing frame arrived; False after ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(
                lambda: src in self._bursts and self._bursts[src].closed, max(timeout, 0.0)
            )

    def take(self, src: int) -> list[float] | None:
        """``[src, bytes, seconds]`` of ``src``'s burst so far (None if too short to time);
        later frames from ``src`` are ignored."""
        with self._cond:
            burst = self._bursts.setdefault(src, _Burst())
            burst.taken = True
            seconds = burst.last - burst.first
            if burst.frames <= MIN_SAMPLE_FRAMES or seconds <= 0:
                return None
            return [float(src), float(burst.bytes_after_first), seconds]
