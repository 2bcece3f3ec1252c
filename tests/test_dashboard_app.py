"""The Streamlit app, driven headless by ``streamlit.testing.v1.AppTest``.

The app finds its run through the ``CREW_LAB_RUN`` environment variable here (it also takes
``st.session_state["run_path"]`` or ``--run``), pointed at a database from ``make_run``.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from crew.runtime import rundb

try:
    from test_dashboard_figures import make_run
except ImportError:  # tests/ became a package
    from tests.test_dashboard_figures import make_run

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")


@pytest.fixture
def live_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    db = make_run(tmp_path)
    monkeypatch.setenv("CREW_LAB_RUN", str(tmp_path))
    return db


@pytest.fixture
def finished_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    db = make_run(tmp_path, live=False)
    monkeypatch.setenv("CREW_LAB_RUN", str(db))  # the lab.db path works as well as the dir
    return db


def run_app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def command_rows(db: Path) -> list[tuple[str, dict, str]]:
    conn = rundb.connect(db, readonly=True)
    try:
        rows = conn.execute("SELECT kind, args, status FROM commands ORDER BY id").fetchall()
    finally:
        conn.close()
    return [(r["kind"], json.loads(r["args"]), r["status"]) for r in rows]


def dump_without_commands(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [line for line in conn.iterdump() if "commands" not in line]
    finally:
        conn.close()


def table_texts(elements) -> list[str]:
    return [t.value.to_string() for t in elements]


def test_live_page_renders_every_panel(live_db):
    at = run_app()
    assert [t.value for t in at.title] == ["CREW Lab"]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Run"] == "test-run"
    assert metrics["Topology"] == "three-in-two-clouds"
    assert metrics["Scheme"] == "crew" and metrics["p"] == "2" and metrics["State"] == "live"
    # The plan panel shows the newest plan; its group is still open, so nothing is measured.
    assert metrics["predicted"] == "1.50 s" and metrics["measured"] == "n/a"
    assert metrics["compute utilisation (mean over workers)"] == "75.0%"
    links = at.main.table[0].value.set_index("link")
    assert links.loc["0→2", "util %"] == "90%"
    assert links.loc["2→1", "rate Mbit/s"] == "50"
    assert links.loc["1→2", "state"] == "DOWN"
    assert "ready now (in queue order): w2" in [c.value for c in at.caption]
    assert any("g4" in t for t in table_texts(at.main.table))  # the open group
    # One page, every panel in view: no tabs to hide the event log behind.
    assert not at.tabs
    assert [h.value for h in at.subheader] == [
        "Network",
        "Link utilisation",
        "Groups",
        "Plans",
        "Training",
        "Compute utilisation",
        "Pace under faults",
        "Events",
    ]
    events = next(t.value for t in at.main.table if "message" in t.value.columns)
    assert events["message"].tolist() == ["link 1→2 cut", "group 2 abandoned", "run started"]
    assert events["worker"].tolist() == ["", "2", ""]  # newest first
    assert at.multiselect(key="util_links").value[0] == "0→2"  # busiest first
    assert at.number_input(key="set_link_delay").disabled  # no netem in this run
    assert not at.number_input(key="set_link_loss").disabled


GOOD_CONTROLS = [
    # widget values, button, expected kind, expected args
    ({"set_p_value": 3}, "set_p_submit", "set_p", {"p": 3}),
    ({"set_scheme_value": "preduce"}, "set_scheme_submit", "set_scheme", {"scheme": "preduce"}),
    (
        {"worker_id": 2, "kill_worker_confirm": True},
        "kill_worker_submit",
        "kill_worker",
        {"worker": 2},
    ),
    ({"worker_id": 1}, "restart_worker_submit", "restart_worker", {"worker": 1}),
    (
        {"worker_id": 1, "slow_factor": 3.0},
        "slow_worker_submit",
        "slow_worker",
        {"worker": 1, "factor": 3.0},
    ),
    (
        {"cut_link_src": 0, "cut_link_dst": 2, "cut_link_both": True, "cut_link_confirm": True},
        "cut_link_submit",
        "cut_link",
        {"src": 0, "dst": 2, "both": True},
    ),
    (
        {"cut_link_src": 2, "cut_link_dst": 0},
        "restore_link_submit",
        "restore_link",
        {"src": 2, "dst": 0, "both": False},
    ),
    (
        {"set_link_src": 0, "set_link_dst": 1, "set_link_rate": 25.0, "set_link_loss": 1.0},
        "set_link_submit",
        "set_link",
        {
            "src": 0,
            "dst": 1,
            "rate_mbit": 25.0,
            "delay_ms": None,
            "loss_pct": 1.0,
            "jitter_ms": None,
        },
    ),
    (
        {"contention_src": 1, "contention_dst": 2, "contention_rate": 40.0},
        "start_contention_submit",
        "start_contention",
        {"src": 1, "dst": 2, "rate_mbit": 40.0},
    ),
    (
        {"contention_src": 1, "contention_dst": 2},
        "stop_contention_submit",
        "stop_contention",
        {"src": 1, "dst": 2},
    ),
]


def _set(at: AppTest, values: dict) -> None:
    for key, value in values.items():
        at.get_by_key(key).set_value(value)


@pytest.mark.parametrize(("values", "button", "kind", "args"), GOOD_CONTROLS)
def test_each_control_writes_its_command(live_db, values, button, kind, args):
    before = dump_without_commands(live_db)
    at = run_app()
    _set(at, values)
    at.button(key=button).click().run()
    assert not at.exception
    assert command_rows(live_db) == [(kind, args, "pending")]
    assert any("Sent #1" in s.value for s in at.sidebar.success)
    # The page wrote a command row and nothing else.
    assert dump_without_commands(live_db) == before
    # The new command is listed next to the controls.
    assert "pending" in at.sidebar.table[0].value["status"].tolist()


BAD_CONTROLS = [
    (
        {"cut_link_src": 1, "cut_link_dst": 1, "cut_link_confirm": True},
        "cut_link_submit",
        "two workers",
    ),
    (
        {"set_link_src": 0, "set_link_dst": 1, "set_link_rate": -5.0},
        "set_link_submit",
        "must be > 0",
    ),
    (
        {"contention_src": 0, "contention_dst": 1, "contention_rate": -1.0},
        "start_contention_submit",
        "must be > 0",
    ),
    ({"set_link_src": 0, "set_link_dst": 1}, "set_link_submit", "at least one"),
    ({"worker_id": 7, "kill_worker_confirm": True}, "kill_worker_submit", "unknown worker 7"),
    ({"worker_id": 1, "slow_factor": 0.0}, "slow_worker_submit", "factor"),
    ({"set_p_value": 4}, "set_p_submit", "1..3"),
    ({"set_p_value": 0}, "set_p_submit", "1..3"),
]


@pytest.mark.parametrize(("values", "button", "reason"), BAD_CONTROLS)
def test_invalid_input_is_refused_and_writes_nothing(live_db, values, button, reason):
    at = run_app()
    _set(at, values)
    at.button(key=button).click().run()
    assert not at.exception
    errors = [e.value for e in at.sidebar.error]
    assert len(errors) == 1 and reason in errors[0], errors
    assert not at.sidebar.success
    assert command_rows(live_db) == []


@pytest.mark.parametrize(
    ("values", "button", "said"),
    [
        ({"worker_id": 2}, "kill_worker_submit", "kill worker 2"),
        ({"cut_link_src": 0, "cut_link_dst": 2}, "cut_link_submit", "cut link 0→2"),
        ({}, "kill_coordinator_submit", "kill the coordinator"),
    ],
)
def test_destructive_controls_need_their_confirm_box(live_db, values, button, said):
    at = run_app()
    _set(at, values)
    at.button(key=button).click().run()
    assert not at.exception
    assert any(said in w.value for w in at.sidebar.warning)
    assert command_rows(live_db) == []


def test_the_coordinator_is_killed_once_confirmed(live_db):
    at = run_app()
    at.checkbox(key="kill_coordinator_confirm").check().run()
    at.button(key="kill_coordinator_submit").click().run()
    assert command_rows(live_db) == [("kill_coordinator", {}, "pending")]


def test_beyond_loopback_the_controls_need_the_token_in_the_address(live_db, monkeypatch):
    monkeypatch.setenv("CREW_DASHBOARD_TOKEN", "s3cret")
    at = run_app()
    assert not at.sidebar.button and any("token" in w.value for w in at.sidebar.warning)
    at = AppTest.from_file(APP, default_timeout=30)
    at.query_params["token"] = "wrong"
    at.run()
    assert not at.sidebar.button
    at = AppTest.from_file(APP, default_timeout=30)
    at.query_params["token"] = "s3cret"
    at.run()
    assert at.button(key="kill_coordinator_submit") is not None and not at.sidebar.warning


def test_command_status_and_reason_are_shown(live_db):
    db = rundb.RunDB(live_db)
    try:
        db.executemany(
            "INSERT INTO commands (t, kind, args, status, reason) VALUES (?, ?, ?, ?, ?)",
            [
                (1.0, "kill_worker", '{"worker": 1}', "applied", None),
                (2.0, "set_link", '{"src": 0, "dst": 1, "rate_mbit": 5}', "rejected", "tc failed"),
            ],
        )
    finally:
        db.close()
    at = run_app()
    table = at.sidebar.table[0].value
    assert table["status"].tolist() == ["rejected", "applied"]  # newest first
    assert table["command"].tolist() == ["set link 0→1: 5 Mbit/s", "kill worker 1"]
    assert table["reason"].tolist()[0] == "tc failed"


def test_finished_run_replays_instead_of_controls(finished_db):
    at = run_app()
    assert {m.label: m.value for m in at.metric}["State"] == "finished"
    assert not at.button  # no controls for a run that is over
    links = at.main.table[0].value.set_index("link")
    assert links.loc["1→2", "state"] == "DOWN"
    at.slider(key="replay_t").set_value(5.0).run()
    assert not at.exception
    links = at.main.table[0].value.set_index("link")
    assert links.loc["1→2", "state"] == "up"  # before the cut
    assert links.loc["2→1", "rate Mbit/s"] == "100"  # before the reshape
    assert {m.label: m.value for m in at.metric}["Elapsed"] == "5 s"


def test_run_path_from_session_state(tmp_path, monkeypatch):
    monkeypatch.delenv("CREW_LAB_RUN", raising=False)
    make_run(tmp_path)
    at = AppTest.from_file(APP, default_timeout=30)
    at.session_state["run_path"] = str(tmp_path)
    at.run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["Run"] == "test-run"


def test_without_a_run_the_page_says_how_to_start(monkeypatch, tmp_path):
    monkeypatch.delenv("CREW_LAB_RUN", raising=False)
    at = run_app()
    assert "python -m dashboard" in at.info[0].value
    monkeypatch.setenv("CREW_LAB_RUN", str(tmp_path / "missing"))
    at = run_app()
    assert "No run database" in at.error[0].value


def test_module_entry_builds_streamlit_argv(tmp_path, monkeypatch):
    from dashboard import __main__ as entry

    make_run(tmp_path)
    seen: list[list[str]] = []
    monkeypatch.setattr(entry.os, "execv", lambda exe, argv: seen.append(argv))
    entry.main([str(tmp_path), "--port", "8611", "--host", "127.0.0.1"])
    argv = seen[0]
    assert argv[1:5] == ["-m", "streamlit", "run", APP]
    assert argv[argv.index("--server.port") + 1] == "8611"
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert argv[-3:] == ["--", "--run", str((tmp_path / "lab.db").resolve())]
    with pytest.raises(SystemExit) as refused:
        entry.main([str(tmp_path / "missing")])
    assert refused.value.code == 2  # argparse's usage error, not a clean exit
    assert len(seen) == 1
    # Beyond loopback the controls need a token, handed to Streamlit in its environment.
    monkeypatch.delenv("CREW_DASHBOARD_TOKEN", raising=False)
    with pytest.raises(SystemExit) as refused:
        entry.main([str(tmp_path), "--host", "0.0.0.0"])
    assert refused.value.code == 2 and len(seen) == 1
    entry.main([str(tmp_path), "--host", "0.0.0.0", "--token", "t0k"])
    assert len(seen) == 2 and entry.os.environ["CREW_DASHBOARD_TOKEN"] == "t0k"
    monkeypatch.delenv("CREW_DASHBOARD_TOKEN")


def test_every_table_has_a_csv_download_that_matches_lab_export(live_db, tmp_path):
    from lab.export import export_csv, table_csv, tables

    at = run_app()
    conn = rundb.connect(live_db, readonly=True)
    try:
        names = tables(conn)
    finally:
        conn.close()
    buttons = {b.label: b for b in at.download_button}
    assert sorted(buttons) == sorted(f"{n}.csv" for n in names)
    assert "groups" in names and "link_samples" in names
    export_csv(live_db, tmp_path / "csv")
    for name in names:
        # The button's data is table_csv(db, name), made on click; it equals the export file.
        want = (tmp_path / "csv" / f"{name}.csv").read_bytes().decode("utf-8")
        assert table_csv(live_db, name) == want
    # Clicking a download does not rerun the page into an error or write anything.
    before = dump_without_commands(live_db)
    buttons["groups.csv"].click().run()
    assert not at.exception
    assert dump_without_commands(live_db) == before


def _add_states(db_path: Path, rows: list[tuple[float, int, str, int | None]]) -> None:
    db = rundb.RunDB(db_path)
    try:
        for t, w, state, gid in rows:
            db.set_worker_status(w, state, iteration=3, group_id=gid, t=t)
    finally:
        db.close()


def _worker_table(at: AppTest) -> dict[str, str]:
    for table in at.main.table:
        frame = table.value
        if list(frame.columns)[:2] == ["worker", "state"]:
            return dict(zip(frame["worker"], frame["state"], strict=True))
    raise AssertionError("no worker table on the page")


def test_ready_workers_are_listed_in_queue_order_not_id_order(live_db):
    import time as _time

    now = _time.time()  # after the run's own states
    # w1 became ready first, then w2, then w0: the queue forms groups in that order.
    _add_states(
        live_db,
        [(now + 1, 1, "ready", None), (now + 2, 2, "ready", None), (now + 3, 0, "ready", None)],
    )
    at = run_app()
    assert "ready now (in queue order): w1, w2, w0" in [c.value for c in at.caption]


def _meta_time(db: Path, key: str) -> float:
    """A time the run's meta table holds (``started_at``, ``ended_at``)."""
    conn = rundb.connect(db, readonly=True)
    try:
        return float(conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0])
    finally:
        conn.close()


