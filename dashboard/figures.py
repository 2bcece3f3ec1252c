"""Figure builders: pandas in, plotly out, no Streamlit and no SQL.

Each builder takes the frames ``dashboard.queries`` returns (or small dicts) and returns a
``plotly.graph_objects.Figure``, so it can be tested on hand-made data. Times on every x axis are
seconds since the run started (``t0``). Utilisation is a fraction (0.9 = 90 %) everywhere in the
data and shown as a percentage.

Colour convention: one colour scale, ``UTIL_COLORSCALE``, from cool (idle) to hot (saturated),
used by the network map, the heat map and the colour bar alike; a link that is down is drawn
grey and dashed with an ✕ at its middle, whatever its counters say.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly import colors as px_colors
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from crew.runtime.rundb import GroupStatus, WorkerState

UTIL_COLORSCALE: list[list[Any]] = [
    [0.0, "rgb(49,130,189)"],  # idle: blue
    [0.5, "rgb(254,224,139)"],
    [0.75, "rgb(253,141,60)"],
    [1.0, "rgb(215,25,28)"],  # saturated: red, the "hot" end
]
DEAD_COLOUR = "rgb(140,140,140)"
STATUS_COLOURS = {
    GroupStatus.COMPLETED.value: "rgb(44,160,44)",
    GroupStatus.OPEN.value: "rgb(31,119,180)",
    GroupStatus.ABANDONED.value: "red",
}
CLOUD_COLOURS = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
]
WORKER_COLOURS = px_colors.qualitative.Plotly
OVERALL = "overall"
MAP_MAX_LINKS = 120  # beyond this a network map draws only the busiest links (and down ones)
MAP_MAX_CLOUD_NAMES = 16  # beyond this many clouds their names would overlap
HEATMAP_TEXT_MAX_N = 16  # beyond this many workers heat-map cells carry no text


def util_colour(util: float) -> str:
    """The colour of a utilisation fraction; values outside [0, 1] are clamped, NaN is idle."""
    u = 0.0 if util is None or not math.isfinite(util) else min(max(util, 0.0), 1.0)
    return sample_colorscale(UTIL_COLORSCALE, [u])[0]


def worker_colour(worker: int) -> str:
    """A worker's colour, the same in every per-worker chart."""
    return WORKER_COLOURS[worker % len(WORKER_COLOURS)]


def link_label(src: int, dst: int) -> str:
    return f"{src}→{dst}"


def worker_names(workers: pd.DataFrame) -> dict[int, str]:
    return {int(w): str(nm) for w, nm in zip(workers["id"], workers["name"], strict=True)}


def empty_figure(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=200, margin=dict(l=10, r=10, t=10, b=10))
    return fig


# -- link data preparation -------------------------------------------------------------------------


def link_view(links: pd.DataFrame, state: pd.DataFrame, latest: pd.DataFrame) -> pd.DataFrame:
    """Every configured link with its current rate, liveness, traffic and utilisation.

    ``links``: configured (src, dst, rate_mbit); ``state``: newest link_state per link (src, dst,
    rate_mbit, up); ``latest``: newest sample per link (src, dst, mbit). Utilisation is the latest
    rate over the current rate (the newest link_state's, else the configured one); NaN when that
    rate is not positive. A link with no recent sample carries 0 Mbit/s. ``delay_ms`` is the
    configured one-way delay (0 where ``links`` has none).
    """
    keep = ["src", "dst", "rate_mbit"] + (["delay_ms"] if "delay_ms" in links else [])
    view = links[keep].rename(columns={"rate_mbit": "configured_mbit"})
    if "delay_ms" not in view:
        view["delay_ms"] = 0.0
    view["delay_ms"] = view["delay_ms"].fillna(0.0).astype(float)
    st = state[["src", "dst", "rate_mbit", "up"]].rename(columns={"rate_mbit": "state_mbit"})
    view = view.merge(st, on=["src", "dst"], how="left")
    view = view.merge(latest[["src", "dst", "mbit"]], on=["src", "dst"], how="left")
    view["rate_mbit"] = view["state_mbit"].fillna(view["configured_mbit"]).astype(float)
    view["up"] = view["up"].fillna(1).astype(int).astype(bool)
    view["mbit"] = view["mbit"].fillna(0.0).astype(float)
    rate = view["rate_mbit"].where(view["rate_mbit"] > 0)
    view["util"] = view["mbit"] / rate
    view["label"] = [link_label(s, d) for s, d in zip(view["src"], view["dst"], strict=True)]
    return view.drop(columns=["state_mbit"]).reset_index(drop=True)


