"""The accept loop every CREW listener runs: the data plane, the coordinator and the rendezvous.

One loop, so that all three survive the same things. ``accept()`` fails for two kinds of
reasons:

* the process or the kernel is out of a resource (file descriptors, socket buffers, memory),
  or the peer reset the connection before it was accepted. These pass: a peer that opens
  connections until the process has no descriptors left must not end the listener, or no
  honest worker could reconnect after the peer leaves. The loop backs off (doubling from
  ``BACKOFF_MIN_S`` up to ``BACKOFF_MAX_S``, so it does not spin on a full table) and goes on,
  logging at most once per ``LOG_EVERY_S``.
* the listener was closed or shut down (the owner is stopping). The loop ends.

Before a connection costs a thread or a byte of buffer, :class:`ConnectionLimit` admits it or
closes it at once: at most ``max_total`` open connections per listener and ``max_per_source``
per source address, so one peer cannot take every slot, and a flood from many cannot take
every descriptor. An admitted connection counts until its owner closes (or drops) its socket;
nobody has to report that. Refusals are counted per source in a bounded table and logged at
most once per ``LOG_EVERY_S``.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.01
BACKOFF_MAX_S = 1.0
LOG_EVERY_S = 10.0

TRANSIENT_ERRNOS = frozenset(
    {
        errno.EMFILE,  # this process's descriptor limit
        errno.ENFILE,  # the system's descriptor limit
        errno.ENOBUFS,
        errno.ENOMEM,
        errno.ECONNABORTED,  # the peer reset before accept(): only that connection is lost
        errno.EPROTO,
        errno.EPERM,  # a firewall refused the connection
    }
)

Address = tuple[str, int]

MAX_CONNECTIONS = 512  # per listener: well under the usual 1024-descriptor limit
MAX_PER_SOURCE = 128  # per source address: a 64-rank job on one host opens two per rank
REFUSED_SOURCES_KEPT = 64


@dataclass
class ConnectionLimit:
    """Caps on a listener's open connections, in all and per source address."""

    max_total: int = MAX_CONNECTIONS
    max_per_source: int = MAX_PER_SOURCE
    # Open connections as weak references: a socket its owner closed or dropped stops counting.
    _open: list[tuple[weakref.ref[socket.socket], str]] = field(default_factory=list)
    refused: OrderedDict[str, int] = field(default_factory=OrderedDict)  # newest source last

    def __post_init__(self) -> None:
        if self.max_total < 1 or self.max_per_source < 1:
            raise ValueError(
                f"connection limits must be >= 1, got {self.max_total} and {self.max_per_source}"
            )

    def _prune(self) -> None:
        live = []
        for ref, host in self._open:
            sock = ref()
            if sock is not None and sock.fileno() != -1:
                live.append((ref, host))
        self._open = live

    def open_from(self, host: str) -> int:
        self._prune()
        return sum(1 for _, h in self._open if h == host)

    def admit(self, sock: socket.socket, host: str) -> bool:
        """Count ``sock`` from ``host`` if both caps allow it; False: the caller closes it."""
        self._prune()
        if len(self._open) >= self.max_total or self.open_from(host) >= self.max_per_source:
            self.refused[host] = self.refused.pop(host, 0) + 1
            while len(self.refused) > REFUSED_SOURCES_KEPT:
                self.refused.popitem(last=False)
            return False
        self._open.append((weakref.ref(sock), host))
        return True


def accept_loop(
    listener: socket.socket,
    stopped: Callable[[], bool],
    on_accept: Callable[[socket.socket, Address], None],
    *,
    name: str,
    poll_s: float = 0.5,
    limit: ConnectionLimit | None = None,
) -> None:
    """Accept connections on ``listener`` until ``stopped()`` or the listener is closed, and
    hand each to ``on_accept(sock, (host, port))`` in this thread (blocking mode). If
    ``on_accept`` raises, that socket is closed and the loop goes on. A connection over
    ``limit`` (default: a fresh :class:`ConnectionLimit`) is closed at once.

    ``poll_s`` bounds how long a stop waits to be noticed when nothing wakes ``accept()``.
    """
    limit = ConnectionLimit() if limit is None else limit
    try:
        listener.settimeout(poll_s)
    except OSError:  # closed before the loop started: the owner is already stopping
        return
    backoff = BACKOFF_MIN_S
    last_log = last_refusal_log = -LOG_EVERY_S
    while not stopped():
        try:
            sock, addr = listener.accept()
        except TimeoutError:
            continue
        except OSError as exc:
            if stopped() or exc.errno not in TRANSIENT_ERRNOS:
                if not stopped():
                    log.error("%s: accept failed, no more inbound connections: %s", name, exc)
                return
            now = time.monotonic()
            if now - last_log >= LOG_EVERY_S:
                log.warning("%s: accept failed (%s); backing off and going on", name, exc)
                last_log = now
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)
            continue
        backoff = BACKOFF_MIN_S
        if not limit.admit(sock, addr[0]):
            sock.close()
            now = time.monotonic()
            if now - last_refusal_log >= LOG_EVERY_S:
                top = sorted(limit.refused.items(), key=lambda kv: -kv[1])[:3]
                log.warning("%s: over its connection limits; refused so far: %s", name, top)
                last_refusal_log = now
            continue
        sock.settimeout(None)
        try:
            on_accept(sock, addr[:2])
        except Exception:  # one connection's set-up must not end the listener
            log.exception("%s: setting up a connection from %s failed", name, addr[:2])
            sock.close()
