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
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import Callable

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


def accept_loop(
    listener: socket.socket,
    stopped: Callable[[], bool],
    on_accept: Callable[[socket.socket, Address], None],
    *,
    name: str,
    poll_s: float = 0.5,
) -> None:
    """Accept connections on ``listener`` until ``stopped()`` or the listener is closed, and
    hand each to ``on_accept(sock, (host, port))`` in this thread (blocking mode). If
    ``on_accept`` raises, that socket is closed and the loop goes on.

    ``poll_s`` bounds how long a stop waits to be noticed when nothing wakes ``accept()``.
    """
    listener.settimeout(poll_s)
    backoff = BACKOFF_MIN_S
    last_log = -LOG_EVERY_S
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
        sock.settimeout(None)
        try:
            on_accept(sock, addr[:2])
        except Exception:  # one connection's set-up must not end the listener
            log.exception("%s: setting up a connection from %s failed", name, addr[:2])
            sock.close()