def utilisation_series(
    samples: pd.DataFrame, links: pd.DataFrame, history: pd.DataFrame
) -> pd.DataFrame:
    """Per-sample utilisation, each sample divided by the link's rate *at that time*.

    ``history`` is every link_state row (t, src, dst, rate_mbit, up), oldest first; a sample
    before a link's first change uses the configured rate.
    """
    cols = ["t", "src", "dst", "mbit", "rate_mbit", "util", "label"]
    if samples.empty:
        return pd.DataFrame(columns=cols)
    s = samples.sort_values("t", kind="stable").copy()
    s["t"] = s["t"].astype(float)
    if not history.empty:
        h = history[["t", "src", "dst", "rate_mbit"]].rename(columns={"rate_mbit": "state_mbit"})
        h = h.sort_values("t", kind="stable").astype({"t": float})
        s = pd.merge_asof(s, h, on="t", by=["src", "dst"], direction="backward")
    else:
        s["state_mbit"] = np.nan
    cfg = links[["src", "dst", "rate_mbit"]].rename(columns={"rate_mbit": "configured_mbit"})
    s = s.merge(cfg, on=["src", "dst"], how="left")
    s["rate_mbit"] = s["state_mbit"].fillna(s["configured_mbit"]).astype(float)
    s["util"] = s["mbit"] / s["rate_mbit"].where(s["rate_mbit"] > 0)
    s["label"] = [link_label(a, b) for a, b in zip(s["src"], s["dst"], strict=True)]
    return s[cols].reset_index(drop=True)


def busiest_links(series: pd.DataFrame, k: int) -> list[str]:
    """Labels of the ``k`` links with the highest mean utilisation in ``series``."""
    if series.empty:
        return []
    mean = series.groupby("label")["util"].mean().fillna(0.0)
    return list(mean.sort_values(ascending=False, kind="stable").index[:k])


# -- the network map -------------------------------------------------------------------------------


def node_positions(workers: pd.DataFrame) -> dict[int, tuple[float, float]]:
    """Workers on the unit circle, clouds contiguous, one empty slot between clouds.

    Cloud order is the order of each cloud's lowest worker id, so the picture is stable.
    """
    order = workers.sort_values("id")
    clouds = list(dict.fromkeys(order["cloud"]))
    slots: list[int | None] = []
    for c in clouds:
        slots.extend(int(w) for w in order.loc[order["cloud"] == c, "id"])
        if len(clouds) > 1:
            slots.append(None)
    pos = {}
    for k, w in enumerate(slots):
        if w is not None:
            a = math.pi / 2 - 2 * math.pi * k / len(slots)
            pos[w] = (math.cos(a), math.sin(a))
    return pos


def _curve(
    p: tuple[float, float], q: tuple[float, float], bend: float, steps: int = 16
) -> tuple[np.ndarray, np.ndarray]:
    """A quadratic Bézier from p to q bowed to the right of the direction p→q.

    Bowing to the right means i→j and j→i bow to opposite sides and never overlap.
    """
    (x0, y0), (x1, y1) = p, q
    dx, dy = x1 - x0, y1 - y0
    # (dy, -dx) is the right-hand normal, scaled with the chord so long links bow as much.
    cx = (x0 + x1) / 2 + bend * dy
    cy = (y0 + y1) / 2 - bend * dx
    s = np.linspace(0.0, 1.0, steps)
    xs = (1 - s) ** 2 * x0 + 2 * (1 - s) * s * cx + s**2 * x1
    ys = (1 - s) ** 2 * y0 + 2 * (1 - s) * s * cy + s**2 * y1
    return xs, ys