def test_replay_shows_the_worker_states_of_that_moment(finished_db):
    t0 = _meta_time(finished_db, "started_at")
    _add_states(
        finished_db,
        [
            (t0 + 2, 0, "training", None),
            (t0 + 2, 1, "training", None),
            (t0 + 2, 2, "ready", None),
            (t0 + 8, 2, "dead", None),
        ],
    )
    at = run_app()
    at.slider(key="replay_t").set_value(5.0).run()
    assert not at.exception
    assert _worker_table(at) == {"w0": "training", "w1": "training", "w2": "ready"}
    assert "ready then (in queue order): w2" in [c.value for c in at.caption]
    at.slider(key="replay_t").set_value(9.0).run()
    assert _worker_table(at)["w2"] == "dead"


def test_pace_panel_shows_windows_against_the_pre_fault_rate_with_faults_marked(
    tmp_path, monkeypatch
):
    db_path = make_run(tmp_path, live=False)
    monkeypatch.setenv("CREW_LAB_RUN", str(db_path))
    t0 = _meta_time(db_path, "started_at")
    conn = sqlite3.connect(db_path)
    try:
        conn.execute("DELETE FROM groups")
        ends = [t0 + 0.5 * k for k in range(1, 24)]  # 2 a second until the cut at 12 s
        ends += [t0 + 14.0, t0 + 19.0]  # then 2 in 10 s
        rows = [
            (100 + i, "crew", "[0, 1]", "[0.5, 0.5]", e - 0.3, e - 0.3, e, "completed")
            for i, e in enumerate(ends)
        ]
        conn.executemany(
            "INSERT INTO groups (id, scheme, members, weights, formed_at, started_at, ended_at,"
            " status) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.executemany(
            "INSERT INTO commands (t, kind, args, status, applied_at) VALUES (?, ?, ?, ?, ?)",
            [
                (t0 + 12.0, "cut_link", '{"src": 0, "dst": 1}', "applied", t0 + 12.0),
                (t0 + 20.0, "restore_link", '{"src": 0, "dst": 1}', "applied", t0 + 20.0),
            ],
        )
        conn.commit()
    finally:
        conn.close()
    at = run_app()
    (caption,) = [c.value for c in at.caption if c.value.startswith("baseline")]
    assert "worst 2 (10%)" in caption, caption
    figs = [json.loads(e.proto.spec) for e in at.get("plotly_chart")]
    (fig,) = [f for f in figs if f["data"] and f["data"][0].get("name") == "groups / 10 s"]
    bars, faults, repairs = fig["data"]
    assert (faults["name"], faults["text"]) == ("fault", ["cut_link"])
    assert (repairs["name"], repairs["text"]) == ("repair", ["restore_link"])
    y = bars["y"]
    if isinstance(y, dict):  # plotly's typed-array encoding
        y = np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]).tolist()
    assert y == [19, 6, 0]  # windows from t0; the last one (20-30 s) had none


