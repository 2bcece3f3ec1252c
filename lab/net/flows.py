"""Background contention flows: a paced TCP stream from one lab host to another.

The lab starts a sink in the receiver's namespace and a source in the sender's; the source
paces its writes to ``--rate-mbit`` so the flow takes that share of the link (or all of it, if
the link is slower). Both stop by themselves after ``--seconds`` and when the lab stops them.

    python -m lab.net.flows sink --bind ADDR:PORT --seconds S
    python -m lab.net.flows source --to ADDR:PORT --rate-mbit R --seconds S
"""

from __future__ import annotations

import socket
import sys
import time

from crew.cli_options import command_parser
from lab.net.goodput import sink_and_source_parsers

CHUNK = 64 << 10
CONNECT_TRIES = 50  # x 0.1 s: the sink may start a moment after the source


def sink(bind: tuple[str, int], seconds: float) -> int:
    deadline = time.monotonic() + seconds
    with socket.create_server(bind) as srv:
        srv.settimeout(1.0)
        received = 0
        while time.monotonic() < deadline:
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1.0)
                while time.monotonic() < deadline:
                    try:
                        data = conn.recv(CHUNK)
                    except TimeoutError:
                        continue
                    if not data:
                        break
                    received += len(data)
    print(received)
    return 0


def source(to: tuple[str, int], rate_mbit: float, seconds: float) -> int:
    if rate_mbit <= 0:
        raise SystemExit("--rate-mbit: must be positive")
    deadline = time.monotonic() + seconds
    for _ in range(CONNECT_TRIES):
        try:
            sock = socket.create_connection(to, timeout=2.0)
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise SystemExit(f"cannot connect to the sink at {to[0]}:{to[1]}")
    payload = bytes(CHUNK)
    bytes_per_s = rate_mbit * 1e6 / 8
    start = time.monotonic()
    sent = 0
    with sock:
        sock.settimeout(2.0)
        while time.monotonic() < deadline:
            ahead = sent / bytes_per_s - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(min(ahead, 0.1))
                continue
            try:
                sent += sock.send(payload)
            except TimeoutError:
                continue
            except OSError:
                break
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("python -m lab.net.flows", __doc__)
    _, c = sink_and_source_parsers(
        parser,
        ("receive and discard", "stop after this long"),
        ("send at a paced rate", "stop after this long"),
    )
    c.add_argument("--rate-mbit", type=float, required=True, help="pace to this rate")
    args = parser.parse_args(argv)
    if args.role == "sink":
        return sink(args.bind, args.seconds)
    return source(args.to, args.rate_mbit, args.seconds)


if __name__ == "__main__":
    sys.exit(main())