def map_links(view: pd.DataFrame, limit: int = MAP_MAX_LINKS) -> pd.DataFrame:
    """The links a network map draws: all of them up to ``limit``, else the ``limit`` busiest
    (by utilisation now) plus every link that is down, so a 60-worker mesh (3540 links)
    stays readable and still shows every fault."""
    if len(view) <= limit:
        return view
    util = view["util"].fillna(-1.0)
    busiest = view.loc[util.sort_values(ascending=False).index[:limit]]
    down = view[~view["up"].astype(bool)]
    return pd.concat([busiest, down]).drop_duplicates(subset=["src", "dst"])


def network_map(
    workers: pd.DataFrame,
    view: pd.DataFrame,
    *,
    worker_state: Mapping[int, str] | None = None,
    show_labels: bool | None = None,
) -> go.Figure:
    """Workers grouped by cloud and the directed links coloured by their utilisation.

    One trace per link (name ``"i→j"``, ``meta`` = {src, dst, util, up, delay_ms}, the delay
    also in the label and hover text when > 0); a link that is down is
    dashed grey with an ✕ at its middle. Then one trace of worker nodes and an invisible trace
    that carries the colour bar. ``show_labels`` writes the percentage at each link's middle
    (default: when there are at most 30 links, beyond which the labels overlap). Beyond
    ``MAP_MAX_LINKS`` links only the busiest and the down ones are drawn (``map_links``), and
    the title says so; nodes shrink and cloud names are left out when there are many.
    """
    if workers.empty:
        return empty_figure("no workers yet")
    total_links = len(view)
    view = map_links(view)
    pos = node_positions(workers)
    names = worker_names(workers)
    worker_state = worker_state or {}
    if show_labels is None:
        show_labels = len(view) <= 30
    # Traces are collected and added at once: Figure.add_trace re-validates every trace already
    # in the figure, which made a 56-link map cost half a second per refresh.
    traces: list[go.Scatter] = []
    mid = 9  # the point of the 16-point curve just past the middle carries arrow and label
    for row in view.itertuples(index=False):
        s, d = int(row.src), int(row.dst)
        if s not in pos or d not in pos:
            continue
        xs, ys = _curve(pos[s], pos[d], bend=0.12)
        up = bool(row.up)
        util = float(row.util) if pd.notna(row.util) else float("nan")
        width = 2 + 4 * (0.0 if math.isnan(util) else min(max(util, 0.0), 1.0)) if up else 2
        pct = "n/a" if math.isnan(util) else f"{util * 100:.0f}%"
        delay = float(getattr(row, "delay_ms", 0.0) or 0.0)
        colour = util_colour(util) if up else DEAD_COLOUR
        hover = (
            f"{names.get(s, s)} → {names.get(d, d)}<br>"
            f"now {row.mbit:.1f} Mbit/s of {row.rate_mbit:g} Mbit/s ({pct})<br>"
            f"configured {row.configured_mbit:g} Mbit/s"
            + (f"<br>one-way delay {delay:g} ms" if delay > 0 else "")
            + ("" if up else "<br><b>DOWN</b>")
        )
        sizes = [0] * len(xs)
        sizes[mid] = 11 if up else 14
        text = [""] * len(xs)
        if show_labels:
            # The delay rides on the label: on a WAN map latency matters as much as the rate.
            text[mid] = (pct + (f" · {delay:g} ms" if delay > 0 else "")) if up else "✕"
        traces.append(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines+markers+text" if show_labels else "lines+markers",
                name=link_label(s, d),
                meta={"src": s, "dst": d, "util": util, "up": up, "delay_ms": delay},
                line=dict(
                    color=colour,
                    width=width,
                    dash="solid" if up else "dash",
                ),
                marker=dict(
                    size=sizes,
                    color=colour,
                    symbol="arrow" if up else "x",
                    angleref="previous",
                ),
                text=text,
                textposition="top center",
                textfont=dict(size=10),
                hovertext=[hover] * len(xs),
                hoverinfo="text",
                showlegend=False,
            )
        )
    fig = go.Figure(data=traces)
    ids = sorted(pos)
    clouds = dict(zip(workers["id"].astype(int), workers["cloud"], strict=True))
    cloud_order = list(dict.fromkeys(clouds[w] for w in ids))
    node_colours = [
        DEAD_COLOUR
        if worker_state.get(w) == WorkerState.DEAD.value
        else CLOUD_COLOURS[cloud_order.index(clouds[w]) % len(CLOUD_COLOURS)]
        for w in ids
    ]
    many = len(ids) > 16
    fig.add_trace(
        go.Scatter(
            x=[pos[w][0] for w in ids],
            y=[pos[w][1] for w in ids],
            mode="markers+text",
            name="workers",
            marker=dict(
                size=max(10, min(34, int(600 / max(len(ids), 1)))),
                color=node_colours,
                line=dict(color="white", width=1 if many else 2),
            ),
            text=[str(w) for w in ids],
            textfont=dict(color="white", size=8 if many else 13),
            hovertext=[
                f"{names[w]} (worker {w})<br>cloud {clouds[w]}<br>state {worker_state.get(w, '?')}"
                for w in ids
            ],
            hoverinfo="text",
            showlegend=False,
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[None],
            y=[None],
            mode="markers",
            name="utilisation scale",
            marker=dict(
                colorscale=UTIL_COLORSCALE,
                cmin=0,
                cmax=100,
                color=[0],
                showscale=True,
                colorbar=dict(title="util %", thickness=12),
            ),
            hoverinfo="skip",
            showlegend=False,
        )
    )
    for c in cloud_order if len(cloud_order) <= MAP_MAX_CLOUD_NAMES else ():
        members = [w for w in ids if clouds[w] == c]
        ang = math.atan2(
            sum(pos[w][1] for w in members) / len(members),
            sum(pos[w][0] for w in members) / len(members),
        )
        fig.add_annotation(
            x=1.32 * math.cos(ang), y=1.32 * math.sin(ang), text=f"<b>{c}</b>", showarrow=False
        )
    fig.update_xaxes(visible=False, range=[-1.55, 1.55])
    fig.update_yaxes(visible=False, range=[-1.45, 1.45], scaleanchor="x")
    fig.update_layout(height=520, margin=dict(l=10, r=10, t=10, b=10), hovermode="closest")
    if len(view) < total_links:
        fig.update_layout(
            title=dict(
                text=f"busiest {len(view)} of {total_links} links", font=dict(size=12), x=0.01
            ),
            margin=dict(l=10, r=10, t=30, b=10),
        )
    return fig


