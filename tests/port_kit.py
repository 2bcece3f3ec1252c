"""Ports for workers started on loopback: a worker's data port carries its TCP listener and
its UDP probes (crew.wire.probes), so a port must be free for both, and the picks must differ."""

from __future__ import annotations

import contextlib
import random
import socket

# Below Linux's ephemeral range (32768 and up by default), so a socket the kernel numbers for
# another test meanwhile rarely takes a port picked here.
LOW, HIGH = 20000, 32000
ATTEMPTS = 200


def loopback_ports(count: int) -> tuple[int, ...]:
    """``count`` distinct ports on 127.0.0.1, each free for TCP and for UDP now (all held
    open together while picked)."""
    rng = random.Random()
    with contextlib.ExitStack() as held:
        picked: list[int] = []
        for _ in range(ATTEMPTS):
            if len(picked) == count:
                break
            port = rng.randrange(LOW, HIGH)
            if port in picked:
                continue
            try:
                tcp = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                tcp.bind(("127.0.0.1", port))
                udp = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
                udp.bind(("127.0.0.1", port))
            except OSError:
                continue
            picked.append(port)
        if len(picked) < count:
            raise RuntimeError(f"found {len(picked)} of {count} free loopback ports")
        return tuple(picked)
