"""Run-time link changes over netlink (pyroute2), in each host's namespace: measured, NOT used
by the lab.

The lab's ``LabNetwork.set_link`` changes rates with tc (``lab.net.shaping``). pyroute2 opens a
socket in another namespace by forking the calling process (``pyroute2.process.ChildProcess``),
and the lab process has threads (monitor, faults, pipes): a forked child of it can run the lab's
own teardown (its namespaces gone, its workers without a coordinator), and a freshly opened socket
can see no interface. Until sockets are opened without a fork (a thread that calls setns before
creating the socket), this module is the measured alternative that ``python -m
lab.studies.netlinkbench`` times, from a process without the lab's threads
(docs/decisions/2026-12-01-rate-changes-by-tc.md).

A rate change by tc is two fork/execs of ``mnexec -a <pid> tc`` (the HTB class, then the leaf
queue sized for the new rate). Here each host's namespace gets one netlink socket, opened on
first use through ``/proc/<pid>/ns/net`` (pyroute2 forks one short-lived helper to create the
socket inside the namespace) and kept: every later change is a request on that socket from this
process, with no fork, and a refusal is a :class:`NetlinkChangeError` carrying the kernel's
errno. On a 3-host lab (``python -m lab.studies.netlinkbench``) a rate change takes 1.9 ms
(median) with 0 forks, against tc's 6.3 ms and 2 forks.

The requests carry what ``lab.net.shaping`` gives tc (the class's rate, ceil, burst, cburst and
quantum; the pfifo leaf's limit), so both paths leave the same tree. What stays with tc and
iptables:

- building the mesh: one ``tc -batch`` per host (``shaping.apply``), 10.7 ms for 3 hosts against
  71 ms over netlink from fresh sockets;
- the monitor's byte counters: parsing ``/proc/<pid>/net/dev`` takes 0.2 ms for 3 hosts, a
  pyroute2 link dump 6 ms (``lab.net.mesh.read_net_dev``);
- netem leaves (delay, jitter, loss): tc loads the "normal" delay distribution that jitter
  uses, which pyroute2's netem does not send (its ``TCA_NETEM_DELAY_DIST`` is a TODO there);
- cuts and the iptables loss fallback: rules in the receiver's INPUT chain, which netlink does
  not reach.
"""

from __future__ import annotations

import threading

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from lab.net import shaping

HTB_ROOT = 0x10000  # "1:"
HTB_CLASS = 0x10010  # "1:10"
LEAF = 0x100000  # "10:"


class NetlinkChangeError(shaping.ShapingError):
    """The kernel refused a netlink request; ``errno`` is its error code."""

    def __init__(self, what: str, dev: str, exc: NetlinkError):
        self.errno = exc.code
        super().__init__(["netlink", what, "dev", dev], exc.code, str(exc))


def _rate_bytes_s(rate_mbit: float) -> int:
    """The rate tc gets from ``shaping.rate_arg`` (whole kbit/s), in bytes/s."""
    return max(1, round(rate_mbit * 1000)) * 1000 // 8


def htb_class_params(rate_mbit: float) -> dict[str, int]:
    """pyroute2's arguments for the HTB class of ``shaping._class_args``."""
    rate, burst = _rate_bytes_s(rate_mbit), shaping.burst_bytes(rate_mbit)
    return {
        "rate": rate,
        "ceil": rate,
        "burst": burst,
        "cburst": burst,
        "quantum": shaping.quantum_bytes(rate_mbit),
    }


class HostNetlink:
    """Netlink sockets into the hosts' namespaces, keyed by host pid; safe across threads."""

    def __init__(self) -> None:
        self._sockets: dict[int, IPRoute] = {}
        self._index: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            for ipr in self._sockets.values():
                ipr.close()
            self._sockets.clear()
            self._index.clear()

    def __enter__(self) -> HostNetlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ipr(self, pid: int) -> IPRoute:
        ipr = self._sockets.get(pid)
        if ipr is None:
            # flags=0: open the namespace the host has, never create one.
            ipr = IPRoute(netns=f"/proc/{pid}/ns/net", flags=0)
            self._sockets[pid] = ipr
        return ipr

    def _ifindex(self, pid: int, dev: str) -> int:
        idx = self._index.get((pid, dev))
        if idx is None:
            found = self._ipr(pid).link_lookup(ifname=dev)
            if not found:
                raise shaping.ShapingError(["netlink", "link_lookup", dev], 1, f"no {dev}")
            idx = self._index[(pid, dev)] = int(found[0])
        return idx

    # -- changes -----------------------------------------------------------------------------

    def change_rate(self, pid: int, dev: str, rate_mbit: float) -> None:
        """``shaping.change_rate`` in place over netlink: queued packets and TCP state stay."""
        with self._lock:
            try:
                self._ipr(pid).tc(
                    "change-class",
                    "htb",
                    self._ifindex(pid, dev),
                    HTB_CLASS,
                    parent=HTB_ROOT,
                    **htb_class_params(rate_mbit),
                )
            except NetlinkError as exc:
                raise NetlinkChangeError("change-class htb", dev, exc) from exc

    def set_leaf(
        self, pid: int, dev: str, shape: shaping.Shape, *, netem: bool, in_place: bool = False
    ) -> None:
        """``shaping.set_leaf`` over netlink for a pfifo leaf changed in place; a netem leaf,
        or a change of kind (which adds or deletes the ACK filter), goes through tc."""
        kind = shaping.leaf_kind(shape, netem=netem)
        if kind != "pfifo" or not in_place:
            shaping.set_leaf(pid, dev, shape, netem=netem, in_place=in_place)
            return
        limit = shaping.queue_limit(shape.rate_mbit, shape.delay_ms, shape.jitter_ms)
        params = {"limit": limit}
        with self._lock:
            ipr, idx = self._ipr(pid), self._ifindex(pid, dev)
            try:
                ipr.tc("change", kind, idx, LEAF, parent=HTB_CLASS, **params)
            except NetlinkError as exc:
                raise NetlinkChangeError(f"change {kind}", dev, exc) from exc