def link_traces(fig: go.Figure) -> list[go.Scatter]:
    """The per-link traces of a ``network_map`` figure (those whose meta names a link)."""
    return [t for t in fig.data if isinstance(t.meta, dict) and "src" in t.meta]


# -- utilisation over time and now ----------------------------------------------------------------


def utilisation_timeseries(
    series: pd.DataFrame, selected: Sequence[str], t0: float, *, rates: bool = False
) -> go.Figure:
    """One line per selected link: utilisation % over time, Mbit/s in the hover; with
    ``rates``, its measured Mbit/s (solid) against its configured rate (dotted), which moves
    when the link follows a rate trace or a fault changes it."""
    if series.empty or not selected:
        return empty_figure("no link samples in this window")
    fig = go.Figure()
    for k, label in enumerate(selected):
        s = series[series["label"] == label]
        if s.empty:
            continue
        if rates:
            colour = WORKER_COLOURS[k % len(WORKER_COLOURS)]
            for col, dash, what in (
                ("mbit", "solid", "measured"),
                ("rate_mbit", "dot", "configured"),
            ):
                fig.add_trace(
                    go.Scatter(
                        x=s["t"] - t0,
                        y=s[col],
                        mode="lines",
                        name=f"{label} {what}",
                        legendgroup=label,
                        line=dict(
                            color=colour, dash=dash, shape="hv" if col == "rate_mbit" else None
                        ),
                        hovertemplate=f"{label} {what}: %{{y:.1f}} Mbit/s<extra></extra>",
                    )
                )
            continue
        fig.add_trace(
            go.Scatter(
                x=s["t"] - t0,
                y=s["util"] * 100,
                mode="lines",
                name=label,
                customdata=np.stack([s["mbit"], s["rate_mbit"]], axis=-1),
                hovertemplate=label
                + ": %{y:.0f}%<br>%{customdata[0]:.1f} of %{customdata[1]:g} Mbit/s"
                + "<extra></extra>",
            )
        )
    fig.update_layout(
        height=320,
        margin=dict(l=10, r=10, t=10, b=10),
        xaxis_title="t (s)",
        yaxis_title="Mbit/s" if rates else "utilisation %",
        legend_title="link",
    )
    fig.update_yaxes(rangemode="tozero")
    return fig


