"""Where an op's time goes, link by link, from the workers' frame traces.

Run a lab or a benchmark with ``CREW_FRAME_TRACE=DIR`` (``crew.wire.transport.FrameTrace``): every
worker appends one line per frame event to ``DIR/frames-w<i>.tsv``. Then

    python -m lab.studies.frametrace DIR [--group G] [--window S]

prints, for each group, one row per directed link i->j: the payload bytes it carried, when its
first frame was queued and sent, when its first and last frames arrived (seconds after the
group's first queued frame), the rate over its span, and the first frame's delay (sent ->
received) over the link's steady per-frame time. A healthy link starts at once and runs at its
rate to the end; a link whose first frame takes many frame times while the others run is
starved (this is how the BBR-on-a-busy-reverse-path stall of ``crew.wire.transport.TCP_CONGESTION``
showed: first-frame delays of 0.55-0.7 s against 0.17 s per frame).

Group ids restart in every run, so a directory shared by several runs mixes them: ``--window``
keeps only the events within S seconds of each group's first one (the first run's).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from crew.cli_options import command_parser

DATA_KINDS = frozenset({"SCATTER", "RESULT"})


@dataclass(frozen=True)
class Event:
    t: float
    what: str  # q queued, s send started, e send ended, r received
    me: int
    peer: int
    kind: str
    group: int
    block: int
    offset: int
    nbytes: int

    @property
    def link(self) -> tuple[int, int]:
        return (self.peer, self.me) if self.what == "r" else (self.me, self.peer)


@dataclass(frozen=True)
class LinkRow:
    src: int
    dst: int
    nbytes: int
    first_queued: float
    first_sent: float
    first_received: float
    last_received: float
    frames: int

    @property
    def mbit_s(self) -> float:
        span = self.last_received - self.first_sent
        return self.nbytes * 8 / 1e6 / span if span > 0 else float("nan")

    @property
    def first_frame_over_steady(self) -> float:
        """The first frame's send -> receive time over the mean time per frame after it."""
        if self.frames < 2:
            return float("nan")
        steady = (self.last_received - self.first_received) / (self.frames - 1)
        return (self.first_received - self.first_sent) / steady if steady > 0 else float("nan")


def read_events(directory: Path) -> list[Event]:
    out = []
    for path in sorted(directory.glob("frames-w*.tsv")):
        me = int(path.stem.removeprefix("frames-w"))
        for line in path.read_text(encoding="ascii").splitlines():
            parts = line.split("\t")
            if len(parts) != 9:
                continue  # a line cut short when the worker was killed
            t, what, peer, kind, group, _rev, block, offset, nbytes = parts
            out.append(
                Event(
                    float(t), what, me, int(peer), kind, int(group), int(block), int(offset),
                    int(nbytes),
                )
            )  # fmt: skip
    out.sort(key=lambda e: e.t)
    return out


def read_traced_run(p: argparse.ArgumentParser, directory: Path, db: Path) -> list[Event] | None:
    """A run's frame events, once its database is known to exist (``p.error`` if not); None,
    said on stderr, when the trace directory holds no events."""
    if not db.is_file():
        p.error(f"{db}: no such run database")
    events = read_events(directory)
    if not events:
        print(f"{directory}: no frame events", file=sys.stderr)
        return None
    return events


def link_rows(events: Iterable[Event], group: int, window_s: float) -> tuple[float, list[LinkRow]]:
    """The group's start (its first queued data frame) and one row per directed link."""
    mine = [e for e in events if e.group == group and e.kind in DATA_KINDS]
    if not mine:
        return 0.0, []
    t0 = mine[0].t
    mine = [e for e in mine if e.t < t0 + window_s]
    by_link: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for e in mine:
        by_link[e.link].append(e)
    rows = []
    for (src, dst), evs in sorted(by_link.items()):
        got = [e for e in evs if e.what == "r"]
        sent = [e for e in evs if e.what == "s"]
        queued = [e for e in evs if e.what == "q"]
        if not got or not sent or not queued:
            continue
        rows.append(
            LinkRow(
                src,
                dst,
                sum(e.nbytes for e in got),
                queued[0].t - t0,
                sent[0].t - t0,
                got[0].t - t0,
                got[-1].t - t0,
                len(got),
            )
        )
    return t0, rows


def main(argv: Sequence[str] | None = None) -> int:
    p = command_parser("python -m lab.studies.frametrace", __doc__.split("\n")[0])
    p.add_argument("directory", type=Path, help="the CREW_FRAME_TRACE directory")
    p.add_argument("--group", type=int, action="append", help="only this group (repeatable)")
    p.add_argument("--window", type=float, default=30.0, metavar="S", help="default 30")
    args = p.parse_args(argv)
    events = read_events(args.directory)
    if not events:
        print(f"{args.directory}: no frame events", file=sys.stderr)
        return 2
    groups = args.group or sorted({e.group for e in events if e.kind in DATA_KINDS})
    for g in groups:
        _, rows = link_rows(events, g, args.window)
        if not rows:
            continue
        end = max(r.last_received for r in rows)
        print(f"group {g}: last frame received {end:.3f} s after the first was queued")
        print("  link     MB   queued  sent   first  last   Mbit/s  first-frame/steady")
        for r in rows:
            print(
                f"  {r.src}->{r.dst:<3} {r.nbytes / 1e6:5.2f}  {r.first_queued:5.2f}  "
                f"{r.first_sent:5.2f}  {r.first_received:5.2f}  {r.last_received:5.2f}  "
                f"{r.mbit_s:6.1f}  {r.first_frame_over_steady:5.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