def test_a_long_lm_runs_training_panel_draws_bins_and_its_newest_evaluation(finished_db):
    # The same rows, recorded as the last 30 s of a 3-hour lm run: the training curves come
    # from bins folded in SQL and the held-out loss from each worker's newest evaluation.
    ended = _meta_time(finished_db, "ended_at")
    newest = _newest_evaluations(finished_db)
    db = rundb.RunDB(finished_db)
    try:
        db.set_meta({"started_at": ended - 3 * 3600.0, "options": {"workload": "lm"}})
        # An older evaluation in the newest one's bin: a bin mean would not be the newest.
        db.add_iterations(rundb.IterationRow(t - 0.5, w, 0, 50.0, 0.1) for w, t, _ in newest)
    finally:
        db.close()
    at = run_app()
    metrics = {m.label: m.value for m in at.metric}
    expected = sum(loss for _, _, loss in newest) / len(newest)
    assert metrics["held-out loss (nats/byte)"] == f"{expected:.3f}"
    figs = [json.loads(e.proto.spec) for e in at.get("plotly_chart")]
    (curves,) = [
        f
        for f in figs
        if any(
            a.get("text") == "held-out loss (nats/byte)" for a in f["layout"].get("annotations", [])
        )
    ]
    # Evaluation rows fold apart from training rows: each worker has a held-out curve.
    held_out = [t.get("name") for t in curves["data"] if t.get("yaxis") == "y2"]
    assert {"w0", "w1", "w2"} <= set(held_out)


def _newest_evaluations(db: Path) -> list[tuple[int, float, float]]:
    conn = rundb.connect(db, readonly=True)
    try:
        rows = conn.execute(
            "SELECT worker, MAX(t), loss FROM iterations WHERE accuracy IS NOT NULL GROUP BY worker"
        ).fetchall()
    finally:
        conn.close()
    return [(int(w), float(t), float(loss)) for w, t, loss in rows]