def utilisation_matrix(view: pd.DataFrame, n: int) -> np.ndarray:
    """An n×n array of utilisation fractions; NaN on the diagonal and for missing links."""
    m = np.full((n, n), np.nan)
    for row in view.itertuples(index=False):
        s, d = int(row.src), int(row.dst)
        if 0 <= s < n and 0 <= d < n and s != d:
            m[s, d] = row.util
    return m


def utilisation_heatmap(view: pd.DataFrame, workers: pd.DataFrame) -> go.Figure:
    """The n×n utilisation matrix, rows = sender, columns = receiver; a down link reads "down"."""
    n = len(workers)
    m = utilisation_matrix(view, n) * 100
    names = [worker_names(workers).get(i, str(i)) for i in range(n)]
    big = n > HEATMAP_TEXT_MAX_N  # cells too small for text: colour and hover only
    text = [["" if np.isnan(v) or big else f"{v:.0f}%" for v in row] for row in m]
    for row in view.itertuples(index=False):
        if not row.up and 0 <= row.src < n and 0 <= row.dst < n:
            text[int(row.src)][int(row.dst)] = "down"
    fig = go.Figure(
        go.Heatmap(
            z=m,
            x=names,
            y=names,
            text=text,
            texttemplate="%{text}",
            colorscale=UTIL_COLORSCALE,
            zmin=0,
            zmax=100,
            colorbar=dict(title="util %", thickness=12),
            hovertemplate="%{y} → %{x}: %{z:.0f}% %{text}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed", title="sender")
    fig.update_xaxes(title="receiver", side="top")
    if big:
        fig.update_xaxes(tickfont=dict(size=8))
        fig.update_yaxes(tickfont=dict(size=8))
    fig.update_layout(height=min(120 + 40 * n, 620), margin=dict(l=10, r=10, t=40, b=10))
    return fig


# -- groups --------------------------------------------------------------------------------------


def group_label(gid: int, members: Sequence[int]) -> str:
    return f"g{gid} [{','.join(str(m) for m in members)}]"


def group_timeline(groups: pd.DataFrame, t0: float, asof: float) -> go.Figure:
    """One horizontal bar per group from formation to end, coloured by status.

    An open group's bar runs to ``asof``; an abandoned one is red and hatched with its reason in
    the hover. One trace per status present, so ``sum(len(trace.y))`` is the number of groups.
    """
    if groups.empty:
        return empty_figure("no groups in this window")
    fig = go.Figure()
    g = groups.sort_values("id")
    order = [group_label(int(i), m) for i, m in zip(g["id"], g["members"], strict=True)]
    for status in (GroupStatus.COMPLETED, GroupStatus.OPEN, GroupStatus.ABANDONED):
        s = g[g["status"] == status]
        if s.empty:
            continue
        start = s["formed_at"].astype(float)
        end = s["ended_at"].astype(float).fillna(asof)
        fig.add_trace(
            go.Bar(
                orientation="h",
                y=[group_label(int(i), m) for i, m in zip(s["id"], s["members"], strict=True)],
                base=start - t0,
                x=(end - start).clip(lower=0.05),
                name=status.value,
                marker=dict(
                    color=STATUS_COLOURS[status],
                    pattern_shape="x" if status == GroupStatus.ABANDONED else "",
                ),
                customdata=np.stack(
                    [s["scheme"].astype(str), s["reason"].fillna("").astype(str)], axis=-1
                ),
                hovertemplate="%{y} %{customdata[0]}<br>%{base:.1f} s → +%{x:.2f} s"
                "<br>%{customdata[1]}<extra>" + status + "</extra>",
            )
        )
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], title=None)
    fig.update_layout(
        barmode="overlay",
        height=min(900, 120 + 18 * len(g)),
        margin=dict(l=10, r=10, t=10, b=10),
        xaxis_title="t (s)",
    )
    return fig


