"""The dashboard's queries read index ranges, never a whole growing table: a week-long run holds
millions of groups, memberships and worker states, and every panel must paint as fast as on a
new run (python -m lab.studies.dashtime measures it). Checked with SQLite's own query plans."""

from __future__ import annotations

import math
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from test_dashboard_figures import make_run

from crew.runtime import rundb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboard"))
import figures  # noqa: E402
import queries  # noqa: E402  (the dashboard's modules import each other by bare name)

# Tables a long run grows without bound (retention folds only the time series).
GROWING = ("groups", "group_members", "worker_states")


def _plans(db: Path, call: Any) -> list[str]:
    """The query plan of every statement ``call(conn)`` runs through ``queries._frame``."""
    seen: list[tuple[str, tuple[Any, ...]]] = []
    original = queries._frame

    def recording(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...], columns: list[str]):
        seen.append((sql, params))
        return original(conn, sql, params, columns)

    conn = rundb.connect(db, readonly=True)
    try:
        queries._frame = recording
        call(conn)
        return [
            " | ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
            for sql, params in seen
        ]
    finally:
        queries._frame = original
        conn.close()


@pytest.mark.parametrize(
    "name",
    ["groups", "completed_memberships", "completed_rounds", "worker_status", "worker_status_now"],
)
def test_panel_queries_never_scan_a_growing_table(tmp_path: Path, name: str) -> None:
    db = make_run(tmp_path)
    t = time.time()
    calls = {
        "groups": lambda c: queries.groups(c, t - 120.0, t),
        "completed_memberships": lambda c: queries.completed_memberships(c, t),
        "completed_rounds": lambda c: queries.completed_rounds(c, t - 30.0, t),
        "worker_status": lambda c: queries.worker_status(c, t),
        "worker_status_now": lambda c: queries.worker_status(c, None),
    }
    plans = _plans(db, calls[name])
    assert plans
    for plan in plans:
        scans = [
            step
            for step in plan.split(" | ")
            if step.startswith("SCAN") and any(table in step.split()[1:2] for table in GROWING)
        ]
        # "SCAN g" is how SQLite names a full pass over an aliased table.
        aliased = [s for s in plan.split(" | ") if s in ("SCAN g", "SCAN s", "SCAN m")]
        assert not scans and not aliased, plan
        if name.startswith("completed_"):  # every completed group ever: a scan by another name
            assert "groups_status" not in plan, plan


def _week_of_iterations(tmp_path: Path, *, lm: bool = False) -> tuple[Path, pd.DataFrame]:
    """A run database holding two workers' iterations over a week, one row a minute, every
    tenth an evaluation; and the same rows as a frame."""
    t = np.arange(0.0, 7 * 86400.0, 60.0)
    frames = []
    for w in (0, 1):
        evaluated = np.arange(len(t)) % 10 == 0
        frames.append(
            pd.DataFrame(
                {
                    "t": t + w,
                    "worker": w,
                    "iteration": np.arange(len(t)),
                    "loss": np.where(evaluated & lm, 9.0, 2.0 + w + t / 1e6),
                    "accuracy": np.where(evaluated, 0.5 + w / 10, np.nan),
                }  # fmt: skip
            )
        )
    rows = pd.concat(frames, ignore_index=True)
    db = rundb.RunDB(tmp_path / "lab.db")
    try:
        db.executemany(
            "INSERT INTO workers (id, name, cloud, address) VALUES (?, ?, ?, ?)",
            [(0, "w0", "a", "x"), (1, "w1", "a", "y")],
        )
        db.add_iterations(
            rundb.IterationRow(*(None if v != v else v for v in r))
            for r in rows.itertuples(index=False)
        )
    finally:
        db.close()
    return tmp_path / "lab.db", rows


def test_iteration_bins_are_the_bin_means_of_the_rows(tmp_path: Path) -> None:
    db, rows = _week_of_iterations(tmp_path)
    span = 7 * 86400.0
    bin_s = figures.curve_bin_s(span)
    assert bin_s > figures.curve_bin_s(0.0)  # a week is binned
    conn = rundb.connect(db, readonly=True)
    try:
        got = queries.iteration_bins(conn, 0.0, -1.0, span, bin_s)
    finally:
        conn.close()
    want = (
        rows.assign(b=(rows["t"] // bin_s).astype(int))
        .groupby(["worker", "b"], as_index=False)
        .agg(
            t=("t", "mean"),
            iteration=("iteration", "max"),
            loss=("loss", "mean"),
            accuracy=("accuracy", "mean"),
        )
    )
    assert len(got) == len(want) <= 2 * figures.MAX_CURVE_POINTS
    got = got.sort_values(["worker", "t"]).reset_index(drop=True)
    want = want.sort_values(["worker", "t"]).reset_index(drop=True)
    assert np.allclose(got["t"], want["t"]) and np.allclose(got["loss"], want["loss"])
    assert got["iteration"].tolist() == want["iteration"].tolist()
    # A bin without an evaluation has no accuracy; one with them, their mean.
    assert np.allclose(got["accuracy"], want["accuracy"], equal_nan=True)


def test_an_lm_runs_bins_keep_evaluations_apart(tmp_path: Path) -> None:
    db, rows = _week_of_iterations(tmp_path, lm=True)
    conn = rundb.connect(db, readonly=True)
    try:
        bins = queries.iteration_bins(conn, 0.0, -1.0, 7 * 86400.0, 3600.0, split_evaluations=True)
        latest = queries.latest_evaluations(conn, 7 * 86400.0)
    finally:
        conn.close()
    evaluated = bins[bins["accuracy"].notna()]
    assert (evaluated["loss"] == 9.0).all()  # held-out loss, not mixed with training loss
    assert (bins.loc[bins["accuracy"].isna(), "loss"] < 9.0).all()
    last = rows[rows["accuracy"].notna()].groupby("worker")["t"].max()
    assert latest["worker"].tolist() == [0, 1]
    assert latest["t"].tolist() == last.tolist()
    assert figures.lm_quality(latest) == pytest.approx((9.0, math.exp(9.0)))


def test_the_samples_span_is_read_from_the_ends_of_the_time_index(tmp_path: Path) -> None:
    db = make_run(tmp_path)
    conn = rundb.connect(db, readonly=True)
    try:
        first, last = queries.data_span(conn)
        assert (first, last) == tuple(
            conn.execute("SELECT MIN(t), MAX(t) FROM link_samples").fetchone()
        )
        plan = [str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + _span_sql(conn))]
    finally:
        conn.close()
    assert not any(step.startswith("SCAN link_samples") for step in plan), plan


def _span_sql(conn: sqlite3.Connection) -> str:
    """The statement ``queries.data_span`` runs."""
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        queries.data_span(conn)
    finally:
        conn.set_trace_callback(None)
    return seen[-1]
