"""The compute-utilisation panel's figures: how each worker's wall time splits between
computing and waiting (``crew.control.utilisation``)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures import empty_figure, worker_names

# What each share of a worker's wall time was spent on, and its colour (computing first).
TIME_SHARES = (
    ("compute_s", "computing", "#2ca02c"),
    ("ready_s", "ready, waiting for a group", "#ff7f0e"),
    ("group_s", "reducing in a group", "#1f77b4"),
    ("stalled_s", "stalled (group abandoned)", "#d62728"),
)


def mean_compute_share(shares: pd.DataFrame) -> float | None:
    """The mean over workers of compute ÷ wall time (None without rows)."""
    if shares.empty:
        return None
    wall = shares[[c for c, _, _ in TIME_SHARES]].sum(axis=1)
    return float((shares["compute_s"] / wall.where(wall > 0)).fillna(1.0).mean())


def compute_shares(shares: pd.DataFrame, workers: pd.DataFrame) -> go.Figure:
    """One stacked bar per worker: the shares of its wall time spent computing, waiting to
    be grouped, reducing and stalled."""
    if shares.empty:
        return empty_figure("no compute utilisation recorded (workers report every few seconds)")
    names = worker_names(workers)
    df = shares.sort_values("worker")
    wall = df[[c for c, _, _ in TIME_SHARES]].sum(axis=1).where(lambda w: w > 0)
    x = [names.get(int(w), f"w{int(w)}") for w in df["worker"]]
    fig = go.Figure()
    for col, label, colour in TIME_SHARES:
        fig.add_trace(go.Bar(x=x, y=(df[col] / wall).fillna(0.0), name=label, marker_color=colour))
    fig.update_layout(
        barmode="stack",
        height=300,
        margin=dict(l=10, r=10, t=10, b=10),
        yaxis=dict(title="share of wall time", tickformat=".0%", range=[0, 1]),
        legend=dict(orientation="h"),
    )
    return fig
