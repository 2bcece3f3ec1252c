"""Whether a link ran at its own rate or at its reverse's, from a run's frame traces.

Run a lab with ``CREW_FRAME_TRACE=DIR`` (``crew.wire.transport.FrameTrace``), then

    python -m lab.studies.ackclock DIR RUN/lab.db

A direction's TCP ACKs return on its reverse link. Queued behind that link's data where the
lab's leaf queue is long (below 15.5 Mbit/s it is 64 frames: 0.78 s at 1 Mbit/s), they clock a
direction whose slower reverse carries data to about the reverse's rate
(``crew.sim.network.ExecutorModel.ack_clock_mbit`` models it). The lab now sends pure ACKs
ahead of the data (``lab.net.shaping``); this prints the evidence of either: the effect in a
run recorded before that, its absence in one since.

Every group's transfer on a directed link (its data frames of one kind, scatter or result:
first sent to last received) of at least ``--min-bytes`` has a payload rate. It is
divided by the link's configured rate x ``goodput`` (**÷ own**) and by its reverse's (**÷
reverse**), and the transfers are split two ways: was the reverse carrying any group's data
for more than half of the transfer's span, and is the link more than ``--faster`` times faster
than its reverse. Rows give the count and the median, p25 and p75 of both ratios. Transfers
clocked by their reverse show ÷ reverse near 1 and ÷ own well below it, only in the row of
faster links with a busy reverse.

The trace directory must hold one run's traces: group ids restart in every run.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crew.cli_options import command_parser
from lab.studies.frametrace import DATA_KINDS, Event, read_traced_run
from lab.studies.grouptime import GOODPUT, read_run

DEFAULT_FASTER = 1.5
DEFAULT_MIN_BYTES = 100_000
WINDOW_S = 60.0  # a transfer's frames within this of its first: one run's, not the next's


@dataclass(frozen=True)
class Transfer:
    """One group's data on one directed link: payload bytes, first sent, last received."""

    src: int
    dst: int
    nbytes: int
    start: float
    end: float


@dataclass(frozen=True)
class Row:
    reverse_busy: bool
    faster: bool
    count: int
    own: tuple[float, float, float]  # median, p25, p75 of rate / (own rate x goodput)
    reverse: tuple[float, float, float]  # the same over the reverse's rate


def transfers(events: Sequence[Event]) -> list[Transfer]:
    """Every group's transfers, one per link and frame kind (a store-and-forward group's
    scatter and result on one link are two: the wait between them is not the link's), on the
    trace's clock."""
    sent: dict[tuple[int, int, int, str], float] = {}
    got: dict[tuple[int, int, int, str], list[Event]] = defaultdict(list)
    for e in events:  # in time order
        if e.kind not in DATA_KINDS:
            continue
        key = (e.group, *e.link, e.kind)
        if e.what == "s":
            sent.setdefault(key, e.t)
        elif e.what == "r" and key in sent and e.t - sent[key] < WINDOW_S:
            got[key].append(e)
    return [
        Transfer(key[1], key[2], sum(e.nbytes for e in evs), sent[key], evs[-1].t)
        for key, evs in got.items()
    ]


def _busy_share(t: Transfer, reverse: Sequence[Transfer]) -> float:
    span = t.end - t.start
    overlap = sum(max(0.0, min(t.end, r.end) - max(t.start, r.start)) for r in reverse)
    return min(1.0, overlap / span) if span > 0 else 0.0


def _spread(xs: list[float]) -> tuple[float, float, float]:
    a = np.asarray(xs)
    return float(np.median(a)), float(np.percentile(a, 25)), float(np.percentile(a, 75))


def classify(
    xfers: Sequence[Transfer],
    rates_mbit: dict[tuple[int, int], float],
    goodput: float = GOODPUT,
    faster: float = DEFAULT_FASTER,
    min_bytes: int = DEFAULT_MIN_BYTES,
) -> list[Row]:
    """One row per (reverse busy for over half the span, link > ``faster`` x its reverse)
    that has transfers; links without a configured rate both ways are left out."""
    by_link: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
    for t in xfers:
        by_link[(t.src, t.dst)].append(t)
    ratios: dict[tuple[bool, bool], list[tuple[float, float]]] = defaultdict(list)
    for t in xfers:
        own, back = rates_mbit.get((t.src, t.dst)), rates_mbit.get((t.dst, t.src))
        if t.nbytes < min_bytes or t.end <= t.start or not own or not back:
            continue
        mbit = t.nbytes * 8 / 1e6 / (t.end - t.start) / goodput
        busy = _busy_share(t, by_link.get((t.dst, t.src), [])) > 0.5
        ratios[(busy, own > faster * back)].append((mbit / own, mbit / back))
    return [
        Row(busy, fast, len(v), _spread([a for a, _ in v]), _spread([b for _, b in v]))
        for (busy, fast), v in sorted(ratios.items(), reverse=True)
    ]


def render(rows: Sequence[Row], faster: float) -> str:
    def cell(s: tuple[float, float, float]) -> str:
        return f"{s[0]:5.2f} ({s[1]:.2f}-{s[2]:.2f})"

    lines = [f"{'reverse':<8} {'link vs reverse':<18} {'count':>5}  ÷ own (p25-p75)    ÷ reverse"]
    for r in rows:
        speed = f"> {faster:g}x faster" if r.faster else "not faster"
        lines.append(
            f"{'busy' if r.reverse_busy else 'idle':<8} {speed:<18} {r.count:>5}  "
            f"{cell(r.own)}  {cell(r.reverse)}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = command_parser("python -m lab.studies.ackclock", __doc__.split("\n")[0])
    p.add_argument("directory", type=Path, help="the CREW_FRAME_TRACE directory")
    p.add_argument("db", type=Path, help="the run's lab.db")
    p.add_argument(
        "--faster",
        type=float,
        default=DEFAULT_FASTER,
        help="a link this many times its reverse's rate counts as faster"
        f" (default {DEFAULT_FASTER:g})",
    )
    p.add_argument(
        "--min-bytes",
        type=int,
        default=DEFAULT_MIN_BYTES,
        help=f"leave out smaller transfers (default {DEFAULT_MIN_BYTES})",
    )
    args = p.parse_args(argv)
    if not args.faster > 1:
        p.error(f"--faster must be above 1, got {args.faster}")
    events = read_traced_run(p, args.directory, args.db)
    if events is None:
        return 2
    _, rates = read_run(args.db)
    rows = classify(transfers(events), rates, GOODPUT, args.faster, args.min_bytes)
    print(render(rows, args.faster))
    return 0


if __name__ == "__main__":
    sys.exit(main())
