"""A tiny TCP goodput meter: a sink that counts bytes and a source that sends for S seconds.

    python -m lab.net.goodput sink --bind 198.18.0.2:5201 --seconds 2
    python -m lab.net.goodput source --to 198.18.0.2:5201 --seconds 2

The sink accepts one connection, reads until EOF (or its deadline), and prints one JSON line:
``{"bytes": total, "counted_bytes": C, "seconds": T, "mbit": C*8/T/1e6, "peer": ADDR}``. The
window T starts at the first read after ``--skip`` seconds (default 0.3, so TCP slow start and
connection set-up do not drag the figure down) and ends at the last read; C counts the bytes
read after the window opened. Both sides are bounded in
time: nothing here waits forever. No iperf3 needed.

``--frames`` on both sides measures the data plane instead of raw TCP: the source sends
``PAYLOAD`` frames of ``--frame-bytes`` through crew's ``FrameStream`` (header, MAC tag, the
transport's socket options), the sink decodes and verifies each; only payload bytes count. The
two share a fixed meter secret: the figure is about throughput, not authentication.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
import time

from crew.cli_options import command_parser
from crew.wire.frames import Frame, FrameCodec, FrameKind
from crew.wire.transport import FrameStream

log = logging.getLogger(__name__)

CHUNK = 256 * 1024
ACCEPT_TIMEOUT_S = 10.0
IO_TIMEOUT_S = 5.0
DEFAULT_SKIP_S = 0.3
DEFAULT_FRAME_BYTES = 1 << 20
_METER_SECRET = b"lab.net.goodput meter secret"
_METER_RUN = 1


def _codec(frame_bytes: int) -> FrameCodec:
    return FrameCodec(_METER_SECRET, _METER_RUN, max_payload=max(frame_bytes, 1))


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"{text!r} is not ADDR:PORT")
    try:
        return host, int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port {port!r} is not a number") from None


def sink_and_source_parsers(
    parser: argparse.ArgumentParser, sink: tuple[str, str], source: tuple[str, str]
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The ``sink`` (``--bind``, ``--seconds``) and ``source`` (``--to``, ``--seconds``)
    subcommands of a traffic tool; each pair is (the subcommand's help, --seconds' help)."""
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("sink", help=sink[0])
    s.add_argument("--bind", type=parse_addr, required=True, help="ADDR:PORT to listen on")
    s.add_argument("--seconds", type=float, required=True, help=sink[1])
    c = sub.add_parser("source", help=source[0])
    c.add_argument("--to", type=parse_addr, required=True, help="ADDR:PORT of the sink")
    c.add_argument("--seconds", type=float, required=True, help=source[1])
    return s, c


def sink_argv(addr: str, seconds: float, *extra: str) -> list[str]:
    """The command that runs a sink on ``addr`` (ADDR:PORT) for ``seconds``; ``extra`` flags
    follow (``--frames``, ``--skip S``)."""
    return [
        sys.executable,
        "-m",
        "lab.net.goodput",
        "sink",
        "--bind",
        addr,
        "--seconds",
        str(seconds),
        *extra,
    ]


def source_argv(addr: str, seconds: float, *extra: str) -> list[str]:
    """The command that runs a source sending to ``addr`` for ``seconds``."""
    return [
        sys.executable,
        "-m",
        "lab.net.goodput",
        "source",
        "--to",
        addr,
        "--seconds",
        str(seconds),
        *extra,
    ]


def sink(
    bind: tuple[str, int],
    seconds: float,
    skip_s: float = DEFAULT_SKIP_S,
    frame_bytes: int | None = None,
) -> dict:
    """Receive one connection; return bytes and seconds counted after ``skip_s``.

    With ``frame_bytes``, read crew frames (FrameStream) and count their payload bytes."""
    with socket.create_server(bind, reuse_port=False) as srv:
        srv.settimeout(ACCEPT_TIMEOUT_S)
        print(json.dumps({"listening": f"{bind[0]}:{bind[1]}"}), flush=True)
        conn, peer = srv.accept()
    with conn:
        conn.settimeout(IO_TIMEOUT_S)
        stream = (
            None if frame_bytes is None else FrameStream(conn, _codec(frame_bytes), IO_TIMEOUT_S)
        )
        buf = bytearray(CHUNK)
        total = 0
        skip_until = clock_start = last = None
        counted = 0
        deadline = time.monotonic() + seconds + ACCEPT_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if stream is None:
                    got = conn.recv_into(buf)
                else:
                    got = stream.recv(idle_timeout=IO_TIMEOUT_S).nbytes
            except (TimeoutError, ConnectionError):
                break
            if got == 0:
                break
            now = time.monotonic()
            total += got
            if skip_until is None:
                skip_until = now + skip_s
            if now < skip_until:
                continue
            if clock_start is None:
                # This chunk arrived before the clock started: count only what follows, so a
                # large first read does not inflate the rate.
                clock_start = now
                continue
            counted += got
            last = now
    elapsed = (last - clock_start) if (last is not None and clock_start is not None) else 0.0
    mbit = counted * 8 / elapsed / 1e6 if elapsed > 0 else 0.0
    return {
        "bytes": total,
        "counted_bytes": counted,
        "seconds": elapsed,
        "mbit": mbit,
        "peer": peer[0],
    }


def source(to: tuple[str, int], seconds: float, frame_bytes: int | None = None) -> dict:
    """Connect (retrying briefly while the sink starts) and send zeros for ``seconds``
    (as crew PAYLOAD frames of ``frame_bytes`` through FrameStream, when given)."""
    deadline = time.monotonic() + ACCEPT_TIMEOUT_S
    while True:
        try:
            sock = socket.create_connection(to, timeout=IO_TIMEOUT_S)
            break
        except (ConnectionRefusedError, TimeoutError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
    sent = 0
    with sock:
        end = time.monotonic() + seconds
        if frame_bytes is None:
            payload = bytes(CHUNK)
            while time.monotonic() < end:
                sent += sock.send(payload)
        else:
            stream = FrameStream(sock, _codec(frame_bytes), IO_TIMEOUT_S)
            frame = Frame(FrameKind.PAYLOAD, 0, _METER_RUN, payload=bytes(frame_bytes))
            while time.monotonic() < end:
                stream.send(frame)
                sent += frame_bytes
        sock.shutdown(socket.SHUT_WR)
    return {"sent": sent}


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("python -m lab.net.goodput", __doc__)
    s, c = sink_and_source_parsers(
        parser,
        ("receive one connection and print goodput as JSON", "expected transfer duration"),
        ("send zeros to a sink for some seconds", "how long to send"),
    )
    s.add_argument(
        "--skip",
        type=float,
        default=DEFAULT_SKIP_S,
        help="seconds after the first byte left out of the figure (slow start)",
    )
    s.add_argument("--frames", action="store_true", help="crew frames, not raw TCP")
    s.add_argument("--frame-bytes", type=int, default=DEFAULT_FRAME_BYTES)
    c.add_argument("--frames", action="store_true", help="crew frames, not raw TCP")
    c.add_argument("--frame-bytes", type=int, default=DEFAULT_FRAME_BYTES)
    args = parser.parse_args(argv)
    if args.role == "sink":
        fb = args.frame_bytes if args.frames else None
        result = sink(args.bind, args.seconds, args.skip, fb)
    else:
        result = source(args.to, args.seconds, args.frame_bytes if args.frames else None)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
