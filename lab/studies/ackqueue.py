"""A fast direction against its busy, slower reverse, with the ACKs queued behind the reverse's
data or sent ahead of it: ``sudo python -m lab.studies.ackqueue [--runs 5]``.

Builds a two-worker lab network (``lab.net.mesh``) whose one pair is shaped at
``--forward-mbit`` one way and ``--reverse-mbit`` back, then moves ``--forward-mb`` forward while
``--reverse-mb`` goes back, over TCP (the system's congestion control), ``--runs`` times in each
mode, alternating:

- **direct**: the lab's shaping, where pure ACKs skip the leaf queue (``lab.net.shaping``);
- **queued**: the same with the ACK filter deleted on both ends, so a direction's ACKs wait
  behind its reverse's data.

Prints, per mode and direction, the median (min-max) time from the receiver's accept to its
last byte and the payload rate it makes. Needs root; run it under the CPU lock.
"""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from crew.cli_options import command_parser
from lab.net import shaping
from lab.net.mesh import LabNetwork
from lab.orchestrate.runner import free_mgmt_subnet
from lab.spec.topology import TopologySpec, parse_topology

PORT = 17031
TRANSFER_TIMEOUT_S = 120.0

# One process per end: "recv PORT N" prints the seconds from accept to the N-th byte;
# "send ADDR PORT N" connects and sends N bytes.
_MOVER = r"""
import socket, sys, time
if sys.argv[1] == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(sys.argv[2]))); s.listen(1); print("listening", flush=True)
    c, _ = s.accept(); t0 = time.monotonic(); want = int(sys.argv[3]); got = 0
    while got < want:
        d = c.recv(1 << 16)
        if not d:
            break
        got += len(d)
    print(f"{got} {time.monotonic() - t0:.6f}", flush=True)
else:
    c = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=60)
    c.sendall(b"x" * int(sys.argv[4])); c.shutdown(socket.SHUT_WR)
"""


def pair_topology(forward_mbit: float, reverse_mbit: float) -> TopologySpec:
    return parse_topology(
        {
            "name": "ackqueue",
            "description": "one shaped pair for lab.studies.ackqueue",
            "clouds": [{"name": "a", "workers": 1}, {"name": "b", "workers": 1}],
            "links": [
                {"between": ["a", "b"], "mbit": {"forward": forward_mbit, "reverse": reverse_mbit}}
            ],
        }
    )


def set_ack_filters(net: LabNetwork, *, direct: bool) -> None:
    """Add (direct) or delete (queued) the ACK filter on both ends of the pair."""
    for i, j in ((0, 1), (1, 0)):
        shaping.run(net.host_pid(i), shaping.ack_filter_command(net.intf(i, j), add=direct))


def both_ways(net: LabNetwork, forward_bytes: int, reverse_bytes: int) -> tuple[float, float]:
    """Seconds for each direction's transfer, both under way at once."""
    py = [sys.executable, "-c", _MOVER]
    opts: dict = {"stdout": subprocess.PIPE, "text": True}
    sinks = [
        net.popen(1, [*py, "recv", str(PORT), str(forward_bytes)], **opts),
        net.popen(0, [*py, "recv", str(PORT), str(reverse_bytes)], **opts),
    ]
    sources = []
    try:
        for sink in sinks:
            if "listening" not in (sink.stdout.readline() if sink.stdout else ""):
                raise RuntimeError("a receiver did not start")
        # The slow reverse first, so the fast direction starts against a busy reverse.
        sources.append(
            net.popen(1, [*py, "send", str(net.identity_address(0)), str(PORT), str(reverse_bytes)])
        )
        sources.append(
            net.popen(0, [*py, "send", str(net.identity_address(1)), str(PORT), str(forward_bytes)])
        )
        times = []
        for sink, want in zip(sinks, (forward_bytes, reverse_bytes), strict=True):
            out, _ = sink.communicate(timeout=TRANSFER_TIMEOUT_S)
            got, seconds = out.split()[-2:]
            if int(got) != want:
                raise RuntimeError(f"a receiver got {got} of {want} bytes")
            times.append(float(seconds))
        return times[0], times[1]
    finally:
        for proc in sources + sinks:
            net.stop_process(proc)


def main(argv: Sequence[str] | None = None) -> int:
    ap = command_parser("python -m lab.studies.ackqueue", __doc__)
    ap.add_argument("--forward-mbit", type=float, default=8.0, help="the fast direction (8)")
    ap.add_argument("--reverse-mbit", type=float, default=1.0, help="the slow direction (1)")
    ap.add_argument("--forward-mb", type=float, default=1.0, help="MB sent forward (1)")
    ap.add_argument("--reverse-mb", type=float, default=0.6, help="MB sent back (0.6)")
    ap.add_argument("--runs", type=int, default=5, help="transfers per mode (5)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("lab.studies.ackqueue needs root (it builds a lab network)", file=sys.stderr)
        return 2
    for flag in ("forward_mbit", "reverse_mbit", "forward_mb", "reverse_mb"):
        if not 0 < getattr(args, flag) < float("inf"):
            ap.error(f"--{flag.replace('_', '-')} must be a positive number")
    if not 1 <= args.runs <= 100:
        ap.error(f"--runs must be 1 to 100, got {args.runs}")
    fwd, rev = int(args.forward_mb * 1e6), int(args.reverse_mb * 1e6)
    times: dict[str, list[tuple[float, float]]] = {"queued": [], "direct": []}
    topo = pair_topology(args.forward_mbit, args.reverse_mbit)
    with tempfile.TemporaryDirectory() as state:
        tag = "aq" + secrets.token_hex(2)
        with LabNetwork(topo, tag=tag, state_dir=state, mgmt_subnet=free_mgmt_subnet()) as net:
            for k in range(args.runs):
                for mode in ("queued", "direct"):  # the lab builds its links with the filter
                    set_ack_filters(net, direct=mode == "direct")
                    times[mode].append(both_ways(net, fwd, rev))
                print(f"run {k + 1}/{args.runs} done", file=sys.stderr)
    print(
        f"{args.forward_mbit:g} Mbit/s forward ({args.forward_mb:g} MB) against"
        f" {args.reverse_mbit:g} Mbit/s back ({args.reverse_mb:g} MB), {args.runs} runs each"
    )
    for mode, runs in times.items():
        for name, idx, nbytes in (("forward", 0, fwd), ("reverse", 1, rev)):
            xs = [r[idx] for r in runs]
            med = statistics.median(xs)
            print(
                f"ACKs {mode:6s} {name}: {med:.2f} s ({min(xs):.2f}-{max(xs):.2f}),"
                f" {nbytes * 8 / 1e6 / med:.2f} Mbit/s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
