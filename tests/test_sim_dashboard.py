"""The dashboard on a simulated run: every panel renders, says "simulated", and stays readable
with many workers (busiest links only on the map, no cell text in a large heat map)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from crew.sim.engine import Fault, FaultKind, SimConfig, Simulation
from crew.sim.record import Recorder
from crew.sim.topogen import generate
from dashboard import figures

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("sim") / "r"
    cfg = SimConfig(scheme="crew", p=4, duration_s=12.0, seed=2, size_bytes=20_000_000)
    faults = [Fault(4.0, FaultKind.CUT_LINK, 0, 1)]
    Simulation(generate(24, 2, 2), cfg, faults, Recorder(run)).run()
    return run


def test_every_panel_renders_and_says_simulated(sim_run: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("CREW_LAB_RUN", str(sim_run))
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert {m.label: m.value for m in at.metric}["State"] == "simulated, finished"
    notes = [c.value for c in at.caption if "Simulated run" in c.value]
    assert len(notes) == 8  # one under each panel heading


def _view(n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    workers = pd.DataFrame(
        {"id": range(n), "name": [f"w{i}" for i in range(n)], "cloud": [f"c{i}" for i in range(n)]}
    )
    rng = np.random.default_rng(0)
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    view = pd.DataFrame(
        {
            "src": [a for a, _ in pairs],
            "dst": [b for _, b in pairs],
            "util": rng.uniform(0, 1, len(pairs)),
            "up": [True] * len(pairs),
            "mbit": 1.0,
            "rate_mbit": 100.0,
            "configured_mbit": 100.0,
        }
    )
    view.loc[5, "up"] = False
    view["label"] = [figures.link_label(a, b) for a, b in pairs]
    return workers, view


def test_sixty_worker_map_draws_the_busiest_links_and_every_down_one() -> None:
    workers, view = _view(60)
    drawn = figures.link_traces(figures.network_map(workers, view))
    assert len(drawn) == figures.MAP_MAX_LINKS + 1
    utils = sorted(view["util"], reverse=True)
    assert min(t.meta["util"] for t in drawn if t.meta["up"]) >= utils[figures.MAP_MAX_LINKS - 1]
    assert any(not t.meta["up"] for t in drawn)


def test_large_heatmap_has_no_cell_text_and_a_bounded_height() -> None:
    workers, view = _view(60)
    fig = figures.utilisation_heatmap(view, workers)
    assert all(v in ("", "down") for row in fig.data[0].text for v in row)
    assert fig.layout.height <= 620
