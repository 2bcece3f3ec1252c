"""Figure builders and queries on a realistic three-worker run database.

``make_run`` writes the database the app tests use too: three workers in two clouds, 30 s of
1 Hz link samples, a rate change and a cut, completed / abandoned / open groups with and
without plans, training progress, worker states and events.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from crew.runtime import rundb
from dashboard import figures, queries

RATE = {(0, 1): 1000.0, (1, 0): 1000.0}  # intra-cloud; every other pair is 100 Mbit/s
# Mbit/s each link carries: 0→2 runs at 90 % of 100, 1→0 at 5 % of 1000.
LOAD = {(0, 1): 100.0, (1, 0): 50.0, (0, 2): 90.0, (2, 0): 10.0, (1, 2): 60.0, (2, 1): 45.0}
RATE_CHANGE_AT = -20.0  # 2→1 drops to 50 Mbit/s: 45 Mbit/s is then 90 %
CUT_AT = -10.0  # 1→2 goes down
DURATION = 30


def make_run(run_dir: Path, *, now: float | None = None, live: bool = True) -> Path:
    """Write a realistic run database for a 3-worker run that started 30 s before ``now``."""
    now = time.time() if now is None else now
    t0 = now - DURATION
    db = rundb.RunDB(run_dir / "lab.db")
    try:
        meta: dict[str, object] = {
            "run_id": "test-run",
            "started_at": t0,
            "scheme": "crew",
            "p": 2,
            "topology": "name: three-in-two-clouds\nclouds: {aws: 2, gcp: 1}\n",
            "config": {"model": "mlp"},
            "schemes": ["preduce", "crew"],
            "impairments": ["rate", "loss"],
        }
        if not live:
            meta["ended_at"] = now
        db.set_meta(meta)
        db.executemany(
            "INSERT INTO workers (id, name, cloud, address) VALUES (?, ?, ?, ?)",
            [
                (0, "w0", "aws", "10.9.0.1"),
                (1, "w1", "aws", "10.9.0.2"),
                (2, "w2", "gcp", "10.9.0.3"),
            ],
        )
        db.executemany(
            "INSERT INTO links (src, dst, rate_mbit, intf) VALUES (?, ?, ?, ?)",
            [(s, d, RATE.get((s, d), 100.0), f"w{s}-w{d}") for (s, d) in LOAD],
        )
        samples = []
        for k in range(1, DURATION + 1):
            t = t0 + k
            for (s, d), mbit in LOAD.items():
                if (s, d) == (1, 2) and t > now + CUT_AT:
                    mbit = 0.0
                samples.append((t, s, d, int(mbit * 1e6 / 8 * k), mbit))
        db.executemany(
            "INSERT INTO link_samples (t, src, dst, tx_bytes, mbit) VALUES (?, ?, ?, ?, ?)", samples
        )
        db.executemany(
            "INSERT INTO link_state (t, src, dst, rate_mbit, up, reason) VALUES (?, ?, ?, ?, ?, ?)",
            [
                (now + RATE_CHANGE_AT, 2, 1, 50.0, 1, "set_link"),
                (now + CUT_AT, 1, 2, 100.0, 0, "cut_link"),
            ],
        )
        groups = [
            # id, members, formed, started, ended, status, predicted, bound, plan, reason
            (1, [0, 1], -28, -28, -25, "completed", 2.5, 2.0, {"elems": [400, 300, 300]}, None),
            (2, [1, 2], -20, -20, -18, "abandoned", None, None, None, "worker 2 died"),
            (3, [0, 2], -15, -15, -12, "completed", None, None, None, None),
            (
                4,
                [0, 1],
                -2,
                -2,
                None,
                "open",
                1.5,
                1.0,
                {"elems": {"0": 500, "1": 250, "2": 250}},
                None,
            ),
        ]
        for gid, members, formed, started, ended, status, pred, bound, plan, reason in groups:
            db.execute(
                "INSERT INTO groups (id, scheme, members, weights, formed_at, started_at, ended_at,"
                " status, bytes, predicted_s, bound_s, plan, reason)"
                " VALUES (?, 'crew', ?, ?, ?, ?, ?, ?, 4000, ?, ?, ?, ?)",
                (
                    gid,
                    json.dumps(members),
                    json.dumps([1 / len(members)] * len(members)),
                    now + formed,
                    now + started,
                    None if ended is None else now + ended,
                    status,
                    pred,
                    bound,
                    None if plan is None else json.dumps(plan),
                    reason,
                ),
            )
            db.executemany(
                "INSERT INTO group_members (group_id, worker, iteration, staleness, weight)"
                " VALUES (?, ?, ?, ?, ?)",
                [(gid, w, gid * 3 + w, 1 + (w == 2) * 2, 1 / len(members)) for w in members],
            )
        iters = []
        for w in range(3):
            for k in range(0, DURATION, 2):
                acc = 0.5 + k / 100 if k % 10 == 0 else None
                iters.append((t0 + k + w * 0.3, w, k // 2, 2.0 - k / 30 + w * 0.1, acc))
        db.executemany(
            "INSERT INTO iterations (t, worker, iteration, loss, accuracy) VALUES (?, ?, ?, ?, ?)",
            iters,
        )
        # Cumulative time splits; the newest per worker: shares 0.75, 0.5 and 1.0 (mean 75%).
        db.add_utilisation(
            rundb.UtilisationRow(t0 + dt, w, *split, 1000 * w)
            for dt, w, split in (
                (10, 0, (5.0, 3.0, 2.0, 0.0)),
                (10, 1, (9.0, 1.0, 0.0, 0.0)),
                (25, 0, (18.0, 3.0, 3.0, 0.0)),
                (25, 1, (12.0, 6.0, 4.0, 2.0)),
                (25, 2, (24.0, 0.0, 0.0, 0.0)),
            )
        )
        for w, state, gid in ((0, "reducing", 4), (1, "reducing", 4), (2, "ready", None)):
            db.set_worker_status(w, state, iteration=14, group_id=gid, pid=1000 + w)
        db.event("start", "run started", t=t0)
        db.event("fault", "link 1→2 cut", level="warning", t=now + CUT_AT)
        db.event("group", "group 2 abandoned", level="warning", worker=2, t=now - 18)
    finally:
        db.close()
    return run_dir / "lab.db"


@pytest.fixture
def run_db(tmp_path: Path) -> tuple[Path, float]:
    now = time.time()
    return make_run(tmp_path, now=now), now


@pytest.fixture
def conn(run_db: tuple[Path, float]):
    c = rundb.connect(run_db[0], readonly=True)
    try:
        yield c
    finally:
        c.close()


def _view(conn: sqlite3.Connection, t: float) -> pd.DataFrame:
    return figures.link_view(
        queries.links(conn),
        queries.link_state_asof(conn, t),
        queries.latest_link_samples(conn, t, 5.0),
    )


def _rgb(colour: str) -> tuple[int, ...]:
    return tuple(int(float(v)) for v in colour[colour.index("(") + 1 : -1].split(","))


# -- queries ----------


def test_run_info_reads_meta(conn):
    info = queries.run_info(conn)
    assert (info.run_id, info.topology, info.scheme, info.p, info.n) == (
        "test-run",
        "three-in-two-clouds",
        "crew",
        2,
        3,
    )
    assert info.live and info.started_at is not None


def test_run_info_as_the_lab_writes_it(tmp_path):
    db = rundb.RunDB(tmp_path / "lab.db")
    try:
        db.set_meta(
            {
                "topology": json.dumps({"name": "from-json", "clouds": []}),
                "p": "3",
                "started_at": "1000.5",
                "ended_at": "1010.0",
                "scheme": "preduce",
            }
        )
        conn = rundb.connect(tmp_path / "lab.db", readonly=True)
        info = queries.run_info(conn)
        assert (info.topology, info.p, info.started_at, info.live) == (
            "from-json",
            3,
            1000.5,
            False,
        )
        db.set_meta({"topology_name": "named"})
        assert queries.run_info(conn).topology == "named"
        conn.close()
    finally:
        db.close()


def test_readonly_connection_after_writers_closed(run_db):
    # The WAL side files are gone once the last writer closes; the dashboard must still read.
    c = rundb.connect(run_db[0], readonly=True)
    try:
        assert c.execute("SELECT COUNT(*) FROM workers").fetchone()[0] == 3
        with pytest.raises(sqlite3.OperationalError):
            c.execute("INSERT INTO meta (key, value) VALUES ('x', 'y')")
    finally:
        c.close()


def test_link_view_utilisation_uses_current_rate(conn, run_db):
    view = _view(conn, run_db[1]).set_index("label")
    assert len(view) == 6
    assert view.loc["0→2", "util"] == pytest.approx(0.9)
    assert view.loc["1→0", "util"] == pytest.approx(0.05)
    # 2→1 was reshaped to 50 Mbit/s: its 45 Mbit/s is 90 %, not the 45 % of the configured 100.
    assert view.loc["2→1", "rate_mbit"] == 50.0
    assert view.loc["2→1", "configured_mbit"] == 100.0
    assert view.loc["2→1", "util"] == pytest.approx(0.9)
    assert not view.loc["1→2", "up"] and view.loc["0→2", "up"]


def test_link_view_rewinds_to_asof(conn, run_db):
    view = _view(conn, run_db[1] - 25).set_index("label")
    assert view.loc["1→2", "up"]  # the cut had not happened yet
    assert view.loc["2→1", "rate_mbit"] == 100.0  # nor the reshape


def test_groups_rewound_to_asof(conn, run_db):
    now = run_db[1]
    g = queries.groups(conn, now - 60, now).set_index("id")
    assert list(g.index) == [1, 2, 3, 4]
    assert g.loc[2, "status"] == "abandoned" and g.loc[4, "status"] == "open"
    assert g.loc[1, "members"] == [0, 1]
    early = queries.groups(conn, now - 60, now - 26).set_index("id")
    assert list(early.index) == [1] and early.loc[1, "status"] == "open"
    # A group formed before the window but still open at asof is included.
    assert 1 in queries.groups(conn, now - 27, now - 26)["id"].tolist()


def test_window_cache_reads_only_new_rows(tmp_path):
    db = rundb.RunDB(tmp_path / "lab.db")
    try:
        db.executemany(
            "INSERT INTO link_samples (t, src, dst, tx_bytes, mbit) VALUES (?, 0, 1, 0, ?)",
            [(100.0 + k, float(k)) for k in range(100)],
        )
        conn = rundb.connect(tmp_path / "lab.db", readonly=True)
        cache = queries.link_sample_cache()
        first = cache.read(conn, 120.0, 199.0)
        assert len(first) == 79 and cache.rows_fetched == 79
        db.executemany(
            "INSERT INTO link_samples (t, src, dst, tx_bytes, mbit) VALUES (?, 0, 1, 0, ?)",
            [(200.0 + k, 1.0) for k in range(5)] + [(198.5, 7.0)],  # one late, older row
        )
        second = cache.read(conn, 125.0, 204.0)
        assert cache.rows_fetched < 10  # the overlap, the late row and the 5 new ones
        assert second["t"].tolist() == sorted(second["t"].tolist())
        expected = queries.link_samples(conn, 125.0, 204.0).sort_values("t")
        assert second["t"].tolist() == expected["t"].tolist()
        back = cache.read(conn, 110.0, 150.0)  # a replay slider moved back: refetch
        assert back["t"].tolist() == [110.0 + k for k in range(1, 41)]
        conn.close()
    finally:
        db.close()


def test_events_newest_first_and_commands(conn, run_db):
    ev = queries.events(conn, run_db[1], 10)
    assert ev["kind"].tolist() == ["fault", "group", "start"]
    assert queries.events(conn, run_db[1] - 19, 10)["kind"].tolist() == ["start"]
    assert queries.commands(conn, 5).empty


# -- colours and the network map ----------


def test_util_colour_scale_ends_and_clamping():
    assert _rgb(figures.util_colour(1.0)) == (215, 25, 28)
    assert _rgb(figures.util_colour(0.0)) == (49, 130, 189)
    assert figures.util_colour(1.7) == figures.util_colour(1.0)
    assert figures.util_colour(float("nan")) == figures.util_colour(0.0)
    r, g, b = _rgb(figures.util_colour(0.9))
    assert r > 200 and b < 100  # the hot end


def test_node_positions_group_clouds():
    w = pd.DataFrame(
        {"id": [0, 1, 2, 3], "name": list("abcd"), "cloud": ["x", "y", "x", "y"], "address": ""}
    )
    pos = figures.node_positions(w)
    assert set(pos) == {0, 1, 2, 3}
    assert all(math.isclose(math.hypot(*p), 1.0) for p in pos.values())
    # Same-cloud workers are neighbours: closer to each other than to the other cloud.
    d = {(a, b): math.dist(pos[a], pos[b]) for a in pos for b in pos}
    assert d[0, 2] < d[0, 1] and d[1, 3] < d[1, 2]


def test_network_map_draws_every_link_coloured_by_utilisation(conn, run_db):
    view = _view(conn, run_db[1])
    fig = figures.network_map(queries.workers(conn), view, worker_state={2: "dead"})
    links = {t.name: t for t in figures.link_traces(fig)}
    assert set(links) == {"0→1", "1→0", "0→2", "2→0", "1→2", "2→1"}
    hot, cold = links["0→2"], links["1→0"]
    assert hot.line.color == figures.util_colour(0.9)
    r, _, b = _rgb(hot.line.color)
    assert r > b
    r, _, b = _rgb(cold.line.color)
    assert b > r
    # The two directions of a pair bow to opposite sides.
    assert not np.allclose(links["0→2"].x[::-1], links["2→0"].x)
    dead = links["1→2"]
    assert dead.line.dash == "dash" and dead.line.color == figures.DEAD_COLOUR
    assert dead.meta["up"] is False and "DOWN" in dead.hovertext[0]
    assert "90.0 Mbit/s of 100 Mbit/s (90%)" in hot.hovertext[0]
    nodes = [t for t in fig.data if t.name == "workers"][0]
    assert len(nodes.x) == 3 and nodes.marker.color[2] == figures.DEAD_COLOUR


def test_network_map_survives_a_link_with_no_rate(conn, run_db):
    # A link_state row with rate 0 (a cut recorded as zero rate) leaves utilisation undefined.
    view = _view(conn, run_db[1])
    view.loc[view["label"] == "0→1", ["rate_mbit", "util"]] = [0.0, float("nan")]
    fig = figures.network_map(queries.workers(conn), view)
    t = {tr.name: tr for tr in figures.link_traces(fig)}["0→1"]
    assert t.line.width == 2 and "n/a" in t.hovertext[0]


def test_network_map_without_workers_is_a_placeholder():
    empty = pd.DataFrame(columns=["id", "name", "cloud", "address"])
    view = pd.DataFrame(
        columns=["src", "dst", "rate_mbit", "configured_mbit", "up", "mbit", "util"]
    )
    fig = figures.network_map(empty, view)
    assert not figures.link_traces(fig) and fig.layout.annotations


def test_heatmap_is_n_by_n_with_dead_link_marked(conn, run_db):
    view = _view(conn, run_db[1])
    fig = figures.utilisation_heatmap(view, queries.workers(conn))
    z = np.array(fig.data[0].z, dtype=float)
    assert z.shape == (3, 3)
    assert np.isnan(np.diag(z)).all()
    assert z[0, 2] == pytest.approx(90.0)
    assert fig.data[0].text[1][2] == "down"
    assert fig.data[0].text[0][2] == "90%"


def test_utilisation_series_divides_by_rate_at_sample_time(conn, run_db):
    now = run_db[1]
    series = figures.utilisation_series(
        queries.link_samples(conn, now - 60, now),
        queries.links(conn),
        queries.link_state_history(conn, now),
    )
    s = series[series["label"] == "2→1"]
    before = s[s["t"] < now + RATE_CHANGE_AT]["util"]
    after = s[s["t"] >= now + RATE_CHANGE_AT]["util"]
    assert np.allclose(before, 0.45) and np.allclose(after, 0.9)
    assert figures.busiest_links(series, 1) == ["0→2"]
    fig = figures.utilisation_timeseries(series, ["0→2", "2→1"], now - DURATION)
    assert [t.name for t in fig.data] == ["0→2", "2→1"]
    assert len(fig.data[0].x) == DURATION and max(fig.data[0].y) == pytest.approx(90.0)
    # Measured against configured: the 2→1 link's configured rate steps from 100 to 50.
    fig = figures.utilisation_timeseries(series, ["2→1"], now - DURATION, rates=True)
    assert [t.name for t in fig.data] == ["2→1 measured", "2→1 configured"]
    assert set(fig.data[1].y) == {100.0, 50.0}
    assert np.allclose(fig.data[0].y, 45.0)  # 45 Mbit/s throughout: 45% of 100, 90% of 50


# -- groups, plans, training ----------


def test_group_timeline_has_one_bar_per_group(conn, run_db):
    now = run_db[1]
    g = queries.groups(conn, now - 60, now)
    fig = figures.group_timeline(g, now - DURATION, now)
    assert sum(len(t.y) for t in fig.data) == len(g) == 4
    by_status = {t.name: t for t in fig.data}
    assert set(by_status) == {"completed", "open", "abandoned"}
    assert by_status["abandoned"].marker.pattern.shape == "x"
    assert list(by_status["abandoned"].y) == ["g2 [1,2]"]
    # The open group's bar reaches asof.
    open_bar = by_status["open"]
    assert open_bar.base[0] + open_bar.x[0] == pytest.approx(DURATION)


def test_rounds_and_staleness_count_completed_groups_only(conn, run_db):
    now = run_db[1]
    m = queries.completed_rounds(conn, now - DURATION, now)
    fig = figures.rounds_and_staleness(m, queries.workers(conn))
    rounds = fig.data[0]
    assert list(rounds.x) == ["w0", "w1", "w2"]
    assert list(rounds.y) == [2, 1, 1]  # g1 {0,1} and g3 {0,2}; abandoned g2 and open g4 not
    assert list(fig.data[2].y) == [1, 1, 3]  # max staleness


def test_plan_elems_accepts_list_and_mapping():
    assert figures.plan_elems('{"elems": [1, 2]}', 3) == [1, 2, 0]
    assert figures.plan_elems({"elems": {"0": 5, "2": 7}}, 3) == [5, 0, 7]
    assert figures.plan_elems('{"other": 1}', 3) is None
    assert figures.plan_elems(None, 3) is None


def test_plan_figures(conn, run_db):
    plans = queries.latest_plans(conn, run_db[1], 10)
    assert plans["id"].tolist() == [4, 1]  # newest first, only groups with a plan
    row = plans.iloc[0].to_dict()
    fig = figures.plan_blocks(row, queries.workers(conn))
    assert list(fig.data[0].y) == [500, 250, 250]
    assert fig.data[0].marker.color[2] != fig.data[0].marker.color[0]  # w2 helps, not a member
    times = figures.plan_times(plans)
    series = {t.name: list(t.y) for t in times.data}
    assert series["predicted"] == [2.5, 1.5]
    assert series["measured"][0] == pytest.approx(3.0) and math.isnan(series["measured"][1])
    assert series["lower bound"] == [2.0, 1.0]


def test_training_curves_per_worker_and_overall(conn, run_db):
    now = run_db[1]
    iters = queries.iterations(conn, now - 60, now)
    fig = figures.training_curves(iters, queries.workers(conn), now - DURATION)
    names = [t.name for t in fig.data]
    assert names.count("w0") == 2 and names.count(figures.OVERALL) == 2  # loss and accuracy
    w0 = [t for t in fig.data if t.name == "w0"]
    assert w0[0].line.color == w0[1].line.color  # one colour per worker in both panels
    overall_loss = [t for t in fig.data if t.name == figures.OVERALL][0]
    assert overall_loss.y[0] > overall_loss.y[-1]  # loss goes down
    rpm = figures.rounds_per_minute(
        queries.completed_rounds(conn, now - DURATION, now), queries.workers(conn), now - DURATION
    )
    assert sorted(t.name for t in rpm.data) == ["w0", "w1", "w2"]
    assert sum(sum(t.y) for t in rpm.data) == 4


def round_counts(memberships: pd.DataFrame, t0: float) -> pd.DataFrame:
    """Completed memberships (worker, ended_at, staleness) counted per worker and minute since
    ``t0`` in pandas: the reference ``queries.completed_rounds`` must agree with."""
    cols = queries.ROUND_COLUMNS
    if memberships.empty:
        return pd.DataFrame(columns=cols)
    m = memberships.assign(minute=((memberships["ended_at"] - t0) // 60).astype(int))
    if "staleness" not in m:
        m["staleness"] = 1
    per = m.groupby(["worker", "minute"], as_index=False)["staleness"]
    return per.agg(rounds="size", staleness_sum="sum", staleness_max="max")[cols]


def test_completed_rounds_count_in_sql_what_the_memberships_hold(conn, run_db):
    now = run_db[1]
    t0 = now - DURATION
    counted = queries.completed_rounds(conn, t0, now)
    assert counted.columns.tolist() == [
        "worker",
        "minute",
        "rounds",
        "staleness_sum",
        "staleness_max",
    ]
    expected = round_counts(queries.completed_memberships(conn, now), t0)
    assert counted.astype(float).values.tolist() == expected.astype(float).values.tolist()
    # Only the window's groups: none ended in the last 5 s, so none are counted.
    assert queries.completed_rounds(conn, t0, now, window_s=5.0).empty


def test_rounds_per_minute_scales_the_running_minute() -> None:
    members = round_counts(
        pd.DataFrame({"worker": [0, 0, 0], "ended_at": [10.0, 70.0, 95.0]}), t0=0.0
    )
    workers = pd.DataFrame({"id": [0], "name": ["w0"], "cloud": ["a"], "address": ["x"]})
    full = figures.rounds_per_minute(members, workers, t0=0.0)
    assert list(full.data[0].y) == [1, 2]  # raw counts: the running minute looks slow
    live = figures.rounds_per_minute(members, workers, t0=0.0, now=100.0)
    assert list(live.data[0].y) == [1, 3]  # 2 rounds in 40 s of minute 1: 3 per minute
    early = figures.rounds_per_minute(members, workers, t0=0.0, now=65.0)
    assert list(early.data[0].x) == [0]  # 5 s into minute 1: too early to say


def test_network_map_shows_each_links_delay(conn, run_db):
    view = _view(conn, run_db[1])
    assert (view["delay_ms"] >= 0).all()
    view.loc[view["label"] == "0→2", "delay_ms"] = 40.0
    fig = figures.network_map(queries.workers(conn), view, show_labels=True)
    t = {tr.name: tr for tr in figures.link_traces(fig)}
    assert "one-way delay 40 ms" in t["0→2"].hovertext[0] and t["0→2"].meta["delay_ms"] == 40.0
    assert "40 ms" in "".join(t["0→2"].text)
    assert "delay" not in t["2→0"].hovertext[0]  # no delay, no clutter


def test_a_long_runs_training_curves_are_drawn_from_bin_means() -> None:
    from dashboard.figures import MAX_CURVE_POINTS, training_curves

    rows = 20_000  # per worker: a week's worth after retention
    t = np.linspace(0.0, 7 * 86400.0, rows)
    iters = pd.concat(
        [
            pd.DataFrame(
                {
                    "t": t,
                    "worker": w,
                    "iteration": np.arange(rows),
                    "loss": 2.0 + w,
                    "accuracy": 0.5,
                }  # fmt: skip
            )
            for w in (0, 1)
        ],
        ignore_index=True,
    )
    workers = pd.DataFrame({"id": [0, 1], "name": ["w0", "w1"]})
    fig = training_curves(iters, workers, 0.0)
    assert all(len(trace.x) <= MAX_CURVE_POINTS + 1 for trace in fig.data)
    w1 = next(tr for tr in fig.data if tr.name == "w1" and tr.yaxis in (None, "y"))
    assert set(np.round(w1.y, 6)) == {3.0}  # means of a constant loss are that loss