def rounds_and_staleness(
    rounds: pd.DataFrame, workers: pd.DataFrame, title: str = "rounds (completed groups)"
) -> go.Figure:
    """Completed rounds per worker (left) and mean / max staleness of its updates (right);
    ``rounds`` as ``queries.completed_rounds`` reads them."""
    ids = [int(w) for w in workers.sort_values("id")["id"]]
    names = worker_names(workers)
    x = [names[w] for w in ids]
    per = rounds.groupby("worker")
    count = per["rounds"].sum().reindex(ids, fill_value=0)
    mean_s = (per["staleness_sum"].sum() / per["rounds"].sum()).reindex(ids)
    max_s = per["staleness_max"].max().reindex(ids)
    fig = make_subplots(rows=1, cols=2, subplot_titles=(title, "staleness"))
    fig.add_trace(go.Bar(x=x, y=count.values, name="rounds", marker_color="#1f77b4"), 1, 1)
    fig.add_trace(go.Bar(x=x, y=mean_s.values, name="mean staleness", marker_color="#ff7f0e"), 1, 2)
    fig.add_trace(go.Bar(x=x, y=max_s.values, name="max staleness", marker_color="#d62728"), 1, 2)
    fig.update_layout(height=300, margin=dict(l=10, r=10, t=30, b=10), barmode="group")
    return fig


# -- plans -----------------------------------------------------------------------------------------


def plan_elems(plan: str | Mapping[str, Any] | None, n: int) -> list[int] | None:
    """Block size (elements) per worker from a plan's JSON; None when it has no ``elems``.

    ``elems`` may be a list indexed by worker or a mapping worker → size (JSON keys are text).
    """
    if plan is None or (isinstance(plan, float) and math.isnan(plan)):
        return None
    doc = json.loads(plan) if isinstance(plan, str) else plan
    elems = doc.get("elems") if isinstance(doc, Mapping) else None
    if isinstance(elems, list):
        return [int(e) for e in elems[:n]] + [0] * max(0, n - len(elems))
    if isinstance(elems, Mapping):
        return [int(elems.get(str(i), elems.get(i, 0))) for i in range(n)]  # type: ignore[call-overload]
    return None


