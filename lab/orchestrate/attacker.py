"""A peer without the run's secret: hostile messages, and the connections that carry them.

``lab.fuzz attack`` and ``lab.hostile`` share these pieces. A hostile message is one of three
kinds (:class:`AttackMode`): well-formed frames signed with a key of the attacker's own, random
garbage, or a valid header that declares an oversized payload. :func:`deliver` sends one on an
open connection, half-closes it and waits for the target to end it; :func:`attack` opens one
connection per message. :class:`AttackReport` counts what was sent and how each connection
ended; only ``closed`` and ``reset`` mean the target dropped it.
"""

from __future__ import annotations

import collections
import enum
import errno
import logging
import random
import socket
import time
from dataclasses import dataclass, field

from crew.wire.frames import (
    DEFAULT_MAX_PAYLOAD,
    HEADER,
    MAGIC,
    VERSION,
    Frame,
    FrameCodec,
    FrameKind,
)
from crew.wire.session import HELLO_PAYLOAD

log = logging.getLogger(__name__)

_U32 = 0xFFFF_FFFF
_DROPPED_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN})


def header_bytes(kind: int, length: int, *, run: int = 0, sender: int = 0) -> bytes:
    """A syntactically valid header (magic, version) with any kind and declared length."""
    return HEADER.pack(MAGIC, VERSION, kind, sender, run, 0, 0, 0, 0, 0, length)


class AttackMode(enum.Enum):
    WRONG_MAC = "wrong-mac"  # well-formed frames (HELLO as peer 0, or data) under another key
    GARBAGE = "garbage"  # random bytes
    OVERSIZED = "oversized"  # a valid header declaring more than the maximum payload
    MIXED = "mixed"  # the three in turn


@dataclass
class AttackReport:
    """How each hostile connection ended. Only ``closed``/``reset`` mean the worker dropped it."""

    target: str
    mode: str
    sent: collections.Counter[str] = field(default_factory=collections.Counter)
    ended: collections.Counter[str] = field(default_factory=collections.Counter)
    bytes_sent: int = 0

    @property
    def dropped(self) -> int:
        return self.ended["closed"] + self.ended["reset"]

    def to_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "mode": self.mode,
            "sent": dict(self.sent),
            "ended": dict(self.ended),
            "dropped": self.dropped,
            "bytes_sent": self.bytes_sent,
        }


def hostile_message(mode: AttackMode, rng: random.Random, max_payload: int) -> bytes:
    """One hostile message for a fresh connection (``mode`` is not MIXED)."""
    if mode is AttackMode.WRONG_MAC:
        # We know the wire format but not the key: sign with a key of our own, for a guessed
        # run, claiming to be worker 0 (an id the target accepts in a HELLO).
        codec = FrameCodec(rng.randbytes(32), rng.randrange(_U32 + 1))
        kind = rng.choice([FrameKind.HELLO, FrameKind.SCATTER, FrameKind.CONTROL])
        size = rng.randrange(1, min(4096, max_payload) + 1)  # within the limit: must fail the MAC
        payload = rng.randbytes(HELLO_PAYLOAD if kind is FrameKind.HELLO else size)
        return codec.encode_bytes(Frame(kind, 0, codec.run, payload=payload))
    if mode is AttackMode.GARBAGE:
        return rng.randbytes(rng.randrange(1, 2048))
    if mode is AttackMode.OVERSIZED:
        length = rng.choice([max_payload + 1, _U32, rng.randrange(max_payload + 1, _U32 + 1)])
        # Some bytes of the "payload" follow: the worker must not read them.
        return header_bytes(rng.choice(list(FrameKind)), length) + rng.randbytes(4096)
    raise ValueError(f"mode {mode} has no single message")


def attack(
    host: str,
    port: int,
    frames: int,
    mode: AttackMode = AttackMode.MIXED,
    *,
    seed: int = 0,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    connect_timeout: float = 5.0,
    wait_s: float = 10.0,
    spread_s: float = 0.0,
) -> AttackReport:
    """Open ``frames`` connections to ``host:port``, one hostile message each; see the module
    docstring. ``spread_s``: the connections start evenly over that many seconds (0: one after
    another). Bounded: at most ``spread_s + frames * (connect_timeout + wait_s)`` seconds."""
    rng = random.Random(seed)
    report = AttackReport(f"{host}:{port}", mode.value)
    singles = [AttackMode.WRONG_MAC, AttackMode.GARBAGE, AttackMode.OVERSIZED]
    gap = spread_s / frames if frames else 0.0
    start = time.monotonic()
    for k in range(frames):
        time.sleep(max(0.0, start + k * gap - time.monotonic()))
        m = singles[k % len(singles)] if mode is AttackMode.MIXED else mode
        msg = hostile_message(m, rng, max_payload)
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as e:
            report.ended["connect_failed"] += 1
            log.warning("connect to %s:%d failed: %s", host, port, e)
            continue
        with sock:
            report.sent[m.value] += 1
            report.ended[deliver(sock, msg, wait_s, report)] += 1
    return report


def deliver(sock: socket.socket, msg: bytes, wait_s: float, report: AttackReport) -> str:
    """Send ``msg``, half-close, and wait for the peer to end the connection."""
    try:
        sock.sendall(msg)
        report.bytes_sent += len(msg)
        sock.shutdown(socket.SHUT_WR)  # EOF: a short message is a truncation, not a stall
    except OSError as e:
        # The peer rejected the message before we finished writing it, and closing with
        # unread data made its kernel reset the connection.
        if e.errno in _DROPPED_ERRNOS:
            return "reset"
        log.warning("send failed: %s", e)
        return "send_failed"
    deadline = time.monotonic() + wait_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "kept_open"
        sock.settimeout(remaining)
        try:
            data = sock.recv(4096)
        except TimeoutError:
            return "kept_open"
        except OSError as e:
            if e.errno in _DROPPED_ERRNOS:
                return "reset"
            log.warning("receive failed: %s", e)
            return "recv_failed"
        if not data:
            return "closed"
        return "answered"  # a worker never writes on an inbound data connection
