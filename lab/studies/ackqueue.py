"""A fast direction against its busy, slower reverse, with the ACKs queued behind the reverse's
data or sent ahead of it: ``sudo python -m lab.studies.ackqueue [--runs 5]``.

Builds a two-worker lab network (``lab.net.mesh``) whose one pair is shaped at
``--forward-mbit`` one way and ``--reverse-mbit`` back, then moves ``--forward-mb`` forward while
``--reverse-mb`` goes back, over plain TCP (``lab.net.rawmove``, the system's congestion control),
both from one common start, ``--runs`` times in each mode, alternating:

- **direct**: the lab's shaping, where pure ACKs skip the leaf queue (``lab.net.shaping``);
- **queued**: the same with the ACK filter deleted on both ends, so a direction's ACKs wait
  behind its reverse's data.

Prints, per mode and direction, the median (min-max) time from the common start to the
receiver's last byte and the payload rate it makes. Needs root; run it under the CPU lock.
"""

from __future__ import annotations

import os
import secrets
import statistics
import sys
import tempfile
from collections.abc import Sequence

from crew.cli_options import command_parser
from lab.bench.rawtcp import raw_move
from lab.net import shaping
from lab.net.mesh import LabNetwork
from lab.orchestrate.runner import free_mgmt_subnet
from lab.spec.topology import TopologySpec, parse_topology

TRANSFER_TIMEOUT_S = 120.0


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
    """Seconds from the common start to each direction's last byte, both moved at once by
    ``lab.net.rawmove`` (``lab.bench.rawtcp.raw_move``)."""
    move = raw_move(net, {(0, 1): forward_bytes, (1, 0): reverse_bytes}, TRANSFER_TIMEOUT_S)
    return move.received_s[1], move.received_s[0]


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