def plan_blocks(group: Mapping[str, Any], workers: pd.DataFrame) -> go.Figure:
    """Block size per worker in one group's plan; members and helpers in different colours.

    Helpers (non-members that aggregate a block) are CREW's point: they show at a glance.
    """
    n = len(workers)
    elems = plan_elems(group.get("plan"), n)
    if elems is None:
        return empty_figure("this plan has no block sizes")
    names = worker_names(workers)
    members = set(int(m) for m in group.get("members", []))
    fig = go.Figure(
        go.Bar(
            x=[names.get(i, str(i)) for i in range(n)],
            y=elems,
            marker_color=["#1f77b4" if i in members else "#ff7f0e" for i in range(n)],
            hovertemplate="%{x}: %{y} elements<extra></extra>",
        )
    )
    fig.update_layout(
        height=280,
        margin=dict(l=10, r=10, t=30, b=10),
        title=dict(
            text=f"{group_label(int(group['id']), sorted(members))}: blue = member,"
            " orange = helper",
            font=dict(size=13),
        ),
        yaxis_title="block (elements)",
    )
    return fig


def plan_times(plans: pd.DataFrame) -> go.Figure:
    """Predicted, measured and lower-bound time per group (newest plans), in seconds.

    Measured = ended_at − started_at (or formed_at) for groups that completed; a missing
    prediction or bound (before the CREW planner) is simply absent from its series.
    """
    if plans.empty:
        return empty_figure("no plans yet")
    p = plans.sort_values("id")
    x = [f"g{int(i)}" for i in p["id"]]
    begin = p["started_at"].fillna(p["formed_at"]).astype(float)
    measured = (p["ended_at"].astype(float) - begin).where(
        p["status"] == GroupStatus.COMPLETED.value
    )
    fig = go.Figure()
    for name, y, colour in (
        ("predicted", p["predicted_s"], "#1f77b4"),
        ("measured", measured, "#2ca02c"),
        ("lower bound", p["bound_s"], "#7f7f7f"),
    ):
        fig.add_trace(go.Bar(x=x, y=y.astype(float), name=name, marker_color=colour))
    fig.update_layout(
        barmode="group", height=300, margin=dict(l=10, r=10, t=10, b=10), yaxis_title="s"
    )
    return fig


# -- training --------------------------------------------------------------------------------------


# Per worker and overall, in the training curves. The chart is half the page wide, under 800
# pixels on the 1600-pixel page: a point per pixel shows every bend, and more only lengthen what
# the browser draws (a week at 2000 a line was 900 kB of figure).
MAX_CURVE_POINTS = 800


def curve_bin_s(span_s: float, bin_s: float = 5.0) -> float:
    """The training curves' bin over ``span_s`` seconds of run: ``bin_s``, or wider so that no
    curve has more than ``MAX_CURVE_POINTS`` points."""
    return max(bin_s, span_s / MAX_CURVE_POINTS)


