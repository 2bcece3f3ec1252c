"""Preflight: what this machine can emulate, and whether that covers a topology.

Kernels differ (ours has no sch_netem; the Vagrant VM's has), so nothing is assumed: the
qdiscs are probed by adding them to a veth pair inside a throw-away network namespace, which is
always deleted. ``check`` fails loudly, naming what is missing and on how many links, unless the
caller allows an impairment to be missing; for loss that means the iptables statistic-match
fallback on the receiver (when present), for delay and jitter it means "not emulated".

Run ``python -m lab.net.preflight [--topology PATH]`` for a report.
"""

from __future__ import annotations

import argparse
import enum
import logging
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field

from crew.cli_options import command_parser
from lab.spec.shipped import add_topology_flag
from lab.spec.topology import Impairment, TopologySpec, load_topology

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0
TOOLS = ("mnexec", "tc", "ip", "iptables", "ethtool")
REQUIRED_TOOLS = ("mnexec", "tc", "ip", "iptables")


class PreflightError(Exception):
    """The machine cannot run the lab, or cannot emulate what the topology asks for."""


class ImpairmentMode(enum.Enum):
    """How an impairment is emulated on this machine."""

    NETEM = "netem"
    IPTABLES = "iptables statistic drop at the receiver"
    OFF = "not emulated"


@dataclass(frozen=True)
class Capabilities:
    """What this machine offers, and which missing impairments the caller accepted.

    ``tools`` maps each tool name to its path (None when not found).
    """

    root: bool
    tools: dict[str, str | None] = field(hash=False)
    htb: bool
    netem: bool
    iptables_statistic: bool
    allow_missing: frozenset[Impairment] = frozenset()

    def mode(self, imp: Impairment) -> ImpairmentMode:
        if self.netem:
            return ImpairmentMode.NETEM
        if imp is Impairment.LOSS and self.iptables_statistic and imp in self.allow_missing:
            return ImpairmentMode.IPTABLES
        return ImpairmentMode.OFF


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)


def probe_kernel() -> tuple[bool, bool, bool]:
    """(htb, netem, iptables statistic) as found by trying them in a temporary namespace."""
    ns = f"crwprobe{uuid.uuid4().hex[:8]}"
    if _run(["ip", "netns", "add", ns]).returncode != 0:
        raise PreflightError(f"cannot create a network namespace ({ns}) to probe the kernel")
    try:
        setup = [
            ["ip", "-n", ns, "link", "add", "crwp0", "type", "veth", "peer", "name", "crwp1"],
            ["ip", "-n", ns, "link", "set", "crwp0", "up"],
        ]
        for argv in setup:
            res = _run(argv)
            if res.returncode != 0:
                raise PreflightError(f"`{' '.join(argv)}` failed: {res.stderr.strip()}")
        htb = _run(["tc", "-n", ns, "qdisc", "add", "dev", "crwp0", "root", "htb"])
        _run(["tc", "-n", ns, "qdisc", "del", "dev", "crwp0", "root"])
        netem = _run(
            [
                "tc",
                "-n",
                ns,
                "qdisc",
                "add",
                "dev",
                "crwp0",
                "root",
                "netem",
                "delay",
                "1ms",
                "loss",
                "1%",
            ]
        )
        stat = _run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "iptables",
                "-w",
                "5",
                "-A",
                "INPUT",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                "0.5",
                "-j",
                "DROP",
            ]
        )
        log.debug(
            "probe: htb %s, netem %s, statistic %s",
            htb.stderr.strip(),
            netem.stderr.strip(),
            stat.stderr.strip(),
        )
        return htb.returncode == 0, netem.returncode == 0, stat.returncode == 0
    finally:
        res = _run(["ip", "netns", "del", ns])
        if res.returncode != 0:
            log.error("could not delete probe namespace %s: %s", ns, res.stderr.strip())


def capabilities(allow_missing: frozenset[Impairment] = frozenset()) -> Capabilities:
    """Find the tools and probe the kernel (the probe needs root; without it all are False)."""
    tools = {t: shutil.which(t) for t in TOOLS}
    root = os.geteuid() == 0
    can_probe = root and tools["ip"] is not None and tools["tc"] is not None
    htb, netem, stat = probe_kernel() if can_probe else (False, False, False)
    return Capabilities(
        root, tools, htb, netem, stat and tools["iptables"] is not None, frozenset(allow_missing)
    )


