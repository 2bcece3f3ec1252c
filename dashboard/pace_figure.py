"""The pace panel's figure: completed groups per 10 s window, with the faults and repairs
marked where they happened (``lab.report.pace``'s figures)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from dashboard.figures import empty_figure

PACE_WINDOW_S = 10.0  # lab.report.pace.WINDOW_S: pace is counted in 10 s windows
FAULT_COLOUR = "rgb(215,25,28)"
REPAIR_COLOUR = "rgb(44,160,44)"


def pace_chart(
    ends: Sequence[float],
    faults: Sequence[tuple[float, str]],
    repairs: Sequence[tuple[float, str]],
    baseline: float | None,
    t0: float,
    asof: float,
) -> go.Figure:
    """Completed groups per 10 s window over the run, with the applied faults (red, dashed)
    and repairs (green, dotted) marked where they happened, and the pre-fault rate with its
    20% and 80% levels when there is one (``lab.report.pace``'s figures).

    Windows start at ``t0``; the window still running is left out."""
    if not len(ends):
        return empty_figure("no completed groups yet")
    full = int((asof - t0) // PACE_WINDOW_S)
    rel = np.asarray(ends, dtype=float) - t0
    counts = np.bincount(
        np.clip((rel // PACE_WINDOW_S).astype(int), 0, None), minlength=max(full, 1)
    )[:full]
    fig = go.Figure(
        go.Bar(
            x=np.arange(full) * PACE_WINDOW_S + PACE_WINDOW_S / 2,
            y=counts,
            width=PACE_WINDOW_S * 0.9,
            name=f"groups / {PACE_WINDOW_S:g} s",
            marker_color="rgb(49,130,189)",
            hovertemplate="t=%{x:.0f} s: %{y} groups<extra></extra>",
        )
    )
    if baseline is not None:
        for share, dash in ((1.0, "solid"), (0.8, "dash"), (0.2, "dot")):
            fig.add_hline(
                y=baseline * share,
                line=dict(color="grey", dash=dash, width=1),
                annotation_text=f"{share:.0%} of pre-fault" if share < 1 else "pre-fault",
                annotation_position="top left",
            )
    lines: list[dict[str, Any]] = []
    for marks, colour, dash, name in (
        (faults, FAULT_COLOUR, "dash", "fault"),
        (repairs, REPAIR_COLOUR, "dot", "repair"),
    ):
        xs = [t - t0 for t, _ in marks]
        # One layout update for all the lines: add_vline per mark costs ~25 ms each, and an
        # hour of a faulty run holds hundreds of marks.
        lines += [
            dict(
                type="line",
                xref="x",
                yref="paper",
                x0=x,
                x1=x,
                y0=0,
                y1=1,
                line=dict(color=colour, dash=dash, width=1),
            )  # fmt: skip
            for x in xs
        ]
        # Invisible points carry the hover text and the legend entry of the markers.
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[0.0] * len(xs),
                mode="markers",
                marker=dict(color=colour, symbol="triangle-up", size=9),
                name=name,
                text=[kind for _, kind in marks],
                hovertemplate="%{text} at t=%{x:.1f} s<extra></extra>",
            )
        )
    fig.update_layout(
        height=300,
        margin=dict(l=10, r=10, t=10, b=10),
        xaxis_title="t (s)",
        yaxis_title=f"groups / {PACE_WINDOW_S:g} s",
        showlegend=True,
        shapes=[*fig.layout.shapes, *lines],
    )
    return fig
