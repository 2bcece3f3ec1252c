"""Link shaping: HTB on the sender's interface, netem or iptables for impairments, cuts.

One directed link i->j is shaped on host i's interface facing j:

    root 1: htb default 10
      filter pref 1: pure TCP ACKs -> 1:0, HTB's direct queue     (pfifo leaf only)
      class 1:10  rate = ceil = R, burst = cburst = B
        leaf 10:  pfifo limit Q          (no delay/jitter/loss, or no netem)
                  netem delay/jitter/loss limit Q   (when the kernel has sch_netem)

Cost model / sizing:
- Burst B: HTB refills its bucket on dequeue; a bucket smaller than one timer tick's worth of
  bytes at rate R makes HTB fall short of R, a large one lets bursts exceed R. B = R x 1 ms,
  never below a few full frames, keeps the long-run rate within a percent or two and bursts
  to about a millisecond of traffic.
- Queue Q (packets): a WAN bottleneck buffers about one bandwidth-delay product; we allow the
  configured two-way delay plus 50 ms of queueing at R (so TCP can fill the pipe), between 64
  and 20000 full-size frames. netem holds delayed packets in the same queue, so its limit
  must cover the BDP or it drops on its own.
- Pure ACKs skip the data queue. A direction's TCP ACKs leave on its reverse's interface; in
  the leaf queue they wait behind the reverse's data, up to Q frames: 0.78 s at 1 Mbit/s,
  where Q is its floor of 64 frames. At the lab's scaled-down rates that is 40 times what
  the same queue holds at the real rates, and it clocks a fast direction down to its busy,
  slower reverse's rate (8 Mbit/s against a busy 1 Mbit/s reverse: 1.6 Mbit/s with the
  ACKs queued, 8.0 Mbit/s with them direct; ``python -m lab.studies.ackqueue``). A u32
  filter sends IPv4 TCP segments of at most 127 bytes whose only flag is ACK to HTB's direct
  queue, which is sent first and not rate-limited. Those bytes are not counted in the
  link's rate: about 66 bytes per two full-size segments the reverse carries, some 2% of the
  reverse's data rate, which the simulator's links (data only) leave out too. A netem leaf
  delays every packet, ACKs included, so a link with netem impairments keeps its ACKs in the
  leaf (no filter).
- Offloads: with TSO/GSO a veth hands HTB 64 KB super-packets, and HTB's rate accounting and
  queue limit (in packets) go coarse; ``disable_offloads`` turns them off on the lab's veths.

A cut of direction i->j is a DROP rule in the *receiver's* INPUT chain for the interface facing
i, inside j's namespace: the sender's TCP sees silence, as on a dead WAN path (a drop in the
sender's OUTPUT would return errors to it). The same goes for the iptables loss fallback.

Every command runs as an argv list through ``mnexec -a <host pid>``; a failure raises
``ShapingError`` naming the command and its stderr.
"""

from __future__ import annotations

import logging
import math
import re
import subprocess
from dataclasses import dataclass

log = logging.getLogger(__name__)

MTU_FRAME = 1514
HTB_HANDLE = "1:"
HTB_CLASS = "1:10"
LEAF_HANDLE = "10:"
QUEUE_MIN_PKTS = 64
QUEUE_MAX_PKTS = 20000
QUEUE_EXTRA_S = 0.050
BURST_S = 0.001
BURST_MIN_BYTES = 4 * MTU_FRAME
QUANTUM_MAX = 200_000
ACK_FILTER_PREF = "1"
ACK_QUEUE_DIRECT = "direct"
"""The run database's ``meta.ack_queue`` for a lab whose pfifo links send pure ACKs direct;
runs recorded without the key queued them behind the data."""
# IPv4, 20-byte header (IHL 5); total length below 128 (an ACK with timestamps and SACK blocks);
# TCP flags byte (20 + 13) exactly ACK. flowid 1:0 is the HTB qdisc itself: its direct queue.
ACK_MATCH = (
    ["match", "ip", "protocol", "6", "0xff"]
    + ["match", "u8", "0x05", "0x0f", "at", "0"]
    + ["match", "u16", "0x0000", "0xff80", "at", "2"]
    + ["match", "u8", "0x10", "0xff", "at", "33"]
)
OFFLOADS = ("tso", "gso", "gro")


