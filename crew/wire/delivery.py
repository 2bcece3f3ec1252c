"""A connection's delivery rate, as the kernel measures it: what a link carries when it is full.

Linux keeps, per TCP connection, the rate of its latest delivery sample (bytes acknowledged over
the interval they took, ``tcpi_delivery_rate`` in ``TCP_INFO``) and whether the sender was
*application-limited* then (had nothing more to send, so the sample says nothing about the
path). A sample taken while the sender was not application-limited is the rate the path
delivers: on a shaped link, the shaper's rate, whatever the sender's or receiver's threads were
doing, since the kernel times ACKs in its softirq. That is why a sender's samples track a
drifting link better than a receiver's timing of frame arrivals in user space, which eight
workers on two cores delay by a scheduling slice at a time.

:class:`DeliveryMeter` keeps one link's samples between reports: the sender reads ``TCP_INFO``
at most every ``min_gap_s`` after a frame went out (one ``getsockopt`` call), and
:meth:`DeliveryMeter.take` gives their median. Elsewhere than Linux, or on a socket that is not
TCP, no sample is ever taken.

Layout (``include/uapi/linux/tcp.h``, stable since 4.9): byte 7 bit 0 is
``tcpi_delivery_rate_app_limited``; ``tcpi_delivery_rate`` is the little-endian u64 at 160.
"""

from __future__ import annotations

import socket
import statistics

TCP_INFO = getattr(socket, "TCP_INFO", None)
INFO_BYTES = 168
APP_LIMITED_BYTE = 7
DELIVERY_RATE_AT = 160
MIN_GAP_S = 0.05
MAX_SAMPLES = 64  # per link between two reports (one a second): enough for a median


def delivery_rate(info: bytes) -> float | None:
    """Bytes per second of a ``TCP_INFO`` record's latest delivery sample, or None when the
    sample was application-limited, absent or the record is too short to hold it."""
    if len(info) < DELIVERY_RATE_AT + 8 or info[APP_LIMITED_BYTE] & 1:
        return None
    rate = int.from_bytes(info[DELIVERY_RATE_AT : DELIVERY_RATE_AT + 8], "little")
    return float(rate) if rate > 0 else None


def read_delivery_rate(sock: socket.socket) -> float | None:
    """The latest delivery sample of ``sock`` (see :func:`delivery_rate`); None where the
    kernel keeps none."""
    if TCP_INFO is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, TCP_INFO, INFO_BYTES)
    except OSError:
        return None
    return delivery_rate(info)


class DeliveryMeter:
    """One link's delivery samples between reports. Not thread-safe: the link's sender thread
    adds, and the reader takes under the transport's lock."""

    def __init__(self, min_gap_s: float = MIN_GAP_S, max_samples: int = MAX_SAMPLES) -> None:
        self.min_gap_s = min_gap_s
        self.max_samples = max_samples
        self._read_at = float("-inf")
        self._samples: list[float] = []

    def due(self, now: float) -> bool:
        """Whether a frame sent at ``now`` should read the connection's sample."""
        if now - self._read_at < self.min_gap_s or len(self._samples) >= self.max_samples:
            return False
        self._read_at = now
        return True

    def add(self, bytes_per_s: float | None) -> None:
        if bytes_per_s is not None and len(self._samples) < self.max_samples:
            self._samples.append(bytes_per_s)

    def take(self) -> float | None:
        """The median sample since the last call, in bytes per second; None without one."""
        out = statistics.median(self._samples) if self._samples else None
        self._samples = []
        return out
