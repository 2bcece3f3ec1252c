"""The emulated WAN: one Mininet host per worker, a shaped point-to-point link per pair.

Layout (n workers, lab tag T, addresses from the 198.18.0.0/15 benchmarking range):

- Host i is a Mininet ``Host`` named ``crwTwi`` (its own network and mount namespaces).
- Workers i < j share one veth pair: ``wi-wj`` in host i, ``wj-wi`` in host j. Each end
  carries HTB for its own direction (lab.net.shaping), so i->j is shaped on ``wi-wj``.
- Identity: 198.18.0.(i+1)/32 on host i's ``lo`` (this kernel has no ``dummy`` link type), and
  a /32 route to every peer's identity over the direct link with that identity as source.
  The peer answers ARP for its lo address (arp_ignore=0), so no static neighbours are needed.
  Peers thus see one address per worker, whichever link a packet used.
- Management: a bridge ``crwTbr`` in the root namespace with the coordinator address (by
  default 198.19.255.254/24), and a veth per host (``crwTmi`` in the root namespace, ``mgmt``
  in the host) with 198.19.255.(i+1)/24. It is not shaped and carries control and telemetry,
  so the measured links stay clean.
- IPv6 is off in the hosts: router solicitations and MLD would otherwise show up on the
  link counters. It is off on the root-namespace bridge and veth ends too: their link-local
  addresses would appear a second or two after the build (duplicate address detection), and
  a browser on this machine aborts its requests on every address change (Chromium's
  ERR_NETWORK_CHANGED), which could leave the dashboard blank just as the lab says it is up.

Shared uplinks (``uplinks: shared`` in the topology): each cloud k also gets a gateway host
``crwTgk`` (IP forwarding on; fixed MACs and static neighbours on its veths, no ARP). Worker i
of cloud k has one veth ``wi-gw`` to it (``gk-wi`` at the gateway), unshaped but with offloads
off, so the gateway's queue sees real frames; gateways a < b share one veth ``ga-gb``/``gb-ga``
shaped with the a->b and b->a values of the cloud pair. Workers route the identities of other
clouds' workers over ``wi-gw``, gateways route them to the peer gateway; workers of one cloud
keep direct shaped links. So all pairs crossing a->b queue in one HTB: they share its rate.
Run-time link changes (``set_link``) exist only for direct links; the per-pair byte
counters of pairs behind gateways come from target-less iptables rules in the sender's OUTPUT
chain (one per peer), so the link monitor and lab.check see every ordered pair as before.

Everything the lab creates is recorded in a state file first (lab.net.cleanup), and teardown
removes all of it, also on exceptions and KeyboardInterrupt.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from lab.net import preflight, shaping
from lab.net.cleanup import (
    DEFAULT_STATE_DIR,
    ROOT_NAME_PREFIX,
    LabState,
    ProcRecord,
    StateError,
    delete_link,
    end_group,
    is_same_process,
    terminate_recorded,
)
from lab.net.lifeline import lifeline
from lab.net.preflight import Capabilities, ImpairmentMode
from lab.net.shaping import ShapingError
from lab.spec.topology import Impairment, TopologySpec, Uplinks

log = logging.getLogger(__name__)

IDENTITY_BASE = ipaddress.IPv4Address("198.18.0.1")
DEFAULT_MGMT_SUBNET = "198.19.255.0/24"
MGMT_INTF = "mgmt"
_TAG_RE = re.compile(r"^[a-z0-9]{1,6}$")
STOP_TIMEOUT_S = 3.0


class LabError(Exception):
    """The lab could not be built or used as asked."""


@dataclass(frozen=True)
class LinkState:
    """The current configuration of one directed link."""

    src: int
    dst: int
    rate_mbit: float
    up: bool = True
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    def shape(self) -> shaping.Shape:
        return shaping.Shape(self.rate_mbit, self.delay_ms, self.jitter_ms, self.loss_pct)


def _no_ipv6_in_root(dev: str) -> None:
    """Turn IPv6 off on a root-namespace interface before it comes up (module docstring)."""
    knob = Path("/proc/sys/net/ipv6/conf") / dev / "disable_ipv6"
    if knob.parent.is_dir():  # absent when the kernel runs without IPv6
        knob.write_text("1")


def _mininet() -> tuple[Any, Any, Any]:
    # Imported late: importing mininet has side effects (its log setup) that tools which only
    # read the lab's API should not pay for.
    from mininet.link import Link
    from mininet.net import Mininet
    from mininet.node import Host

    return Mininet, Host, Link


class LabNetwork:
    """A running emulated network; use as a context manager.

    ``capabilities`` comes from ``lab.net.preflight.check``; when None, the check runs here with no
    impairments allowed to be missing.
    """

    def __init__(
        self,
        topology: TopologySpec,
        *,
        tag: str,
        state_dir: Path | str = DEFAULT_STATE_DIR,
        capabilities: Capabilities | None = None,
        mgmt_subnet: str = DEFAULT_MGMT_SUBNET,
        offloads_off: bool = True,
    ):
        if not _TAG_RE.match(tag):
            raise LabError(f"tag {tag!r} must be 1-6 lowercase letters or digits")
        self.topology = topology
        self.tag = tag
        self.state_dir = Path(state_dir)
        self.cap = capabilities
        self.mgmt_net = ipaddress.IPv4Network(mgmt_subnet)
        if self.mgmt_net.num_addresses - 2 < topology.n + 1:
            raise LabError(f"mgmt_subnet {mgmt_subnet} too small for {topology.n} hosts")
        self.offloads_off = offloads_off
        self.bridge = f"{ROOT_NAME_PREFIX}{tag}br"
        self._lock = threading.RLock()
        self._net: Any = None
        self._hosts: list[Any] = []
        self._pids: list[int] = []
        self._links: dict[tuple[int, int], LinkState] = {}
        self._loss_fallback: dict[tuple[int, int], float] = {}
        self._procs: dict[int, ProcRecord] = {}
        self._gw_hosts: list[Any] = []
        self._gw_pids: list[int] = []
        self.state: LabState | None = None

    # -- addressing and names ----------------------------------------------------------------

    @property
    def n(self) -> int:
        return self.topology.n

    def host_name(self, i: int) -> str:
        return f"{ROOT_NAME_PREFIX}{self.tag}w{i}"

    def host_pid(self, i: int) -> int:
        return self._pids[i]

    def identity_address(self, i: int) -> str:
        return str(IDENTITY_BASE + i)

    def mgmt_address(self, i: int) -> str:
        return str(self.mgmt_net.network_address + 1 + i)

    @property
    def coordinator_address(self) -> str:
        return str(self.mgmt_net.broadcast_address - 1)

    def intf(self, i: int, j: int) -> str:
        """The interface in host i facing j (the sender side of i->j)."""
        if i == j or not (0 <= i < self.n and 0 <= j < self.n):
            raise LabError(f"no link {i}->{j} (n = {self.n})")
        if not self.has_direct_link(i, j):
            raise LabError(f"no direct link {i}->{j}: their clouds share an uplink")
        return f"w{i}-w{j}"

    def sender_intf(self, i: int, j: int) -> str:
        """The interface i->j's bytes leave host i by: its own veth, or (behind a shared
        uplink) the veth to its cloud's gateway, which every pair to other clouds uses."""
        if self.has_direct_link(i, j):
            return self.intf(i, j)
        if i == j or not (0 <= j < self.n):
            raise LabError(f"no link {i}->{j} (n = {self.n})")
        return f"w{i}-gw"

    @property
    def shared(self) -> bool:
        return self.topology.uplinks is Uplinks.SHARED

    def has_direct_link(self, i: int, j: int) -> bool:
        """Whether i and j have their own veth (always, unless uplinks are shared)."""
        w = self.topology.workers
        return (
            not self.shared
            or not (0 <= i < self.n and 0 <= j < self.n)
            or (w[i].cloud == w[j].cloud)
        )

    def gateway_name(self, k: int) -> str:
        return f"{ROOT_NAME_PREFIX}{self.tag}g{k}"

    def gateway_pid(self, k: int) -> int:
        return self._gw_pids[k]

    @staticmethod
    def gateway_intf(a: int, b: int) -> str:
        """The interface in gateway a facing gateway b (the sender side of cloud a -> b)."""
        return f"g{a}-g{b}"

    def root_mgmt_intf(self, i: int) -> str:
        return f"{ROOT_NAME_PREFIX}{self.tag}m{i}"

    # -- lifetime ----------------------------------------------------------------------------

    def __enter__(self) -> LabNetwork:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self.cap is None:
            self.cap = preflight.check(self.topology)
        path = self.state_dir / f"{self.tag}.json"
        if path.exists():
            try:
                other = LabState.load(path)
                alive = other.owner_alive()
            except StateError:
                alive = False
            if alive:
                raise LabError(f"lab {self.tag!r} is already running (state file {path})")
            raise LabError(f"state file {path} of a dead lab exists: run lab.net.cleanup first")
        self._check_mgmt_free()
        self.state = LabState(path, self.tag)
        self.state.save()
        log.info("building lab %s: %d hosts, %d links", self.tag, self.n, len(self.topology.links))
        self._build_hosts()
        self._build_links()
        if self.shared:
            self._build_gateways()
        self._build_mgmt()
        for lk in self.topology.links:
            if self.has_direct_link(lk.src, lk.dst):
                self._links[(lk.src, lk.dst)] = LinkState(
                    lk.src, lk.dst, lk.rate_mbit, True, lk.delay_ms, lk.jitter_ms, lk.loss_pct
                )
        self._shape_all()
        if self.shared:
            self._shape_gateways()

    def _check_mgmt_free(self) -> None:
        out = subprocess.run(
            ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
        ).stdout
        if f" {self.coordinator_address}/" in out:
            raise LabError(
                f"coordinator address {self.coordinator_address} is already in use in the root "
                "namespace (another lab?); pass a different mgmt_subnet"
            )

    def _build_hosts(self) -> None:
        Mininet, Host, _ = _mininet()
        assert self.state is not None
        self._net = Mininet(topo=None, controller=None, build=False, autoSetMacs=False)
        for i in range(self.n):
            h = self._net.addHost(self.host_name(i), cls=Host, ip=None, inNamespace=True)
            self._hosts.append(h)
            self._pids.append(h.pid)
            # The shell leads its own session (mnexec -d), so signal its group.
            self.state.add_proc(ProcRecord.of(h.pid, "shell", h.name, group=True))
            pid = h.pid
            shaping.run(pid, ["ip", "link", "set", "lo", "up"])
            shaping.run(pid, ["ip", "addr", "add", f"{self.identity_address(i)}/32", "dev", "lo"])
            shaping.run(
                pid,
                [
                    "sysctl",
                    "-q",
                    "-w",
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1",
                ],
            )

    def _build_links(self) -> None:
        _, _, Link = _mininet()
        for i in range(self.n):
            for j in range(i + 1, self.n):
                if not self.has_direct_link(i, j):
                    continue
                link = Link(
                    self._hosts[i],
                    self._hosts[j],
                    intfName1=self.intf(i, j),
                    intfName2=self.intf(j, i),
                )
                self._net.links.append(link)
        for i in range(self.n):
            pid = self._pids[i]
            commands: list[list[str]] = []
            for j in range(self.n):
                if i == j or not self.has_direct_link(i, j):
                    continue
                dev = self.intf(i, j)
                if self.offloads_off:
                    shaping.disable_offloads(pid, dev)
                commands.append(["ip", "link", "set", dev, "up"])
                commands.append(
                    [
                        "ip",
                        "route",
                        "add",
                        f"{self.identity_address(j)}/32",
                        "dev",
                        dev,
                        "src",
                        self.identity_address(i),
                    ]
                )
            shaping.run_batch(pid, "ip", commands)

    def _build_gateways(self) -> None:
        """One gateway host per cloud, its workers' veths and the gateway-to-gateway veths,
        with routes and static neighbours for every identity (module docstring).

        Static neighbours, not ARP: a gateway has no address of its own to ask from, and
        proxy ARP answers only after a random delay of up to 0.8 s."""
        _, Host, Link = _mininet()
        assert self.state is not None
        clouds = self.topology.clouds
        for k in range(len(clouds)):
            h = self._net.addHost(self.gateway_name(k), cls=Host, ip=None, inNamespace=True)
            self._gw_hosts.append(h)
            self._gw_pids.append(h.pid)
            self.state.add_proc(ProcRecord.of(h.pid, "shell", h.name, group=True))
            shaping.run(
                h.pid,
                [
                    "sysctl",
                    "-q",
                    "-w",
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1",
                    "net.ipv4.ip_forward=1",
                    "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.default.rp_filter=0",
                ],
            )
        members = [self.topology.cloud_members(c.name) for c in clouds]
        gw_cmds: list[list[list[str]]] = [[] for _ in clouds]
        gw_devs: list[list[str]] = [[] for _ in clouds]

        def dev_up(dev: str, mac: str) -> list[list[str]]:
            return [["ip", "link", "set", dev, "address", mac], ["ip", "link", "set", dev, "up"]]

        def host_route(addr: str, dev: str, mac: str) -> list[list[str]]:
            return [
                ["ip", "neigh", "replace", addr, "lladdr", mac, "dev", dev, "nud", "permanent"],
                ["ip", "route", "add", f"{addr}/32", "dev", dev],
            ]

        for k, ws in enumerate(members):
            for i in ws:
                wdev, gdev = f"w{i}-gw", f"g{k}-w{i}"
                wmac, gmac = f"02:00:00:00:{i:02x}:01", f"02:00:00:00:{i:02x}:02"
                self._net.links.append(
                    Link(self._hosts[i], self._gw_hosts[k], intfName1=wdev, intfName2=gdev)
                )
                gw_devs[k].append(gdev)
                gw_cmds[k] += dev_up(gdev, gmac) + host_route(self.identity_address(i), gdev, wmac)
                cmds = dev_up(wdev, wmac)
                for j in range(self.n):
                    if j != i and not self.has_direct_link(i, j):
                        cmds += host_route(self.identity_address(j), wdev, gmac)
                        cmds[-1] += ["src", self.identity_address(i)]
                if self.offloads_off:
                    shaping.disable_offloads(self._pids[i], wdev)
                shaping.run_batch(self._pids[i], "ip", cmds)
                for j in range(self.n):
                    if j != i and not self.has_direct_link(i, j):
                        shaping.add_rule(self._pids[i], self._count_rule(wdev, j), first=False)
        for a in range(len(clouds)):
            for b in range(a + 1, len(clouds)):
                self._net.links.append(
                    Link(
                        self._gw_hosts[a],
                        self._gw_hosts[b],
                        intfName1=self.gateway_intf(a, b),
                        intfName2=self.gateway_intf(b, a),
                    )
                )
        for a in range(len(clouds)):
            for b in range(len(clouds)):
                if a == b:
                    continue
                dev, peer_mac = self.gateway_intf(a, b), f"02:00:00:01:{b:02x}:{a:02x}"
                gw_devs[a].append(dev)
                gw_cmds[a] += dev_up(dev, f"02:00:00:01:{a:02x}:{b:02x}")
                for j in members[b]:
                    gw_cmds[a] += host_route(self.identity_address(j), dev, peer_mac)
        for k in range(len(clouds)):
            pid = self._gw_pids[k]
            shaping.run(
                pid, ["sysctl", "-q", "-w"] + [f"net.ipv4.conf.{d}.rp_filter=0" for d in gw_devs[k]]
            )
            if self.offloads_off:
                for dev in gw_devs[k]:
                    shaping.disable_offloads(pid, dev)
            shaping.run_batch(pid, "ip", gw_cmds[k])

    def _count_rule(self, dev: str, j: int) -> list[str]:
        """A rule without a target: it only counts what host i sends to j through the gateway
        (the per-pair counter a shared uplink has no interface for)."""
        addr = f"{self.identity_address(j)}/32"
        return ["OUTPUT", "-o", dev, "-d", addr, "-m", "comment", "--comment", _COUNT_TAG]

    def _gateway_tx_bytes(self, i: int) -> dict[tuple[int, int], int]:
        """Frame bytes i sent to each peer in another cloud: the counting rules' bytes plus an
        Ethernet header per packet, so they compare with the interface counters."""
        out: dict[tuple[int, int], int] = {}
        try:
            text = shaping.run(self._pids[i], ["iptables", "-w", "5", "-v", "-S", "OUTPUT"])
        except (ShapingError, subprocess.TimeoutExpired) as e:
            log.warning("cannot read the uplink counters of w%d: %s", i, e)
            return out
        for line in text.splitlines():
            m = _COUNT_RE.search(line)
            if m and _COUNT_TAG in line:
                j = int(ipaddress.IPv4Address(m.group(1))) - int(IDENTITY_BASE)
                pkts, nbytes = int(m.group(2)), int(m.group(3))
                out[(i, j)] = nbytes + ETH_HEADER_BYTES * pkts
        return out

    def _shape_gateways(self) -> None:
        """HTB (and netem where the kernel has it) on every gateway-to-gateway direction."""
        assert self.cap is not None
        names = [c.name for c in self.topology.clouds]
        for up in self.topology.shared_uplinks():
            a, b = names.index(up.src_cloud), names.index(up.dst_cloud)
            st = LinkState(-1, -1, up.rate_mbit, True, up.delay_ms, up.jitter_ms, up.loss_pct)
            if up.loss_pct > 0 and self.cap.mode(Impairment.LOSS) is ImpairmentMode.IPTABLES:
                raise LabError(
                    f"uplink {up.src_cloud}->{up.dst_cloud}: the iptables loss fallback is not "
                    "built for shared uplinks; loss needs sch_netem there"
                )
            shaping.run_batch(
                self._gw_pids[a],
                "tc",
                shaping.apply_commands(
                    self.gateway_intf(a, b), self._netem_shape(st), netem=self.cap.netem
                ),
            )

    def _build_mgmt(self) -> None:
        assert self.state is not None
        prefix = self.mgmt_net.prefixlen
        self.state.add_bridge(self.bridge)
        shaping.run(None, ["ip", "link", "add", self.bridge, "type", "bridge"])
        _no_ipv6_in_root(self.bridge)
        shaping.run(
            None, ["ip", "addr", "add", f"{self.coordinator_address}/{prefix}", "dev", self.bridge]
        )
        shaping.run(None, ["ip", "link", "set", self.bridge, "up"])
        for i in range(self.n):
            root_end = self.root_mgmt_intf(i)
            self.state.add_root_link(root_end)
            shaping.run(
                None,
                [
                    "ip",
                    "link",
                    "add",
                    root_end,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    MGMT_INTF,
                    "netns",
                    str(self._pids[i]),
                ],
            )
            _no_ipv6_in_root(root_end)
            shaping.run(None, ["ip", "link", "set", root_end, "master", self.bridge, "up"])
            pid = self._pids[i]
            shaping.run(
                pid, ["ip", "addr", "add", f"{self.mgmt_address(i)}/{prefix}", "dev", MGMT_INTF]
            )
            shaping.run(pid, ["ip", "link", "set", MGMT_INTF, "up"])

    def stop(self) -> None:
        """Remove everything this lab created. Safe to call more than once or half-built."""
        with self._lock:
            errors: list[str] = []
            state = self.state
            if state is not None:
                procs = [p for p in state.procs if p.kind == "proc"]
                terminate_recorded(procs, grace_s=STOP_TIMEOUT_S)
                for p in procs:
                    state.remove_proc(p.pid)
            if self._net is not None:
                try:
                    # Deleting the hosts' shells frees their namespaces, and with them every
                    # veth, qdisc and iptables rule inside.
                    for h in self._hosts + self._gw_hosts:
                        h.terminate()
                except Exception as e:  # keep tearing down; reported at the end
                    errors.append(f"stopping hosts: {e}")
                self._net = None
            if state is not None:
                shells = [p for p in state.procs if p.kind == "shell"]
                terminate_recorded(shells, grace_s=STOP_TIMEOUT_S)
                for name in list(state.root_links) + list(state.bridges):
                    delete_link(name)
                    if name in state.root_links:
                        state.remove_root_link(name)
                    else:
                        state.remove_bridge(name)
                for p in shells:
                    state.remove_proc(p.pid)
                left = [p.pid for p in state.procs if is_same_process(p.pid, p.start_time)]
                if left:
                    errors.append(f"processes still alive: {left}")
                else:
                    state.remove_file()
                self.state = None
            self._hosts, self._pids = [], []
            self._gw_hosts, self._gw_pids = [], []
            if errors:
                raise LabError(f"teardown of lab {self.tag} incomplete: {'; '.join(errors)}")

    # -- processes ---------------------------------------------------------------------------

    def popen(self, i: int, argv: Sequence[str], label: str = "", **kw: Any) -> subprocess.Popen:
        """Start ``argv`` inside host i's namespaces, in its own process group, recorded in the
        state file. ``kw`` goes to subprocess.Popen (not ``shell``, not ``start_new_session``)."""
        if isinstance(argv, str):
            raise TypeError("argv must be a list of strings, not a shell string")
        if "shell" in kw or "start_new_session" in kw:
            raise TypeError(
                "popen runs argv lists in a new session; shell/start_new_session cannot be set"
            )
        assert self.state is not None, "lab not started"
        # It ends with the lab even when the lab is killed with -9 (lab.net.lifeline).
        kw["preexec_fn"] = lifeline(kw.get("preexec_fn"))
        proc = subprocess.Popen(
            ["mnexec", "-a", str(self.host_pid(i)), *argv], start_new_session=True, **kw
        )
        try:
            rec = ProcRecord.of(proc.pid, "proc", label or f"w{i}:{argv[0]}", group=True)
        except StateError:
            log.debug("pid %d exited before it was recorded", proc.pid)
            return proc
        with self._lock:
            self._procs[proc.pid] = rec
            self.state.add_proc(rec)
        return proc

    def stop_process(self, proc: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM the process group, SIGKILL after ``timeout``; return the exit code."""
        rec = self._procs.get(proc.pid)
        if proc.poll() is None and rec is not None and is_same_process(rec.pid, rec.start_time):
            end_group(proc, timeout)
        code = proc.wait(timeout)
        with self._lock:
            self._procs.pop(proc.pid, None)
            if self.state is not None:
                self.state.remove_proc(proc.pid)
        return code

    # -- counters ----------------------------------------------------------------------------

    def tx_bytes(self) -> dict[tuple[int, int], int]:
        """Bytes sent on every directed link so far (the sender interface's tx counter)."""
        out: dict[tuple[int, int], int] = {}
        for i, pid in enumerate(self._pids):
            for dev, (_rx, tx) in read_net_dev(pid).items():
                m = _INTF_RE.match(dev)
                if m and int(m.group(1)) == i:
                    out[(i, int(m.group(2)))] = tx
            if self.shared:
                out |= self._gateway_tx_bytes(i)
        return out

    def rx_bytes(self) -> dict[tuple[int, int], int]:
        """Bytes received on every directed link i->j, counted at j's interface."""
        out: dict[tuple[int, int], int] = {}
        for j, pid in enumerate(self._pids):
            for dev, (rx, _tx) in read_net_dev(pid).items():
                m = _INTF_RE.match(dev)
                if m and int(m.group(1)) == j:
                    out[(int(m.group(2)), j)] = rx
        return out

    # -- run-time link changes ---------------------------------------------------------------

    def link_state(self, i: int, j: int) -> LinkState:
        try:
            return self._links[(i, j)]
        except KeyError:
            why = "" if self.has_direct_link(i, j) else " of its own (the clouds share an uplink)"
            raise LabError(f"no link {i}->{j}{why} (n = {self.n})") from None

    def set_link(
        self,
        i: int,
        j: int,
        *,
        rate_mbit: float | None = None,
        up: bool | None = None,
        delay_ms: float | None = None,
        jitter_ms: float | None = None,
        loss_pct: float | None = None,
    ) -> LinkState:
        """Change link i->j in place (no teardown, TCP connections survive); return its new
        state. Raises LabError for an impairment this machine cannot emulate."""
        with self._lock:
            old = self.link_state(i, j)
            new = replace(
                old,
                rate_mbit=old.rate_mbit if rate_mbit is None else rate_mbit,
                up=old.up if up is None else up,
                delay_ms=old.delay_ms if delay_ms is None else delay_ms,
                jitter_ms=old.jitter_ms if jitter_ms is None else jitter_ms,
                loss_pct=old.loss_pct if loss_pct is None else loss_pct,
            )
            new.shape()  # validates the values before anything is changed
            if new.jitter_ms > new.delay_ms:
                raise LabError(
                    f"link {i}->{j}: jitter {new.jitter_ms:g} ms exceeds its delay "
                    f"{new.delay_ms:g} ms (the delay would go negative)"
                )
            impaired = (new.delay_ms, new.jitter_ms, new.loss_pct) != (
                old.delay_ms,
                old.jitter_ms,
                old.loss_pct,
            )
            if impaired:
                self._check_emulable(new)
            self._links[(i, j)] = new  # _apply_leaf reads it; undone below if tc fails
            try:
                self._reshape(i, j, old, new, impaired)
            except (ShapingError, OSError) as exc:
                self._links[(i, j)] = old
                raise LabError(
                    f"link {i}->{j}: tc failed, the link keeps its previous state: {exc}"
                ) from exc
            log.info("link %d->%d: %s", i, j, new)
            return new

    def _reshape(self, i: int, j: int, old: LinkState, new: LinkState, impaired: bool) -> None:
        """The tc side of :meth:`set_link`: rate, impairments, cut or restore."""
        pid, dev = self.host_pid(i), self.intf(i, j)
        if new.rate_mbit != old.rate_mbit:
            # tc, not lab.net.netlink: pyroute2 opens a namespace's socket by forking this
            # (threaded) process, and in CI such a child ran the lab's teardown.
            shaping.change_rate(pid, dev, new.rate_mbit)
        if impaired or new.rate_mbit != old.rate_mbit:
            self._apply_leaf(i, j, old)
        if new.up != old.up:
            rpid, rdev = self.host_pid(j), self.intf(j, i)
            if new.up:
                shaping.restore(rpid, rdev)
                assert self.state is not None
                self.state.remove_ns_rule(j, shaping.cut_rule(rdev))
            else:
                assert self.state is not None
                # Recorded first, so that a lab killed meanwhile still has it removed.
                self.state.add_ns_rule(j, shaping.cut_rule(rdev))
                try:
                    shaping.cut(rpid, rdev)
                except BaseException:
                    self.state.remove_ns_rule(j, shaping.cut_rule(rdev))
                    raise

    def _check_emulable(self, st: LinkState) -> None:
        assert self.cap is not None
        for imp, value in (
            (Impairment.DELAY, st.delay_ms),
            (Impairment.JITTER, st.jitter_ms),
            (Impairment.LOSS, st.loss_pct),
        ):
            if value > 0 and self.cap.mode(imp) is ImpairmentMode.OFF:
                raise LabError(
                    f"link {st.src}->{st.dst}: {imp.value} cannot be emulated here "
                    "(no sch_netem and no allowed fallback)"
                )

    def _shape_all(self) -> None:
        """Shape every link at build time: one tc batch per sending host."""
        assert self.cap is not None
        for i in range(self.n):
            links = [lk for lk in self.topology.links if lk.src == i and (i, lk.dst) in self._links]
            shaping.run_batch(
                self.host_pid(i),
                "tc",
                [
                    cmd
                    for lk in links
                    for cmd in shaping.apply_commands(
                        self.intf(i, lk.dst),
                        self._netem_shape(self._links[(i, lk.dst)]),
                        netem=self.cap.netem,
                    )
                ],
            )
            for lk in links:
                self._apply_loss_fallback(i, lk.dst)

    def _apply_leaf(self, i: int, j: int, old: LinkState) -> None:
        st = self._links[(i, j)]
        assert self.cap is not None
        shape, before = self._netem_shape(st), self._netem_shape(old)
        # Same leaf kind: change it in place, so queued packets are not flushed.
        same_kind = shaping.leaf_kind(shape, netem=self.cap.netem) == shaping.leaf_kind(
            before, netem=self.cap.netem
        )
        shaping.set_leaf(
            self.host_pid(i), self.intf(i, j), shape, netem=self.cap.netem, in_place=same_kind
        )
        self._apply_loss_fallback(i, j)

    def _netem_shape(self, st: LinkState) -> shaping.Shape:
        """The shape netem gets: impairments it cannot apply are left out (see preflight)."""
        assert self.cap is not None
        if self.cap.netem:
            return st.shape()
        return shaping.Shape(st.rate_mbit)

    def _apply_loss_fallback(self, i: int, j: int) -> None:
        assert self.cap is not None and self.state is not None
        st = self._links[(i, j)]
        want = st.loss_pct if self.cap.mode(Impairment.LOSS) is ImpairmentMode.IPTABLES else 0.0
        have = self._loss_fallback.get((i, j), 0.0)
        if want == have:
            return
        rpid, rdev = self.host_pid(j), self.intf(j, i)
        if have > 0:
            self.state.remove_ns_rule(j, shaping.loss_rule(rdev, have))
        if want > 0:
            self.state.add_ns_rule(j, shaping.loss_rule(rdev, want))
        shaping.set_loss_fallback(rpid, rdev, want, previous_pct=have)
        self._loss_fallback[(i, j)] = want


_INTF_RE = re.compile(r"^w(\d+)-w(\d+)$")
_COUNT_TAG = "crew-count"
_COUNT_RE = re.compile(r"-d (\d+\.\d+\.\d+\.\d+)/32 .*-c (\d+) (\d+)")
ETH_HEADER_BYTES = 14


def read_net_dev(pid: int) -> dict[str, tuple[int, int]]:
    """(rx_bytes, tx_bytes) per interface in the network namespace of ``pid``.

    Parsing this text is 30 times faster than a netlink link dump through pyroute2 (0.2 ms
    against 6 ms for 3 hosts, ``python -m lab.studies.netlinkbench``), so the 1 Hz monitor keeps
    it."""
    text = Path(f"/proc/{pid}/net/dev").read_text()
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if len(fields) >= 9:
            out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


def wait_until(pred: Any, timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll ``pred`` until it is true or ``timeout_s`` passes (bounded); return its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