class ShapingError(Exception):
    """A tc/iptables/ethtool command failed; carries the command and its stderr."""

    def __init__(self, argv: list[str], returncode: int, stderr: str):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"`{' '.join(argv)}` failed ({returncode}): {self.stderr}")


@dataclass(frozen=True)
class Shape:
    """What one directed link should look like. Rates in Mbit/s (10^6 bit/s)."""

    rate_mbit: float
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    def __post_init__(self) -> None:
        if not self.rate_mbit > 0:
            raise ValueError(f"rate_mbit must be > 0, got {self.rate_mbit}")
        for name in ("delay_ms", "jitter_ms", "loss_pct"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.loss_pct > 100:
            raise ValueError(f"loss_pct must be <= 100, got {self.loss_pct}")

    @property
    def needs_netem(self) -> bool:
        return self.delay_ms > 0 or self.jitter_ms > 0 or self.loss_pct > 0


def in_ns(pid: int | None, argv: list[str]) -> list[str]:
    """``argv`` run inside the network namespace of ``pid`` (root namespace when None)."""
    return argv if pid is None else ["mnexec", "-a", str(pid), *argv]


def run(pid: int | None, argv: list[str], *, timeout: float = 10.0) -> str:
    """Run ``argv`` in ``pid``'s namespace; return stdout, raise ShapingError on failure."""
    full = in_ns(pid, argv)
    res = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise ShapingError(full, res.returncode, res.stderr)
    return res.stdout


def run_batch(
    pid: int | None, tool: str, commands: list[list[str]], *, timeout: float = 10.0
) -> None:
    """Run many ``tool`` commands (argv lists that start with ``tool``) in one process.

    ``ip -batch -`` and ``tc -batch -`` read commands from stdin, one per line, and stop at the
    first that fails, so a lab's build runs two processes per host instead of a few hundred
    fork/execs in all. Raises ShapingError naming the failing command."""
    lines = []
    for argv in commands:
        if not argv or argv[0] != tool:
            raise ValueError(f"not a {tool} command: {argv}")
        if any(not a or a.split() != [a] or a[0] in "\"'#" for a in argv[1:]):
            raise ValueError(f"cannot batch {argv}: an argument is empty, quoted or has spaces")
        lines.append(" ".join(argv[1:]))
    if not lines:
        return
    full = in_ns(pid, [tool, "-batch", "-"])
    res = subprocess.run(
        full, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=timeout
    )
    if res.returncode != 0:
        # Both tools report "Command failed -:N" with N the 1-based line of the batch.
        m = re.search(r"Command failed -:(\d+)", res.stderr)
        failed = (
            commands[int(m.group(1)) - 1] if m and 0 < int(m.group(1)) <= len(commands) else full
        )
        raise ShapingError(failed, res.returncode, res.stderr)


def rate_arg(rate_mbit: float) -> str:
    # kbit keeps fractional Mbit/s rates exact enough; tc's k is 1000.
    return f"{max(1, round(rate_mbit * 1000))}kbit"


def burst_bytes(rate_mbit: float) -> int:
    return max(BURST_MIN_BYTES, math.ceil(rate_mbit * 1e6 / 8 * BURST_S))


def quantum_bytes(rate_mbit: float) -> int:
    # One class only, so the quantum does not share anything; clamp to silence HTB's warning.
    return int(min(QUANTUM_MAX, max(MTU_FRAME, rate_mbit * 1e6 / 8 / 10)))


def queue_limit(rate_mbit: float, delay_ms: float = 0.0, jitter_ms: float = 0.0) -> int:
    """Leaf queue limit in packets: two-way delay plus ``QUEUE_EXTRA_S`` at the rate."""
    seconds = 2 * (delay_ms + jitter_ms) / 1000 + QUEUE_EXTRA_S
    pkts = math.ceil(rate_mbit * 1e6 / 8 * seconds / MTU_FRAME)
    return min(QUEUE_MAX_PKTS, max(QUEUE_MIN_PKTS, pkts))


def _class_args(rate_mbit: float) -> list[str]:
    r, b = rate_arg(rate_mbit), str(burst_bytes(rate_mbit))
    quantum = str(quantum_bytes(rate_mbit))
    return ["htb", "rate", r, "ceil", r, "burst", b, "cburst", b, "quantum", quantum]


def _leaf_args(shape: Shape, *, netem: bool) -> list[str]:
    limit = str(queue_limit(shape.rate_mbit, shape.delay_ms, shape.jitter_ms))
    if not (netem and shape.needs_netem):
        return ["pfifo", "limit", limit]
    args = ["netem", "limit", limit]
    if shape.delay_ms > 0 or shape.jitter_ms > 0:
        args += ["delay", f"{shape.delay_ms:g}ms"]
        if shape.jitter_ms > 0:
            # Without a distribution netem's jitter is uniform; "normal" is closer to WAN RTTs.
            args += [f"{shape.jitter_ms:g}ms", "distribution", "normal"]
    if shape.loss_pct > 0:
        args += ["loss", f"{shape.loss_pct:g}%"]
    return args


def apply_commands(dev: str, shape: Shape, *, netem: bool) -> list[list[str]]:
    """The tc commands that install the HTB tree for ``shape`` on ``dev`` (see :func:`apply`)."""
    return [
        ["tc", "qdisc", "replace", "dev", dev, "root", "handle", HTB_HANDLE, "htb", "default"]
        + [HTB_CLASS.split(":")[1]],
        ["tc", "class", "replace", "dev", dev, "parent", HTB_HANDLE, "classid", HTB_CLASS]
        + _class_args(shape.rate_mbit),
        leaf_command(dev, shape, netem=netem),
    ] + ([ack_filter_command(dev, add=True)] if leaf_kind(shape, netem=netem) == "pfifo" else [])


def ack_filter_command(dev: str, *, add: bool) -> list[str]:
    """The tc command that adds (or deletes) the filter sending pure ACKs to HTB's direct queue
    (see the module docstring)."""
    head = ["tc", "filter", "add" if add else "del", "dev", dev, "parent", HTB_HANDLE]
    head += ["protocol", "ip", "pref", ACK_FILTER_PREF]
    return head + ["u32", *ACK_MATCH, "flowid", HTB_HANDLE + "0"] if add else head + ["u32"]


def apply(pid: int, dev: str, shape: Shape, *, netem: bool) -> None:
    """Install the HTB tree for ``shape`` on ``dev`` in ``pid``'s namespace.

    ``netem`` says whether the kernel has sch_netem; without it delay/jitter/loss are not
    applied here (the caller decides whether that is allowed, see lab.net.preflight).
    """
    run_batch(pid, "tc", apply_commands(dev, shape, netem=netem))


def leaf_kind(shape: Shape, *, netem: bool) -> str:
    return _leaf_args(shape, netem=netem)[0]


def leaf_command(dev: str, shape: Shape, *, netem: bool, in_place: bool = False) -> list[str]:
    """The tc command of :func:`set_leaf`."""
    op = "change" if in_place else "replace"
    return ["tc", "qdisc", op, "dev", dev, "parent", HTB_CLASS, "handle", LEAF_HANDLE] + (
        _leaf_args(shape, netem=netem)
    )


def set_leaf(pid: int, dev: str, shape: Shape, *, netem: bool, in_place: bool = False) -> None:
    """Set the leaf queue: new delay/loss, or a limit fitting a new rate. Without ``in_place``
    the leaf changes kind (pfifo <-> netem).

    ``in_place`` uses ``tc qdisc change`` (same kind only), which keeps the queued packets;
    otherwise the leaf is deleted and added anew (its queue flushed): the kernel refuses
    ``replace`` of a handle by a qdisc of another kind (pfifo -> netem fails with "Invalid
    qdisc name"). The ACK filter goes with a pfifo leaf: added with one, deleted with a
    netem one (``in_place`` keeps the kind, so the filter stays as it is). The commands run in
    one tc process, back to back."""
    if in_place:
        run(pid, leaf_command(dev, shape, netem=netem, in_place=True))
        return
    delete = ["tc", "qdisc", "del", "dev", dev, "parent", HTB_CLASS, "handle", LEAF_HANDLE]
    add = leaf_command(dev, shape, netem=netem)
    add[2] = "add"
    to_pfifo = leaf_kind(shape, netem=netem) == "pfifo"
    filt = ack_filter_command(dev, add=to_pfifo)
    # A link goes pfifo -> netem with its filter there, netem -> pfifo without one.
    run_batch(pid, "tc", [delete, add, filt] if to_pfifo else [filt, delete, add])


def change_rate(pid: int, dev: str, rate_mbit: float) -> None:
    """Change the class rate in place (``tc class change``): queued packets and TCP state
    survive, only the token rate changes."""
    run(
        pid,
        [
            "tc",
            "class",
            "change",
            "dev",
            dev,
            "parent",
            HTB_HANDLE,
            "classid",
            HTB_CLASS,
            *_class_args(rate_mbit),
        ],
    )


def remove(pid: int, dev: str) -> None:
    run(pid, ["tc", "qdisc", "del", "dev", dev, "root"])


_RATE_RE = re.compile(r"\brate (\d+(?:\.\d+)?)([KMG]?)bit\b.*?\bceil (\d+(?:\.\d+)?)([KMG]?)bit")
_UNIT = {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3}


@dataclass(frozen=True)
class HtbClass:
    classid: str
    rate_mbit: float
    ceil_mbit: float


def show_classes(pid: int, dev: str) -> list[HtbClass]:
    """The HTB classes on ``dev`` as the kernel reports them (tc's text output, which has no
    JSON form for classes in iproute2 6.1)."""
    out = run(pid, ["tc", "class", "show", "dev", dev])
    classes = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[0] != "class" or parts[1] != "htb":
            continue
        m = _RATE_RE.search(line)
        if not m:
            continue
        classes.append(
            HtbClass(
                classid=parts[2],
                rate_mbit=float(m.group(1)) * _UNIT[m.group(2)],
                ceil_mbit=float(m.group(3)) * _UNIT[m.group(4)],
            )
        )
    return classes


# -- receiver-side iptables rules --------------------------------------------------------------


def cut_rule(in_dev: str) -> list[str]:
    """The rule spec (without -I/-D) that drops everything arriving on ``in_dev``."""
    return ["INPUT", "-i", in_dev, "-m", "comment", "--comment", "crew-cut", "-j", "DROP"]


def loss_rule(in_dev: str, loss_pct: float) -> list[str]:
    """The rule spec that drops ``loss_pct`` percent of packets arriving on ``in_dev``."""
    p = f"{loss_pct / 100:.6f}"
    return [
        "INPUT",
        "-i",
        in_dev,
        "-m",
        "statistic",
        "--mode",
        "random",
        "--probability",
        p,
        "-m",
        "comment",
        "--comment",
        "crew-loss",
        "-j",
        "DROP",
    ]


def add_rule(pid: int, spec: list[str], *, first: bool) -> list[str]:
    """Add ``spec`` in ``pid``'s namespace (-I when ``first``, else -A); return the argv."""
    argv = ["iptables", "-w", "5", "-I" if first else "-A", *spec]
    run(pid, argv)
    return argv


def delete_rule(pid: int, spec: list[str]) -> None:
    run(pid, ["iptables", "-w", "5", "-D", *spec])


def cut(receiver_pid: int, receiver_dev: str) -> list[str]:
    """Cut one direction: drop all it delivers at the receiver. Returns the argv used."""
    return add_rule(receiver_pid, cut_rule(receiver_dev), first=True)


def restore(receiver_pid: int, receiver_dev: str) -> None:
    delete_rule(receiver_pid, cut_rule(receiver_dev))


def set_loss_fallback(
    receiver_pid: int, receiver_dev: str, loss_pct: float, previous_pct: float = 0.0
) -> list[str] | None:
    """Emulate random loss without netem: replace the statistic DROP on the receiver's INPUT.

    Only for callers that allow the fallback (lab.net.preflight). Returns the argv added, or None
    when ``loss_pct`` is 0 (rule removed)."""
    if previous_pct > 0:
        delete_rule(receiver_pid, loss_rule(receiver_dev, previous_pct))
    if loss_pct <= 0:
        return None
    # Appended, so a cut (inserted first) still drops everything.
    return add_rule(receiver_pid, loss_rule(receiver_dev, loss_pct), first=False)


def disable_offloads(pid: int, dev: str) -> None:
    """Turn TSO/GSO/GRO off so HTB sees and counts real frames (see the module docstring)."""
    argv = ["ethtool", "-K", dev]
    for name in OFFLOADS:
        argv += [name, "off"]
    run(pid, argv)
