"""What the link probes cost, on the link counters of an idle lab.

    sudo python -m lab.studies.probecost

Builds a topology's network (``--topology``, default ``topologies/default.yaml``), starts one
:class:`crew.wire.probes.Prober` per host inside its namespace and nothing else (no
coordinator, no training, no data plane), waits ``--warmup`` seconds, then reads every directed
link's sender-side tx counter (``LabNetwork.tx_bytes``, the counters the lab's link monitor
samples) before and after ``--seconds``. Per link it reports the measured bit rate against the
link's configured rate; the budget is ``BUDGET`` = 0.5% of any link's rate. The
counters see everything the hosts send on the link (ARP included), so the figure is an upper
bound on the probes' share.

The probers report how many probes they sent and received, so a run whose probers did not work
cannot pass for cheap probes: every prober must have received at least ``MIN_DELIVERED`` of the
probes its peers were due to send it. Exit status 0 when both hold, 1 otherwise, 2 on bad input
or a lab error.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from crew.cli_options import command_parser
from crew.wire.frames import FrameCodec
from crew.wire.probes import PROBE_INTERVAL_S, PROBE_WIRE_BYTES, Prober
from lab.net import preflight
from lab.net.cleanup import DEFAULT_STATE_DIR, cleanup_leftovers
from lab.net.mesh import LabError, LabNetwork
from lab.net.preflight import PreflightError
from lab.orchestrate.runner import REPO
from lab.spec.shipped import default_topology, topology_arg
from lab.spec.topology import TopologyError, load_topology

BUDGET = 0.005  # share of a link's configured rate the probes may take
MIN_DELIVERED = 0.9  # share of the due probes each prober must have received
PROBE_PORT = 7355
RUN_NUM = 1


@dataclass(frozen=True)
class LinkCost:
    src: int
    dst: int
    rate_mbit: float
    kbit_s: float

    @property
    def share(self) -> float:
        return self.kbit_s * 1e3 / (self.rate_mbit * 1e6)


def _prober(args: argparse.Namespace) -> int:
    """Inside host ``--me``'s namespace: probe every peer for ``--seconds``, print counters."""
    addrs = args.addrs.split(",")
    codec = FrameCodec(Path(args.secret).read_bytes(), RUN_NUM)
    peers = {j: (a, args.port) for j, a in enumerate(addrs) if j != args.me}
    prober = Prober(args.me, (addrs[args.me], args.port), peers, codec, lambda _c: None)
    prober.start()
    time.sleep(args.seconds)
    prober.close()
    print(json.dumps({"me": args.me, "sent": prober.sent, "received": prober.received}))
    return 0


def measure(topology: Path, seconds: float, warmup: float, state_dir: Path) -> int:
    console = Console()
    try:
        topo = load_topology(topology)
        cleanup_leftovers(state_dir)
        cap = preflight.check(topo, frozenset())
    except (TopologyError, PreflightError) as e:
        console.print(f"[red]{e}[/red]")
        return 2
    rates = topo.bw_matrix()
    with tempfile.TemporaryDirectory(prefix="probecost-") as tmp:
        secret = Path(tmp) / "secret"
        secret.write_bytes(secrets.token_bytes(32))
        os.chmod(secret, 0o600)
        try:
            with LabNetwork(
                topo, tag="pc" + secrets.token_hex(2), state_dir=state_dir, capabilities=cap
            ) as net:
                addrs = ",".join(net.identity_address(i) for i in range(topo.n))
                procs = [
                    net.popen(
                        i,
                        [
                            sys.executable,
                            "-m",
                            "lab.studies.probecost",
                            "prober",
                            "--me",
                            str(i),
                            "--addrs",
                            addrs,
                            "--port",
                            str(PROBE_PORT),
                            "--secret",
                            str(secret),
                            "--seconds",
                            str(warmup + seconds + 1.0),
                        ],
                        label=f"w{i}:prober",
                        cwd=REPO,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    for i in range(topo.n)
                ]
                time.sleep(warmup)
                before, t0 = net.tx_bytes(), time.monotonic()
                time.sleep(seconds)
                after, t1 = net.tx_bytes(), time.monotonic()
                counters = []
                for proc in procs:
                    out, _ = proc.communicate(timeout=warmup + seconds + 30.0)
                    counters.append(json.loads(out.strip().splitlines()[-1]))
                    net.stop_process(proc)
        except (LabError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as e:
            console.print(f"[red]lab error: {e}[/red]")
            return 2
    costs = [
        LinkCost(s, d, float(rates[s][d]), (after[(s, d)] - before[(s, d)]) * 8 / (t1 - t0) / 1e3)
        for (s, d) in sorted(after)
        if (s, d) in before
    ]
    lifetime = warmup + seconds + 1.0
    due = (topo.n - 1) * lifetime / PROBE_INTERVAL_S
    delivered = min(c["received"] / due for c in counters)
    table = Table(title=f"{topo.name}: idle links, {seconds:g} s of probes only")
    for col in ("link", "configured Mbit/s", "measured kbit/s", "share of rate"):
        table.add_column(col, justify="right")
    for c in sorted(costs, key=lambda c: -c.share)[:8]:
        table.add_row(
            f"{c.src}->{c.dst}", f"{c.rate_mbit:.1f}", f"{c.kbit_s:.2f}", f"{c.share:.4%}"
        )
    console.print(table)
    kbits = sorted(c.kbit_s for c in costs)
    worst = max(costs, key=lambda c: c.share)
    model = PROBE_WIRE_BYTES * 8 / PROBE_INTERVAL_S / 1e3
    console.print(
        f"{len(costs)} links: {kbits[0]:.2f} / {kbits[len(kbits) // 2]:.2f} / {kbits[-1]:.2f}"
        f" kbit/s (min / median / max; cost model {model:.2f}); largest share {worst.share:.4%}"
        f" on {worst.src}->{worst.dst} ({worst.rate_mbit:g} Mbit/s), budget {BUDGET:.1%};"
        f" probes delivered: at least {delivered:.0%} of those due at every host"
    )
    ok = worst.share <= BUDGET and delivered >= MIN_DELIVERED
    console.print("[green]within budget[/green]" if ok else "[red]over budget or probes lost[/red]")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = command_parser("python -m lab.studies.probecost", __doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd")
    pr = sub.add_parser("prober", help="(internal) one host's prober")
    pr.add_argument("--me", type=int, required=True)
    pr.add_argument("--addrs", required=True)
    pr.add_argument("--port", type=int, required=True)
    pr.add_argument("--secret", required=True)
    pr.add_argument("--seconds", type=float, required=True)
    p.add_argument("--topology", type=topology_arg, default=default_topology())
    p.add_argument("--seconds", type=float, default=30.0, help="measured span (30)")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds before counting (3)")
    p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    args = p.parse_args(argv)
    if args.cmd == "prober":
        return _prober(args)
    if args.seconds <= 0 or args.warmup < 0:
        print("error: need --seconds > 0 and --warmup >= 0", file=sys.stderr)
        return 2
    return measure(args.topology, args.seconds, args.warmup, args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
