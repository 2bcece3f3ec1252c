"""The host's busy CPU while a lab trains, from the kernel's own counters (``/proc/stat``).

The lab's ``cpu_share`` counts its own processes over the whole run, the mesh's build and
teardown included, and none of the kernel's work in softirq context. That work is much of what
shaped veth links cost: HTB and the TCP stack run there for every byte on every link. A study
of how busy the host was *while the workers trained* needs the host's figure over that window.
The runner marks the host's busy CPU seconds once every worker has been ready (started, its
first step taken: start-up is 15 s of two busy cores at 32 clouds) and again when it begins
to stop them; the difference over the window is ``HostBusy``. A run whose workers were never
all ready keeps the window from their launch.

A host counter counts every process on the machine, not only the lab's, so it is the lab's
figure only on a quiet machine, where a lab is meant to be measured.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "HostBusy",
    "HostBusyError",
    "HostMark",
    "TrainingLoad",
    "host_busy_s",
    "mark",
    "training_load",
]

PROC_STAT = Path("/proc/stat")
# /proc/stat's first line: cpu user nice system idle iowait irq softirq steal guest guest_nice.
# Busy is everything but idle and iowait; guest time is already inside user (proc(5)).
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


class HostBusyError(ValueError):
    """A host CPU record is missing or malformed; the message names it."""


def host_busy_s(stat: Path = PROC_STAT) -> float:
    """CPU seconds the host's cores have been busy since boot, summed over the cores."""
    first = stat.read_text().splitlines()[0].split()
    if first[0] != "cpu":
        raise HostBusyError(f"{stat}: first line is not the 'cpu' total: {first[:1]}")
    ticks = [int(v) for v in first[1:]]
    return sum(ticks[i] for i in BUSY_FIELDS if i < len(ticks)) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class HostMark:
    """The host's busy CPU seconds at wall time ``t``."""

    t: float
    busy_s: float


def mark() -> HostMark:
    return HostMark(time.time(), host_busy_s())


@dataclass(frozen=True)
class HostBusy:
    """The host's busy CPU seconds between two marks, on ``cores`` cores."""

    started: float
    ended: float
    busy_s: float
    cores: int

    @classmethod
    def between(cls, a: HostMark, b: HostMark, cores: int) -> HostBusy:
        return cls(a.t, b.t, max(0.0, b.busy_s - a.busy_s), cores)

    @property
    def share(self) -> float:
        """Busy CPU ÷ (the window × the cores): 1.0 is every core busy throughout."""
        return self.busy_s / max(self.ended - self.started, 1e-9) / max(self.cores, 1)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> HostBusy:
        """A record written by :meth:`to_json` (a run database's ``meta.host_busy``)."""
        try:
            d = json.loads(text)
            out = cls(float(d["started"]), float(d["ended"]), float(d["busy_s"]), int(d["cores"]))
        except (ValueError, TypeError, KeyError) as exc:
            raise HostBusyError(f"host_busy record {text[:80]!r}: {exc}") from None
        if not out.ended > out.started or out.busy_s < 0 or out.cores < 1:
            raise HostBusyError(f"host_busy record {text[:80]!r}: not a window of busy CPU")
        return out


@dataclass(frozen=True)
class TrainingLoad:
    """How busy the host was while the workers trained, and the link bytes it carried then."""

    busy: HostBusy
    link_bytes: int

    @property
    def cpu_s_per_link_gb(self) -> float | None:
        """The host's busy CPU seconds per GB its shaped links carried: every cost of the run
        (data path, plans, control, monitor) charged to its bytes, as ``crew.sim``'s host model
        (``ExecutorModel.cpu_s_per_byte``) takes it. None without link bytes."""
        return self.busy.busy_s / (self.link_bytes / 1e9) if self.link_bytes else None


def training_load(conn: sqlite3.Connection) -> TrainingLoad | None:
    """A run database's training load: its ``meta.host_busy`` window and the bytes its links
    carried in it (each link's last ``link_samples`` counter in the window less its first).
    None for a run recorded without the window."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'host_busy'").fetchone()
    if row is None:
        return None
    busy = HostBusy.from_json(row[0])
    first: dict[tuple[int, int], int] = {}
    last: dict[tuple[int, int], int] = {}
    for src, dst, tx in conn.execute(
        "SELECT src, dst, tx_bytes FROM link_samples WHERE t >= ? AND t <= ? ORDER BY t",
        (busy.started, busy.ended),
    ):
        first.setdefault((src, dst), int(tx))
        last[(src, dst)] = int(tx)
    return TrainingLoad(busy, sum(last[k] - first[k] for k in last))
