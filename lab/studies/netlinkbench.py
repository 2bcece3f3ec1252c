"""What netlink (pyroute2) costs or saves against tc and /proc, on a real mesh: ``sudo python -m
lab.studies.netlinkbench [--topology T] [--changes K] [--samples S] [--builds B]``.

Builds one lab network (``lab.net.mesh``) and measures, on it, three things both ways:

- a run-time rate change of one link (HTB class rate, then the leaf queue sized for it):
  ``mnexec tc class change`` + ``tc qdisc change`` (what the lab does) against
  ``LabNetwork.set_link`` over netlink (``lab.net.netlink``);
- one monitor sample of every host's counters: parsing ``/proc/<pid>/net/dev`` (what the monitor
  does) against netlink link stats;
- shaping the whole mesh at build time: one ``tc -batch`` per host (what the lab does) against
  the same tree sent over netlink from fresh sockets (one helper fork per host included).

Prints median, min and max milliseconds and the processes forked per operation (subprocesses and
pyroute2's helper forks, counted in this process). Needs root; run it under the CPU lock.
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute

from crew.cli_options import command_parser
from lab.net import shaping
from lab.net.mesh import LabNetwork, read_net_dev
from lab.net.netlink import HTB_CLASS, HTB_ROOT, LEAF, htb_class_params
from lab.orchestrate.runner import free_mgmt_subnet
from lab.spec.shipped import Shipped, shipped_file, topology_arg
from lab.spec.topology import load_topology

MAX_REPEATS = 1000


class ForkCounter:
    """Counts the processes this process starts: subprocess.Popen and os.fork (pyroute2)."""

    def __init__(self) -> None:
        self.count = 0

    @contextmanager
    def counting(self) -> Iterator[None]:
        popen_init, fork = subprocess.Popen.__init__, os.fork

        def counted_init(this: Any, *a: Any, **kw: Any) -> None:
            self.count += 1
            popen_init(this, *a, **kw)

        def counted_fork() -> int:
            self.count += 1
            return fork()

        subprocess.Popen.__init__ = counted_init  # type: ignore[method-assign]
        os.fork = counted_fork
        try:
            yield
        finally:
            subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]
            os.fork = fork


def measure(
    fn: Callable[[int], None], repeats: int, setup: Callable[[], None] | None = None
) -> dict[str, float]:
    """Run ``fn(k)`` ``repeats`` times (``setup()`` before each, not counted); times in ms and
    forks per call."""
    forks = ForkCounter()
    times, forked = [], 0
    for k in range(min(repeats, MAX_REPEATS)):
        if setup is not None:
            setup()
        with forks.counting():
            before = forks.count
            t0 = time.perf_counter()
            fn(k)
            times.append((time.perf_counter() - t0) * 1000)
            forked += forks.count - before
    return {
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "forks_per_op": forked / len(times),
        "n": len(times),
    }


def unshape(net: LabNetwork) -> None:
    """Remove every link's HTB tree, so a build starts from nothing (an HTB root cannot be
    replaced by another in place)."""
    for lk in net.topology.links:
        shaping.remove(net.host_pid(lk.src), net.intf(lk.src, lk.dst))


def netlink_counters(ipr: IPRoute) -> dict[str, tuple[int, int]]:
    """The alternative to ``read_net_dev``: (rx_bytes, tx_bytes) per interface, netlink's
    64-bit link stats."""
    out: dict[str, tuple[int, int]] = {}
    for msg in ipr.get_links():
        stats = msg.get_attr("IFLA_STATS64")
        if stats is not None:
            out[msg.get_attr("IFLA_IFNAME")] = (int(stats["rx_bytes"]), int(stats["tx_bytes"]))
    return out


def shape_over_netlink(net: LabNetwork) -> None:
    """The build-time tree of ``LabNetwork._shape_all`` (no impairments) sent over netlink,
    less the ACK filter (``shaping.ack_filter_command``): one request per link fewer than the
    lab's build, whose u32 selector pyroute2 would have to be given field by field."""
    for i in range(net.n):
        with IPRoute(netns=f"/proc/{net.host_pid(i)}/ns/net", flags=0) as ipr:
            for lk in (lk for lk in net.topology.links if lk.src == i):
                idx = ipr.link_lookup(ifname=net.intf(i, lk.dst))[0]
                ipr.tc("add", "htb", idx, HTB_ROOT, default=0x10)
                ipr.tc(
                    "add-class",
                    "htb",
                    idx,
                    HTB_CLASS,
                    parent=HTB_ROOT,
                    **htb_class_params(lk.rate_mbit),
                )
                limit = shaping.queue_limit(lk.rate_mbit)
                ipr.tc("add", "pfifo", idx, LEAF, parent=HTB_CLASS, limit=limit)


