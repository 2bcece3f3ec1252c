"""Fidelity check: build the lab for a topology and measure every directed link's goodput.

    sudo python -m lab.check --topology topologies/small.yaml

For each link i->j a sink in host j and a source in host i (lab.net.goodput) run one TCP transfer
over the direct link for ``--seconds``. Links whose hosts are disjoint may run at the same
time (``--parallel``); the machine has few cores, so keep that small.

Expected ceiling: TCP payload over Ethernet with timestamps is 1448 of every 1514 frame bytes
HTB counts, 95.6%; HTB itself was measured at ~95% of the configured rate up to 200 Mbit/s
(docs/architecture.md §6). A link fails when its goodput is more than ``--tolerance`` (10%) below
that ceiling, and also when its sender counter did not carry the bytes (wrong path). Links
with emulated delay or loss are measured but not judged: a short TCP transfer does not reach
the rate there.

Delay, jitter and loss, where configured and emulated, are measured too: after the transfers,
``--probes`` pings over every pair with an impairment in either direction, judged by lab.net.probe
(RTT median and p90 within 10%, jitter within 25%, loss within the larger of 10% and 3
binomial standard deviations of the probe count). A pair out of bounds fails the check.

Shared uplinks (``uplinks: shared``): each pair is first measured alone (it may use the whole
WAN rate; two pairs crossing one cloud pair, in either direction, are never in one batch: ACKs
queue in the reverse uplink), then, for every directed cloud pair, one flow from each worker of
the first cloud to a distinct worker of the second runs at once (``measure_sharing``): together
(all their bits over the longest window) they must get about the uplink's rate, not a multiple
of it ("NOT SHARED" above (1 + tolerance) x rate, "LOW" below the ceiling minus tolerance).

A link or a shared uplink that comes out LOW or ERROR, or a pair with a figure out of bounds,
is measured again, alone, up to ``--retries`` times (default 1) before it fails; the last
measurement stands and the link and ping tables show how many attempts each took. Why: a short
transfer or a ping train on a loaded host (or under QEMU's software emulation) can lose a few
hundred milliseconds of CPU once, and one such slice fails a 1.5 s transfer that the link
carries at its rate when measured again. A link that is really slow is slow every time. WRONG
PATH and NOT SHARED are facts and are not retried.

Exit status: 0 all links fine, 1 some link failed, 2 the lab could not be built.
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from crew.cli_options import command_parser
from lab.net import preflight
from lab.net.cleanup import DEFAULT_STATE_DIR, cleanup_leftovers
from lab.net.goodput import sink_argv, source_argv
from lab.net.mesh import LabError, LabNetwork, LinkState
from lab.net.preflight import ImpairmentMode, PreflightError
from lab.net.probe import Row, loss_row, ping, rtt_rows
from lab.net.shaping import ShapingError
from lab.spec.shipped import add_topology_flag
from lab.spec.topology import (
    Impairment,
    LinkSpec,
    SharedUplink,
    TopologyError,
    TopologySpec,
    load_topology,
)

log = logging.getLogger(__name__)

PAYLOAD_FRACTION = 1448 / 1514  # TCP payload per Ethernet frame (MSS with timestamps)
BASE_PORT = 15201
PROC_TIMEOUT_PAD_S = 20.0
PROBE_INTERVAL_S = 0.01
RETRYABLE = frozenset({"LOW", "ERROR"})

T = TypeVar("T")


@dataclass(frozen=True)
class LinkResult:
    src: int
    dst: int
    rate_mbit: float
    expected_mbit: float
    measured_mbit: float
    received_bytes: int
    link_tx_bytes: int
    status: str  # "ok", "LOW", "WRONG PATH", "not judged (impaired)", "ERROR"
    error: str = ""
    window_s: float = 0.0  # the sink's counting window (measured_mbit is over it)
    attempts: int = 1  # measurements made; the last one stands

    @property
    def failed(self) -> bool:
        return self.status in ("LOW", "WRONG PATH", "ERROR")

    @property
    def retryable(self) -> bool:
        """A transient shortfall may pass alone; a wrong path is a routing fact."""
        return self.status in RETRYABLE


def retried(measure: Callable[[], T], failed: Callable[[T], bool], retries: int) -> tuple[T, int]:
    """``measure()``, then again while ``failed`` says so, at most ``retries`` more times: the
    last result and how many measurements were made."""
    result, attempts = measure(), 1
    while failed(result) and attempts <= retries:
        result, attempts = measure(), attempts + 1
    return result, attempts


def _measure_alone(net: LabNetwork, spec: LinkSpec, seconds: float, tolerance: float) -> LinkResult:
    return measure_batch(net, [spec], seconds, tolerance)[0]


def _retryable(r: LinkResult) -> bool:
    return r.retryable


def remeasure(
    net: LabNetwork, results: list[LinkResult], seconds: float, tolerance: float, retries: int
) -> list[LinkResult]:
    """Each LOW or ERROR link measured again alone, up to ``retries`` times (module doc)."""
    out = []
    for r in results:
        if not r.retryable or retries < 1:
            out.append(r)
            continue
        again, more = retried(
            partial(_measure_alone, net, net.topology.link(r.src, r.dst), seconds, tolerance),
            _retryable,
            retries - 1,
        )
        out.append(replace(again, attempts=r.attempts + more))
    return out


def schedule(
    links: list[LinkSpec], parallel: int, shared_by: Mapping[tuple[int, int], str] | None = None
) -> list[list[LinkSpec]]:
    """Batches of at most ``parallel`` links with pairwise disjoint hosts, greedily in order.

    No host ever runs two transfers at once, so each measures its link alone. ``shared_by``
    names the shared uplink a pair crosses (``uplinks: shared``): two links over the same
    uplink are never in one batch either."""
    shared_by = shared_by or {}
    todo = list(links)
    batches: list[list[LinkSpec]] = []
    while todo:
        batch: list[LinkSpec] = []
        busy: set[object] = set()
        for lk in list(todo):
            if len(batch) >= parallel:
                break
            keys: set[object] = {lk.src, lk.dst}
            if (lk.src, lk.dst) in shared_by:
                keys.add(shared_by[(lk.src, lk.dst)])
            if keys & busy:
                continue
            batch.append(lk)
            busy |= keys
            todo.remove(lk)
        batches.append(batch)
    return batches


def _impaired(net: LabNetwork, lk: LinkSpec) -> bool:
    assert net.cap is not None
    pairs = (
        (Impairment.DELAY, lk.delay_ms),
        (Impairment.JITTER, lk.jitter_ms),
        (Impairment.LOSS, lk.loss_pct),
    )
    return any(v > 0 and net.cap.mode(imp) is not ImpairmentMode.OFF for imp, v in pairs)


def _path_impaired(net: LabNetwork, lk: LinkSpec) -> bool:
    """True when either direction of the pair is impaired. A TCP transfer's ACKs travel the
    reverse direction, so a lossy or delayed reverse path lowers the forward goodput too (a CI
    run measured 78.8% of the ceiling on an unimpaired link whose reverse lost 25%)."""
    return _impaired(net, lk) or _impaired(net, net.topology.link(lk.dst, lk.src))


def measure_batch(
    net: LabNetwork,
    batch: list[LinkSpec],
    seconds: float,
    tolerance: float,
    meter_args: tuple[str, ...] = (),
    sink_args: tuple[str, ...] = (),
) -> list[LinkResult]:
    """Run one transfer per link in ``batch`` at the same time; judge each. ``meter_args`` go
    to both ends of lab.net.goodput (``("--frames",)`` measures crew's data plane), ``sink_args``
    to the sink alone (``("--skip", "2")`` leaves a long link's slow start out)."""
    before = net.tx_bytes()
    sinks, sources = [], []
    timeout = seconds + PROC_TIMEOUT_PAD_S
    try:
        for lk in batch:
            port = BASE_PORT + lk.src * net.n + lk.dst
            addr = f"{net.identity_address(lk.dst)}:{port}"
            s = net.popen(
                lk.dst,
                sink_argv(addr, seconds, *meter_args, *sink_args),
                label=f"check-sink-{lk.src}-{lk.dst}",
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            sinks.append((s, addr))
        for s, _addr in sinks:
            assert s.stdout is not None
            s.stdout.readline()  # {"listening": ...}; '' if the sink died (reported below)
        for lk, (_s, addr) in zip(batch, sinks, strict=True):
            c = net.popen(
                lk.src,
                source_argv(addr, seconds, *meter_args),
                label=f"check-source-{lk.src}-{lk.dst}",
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            sources.append(c)
        outputs = []
        for s, _addr in sinks:
            out, err = s.communicate(timeout=timeout)
            outputs.append((s.returncode, out, err))
        for c in sources:
            c.communicate(timeout=timeout)
    finally:
        for p in [s for s, _ in sinks] + sources:
            net.stop_process(p, timeout=2.0)
    after = net.tx_bytes()
    results = []
    for lk, (code, out, err) in zip(batch, outputs, strict=True):
        expected = lk.rate_mbit * PAYLOAD_FRACTION
        tx = after.get((lk.src, lk.dst), 0) - before.get((lk.src, lk.dst), 0)
        if code != 0 or not out.strip():
            results.append(
                LinkResult(
                    lk.src, lk.dst, lk.rate_mbit, expected, 0.0, 0, tx, "ERROR", err.strip()[-300:]
                )
            )
            continue
        r = json.loads(out.strip().splitlines()[-1])
        measured = float(r["mbit"])
        # Pairs behind shared uplinks have no interface of their own to count on.
        if (lk.src, lk.dst) in after and tx < r["bytes"]:
            status = "WRONG PATH"
        elif _path_impaired(net, lk):
            status = "not judged (impaired)"
        elif measured < (1 - tolerance) * expected:
            status = "LOW"
        else:
            status = "ok"
        results.append(
            LinkResult(
                lk.src,
                lk.dst,
                lk.rate_mbit,
                expected,
                measured,
                int(r["bytes"]),
                tx,
                status,
                window_s=float(r["seconds"]),
            )
        )
    return results


@dataclass(frozen=True)
class ShareResult:
    """Concurrent flows from the workers of one cloud to another's, over their shared uplink:
    together they must get about the uplink's rate, not a multiple of it."""

    src_cloud: str
    dst_cloud: str
    rate_mbit: float
    flows: int
    total_mbit: float
    status: str  # "ok", "LOW", "NOT SHARED", "ERROR", "not judged (impaired)"

    @property
    def failed(self) -> bool:
        return self.status in ("LOW", "NOT SHARED", "ERROR")


def shared_goodput(results: list[LinkResult]) -> float:
    """Mbit/s the flows got together: all their counted bits over the longest window.

    Not the sum of their rates: the windows end at different times (the uplink's queue drains
    one flow after the others stopped, and alone it gets the whole rate), so such a sum
    exceeds the uplink's rate even when the flows share it."""
    window = max((r.window_s for r in results), default=0.0)
    if window <= 0:
        return 0.0
    return sum(r.measured_mbit * r.window_s for r in results) / window


def uplink_keys(topo: TopologySpec) -> dict[tuple[int, int], str]:
    """For ``schedule``: the cloud pair each pair behind shared uplinks crosses, in either
    direction, since a flow's ACKs queue in the reverse uplink behind any data there."""
    return {
        pair: "-".join(sorted((u.src_cloud, u.dst_cloud)))
        for u in topo.shared_uplinks()
        for pair in u.pairs
    }


def measure_sharing(
    net: LabNetwork,
    seconds: float,
    tolerance: float,
    limit: int | None = None,
    retries: int = 0,
) -> list[ShareResult]:
    """For every shared uplink A->B, run min(|A|, |B|) disjoint flows a_k -> b_k at once and
    compare their summed goodput with the uplink's rate: above (1 + tolerance) x rate means the
    workers are not sharing it, below (1 - tolerance) x the payload ceiling means it is lost.
    An uplink that comes out LOW or ERROR is measured again, up to ``retries`` times (the
    module doc); NOT SHARED is a fact and stands. ``limit`` measures only the first uplinks
    (tests)."""
    return [
        retried(partial(_share_row, net, up, seconds, tolerance), _share_retryable, retries)[0]
        for up in net.topology.shared_uplinks()[:limit]
    ]


def _share_retryable(row: ShareResult) -> bool:
    return row.status in ("LOW", "ERROR")


def _share_row(net: LabNetwork, up: SharedUplink, seconds: float, tolerance: float) -> ShareResult:
    src = sorted({a for a, _ in up.pairs})
    dst = sorted({b for _, b in up.pairs})
    flows = [net.topology.link(a, b) for a, b in zip(src, dst, strict=False)]
    results = measure_batch(net, flows, seconds, tolerance)
    total = shared_goodput(results)
    impaired = any(_path_impaired(net, lk) for lk in flows)
    if any(r.status == "ERROR" for r in results):
        status = "ERROR"
    elif total > (1 + tolerance) * up.rate_mbit:
        status = "NOT SHARED"
    elif impaired:
        status = "not judged (impaired)"
    elif total < (1 - tolerance) * up.rate_mbit * PAYLOAD_FRACTION:
        status = "LOW"
    else:
        status = "ok"
    return ShareResult(up.src_cloud, up.dst_cloud, up.rate_mbit, len(flows), total, status)


def render_sharing(rows: list[ShareResult]) -> Table:
    t = Table(title="shared uplinks: concurrent flows from one cloud to another (Mbit/s)")
    for col in ("uplink", "flows", "rate", "goodput together", "of rate", "status"):
        t.add_column(col)
    for r in rows:
        style = "red" if r.failed else ""
        t.add_row(
            f"{r.src_cloud}->{r.dst_cloud}",
            str(r.flows),
            f"{r.rate_mbit:g}",
            f"{r.total_mbit:.1f}",
            f"{r.total_mbit / r.rate_mbit:.1%}",
            r.status,
            style=style,
        )
    return t


def impaired_pairs(net: LabNetwork) -> list[tuple[int, int]]:
    """Unordered pairs (i < j) with an emulated impairment in either direction."""
    pairs = []
    for lk in net.topology.links:
        if lk.src < lk.dst and _path_impaired(net, lk):
            pairs.append((lk.src, lk.dst))
    return pairs


def _state(net: LabNetwork, i: int, j: int) -> LinkState:
    """The pair's link; behind shared uplinks, the cloud pair's uplink values (path i -> j)."""
    if net.has_direct_link(i, j):
        return net.link_state(i, j)
    lk = net.topology.link(i, j)
    return LinkState(i, j, lk.rate_mbit, True, lk.delay_ms, lk.jitter_ms, lk.loss_pct)


def probe_pair(net: LabNetwork, i: int, j: int, probes: int, interval_s: float) -> list[Row]:
    """RTT (and jitter) rows where delay is configured, a loss row where loss is."""
    stats = ping(net, i, j, count=probes, interval_s=interval_s)
    a, b = _state(net, i, j), _state(net, j, i)
    rows: list[Row] = []
    if a.delay_ms or b.delay_ms or a.jitter_ms or b.jitter_ms:
        rows += rtt_rows("check", a, b, stats)
    if a.loss_pct or b.loss_pct:
        rows.append(loss_row("check", a, b, stats))
    return rows


def any_out(rows: list[Row]) -> bool:
    """Whether some figure of ``rows`` is out of its bounds."""
    return not all(r.ok for r in rows)


def probe_pairs(
    net: LabNetwork, probes: int, interval_s: float, retries: int = 0
) -> list[tuple[Row, int]]:
    """Every impaired pair's rows, each with the attempts its pair took: a pair with a figure
    out of bounds is pinged again, up to ``retries`` times (see the module doc)."""
    out: list[tuple[Row, int]] = []
    for i, j in impaired_pairs(net):
        rows, attempts = retried(
            partial(probe_pair, net, i, j, probes, interval_s),
            any_out,
            retries,
        )
        out += [(r, attempts) for r in rows]
    return out


def render_probes(rows: list[tuple[Row, int]]) -> Table:
    table = Table(title="delay, jitter and loss per impaired pair (ping)")
    for col in ("pair", "quantity", "configured", "measured", "bound", "probes", "tries", "status"):
        table.add_column(col)
    for r, attempts in rows:
        style = "green" if r.ok else "red"
        table.add_row(
            r.link,
            r.quantity,
            f"{r.configured:.2f} {r.unit}",
            f"{r.measured:.2f} {r.unit}",
            f"{r.low:.2f}-{r.high:.2f}",
            str(r.samples),
            str(attempts),
            f"[{style}]{'ok' if r.ok else 'OUT'}[/{style}]",
        )
    return table


def render(results: list[LinkResult], title: str) -> Table:
    table = Table(title=title)
    for col, justify in (
        ("link", "left"),
        ("configured", "right"),
        ("expected ceiling", "right"),
        ("measured", "right"),
        ("of configured", "right"),
        ("tries", "right"),
        ("status", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in results:
        style = "red" if r.failed else ("yellow" if r.status != "ok" else "green")
        table.add_row(
            f"w{r.src} -> w{r.dst}",
            f"{r.rate_mbit:g} Mbit/s",
            f"{r.expected_mbit:.1f}",
            f"{r.measured_mbit:.1f}",
            f"{r.measured_mbit / r.rate_mbit:.1%}",
            str(r.attempts),
            f"[{style}]{r.status}[/{style}]" + (f" {r.error}" if r.error else ""),
        )
    return table


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("python -m lab.check", __doc__)
    add_topology_flag(
        p, "topology YAML to emulate and check, or a shipped topology's name (default: default)"
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=2.0,
        help="duration of each link's transfer in seconds (default: %(default)s)",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=2,
        help="at most this many links measured at once, never two on one host "
        "(default: %(default)s; 1 = strictly one after another)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.10,
        help="fail a link whose goodput is more than this fraction below the "
        "expected ceiling (default: %(default)s)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=1,
        help="measure a LOW or ERROR link, or a pair with a figure out of bounds, again alone "
        "up to this many times before failing it (default: %(default)s; 0 = never)",
    )
    p.add_argument(
        "--probes",
        type=int,
        default=300,
        help="pings per pair with delay, jitter or loss configured (default: %(default)s)",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="OUT",
        help="also write the results as JSON to OUT",
    )
    preflight.add_allow_missing(p)
    p.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help="where labs record what they create (default: %(default)s)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (
        args.seconds <= 0
        or args.parallel < 1
        or not 0 <= args.tolerance < 1
        or args.probes < 2
        or args.retries < 0
    ):
        print(
            "error: need --seconds > 0, --parallel >= 1, 0 <= --tolerance < 1, --probes >= 2,"
            " --retries >= 0",
            file=sys.stderr,
        )
        return 2
    console = Console()
    try:
        topo = load_topology(args.topology)
        report = cleanup_leftovers(args.state_dir)
        if report.cleaned or report.errors:
            console.print(f"[yellow]leftovers:[/yellow] {report.summary()}")
        cap = preflight.check(topo, preflight.allowed_missing(args))
    except (TopologyError, PreflightError) as e:
        console.print(f"[red]{e}[/red]")
        return 2
    console.print(preflight.describe(cap, topo))
    tag = "ck" + secrets.token_hex(2)
    results: list[LinkResult] = []
    probe_rows: list[tuple[Row, int]] = []
    share_rows: list[ShareResult] = []
    t0 = time.monotonic()
    try:
        with LabNetwork(topo, tag=tag, state_dir=args.state_dir, capabilities=cap) as net:
            console.print(
                f"lab {tag}: {topo.n} hosts, {len(topo.links)} directed links built "
                f"in {time.monotonic() - t0:.1f} s"
            )
            batches = schedule(list(topo.links), args.parallel, uplink_keys(topo))
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as progress:
                task = progress.add_task("measuring links", total=len(topo.links))
                for batch in batches:
                    names = ", ".join(f"w{lk.src}->w{lk.dst}" for lk in batch)
                    progress.update(task, description=f"measuring {names}")
                    results += measure_batch(net, batch, args.seconds, args.tolerance)
                    progress.advance(task, len(batch))
                if any(r.retryable for r in results) and args.retries:
                    progress.update(task, description="measuring LOW or ERROR links again, alone")
                    results = remeasure(net, results, args.seconds, args.tolerance, args.retries)
                if topo.shared_uplinks():
                    progress.update(task, description="measuring shared uplinks")
                    share_rows = measure_sharing(
                        net, args.seconds, args.tolerance, retries=args.retries
                    )
                pairs = impaired_pairs(net)
                if pairs:
                    progress.update(task, description=f"pinging {len(pairs)} impaired pair(s)")
                    probe_rows = probe_pairs(net, args.probes, PROBE_INTERVAL_S, args.retries)
    except (LabError, ShapingError) as e:
        console.print(f"[red]lab error: {e}[/red]")
        return 2
    results.sort(key=lambda r: (r.src, r.dst))
    console.print(render(results, f"{topo.name}: goodput per directed link (Mbit/s)"))
    if probe_rows:
        console.print(render_probes(probe_rows))
    if share_rows:
        console.print(render_sharing(share_rows))
    failed: list[LinkResult | ShareResult] = [r for r in results if r.failed]
    failed += [r for r in share_rows if r.failed]
    bad_probes = [r for r, _ in probe_rows if not r.ok]
    ratios = [r.measured_mbit / r.rate_mbit for r in results if r.status == "ok"]
    if ratios:
        console.print(
            f"measured/configured over judged links: min {min(ratios):.1%}, "
            f"mean {sum(ratios) / len(ratios):.1%}, max {max(ratios):.1%} "
            f"(payload ceiling {PAYLOAD_FRACTION:.1%})"
        )
    console.print(
        f"total time {time.monotonic() - t0:.1f} s; "
        + (
            f"[red]{len(failed)} link(s), {len(bad_probes)} probe figure(s) failed[/red]"
            if failed or bad_probes
            else "[green]all links within tolerance[/green]"
        )
    )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "topology": topo.name,
                    "seconds": args.seconds,
                    "tolerance": args.tolerance,
                    "payload_fraction": PAYLOAD_FRACTION,
                    "ok": not failed and not bad_probes,
                    "links": [asdict(r) for r in results],
                    "retries": args.retries,
                    "probes": [asdict(r) | {"ok": r.ok, "attempts": n} for r, n in probe_rows],
                    "shared_uplinks": [asdict(r) for r in share_rows],
                },
                indent=1,
            )
        )
    return 1 if failed or bad_probes else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
