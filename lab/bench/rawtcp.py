"""The physical reference of ``lab.bench --raw-tcp``: a scheme's bytes over plain TCP.

For each scheme the benchmark knows the bytes its plans put on each link. :func:`raw_move`
moves one op's worth of them (the plans' total divided by the ops) over the same links at the
same time, with ``lab.net.rawmove`` in every host: ``sendall`` from a preallocated buffer and
``recv_into`` one, no framing, MAC, aggregation or ordering between hops. Its time is what the
kernel's TCP over veth and HTB needs for those bytes, and its CPU per GB what the kernel and a
minimal Python loop cost; the benchmark divides the scheme's median op and its CPU s/GB by
them (``÷ raw``, ``CPU ÷ raw``).

The raw move starts every link at once, while a scheme's hops depend on each other, so the raw
time is a lower bound for the same bytes on this machine, not a plan.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from lab.net.mesh import LabNetwork

BASE_PORT = 7900
START_DELAY_S = 2.0  # every host connects before the common start
TIMEOUT_PAD_S = 30.0


class RawMoveError(RuntimeError):
    """A raw move did not carry every byte; the message names the hosts."""


@dataclass(frozen=True)
class RawMove:
    """One raw move: wall time from the common start to the last byte read, the CPU seconds
    of every host's mover after the start, the bytes moved, and when each receiving host read
    its last byte."""

    seconds: float
    cpu_s: float
    nbytes: int
    # Each receiving host's last read, in seconds from the common start.
    received_s: Mapping[int, float] = field(default_factory=dict)

    @property
    def cpu_s_per_gb(self) -> float | None:
        return self.cpu_s / (self.nbytes / 1e9) if self.nbytes else None


def per_op_link_bytes(planned: Mapping[str, int], ops: int) -> dict[tuple[int, int], int]:
    """The plans' bytes per link ("i->j" keys, as ``SchemeResult.planned_link_bytes``) of one
    op on average."""
    out = {}
    for key, total in planned.items():
        src, _, dst = key.partition("->")
        share = int(total / max(ops, 1))
        if share > 0:
            out[(int(src), int(dst))] = share
    return out


def raw_move(
    net: LabNetwork, link_bytes: Mapping[tuple[int, int], int], timeout_s: float = 60.0
) -> RawMove:
    """Move ``link_bytes`` over their links at once (see the module docstring)."""
    if not link_bytes:
        return RawMove(0.0, 0.0, 0)
    senders: dict[int, list[str]] = defaultdict(list)
    expect: dict[int, int] = defaultdict(int)
    for (i, j), nbytes in sorted(link_bytes.items()):
        senders[i].append(f"{net.identity_address(j)}:{BASE_PORT}={nbytes}")
        expect[j] += 1
    hosts = sorted(set(senders) | set(expect))
    start_at = time.time() + START_DELAY_S + 0.05 * len(hosts)
    procs = {}
    try:
        for h in hosts:
            argv = [sys.executable, "-m", "lab.net.rawmove", "--start-at", f"{start_at:.6f}"]
            argv += ["--timeout", str(timeout_s)]
            if expect[h]:
                argv += ["--listen", f"{net.identity_address(h)}:{BASE_PORT}"]
                argv += ["--expect", str(expect[h])]
            for s in senders[h]:
                argv += ["--send", s]
            procs[h] = net.popen(
                h, argv, label=f"rawmove-{h}", stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        results, failed = {}, []
        for h, proc in procs.items():
            out, err = proc.communicate(timeout=timeout_s + TIMEOUT_PAD_S)
            try:
                results[h] = json.loads(out.decode().strip().splitlines()[-1])
            except (ValueError, IndexError):
                failed.append(f"host {h}: {err.decode().strip()[-300:] or 'no output'}")
                continue
            if proc.returncode != 0:
                failed.append(f"host {h}: {results[h].get('errors') or 'not every byte sent'}")
    finally:
        for proc in procs.values():
            net.stop_process(proc, timeout=2.0)
    if failed:
        raise RawMoveError("raw TCP move failed: " + "; ".join(failed))
    ends = [r["recv_end"] for r in results.values() if r["recv_end"] is not None]
    received = sum(r["received"] for r in results.values())
    if received != sum(link_bytes.values()):
        raise RawMoveError(f"raw TCP move read {received} of {sum(link_bytes.values())} bytes")
    return RawMove(
        max(ends) - start_at,
        sum(r["cpu_s"] for r in results.values()),
        received,
        {h: r["recv_end"] - start_at for h, r in results.items() if r["recv_end"] is not None},
    )


def raw_reference(
    net: LabNetwork, link_bytes: Mapping[tuple[int, int], int], repeats: int = 3
) -> tuple[float, float | None]:
    """Median time and median CPU s/GB of ``repeats`` raw moves of ``link_bytes``."""
    moves = [raw_move(net, link_bytes) for _ in range(repeats)]
    per_gb = [m.cpu_s_per_gb for m in moves if m.cpu_s_per_gb is not None]
    return (
        statistics.median(m.seconds for m in moves),
        statistics.median(per_gb) if per_gb else None,
    )