def training_curves(
    iters: pd.DataFrame,
    workers: pd.DataFrame,
    t0: float,
    *,
    bin_s: float = 5.0,
    workload: str = "mlp",
) -> go.Figure:
    """Loss (top) and held-out accuracy (bottom) per worker and overall.

    "Overall" is the mean over all workers' reports in each ``bin_s`` bin: workers report at
    different rates, so a plain mean over rows would follow the fastest worker.

    ``workload="lm"``: evaluation rows carry the held-out loss (``crew.runtime.worker``), so the
    top shows the training loss of the other rows and the bottom the held-out loss in nats per
    byte (perplexity is its exp, see :func:`lm_quality`).
    """
    if iters.empty:
        return empty_figure("no training progress yet")
    titles = ("loss", "accuracy")
    if workload == "lm":
        evaluated = iters["accuracy"].notna()
        iters = iters.assign(
            loss=iters["loss"].where(~evaluated), accuracy=iters["loss"].where(evaluated)
        )
        titles = ("training loss (nats/byte)", "held-out loss (nats/byte)")
    # A long run's curves are drawn from bin means: a week holds about 200k rows even after
    # retention, more points than a browser draws quickly or a chart can show. Bins just wide
    # enough to fit, so a run a little over the limit keeps its detail.
    span = float(iters["t"].max() - iters["t"].min())
    bin_s = curve_bin_s(span, bin_s)
    if len(iters) > MAX_CURVE_POINTS * max(1, iters["worker"].nunique()):
        fit_s = span / MAX_CURVE_POINTS
        iters = (
            iters.assign(b=(iters["t"] - t0) // fit_s)
            .groupby(["worker", "b"], as_index=False)[["t", "loss", "accuracy"]]
            .mean()
        )
    names = worker_names(workers)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=titles)

    def series(x: Any, y: Any, row: int, name: str, line: dict, mode: str = "lines") -> None:
        # One legend entry per name: the accuracy row follows the loss row's visibility.
        trace = go.Scatter(
            x=x, y=y, mode=mode, name=name, legendgroup=name, showlegend=row == 1, line=line
        )
        fig.add_trace(trace, row, 1)

    for w, s in iters.groupby("worker"):
        name = names.get(int(w), str(w))
        colour = dict(color=worker_colour(int(w)))
        top = s.dropna(subset=["loss"])  # lm: the evaluation rows are in the bottom plot
        series(top["t"] - t0, top["loss"], 1, name, colour)
        acc = s.dropna(subset=["accuracy"])
        if not acc.empty:
            series(acc["t"] - t0, acc["accuracy"], 2, name, colour, "lines+markers")
    binned = iters.assign(bin=((iters["t"] - t0) // bin_s) * bin_s + bin_s / 2)
    per_worker = binned.groupby(["bin", "worker"])[["loss", "accuracy"]].mean()
    overall = per_worker.groupby("bin").mean()
    line = dict(color="black", width=3)
    series(overall.index, overall["loss"], 1, OVERALL, line)
    if overall["accuracy"].notna().any():
        acc = overall["accuracy"].dropna()
        series(acc.index, acc, 2, OVERALL, line)
    fig.update_xaxes(title_text="t (s)", row=2, col=1)
    fig.update_layout(height=520, margin=dict(l=10, r=10, t=30, b=10))
    return fig


def lm_quality(iters: pd.DataFrame) -> tuple[float, float] | None:
    """(held-out loss, perplexity) of an lm run: the mean of each worker's latest evaluation
    row's loss (nats per byte), and its exp; None before any evaluation."""
    evaluated = iters.dropna(subset=["accuracy", "loss"])
    if evaluated.empty:
        return None
    loss = float(evaluated.sort_values("t").groupby("worker")["loss"].last().mean())
    return loss, math.exp(loss)


def rounds_per_minute(
    rounds: pd.DataFrame, workers: pd.DataFrame, t0: float, now: float | None = None
) -> go.Figure:
    """Completed rounds per worker in each minute of the run; ``rounds`` as
    ``queries.completed_rounds`` reads them (minutes since ``t0``).

    With ``now``, the minute still running is scaled to a full minute (a raw count would make
    every line drop at the right edge), or left out while less than 10 s of it has passed."""
    if rounds.empty:
        return empty_figure("no completed groups yet")
    names = worker_names(workers)
    counts = (
        rounds.pivot_table(index="worker", columns="minute", values="rounds", aggfunc="sum")
        .fillna(0)
        .astype(float)
    )
    if now is not None:
        current = int((now - t0) // 60)
        elapsed = (now - t0) - 60 * current
        if current in counts.columns:
            if elapsed < 10.0:
                counts = counts.drop(columns=current)
            else:
                counts[current] = counts[current] * 60.0 / elapsed
    fig = go.Figure()
    for w, row in counts.iterrows():
        fig.add_trace(
            go.Scatter(
                x=row.index,
                y=row.values,
                mode="lines+markers",
                name=names.get(int(w), str(w)),
                line=dict(color=worker_colour(int(w))),
            )
        )
    fig.update_layout(
        height=280,
        margin=dict(l=10, r=10, t=10, b=10),
        xaxis=dict(title="minute", dtick=1),
        yaxis_title="rounds / min",
    )
    return fig
