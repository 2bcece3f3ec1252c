"""Move given bytes over plain TCP: the kernel's own cost, the reference for the data path.

One process per lab host (network namespace)::

    python -m lab.net.rawmove --listen 198.18.0.2:7900 --expect 2 \\
        --send 198.18.0.3:7900=4194304 --send 198.18.0.4:7900=1048576 \\
        --start-at 1733390000.5 --timeout 60

It listens for ``--expect`` incoming connections and connects its ``--send`` connections
first; at ``--start-at`` (Unix time; the lab's namespaces share one clock) every sender writes
its bytes with ``sendall`` from one preallocated buffer and shuts its side down, and every
receiver reads with ``recv_into`` into one preallocated buffer until EOF. No framing, no MAC,
no aggregation, no copies beyond the kernel's: what TCP over the lab's veth and HTB costs.

It prints one JSON line: ``sent`` and ``received`` bytes, ``send_end`` and ``recv_end`` (Unix
time of its last write and of its last read; null when it had none), and ``cpu_s``, the
process's user + system CPU from ``--start-at`` to its end (start-up and connecting excluded).
Every wait is bounded by ``--timeout``; the exit status is 0 only when every byte moved.
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import sys
import threading
import time

from lab.net.goodput import parse_addr

BUFFER_BYTES = 1 << 20
CONNECT_ATTEMPTS = 50  # x 0.1 s: the peer's listener may start a moment later


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def parse_send(text: str) -> tuple[tuple[str, int], int]:
    addr, sep, nbytes = text.rpartition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not ADDR:PORT=BYTES")
    try:
        n = int(nbytes)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bytes {nbytes!r} is not a number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"bytes must be >= 0, got {n}")
    return parse_addr(addr), n


class Mover:
    """The listener, the connections and their threads of one host's move."""

    def __init__(self, listen: tuple[str, int] | None, expect: int, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.expect = expect
        self.received = 0
        self.recv_end: float | None = None
        self.sent = 0
        self.send_end: float | None = None
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self.server: socket.socket | None = None
        if listen is not None:
            self.server = socket.create_server(listen, backlog=max(expect, 1))
            self.server.settimeout(timeout)

    def _left(self) -> float:
        return max(0.01, self.deadline - time.monotonic())

    def connect(self, addr: tuple[str, int]) -> socket.socket:
        for _ in range(CONNECT_ATTEMPTS):
            try:
                return socket.create_connection(addr, timeout=self._left())
            except ConnectionRefusedError:
                time.sleep(0.1)
        raise TimeoutError(f"{addr[0]}:{addr[1]} refused {CONNECT_ATTEMPTS} connections")

    def receive_all(self) -> list[threading.Thread]:
        """Accept the expected connections; one reading thread each."""
        threads = []
        assert self.server is not None or self.expect == 0
        for _ in range(self.expect):
            assert self.server is not None
            conn, _ = self.server.accept()
            conn.settimeout(self._left())
            t = threading.Thread(target=self._read, args=(conn,), daemon=True)
            t.start()
            threads.append(t)
        return threads

    def _read(self, conn: socket.socket) -> None:
        buf = bytearray(BUFFER_BYTES)
        view = memoryview(buf)
        got = 0
        try:
            while True:
                k = conn.recv_into(view)
                if k == 0:
                    break
                got += k
        except OSError as exc:
            self.errors.append(f"receive: {exc}")
        finally:
            conn.close()
        with self._lock:
            self.received += got
            now = time.time()
            self.recv_end = now if self.recv_end is None else max(self.recv_end, now)

    def send(self, conn: socket.socket, nbytes: int, start_at: float) -> None:
        payload = memoryview(bytes(min(BUFFER_BYTES, max(nbytes, 1))))
        try:
            time.sleep(max(0.0, start_at - time.time()))
            left = nbytes
            while left > 0:
                k = min(left, len(payload))
                conn.sendall(payload[:k])
                left -= k
            conn.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self.errors.append(f"send: {exc}")
            return
        finally:
            conn.close()
        with self._lock:
            self.sent += nbytes
            now = time.time()
            self.send_end = now if self.send_end is None else max(self.send_end, now)


def main(argv: list[str] | None = None) -> int:
    from crew.cli_options import command_parser

    ap = command_parser("python -m lab.net.rawmove", __doc__)
    ap.add_argument("--listen", type=parse_addr, help="ADDR:PORT to accept connections on")
    ap.add_argument("--expect", type=int, default=0, help="incoming connections to read")
    ap.add_argument(
        "--send", type=parse_send, action="append", default=[], help="ADDR:PORT=BYTES to write"
    )
    ap.add_argument("--start-at", type=float, required=True, help="Unix time to start moving")
    ap.add_argument("--timeout", type=float, default=60.0, help="bound on every wait, s")
    args = ap.parse_args(argv)
    if args.expect < 0 or (args.expect and args.listen is None):
        ap.error("--expect needs --listen and must be >= 0")
    mover = Mover(args.listen, args.expect, args.timeout)
    # Connect first (the transport's connections are up before a group starts as well).
    conns = [(mover.connect(addr), n) for addr, n in args.send]
    senders = [
        threading.Thread(target=mover.send, args=(c, n, args.start_at), daemon=True)
        for c, n in conns
    ]
    for t in senders:
        t.start()
    time.sleep(max(0.0, args.start_at - time.time()))
    cpu0 = _cpu_s()
    readers = mover.receive_all()
    for t in (*senders, *readers):
        t.join(timeout=mover._left())
    cpu = _cpu_s() - cpu0
    want_sent = sum(n for _, n in args.send)
    out = {
        "sent": mover.sent,
        "received": mover.received,
        "send_end": mover.send_end,
        "recv_end": mover.recv_end,
        "cpu_s": round(cpu, 6),
        "errors": mover.errors,
    }
    print(json.dumps(out), flush=True)
    return 0 if mover.sent == want_sent and not mover.errors else 1


if __name__ == "__main__":
    sys.exit(main())
