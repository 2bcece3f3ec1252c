"""What ``lab.bench`` shows: the terminal tables and the plotly figures of its results files
(``results.json`` / ``train.json`` dicts in), and the figures written as HTML and PNG."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from lab.bench.spec import MB
from lab.report.benchresults import BenchResults, RoundsSummary, SchemeResults, Spread
from lab.report.benchrounds import percentile, pooled_rounds


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def results_table(schemes: Mapping[str, SchemeResults], title: str, ops: int) -> Table:
    """Scheme, median, p90, planned, measured/planned, median/bound, median relative to the
    best correct scheme, CPU per GB moved, ops, correct."""
    medians = [r["median_s"] for r in schemes.values() if r["correct"] and r["median_s"]]
    best = min(medians) if medians else None
    t = Table(
        title=title,
        caption="planned: median of the plans' predicted op times; meas/plan: median over ops"
        " of measured/planned; /bound: median over ops of measured/fluid lower bound;"
        " /best: median over the fastest correct scheme's median; CPU: worker CPU s per GB"
        " moved; plan ms: median over ops of the planning the coordinator waited for before"
        " the op's Assign (ahead: ops planned while the op before ran); ÷ raw, CPU ÷ raw"
        " (--raw-tcp): median and CPU s/GB over those of one op's planned bytes moved over"
        " plain TCP on the same links at once",
    )
    cols = (
        "scheme",
        "median s",
        "p90 s",
        "planned s",
        "meas/plan",
        "/bound",
        "/best",
        "CPU s/GB",
        "÷ raw",
        "CPU ÷ raw",
        "plan ms",
        "ahead",
        "ops",
        "correct",
    )
    for col in cols:
        t.add_column(col, justify="left" if col == "scheme" else "right")
    for name, r in schemes.items():
        vs = r["median_s"] / best if best and r["median_s"] is not None else None
        ok = "[green]yes" if r["correct"] else "[red]no"
        t.add_row(
            name,
            _fmt(r["median_s"]),
            _fmt(r["p90_s"]),
            _fmt(r.get("planned_s")),
            _fmt(r.get("median_over_planned"), ".2f"),
            _fmt(r["median_over_bound"], ".2f"),
            _fmt(vs, ".2f"),
            _fmt(r.get("cpu_s_per_gb"), ".1f"),
            _fmt(_ratio(r["median_s"], r.get("raw_s")), ".2f"),
            _fmt(_ratio(r.get("cpu_s_per_gb"), r.get("raw_cpu_s_per_gb")), ".2f"),
            _fmt(r.get("plan_ms_median"), ".1f"),
            f"{r.get('planned_ahead', 0)}/{r['completed']}",
            f"{r['completed']}/{ops}",
            ok,
        )
    return t


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fmt_spread(s: Spread, spec: str = ".3f") -> str:
    if s["median"] is None:
        return "-"
    return f"{s['median']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"


def rounds_table(summary: Mapping[str, RoundsSummary], topology: str, rounds: int) -> Table:
    """Per scheme over the rounds (``lab.report.benchrounds.round_summary``): the median of the
    rounds' medians, measured / planned and measured / bound, each with its range, the rounds
    it was the fastest correct scheme in, and the rounds it was correct in."""
    t = Table(
        title=f"{topology}: {rounds} rounds, each scheme list rotated one place per round",
        caption="median (min-max) over the rounds of each round's median; fastest: rounds in"
        " which the scheme's median was the lowest of the correct schemes' (ties count for"
        " each)",
    )
    for col in ("scheme", "median s", "meas/plan", "/bound", "CPU s/GB", "fastest", "correct"):
        t.add_column(col, justify="left" if col == "scheme" else "right")
    for name, r in summary.items():
        t.add_row(
            name,
            _fmt_spread(r["median_s"]),
            _fmt_spread(r["median_over_planned"], ".2f"),
            _fmt_spread(r["median_over_bound"], ".2f"),
            _fmt_spread(r["cpu_s_per_gb"], ".1f"),
            f"{r['fastest']}/{r['rounds']}",
            ("[green]" if r["correct"] == r["rounds"] else "[red]")
            + f"{r['correct']}/{r['rounds']}",
        )
    return t


def error_lines(schemes: Mapping[str, Mapping[str, Any]], limit: int = 400) -> list[str]:
    """One line per scheme that failed: its name and (the start of) its error."""
    out = []
    for name, r in schemes.items():
        if r["error"]:
            err = " ".join(str(r["error"]).split())
            out.append(f"{name}: {err[:limit]}{'...' if len(err) > limit else ''}")
    return out


def _same_run_but_codec(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("scheme", "sync", "local_steps", "overlap", "p", "quorum_min", "quorum_max")
    return all(a.get(k) == b.get(k) for k in keys)


def _fp32_twin(name: str, r: dict[str, Any], results: dict[str, dict[str, Any]]) -> str | None:
    """The run with the same scheme, sync, overlap and group size in fp32, for the bytes ratio
    (None: not run)."""
    c = r.get("config")
    if not c:
        return None
    for other, o in results.items():
        oc = o.get("config") or {}
        if other != name and oc.get("compress") == "none" and _same_run_but_codec(oc, c):
            return other
    return None


def train_table(results: dict[str, dict[str, Any]], target: float) -> Table:
    """One row per training run: time to target, final quality, rounds and link bytes per
    worker, bytes per worker-round (and its ratio to the same scheme and sync in fp32), and
    the link bytes until the target was reached."""
    lm = any(r.get("target_loss") is not None for r in results.values())
    if lm:
        target = next(r["target_loss"] for r in results.values() if r.get("target_loss"))
    t = Table(title="training")
    cols = (
        "run",
        "training s",
        f"time to {target:g} s",
        "final held-out loss" if lm else "final accuracy",
        "rounds per worker",
        "compute share",
        "CPU share",
        "link MB per worker",
        "MB per worker-round",
        "x fp32",
        "link MB to target",
        "error",
    )
    left = ("run", "error")
    for col in cols:
        t.add_column(col, justify="left" if col in left else "right", no_wrap=col == "run")
    for name, r in results.items():
        per_round = r.get("link_bytes_per_round")
        twin = _fp32_twin(name, r, results)
        twin_round = results[twin].get("link_bytes_per_round") if twin else None
        ratio = per_round / twin_round if per_round and twin_round else None
        rounds = r.get("rounds_per_worker") or {}
        n = max(1, len(rounds))
        link = r.get("link_bytes")
        to_target = r.get("link_bytes_to_target")
        t.add_row(
            name,
            _fmt(r.get("training_s"), ".0f"),
            _fmt(r["time_to_target_s"], ".1f"),
            _fmt(r.get("final_heldout_loss") if lm else r["final_accuracy"]),
            _fmt(sum(rounds.values()) / n if rounds else None, ".1f"),
            _fmt(r.get("compute_utilisation"), ".1%"),
            _fmt(r.get("cpu_share"), ".0%"),
            _fmt(None if link is None else link / n / 1e6, ".1f"),
            _fmt(None if per_round is None else per_round / 1e6, ".2f"),
            _fmt(ratio),
            _fmt(None if to_target is None else to_target / 1e6, ".0f"),
            r["error"] or "",
        )
    return t


def train_figures(train: dict[str, Any]) -> dict[str, Any]:
    """Plotly figures of a training matrix: the quality curve of every run against time (with
    the target), and each run's link MB in all and until the target."""
    import plotly.graph_objects as go

    runs = train["schemes"]
    lm = any(r.get("target_loss") is not None for r in runs.values())
    target = train.get("target_loss") if lm else train.get("target_accuracy")
    what = "mean held-out loss (nats/byte)" if lm else "mean held-out accuracy"
    curves = go.Figure()
    for name, r in runs.items():
        pts = r.get("curve") or []
        curves.add_trace(
            go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines", name=name)
        )
    if target is not None:
        curves.add_hline(y=target, line_dash="dash", annotation_text=f"target {target:g}")
    curves.update_layout(
        title=f"training on {train['topology']}, p={train['p']}, seed {train['seed']}: "
        f"{what} of all workers",
        xaxis_title="seconds since the first iteration",
        yaxis_title=what,
        template="plotly_white",
        width=1000,
        height=550,
    )
    names = list(runs)
    mb = go.Figure()
    mb.add_trace(
        go.Bar(
            x=names,
            y=[(runs[k].get("link_bytes") or 0) / 1e6 for k in names],
            name="whole run",
        )
    )
    mb.add_trace(
        go.Bar(
            x=names,
            y=[(runs[k].get("link_bytes_to_target") or 0) / 1e6 for k in names],
            name="until the target",
        )
    )
    mb.update_layout(
        title="WAN traffic: MB on all links (link counters)",
        yaxis_title="MB",
        barmode="group",
        template="plotly_white",
        width=max(700, 90 * len(names) + 200),
        height=500,
    )
    return {"train-curves": curves, "train-bytes": mb}