def _links_wanting(topology: TopologySpec, imp: Impairment) -> int:
    attr = {
        Impairment.DELAY: "delay_ms",
        Impairment.JITTER: "jitter_ms",
        Impairment.LOSS: "loss_pct",
    }[imp]
    return sum(1 for lk in topology.links if getattr(lk, attr) > 0)


def check(
    topology: TopologySpec, allow_missing: frozenset[Impairment] = frozenset()
) -> Capabilities:
    """Probe the machine and make sure it can run ``topology``.

    Raises PreflightError listing every problem: not root, missing tools, no HTB, and each
    requested impairment that cannot be applied and is not in ``allow_missing``.
    """
    cap = capabilities(allow_missing)
    problems: list[str] = []
    if not cap.root:
        problems.append("the lab needs root (network namespaces, tc, iptables): run with sudo")
    missing_tools = [t for t in REQUIRED_TOOLS if cap.tools[t] is None]
    if missing_tools:
        problems.append(
            f"tools not found on PATH: {', '.join(missing_tools)} (lab/setup.sh installs them)"
        )
    if cap.root and not missing_tools and not cap.htb:
        problems.append("this kernel has no sch_htb, which shapes every link")
    if cap.root and not cap.netem:
        for imp in sorted(topology.impairments_requested(), key=lambda i: i.value):
            if imp in allow_missing:
                continue
            count = _links_wanting(topology, imp)
            hint = (
                "; allow the iptables fallback for loss"
                if imp is Impairment.LOSS and cap.iptables_statistic
                else ""
            )
            problems.append(
                f"topology {topology.name!r} asks for {imp.value} on {count} link(s) but this "
                f"kernel has no sch_netem (try `modprobe sch_netem`; on Ubuntu install "
                f"linux-modules-extra-$(uname -r)){hint}, or allow {imp.value} to be missing"
            )
    if problems:
        raise PreflightError("preflight failed:\n  - " + "\n  - ".join(problems))
    return cap


def describe(cap: Capabilities, topology: TopologySpec) -> str:
    """Lines saying what the lab will emulate for ``topology`` on this machine."""
    lines = [
        f"root: {'yes' if cap.root else 'NO'}; tools: "
        + ", ".join(f"{t} {'ok' if p else 'MISSING'}" for t, p in cap.tools.items()),
        f"kernel: htb {'yes' if cap.htb else 'NO'}, netem {'yes' if cap.netem else 'no'}, "
        f"iptables statistic {'yes' if cap.iptables_statistic else 'no'}",
        f"rate limiting: HTB on {len(topology.links)} directed links, pure TCP ACKs sent ahead of"
        " their data (netem links: queued with it)",
    ]
    wanted = topology.impairments_requested()
    for imp in Impairment:
        if imp not in wanted:
            lines.append(f"{imp.value}: not requested")
            continue
        count = _links_wanting(topology, imp)
        mode = cap.mode(imp)
        if mode is ImpairmentMode.OFF:
            lines.append(f"{imp.value}: requested on {count} link(s), NOT EMULATED (allowed)")
        else:
            lines.append(f"{imp.value}: active on {count} link(s) via {mode.value}")
    return "\n".join(lines)


def add_allow_missing(parser: argparse.ArgumentParser) -> None:
    """Declare ``--allow-missing``, shared by every command that builds or checks a lab; read
    the parsed value with :func:`allowed_missing`."""
    parser.add_argument(
        "--allow-missing",
        action="append",
        default=[],
        choices=[i.value for i in Impairment],
        help="accept that the kernel cannot emulate this impairment the topology asks for "
        "(loss then uses the iptables fallback when available, delay and jitter are not "
        "emulated); repeatable. Without it such a topology is refused",
    )


def allowed_missing(args: argparse.Namespace) -> frozenset[Impairment]:
    """The impairments ``--allow-missing`` (see :func:`add_allow_missing`) accepts as missing."""
    return frozenset(Impairment(v) for v in args.allow_missing)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(
        "python -m lab.net.preflight",
        "Probe this machine (root, tools, HTB, netem, iptables statistic match) and "
        "say which impairments of a topology the lab can emulate.",
    )
    add_topology_flag(
        parser, "topology YAML to check, or a shipped topology's name (default: default)"
    )
    add_allow_missing(parser)
    args = parser.parse_args(argv)
    topo = load_topology(args.topology)
    try:
        cap = check(topo, allowed_missing(args))
    except PreflightError as e:
        print(e, file=sys.stderr)
        return 1
    print(describe(cap, topo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
