"""Delay, jitter, loss and rate-with-delay, measured on a running lab against what it was told.

    python -m lab.vm -- python -m lab.studies.impairments        # needs sch_netem: run it in lab.vm

RTT, jitter and loss by ping (bounds in lab.net.probe); rate with delay by one bulk TCP transfer
(lab.check's meter), within 10% of HTB's payload ceiling. After the run-time change, w0->w1
carries 100 ms of RTT, so its goodput row is the long-fat-link figure at the case's rate.

``python -m lab.studies.impairments`` builds a 3-host lab, measures every case first as built and
then after changing the links at run time (``LabNetwork.set_link``, the call the dashboard's
and scenarios' commands end in), prints the table and exits 1 if any row is out of bounds.

Like ``lab.check``, a measurement out of bounds (one pair's RTT rows, the loss row, the
goodput row) is taken again once before it counts (``measure_all(retries=1)``): under QEMU's
software emulation one lost slice of CPU can push a ping train's p90 or a 3 s transfer out of
bounds, and a wrong impairment is wrong every time.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from crew.cli_options import command_parser
from lab.check import PAYLOAD_FRACTION, any_out, measure_batch, retried
from lab.net import preflight
from lab.net.mesh import LabNetwork, LinkState
from lab.net.probe import TOLERANCE, Row, loss_row, ping, rtt_rows
from lab.report.markdown import md_table
from lab.spec.topology import LinkSpec, TopologySpec, parse_topology


def rate_row(when: str, net: LabNetwork, i: int, j: int, seconds: float) -> Row:
    st = net.link_state(i, j)
    spec = LinkSpec(i, j, st.rate_mbit, st.delay_ms, st.jitter_ms, st.loss_pct)
    res = measure_batch(net, [spec], seconds, TOLERANCE)[0]
    if res.status == "ERROR":
        raise RuntimeError(f"bulk transfer w{i}->w{j} failed: {res.error}")
    ceiling = st.rate_mbit * PAYLOAD_FRACTION
    link = f"w{i}->w{j} ({st.delay_ms + net.link_state(j, i).delay_ms:g} ms RTT)"
    return Row.within(
        when, link, "goodput", ceiling, res.measured_mbit, ceiling * TOLERANCE, "Mbit/s", 1
    )


# -- the standard cases ------------------------------------------------------------------------

RATE_MBIT = 20.0


def case_topology() -> TopologySpec:
    """Three hosts; w0<->w1 delay per direction, w0<->w2 jitter one way, w1<->w2 loss one way."""
    return parse_topology(
        {
            "name": "impairments",
            "clouds": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "links": [
                {
                    "between": ["a", "b"],
                    "mbit": RATE_MBIT,
                    "delay_ms": {"forward": 30, "reverse": 10},
                },
                {
                    "between": ["a", "c"],
                    "mbit": RATE_MBIT,
                    "delay_ms": {"forward": 25, "reverse": 0},
                    "jitter_ms": {"forward": 5, "reverse": 0},
                },
                {
                    "between": ["b", "c"],
                    "mbit": RATE_MBIT,
                    "loss_pct": {"forward": 20, "reverse": 0},
                },
            ],
        }
    )


@dataclass(frozen=True)
class Sizes:
    """How much to probe; the defaults fit the bounds above (see the module docstring)."""

    rtt_probes: int = 300
    loss_probes: int = 4000
    interval_s: float = 0.005
    bulk_s: float = 4.0


def measure_all(net: LabNetwork, when: str, sizes: Sizes, retries: int = 1) -> list[Row]:
    """Every case's rows; each measurement out of bounds is taken again, up to ``retries``
    times (module doc)."""

    def pair(i: int, j: int) -> tuple[LinkState, LinkState]:
        return net.link_state(i, j), net.link_state(j, i)

    def rtt(i: int, j: int) -> list[Row]:
        stats = ping(net, i, j, count=sizes.rtt_probes, interval_s=sizes.interval_s)
        return rtt_rows(when, *pair(i, j), stats)

    def loss() -> list[Row]:
        stats = ping(net, 1, 2, count=sizes.loss_probes, interval_s=sizes.interval_s / 2)
        return [loss_row(when, *pair(1, 2), stats)]

    def rate() -> list[Row]:
        return [rate_row(when, net, 0, 1, sizes.bulk_s)]

    rows: list[Row] = []
    for measure in (partial(rtt, 0, 1), partial(rtt, 0, 2), loss, rate):
        rows += retried(measure, any_out, retries)[0]
    return rows


def change_at_run_time(net: LabNetwork) -> None:
    """New delays (the other way round, and longer), jitter and loss on the same links."""
    net.set_link(0, 1, delay_ms=70)
    net.set_link(1, 0, delay_ms=30)
    net.set_link(0, 2, delay_ms=40, jitter_ms=8)
    net.set_link(1, 2, loss_pct=10)
    net.set_link(2, 1, loss_pct=10)


def run_cases(sizes: Sizes, progress: Callable[[str], None] = lambda s: None) -> list[Row]:
    topo = case_topology()
    cap = preflight.check(topo, frozenset())
    if not cap.netem:
        raise RuntimeError("this kernel has no sch_netem: run under python -m lab.vm")
    tag = "im" + secrets.token_hex(2)
    with LabNetwork(topo, tag=tag, capabilities=cap) as net:
        progress("measuring the links as built")
        rows = measure_all(net, "built", sizes)
        change_at_run_time(net)
        progress("measuring after the run-time change")
        rows += measure_all(net, "changed at run time", sizes)
    return rows


def render(rows: list[Row]) -> str:
    header = ("when", "link", "quantity", "configured", "measured", "bound", "samples", "ok")
    return md_table(
        header,
        (
            (
                r.when,
                r.link,
                r.quantity,
                f"{r.configured:.2f} {r.unit}",
                f"{r.measured:.2f} {r.unit}",
                f"{r.low:.2f}–{r.high:.2f}",
                str(r.samples),
                "yes" if r.ok else "**NO**",
            )
            for r in rows
        ),
    )


LONG_FAT_ONE_WAY_MS = 50.0


@dataclass(frozen=True)
class LongFatRow:
    rate_mbit: float
    rtt_ms: float
    tcp_mbit: float
    frames_mbit: float

    @property
    def ceiling_mbit(self) -> float:
        return self.rate_mbit * PAYLOAD_FRACTION


def long_fat(
    rates: list[float], seconds: float, skip_s: float, one_way_ms: float = LONG_FAT_ONE_WAY_MS
) -> list[LongFatRow]:
    """Goodput over one link with 2 x ``one_way_ms`` RTT at each rate: raw TCP and crew's
    frames (``one_way_ms=0`` gives the same without delay, to tell CPU limits from windows)."""
    topo = parse_topology(
        {
            "name": "long-fat",
            "clouds": [{"name": "a"}, {"name": "b"}],
            "links": [{"between": ["a", "b"], "mbit": rates[0], "delay_ms": one_way_ms}],
        }
    )
    cap = preflight.check(topo, frozenset())
    if one_way_ms and not cap.netem:
        raise RuntimeError("this kernel has no sch_netem: run under python -m lab.vm")
    out = []
    skip = ("--skip", f"{skip_s:g}")
    with LabNetwork(topo, tag="lf" + secrets.token_hex(2), capabilities=cap) as net:
        for rate in rates:
            net.set_link(0, 1, rate_mbit=rate)
            net.set_link(1, 0, rate_mbit=rate)
            st = net.link_state(0, 1)
            spec = LinkSpec(0, 1, rate, st.delay_ms, st.jitter_ms, st.loss_pct)
            tcp = measure_batch(net, [spec], seconds, TOLERANCE, sink_args=skip)[0]
            frames = measure_batch(net, [spec], seconds, TOLERANCE, ("--frames",), skip)[0]
            for r in (tcp, frames):
                if r.status == "ERROR":
                    raise RuntimeError(f"transfer at {rate} Mbit/s failed: {r.error}")
            rtt = 2 * one_way_ms
            out.append(LongFatRow(rate, rtt, tcp.measured_mbit, frames.measured_mbit))
            print(out[-1], flush=True)
    return out


def render_long_fat(rows: list[LongFatRow]) -> str:
    header = ("rate", "RTT", "payload ceiling", "raw TCP", "crew frames", "frames / ceiling")
    return md_table(
        header,
        (
            (
                f"{r.rate_mbit:g} Mbit/s",
                f"{r.rtt_ms:g} ms",
                f"{r.ceiling_mbit:.1f}",
                f"{r.tcp_mbit:.1f}",
                f"{r.frames_mbit:.1f}",
                f"{r.frames_mbit / r.ceiling_mbit:.0%}",
            )
            for r in rows
        ),
    )


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("python -m lab.studies.impairments", __doc__)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    ap.add_argument(
        "--long-fat",
        default=None,
        metavar="RATES",
        help="instead: goodput over one 100 ms RTT link at these Mbit/s (comma-separated)",
    )
    ap.add_argument("--seconds", type=float, default=8.0, help="long-fat transfer length")
    ap.add_argument(
        "--one-way-ms", type=float, default=LONG_FAT_ONE_WAY_MS, help="long-fat one-way delay"
    )
    ap.add_argument("--skip", type=float, default=2.0, help="long-fat: seconds of ramp left out")
    args = ap.parse_args(argv)
    if args.long_fat:
        rates = [float(x) for x in args.long_fat.split(",")]
        print(render_long_fat(long_fat(rates, args.seconds, args.skip, args.one_way_ms)))
        return 0
    t0 = time.monotonic()
    rows = run_cases(
        Sizes(), progress=lambda s: print(f"[{time.monotonic() - t0:5.1f} s] {s}", flush=True)
    )
    print(render(rows))
    bad = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(bad)}/{len(rows)} within bounds, {time.monotonic() - t0:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