def build_figures(results: BenchResults) -> dict[str, Any]:
    """Plotly figures: op-time distribution per scheme, and per-link bytes per scheme (MB)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    schemes = results["schemes"]
    n = results["n"]
    times = go.Figure()
    for name, r in schemes.items():
        if r["op_times_s"]:
            times.add_trace(
                go.Box(
                    y=r["op_times_s"],
                    name=name,
                    boxpoints="all",
                    jitter=0.4,
                    pointpos=0,
                    hovertext=[f"op {i}" for i in range(len(r["op_times_s"]))],
                )
            )
    # Each scheme's own median bound (Gloo's is for all n workers, the others' for p).
    marked = [
        (s, percentile([b for b in r["bound_s"] if b is not None], 50))
        for s, r in schemes.items()
        if r["op_times_s"]
    ]
    marked = [(s, b) for s, b in marked if b is not None]
    if marked:
        times.add_trace(
            go.Scatter(
                x=[s for s, _ in marked],
                y=[b for _, b in marked],
                mode="markers",
                name="lower bound (median)",
                marker={
                    "symbol": "line-ew-open",
                    "size": max(12, min(40, 300 // max(1, len(marked)))),
                    "color": "black",
                    "line": {"width": 2},
                },
                hovertemplate="%{x}: median lower bound %{y:.3f} s<extra></extra>",
            )
        )
    times.update_layout(
        title=f"op time per scheme: {results['topology']}, p={results['p']}, "
        f"{results['size_bytes'] / MB:g} MB, {results['ops']} ops (black bar: median lower "
        "bound)",
        yaxis_title="op time (s)",
        yaxis_rangemode="tozero",
        width=max(700, 120 * len(schemes) + 200),
        height=600,
        showlegend=False,
        template="plotly_white",
    )

    names = [s for s, r in schemes.items() if r["link_bytes"]]
    cols = min(4, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / cols))
    links = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=names or ["no data"],
        horizontal_spacing=0.04,
        vertical_spacing=0.1,
    )
    # MB per op on a log colour scale: Gloo moves tens of times more than a p-member group,
    # and a linear scale would flatten every other scheme. Links that moved under 1 kB per op
    # get the floor colour.
    ops = max(1, int(results["ops"]) * pooled_rounds(results))
    floor = -3.0
    ticks = list(range(-3, 4))
    for k, name in enumerate(names):
        mb = np.full((n, n), np.nan)
        for key, b in schemes[name]["link_bytes"].items():
            src, dst = (int(x) for x in key.split("->"))
            mb[src, dst] = b / MB / ops
        with np.errstate(divide="ignore"):
            z = np.where(np.isnan(mb), np.nan, np.maximum(np.log10(mb), floor))
        links.add_trace(
            go.Heatmap(
                z=z,
                customdata=mb,
                x=[f"w{j}" for j in range(n)],
                y=[f"w{i}" for i in range(n)],
                coloraxis="coloraxis",
                hovertemplate="%{y} → %{x}: %{customdata:.3f} MB per op<extra>" + name + "</extra>",
            ),
            row=k // cols + 1,
            col=k % cols + 1,
        )
    links.update_yaxes(autorange="reversed")
    links.update_layout(
        title="measured MB per op on each directed link (row = sender, column = receiver; "
        "log colour scale)",
        coloraxis={
            "colorscale": "Viridis",
            "cmin": floor,
            "colorbar": {
                "title": "MB/op",
                "tickvals": ticks,
                "ticktext": [f"{10.0**t:g}" for t in ticks],
            },
        },
        height=320 * rows + 80,
        width=max(600, 300 * cols + 120),
        template="plotly_white",
    )
    return {"op-times": times, "link-bytes": links}


def write_figures(figures: dict[str, Any], out: Path, html_name: str = "plots.html") -> list[str]:
    """Write all figures into ``plots.html``, and each as ``<name>.png`` when kaleido and a
    Chromium work.

    Returns notes for the user (what was written, or why no PNG). The HTML embeds plotly.js
    once, so it opens offline.
    """
    notes: list[str] = []
    parts = [
        fig.to_html(full_html=False, include_plotlyjs=(k == 0))
        for k, fig in enumerate(figures.values())
    ]
    html = out / html_name
    html.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>lab.bench</title>"
        "</head><body>" + "\n".join(parts) + "</body></html>"
    )
    notes.append(f"plots: {html}")
    # kaleido 1.x drives a Chromium through choreographer; point it at Debian's.
    if "BROWSER_PATH" not in os.environ and Path("/usr/bin/chromium").exists():
        os.environ["BROWSER_PATH"] = "/usr/bin/chromium"
    try:
        for name, fig in figures.items():
            fig.write_image(out / f"{name}.png", scale=2)
        notes.append(f"PNG: {', '.join(str(out / f'{n}.png') for n in figures)}")
    except Exception as exc:  # kaleido missing, or no browser it can start: HTML only
        notes.append(f"no PNG (HTML only): {type(exc).__name__}: {str(exc)[:200]}")
    return notes