def run(topology: Path, changes: int, samples: int, builds: int) -> dict[str, Any]:
    topo = load_topology(topology)
    if any(lk.delay_ms or lk.jitter_ms or lk.loss_pct for lk in topo.links):
        raise SystemExit(f"{topology}: pick a topology without impairments (pfifo leaves)")
    out: dict[str, Any] = {"topology": str(topology), "n": topo.n, "links": len(topo.links)}
    with tempfile.TemporaryDirectory() as state:
        tag = "nb" + secrets.token_hex(2)
        with LabNetwork(topo, tag=tag, state_dir=state, mgmt_subnet=free_mgmt_subnet()) as net:
            pid, dev = net.host_pid(0), net.intf(0, 1)
            base = net.link_state(0, 1).rate_mbit
            rates = [base * f for f in (0.5, 0.75)]
            assert net.cap is not None

            def tc_change(k: int) -> None:
                rate = rates[k % 2]
                shaping.change_rate(pid, dev, rate)
                shaping.set_leaf(pid, dev, shaping.Shape(rate), netem=net.cap.netem, in_place=True)

            def netlink_change(k: int) -> None:
                net.set_link(0, 1, rate_mbit=rates[(k + 1) % 2])

            netlink_change(0)  # the socket to host 0 is opened once, outside the timing
            out["rate_change_tc"] = measure(tc_change, changes)
            out["rate_change_netlink"] = measure(netlink_change, changes)
            pids = [net.host_pid(i) for i in range(net.n)]
            out["sample_proc_net_dev"] = measure(
                lambda _k: [read_net_dev(p) for p in pids], samples
            )
            # every host's socket opened first, as a monitor would keep them
            iprs = [IPRoute(netns=f"/proc/{p}/ns/net", flags=0) for p in pids]
            out["sample_netlink"] = measure(lambda _k: [netlink_counters(i) for i in iprs], samples)
            for ipr in iprs:
                ipr.close()
            out["build_tc_batch"] = measure(
                lambda _k: net._shape_all(), builds, lambda: unshape(net)
            )
            out["build_netlink"] = measure(
                lambda _k: shape_over_netlink(net), builds, lambda: unshape(net)
            )
            unshape(net)
            net._shape_all()  # leave the lab's own tree before teardown checks
    return out


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("python -m lab.studies.netlinkbench", __doc__)
    ap.add_argument(
        "--topology", type=topology_arg, default=shipped_file(Shipped.TOPOLOGIES, "small")
    )
    ap.add_argument("--changes", type=int, default=50, help="rate changes per path (50)")
    ap.add_argument("--samples", type=int, default=50, help="counter samples per path (50)")
    ap.add_argument("--builds", type=int, default=10, help="mesh shapings per path (10)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("lab.studies.netlinkbench needs root (it builds a lab network)", file=sys.stderr)
        return 2
    res = run(args.topology, args.changes, args.samples, args.builds)
    for name, r in res.items():
        if isinstance(r, dict):
            print(
                f"{name:22s} median {r['median_ms']:8.3f} ms  (min {r['min_ms']:.3f},"
                f" max {r['max_ms']:.3f}, n={r['n']})  forks/op {r['forks_per_op']:.2f}"
            )
    for what, old, new in (
        ("rate change", "rate_change_tc", "rate_change_netlink"),
        ("counter sample", "sample_proc_net_dev", "sample_netlink"),
        ("mesh shaping", "build_tc_batch", "build_netlink"),
    ):
        ratio = res[new]["median_ms"] / res[old]["median_ms"]
        print(f"{what}: netlink / old = {ratio:.2f}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
