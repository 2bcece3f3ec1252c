"""The CREW Lab dashboard: one run database in, command rows out.

Run it as ``python -m dashboard runs/<id>`` or ``streamlit run dashboard/app.py -- --run
runs/<id>``. The run is found, in this order, from ``st.session_state["run_path"]``, the
``--run`` argument, or the ``CREW_LAB_RUN`` environment variable (tests use the last); it may
name the run directory or its ``lab.db``.

The page reads the database through one read-only connection per browser session and writes
nothing but ``commands`` rows, through ``lab.orchestrate.commands.submit``; the lab applies them.
Every command goes through ``lab.orchestrate.commands.parse_command`` first, so a refused one shows
its reason and writes nothing.

Every panel is on one page, in a fixed grid (network, utilisation, groups, plans and training,
events), so a click in the sidebar and its effect are in view together, and a screenshot shows
the whole run. While the run is live each panel is its own fragment that re-runs every one to
ten seconds, so a refresh re-queries and redraws only that panel; plans and training change
slowly and refresh least often, which keeps the page's CPU share small beside the workers.

A finished run (``meta.ended_at`` set) gets a replay slider instead, and every panel shows
the run as it was at the chosen time.
"""

from __future__ import annotations

import argparse
import functools
import hmac
import logging
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

# `streamlit run dashboard/app.py` puts dashboard/ on sys.path, not the repository root.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from crew.runtime import rundb  # noqa: E402
from dashboard import compute_share, figures, pace_figure, queries  # noqa: E402
from lab import export  # noqa: E402
from lab.orchestrate import commands as lc  # noqa: E402
from lab.report import pace as lab_pace  # noqa: E402

log = logging.getLogger(__name__)

RUN_ENV = "CREW_LAB_RUN"
# Each refresh costs about 0.3 s of server and as much of browser CPU for the charts (measured
# with 8 workers on 2 cores); 3 s keeps the page live at a third of a core in all.
PANEL_REFRESH_S = 3.0
SLOW_PANEL_REFRESH_S = 10.0  # plans and training: a few new points a minute
STATUS_REFRESH_S = 1.0
LATEST_HORIZON_S = 5.0  # a link without a sample this recent is idle (or its monitor stalled)
TOP_K_LINKS = 5
WINDOW_CHOICES_MIN = (1, 2, 5, 10, 30)
TIMELINE_WINDOW_S = 120.0
TIMELINE_MAX_GROUPS = 30  # a bar each: more would make the page scroll for groups alone
PLAN_LIMIT = 20
EVENT_LIMIT = 200
EVENT_LOG_HEIGHT_PX = 320
COMMAND_LIMIT = 10
SIMULATED_NOTE = (
    "Simulated run (crew.sim): flow-level model, no emulated network; link rates are the "
    "model's, loss and accuracy are not computed."
)


# -- which run, and how to read it ---------------------------------------------------------------


def _run_arg() -> str | None:
    if st.session_state.get("run_path"):
        return str(st.session_state["run_path"])
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--run")
    known, _ = parser.parse_known_args(sys.argv[1:])
    return known.run or os.environ.get(RUN_ENV)


def db_path(run: str | Path) -> Path:
    p = Path(run)
    return p / "lab.db" if p.is_dir() else p


def _connection(db: Path) -> sqlite3.Connection:
    held = st.session_state.get("_conn")
    if held is None or held[0] != str(db):
        st.session_state["_conn"] = (str(db), rundb.connect(db, readonly=True))
    return st.session_state["_conn"][1]


def _cache(name: str, factory: Callable[[], queries.WindowCache]) -> queries.WindowCache:
    caches = st.session_state.setdefault("_caches", {})
    if name not in caches:
        caches[name] = factory()
    return caches[name]


def _fragment(live: bool, every: float = PANEL_REFRESH_S) -> Callable[[Callable[[], None]], Any]:
    return st.fragment(run_every=every if live else None)


def _ago(t: float, now: float) -> str:
    return f"{max(0.0, now - t):.0f} s ago"


# -- panels --------------------------------------------------------------------------------------


class Page:
    """The state every panel shares: the connection, the run's facts and the clock."""

    def __init__(self, db: Path, conn: sqlite3.Connection):
        self.db = db
        self.conn = conn
        self.info = queries.run_info(conn)
        self.limits = lc.load_limits(conn)
        # The samples' span only when meta lacks a time (a run recorded without them, or live).
        span = (
            queries.data_span(conn)
            if self.info.started_at is None or self.info.ended_at is None
            else None
        )
        self.t0 = self.info.started_at or (span[0] if span else time.time())
        self.t_end = self.info.ended_at or (span[1] if span else self.t0)
        self._rounds: tuple[float, pd.DataFrame] | None = None
        self.replay_at: float | None = None
        self.workers = queries.workers(conn)
        self.names = {
            int(i): str(n) for i, n in zip(self.workers["id"], self.workers["name"], strict=True)
        }

    @property
    def live(self) -> bool:
        return self.info.live

    def rounds(self, t: float) -> pd.DataFrame:
        """Completed rounds per worker and minute up to ``t``, read once for the groups and
        the training panels (``queries.completed_rounds``)."""
        if self._rounds is None or self._rounds[0] != t:
            self._rounds = (t, queries.completed_rounds(self.conn, self.t0, t))
        return self._rounds[1]

    def asof(self) -> float:
        """Now for a live run; the replay slider's time for a finished one."""
        return time.time() if self.replay_at is None else self.replay_at

    # -- header -------------------------------------------------------------------------------

    def header(self) -> None:
        @_fragment(self.live, STATUS_REFRESH_S)
        def header_panel() -> None:
            info = queries.run_info(self.conn)
            if self.live and not info.live:
                st.rerun(scope="app")  # the run just ended: switch to replay
            t = self.asof()
            cols = st.columns([3.2, 1.6, 1, 0.5, 0.9, 1])
            cols[0].metric("Run", info.run_id)
            cols[1].metric("Topology", info.topology)
            cols[2].metric("Scheme", info.scheme)
            cols[3].metric("p", "n/a" if info.p is None else str(info.p))
            cols[4].metric("Elapsed", f"{max(0.0, t - self.t0):.0f} s")
            state = "live" if info.live else "finished"
            cols[5].metric("State", f"simulated, {state}" if info.simulated else state)

        header_panel()

    # -- network ------------------------------------------------------------------------------

    def section(self, title: str) -> None:
        """A panel's heading; on a simulated run it says so under every heading."""
        st.subheader(title)
        if self.info.simulated:
            st.caption(SIMULATED_NOTE)

    def link_view(self, t: float) -> pd.DataFrame:
        return figures.link_view(
            queries.links(self.conn),
            queries.link_state_asof(self.conn, t),
            queries.latest_link_samples(self.conn, t, LATEST_HORIZON_S),
        )

    def network(self) -> None:
        @_fragment(self.live)
        def network_panel() -> None:
            t = self.asof()
            view = self.link_view(t)
            status = queries.worker_status(self.conn, None if self.live else t)
            states = (
                {int(w): str(s) for w, s in zip(status["worker"], status["state"], strict=True)}
                if not status.empty
                else {}
            )
            left, right = st.columns([3, 2])
            with left:
                st.plotly_chart(
                    figures.network_map(self.workers, view, worker_state=states),
                    key="network_map",
                )
            with right:
                st.markdown("**Link utilisation now**")
                table = view.sort_values(["up", "util"], ascending=[True, False])
                st.table(
                    pd.DataFrame(
                        {
                            "link": table["label"],
                            "Mbit/s": table["mbit"].map(lambda v: f"{v:.1f}"),
                            "rate Mbit/s": table["rate_mbit"].map(lambda v: f"{v:g}"),
                            "util %": table["util"].map(
                                lambda v: "n/a" if v != v else f"{v * 100:.0f}%"
                            ),
                            "state": table["up"].map(lambda u: "up" if u else "DOWN"),
                        }
                    ).head(12),
                    hide_index=True,
                )

        network_panel()

    def utilisation(self) -> None:
        @_fragment(self.live)
        def utilisation_panel() -> None:
            t = self.asof()
            left, right = st.columns([3, 2])
            minutes = left.select_slider(
                "Window (minutes)", WINDOW_CHOICES_MIN, value=5, key="util_window_min"
            )
            start = max(self.t0 - 1.0, t - 60.0 * minutes)
            samples = _cache("link_samples", queries.link_sample_cache).read(self.conn, start, t)
            links = queries.links(self.conn)
            series = figures.utilisation_series(
                samples, links, queries.link_state_history(self.conn, t)
            )
            labels = [
                figures.link_label(s, d) for s, d in zip(links["src"], links["dst"], strict=True)
            ]
            with left:
                chosen = st.multiselect(
                    "Links",
                    labels,
                    default=figures.busiest_links(series, TOP_K_LINKS),
                    key="util_links",
                )
                rates = st.toggle(
                    "Mbit/s: measured against configured",
                    key="util_rates",
                    help="links that follow a rate trace drift; their configured rate moves",
                )
                st.plotly_chart(
                    figures.utilisation_timeseries(series, chosen, self.t0, rates=rates),
                    key="util_timeseries",
                )
            with right:
                st.markdown("**Utilisation matrix now** (row sends to column)")
                st.plotly_chart(
                    figures.utilisation_heatmap(self.link_view(t), self.workers),
                    key="util_heatmap",
                )

        utilisation_panel()

    # -- groups -------------------------------------------------------------------------------

    def groups(self) -> None:
        @_fragment(self.live)
        def groups_panel() -> None:
            t = self.asof()
            groups = queries.groups(self.conn, t - TIMELINE_WINDOW_S, t)
            open_g = groups[groups["status"] == rundb.GroupStatus.OPEN.value]
            charts, tables = st.columns([3, 2])
            with tables:
                st.markdown("**Open groups**")
                if open_g.empty:
                    st.caption("none")
                else:
                    st.table(
                        pd.DataFrame(
                            {
                                "group": [f"g{int(i)}" for i in open_g["id"]],
                                "members": [", ".join(map(str, m)) for m in open_g["members"]],
                                "scheme": open_g["scheme"],
                                "age": [_ago(f, t) for f in open_g["formed_at"]],
                            }
                        ),
                        hide_index=True,
                    )
                st.markdown("**Workers**")
                status = queries.worker_status(self.conn, None if self.live else t)
                if status.empty:
                    st.caption("no worker states recorded yet")
                else:
                    ready = [self.names.get(w, str(w)) for w in queries.ready_in_fifo_order(status)]
                    st.caption(
                        ("ready now" if self.live else "ready then")
                        + " (in queue order): "
                        + (", ".join(ready) if ready else "none")
                    )
                    st.table(
                        pd.DataFrame(
                            {
                                "worker": [
                                    self.names.get(int(w), str(w)) for w in status["worker"]
                                ],
                                "state": status["state"],
                                "iteration": status["iteration"],
                                "group": status["group_id"].map(
                                    lambda g: "" if pd.isna(g) else f"g{int(g)}"
                                ),
                            }
                        ),
                        hide_index=True,
                    )
            shown = groups.sort_values("id").tail(TIMELINE_MAX_GROUPS)
            with charts:
                st.markdown(
                    f"**Group timeline** (newest {len(shown)} groups"
                    f" of the last {TIMELINE_WINDOW_S:.0f} s)"
                )
                st.plotly_chart(
                    figures.group_timeline(shown, self.t0, t),
                    key="group_timeline",
                )
                st.plotly_chart(
                    figures.rounds_and_staleness(
                        self.rounds(t),
                        self.workers,
                        self.rounds_title(t),
                    ),
                    key="rounds_staleness",
                )

        groups_panel()

    # -- plans --------------------------------------------------------------------------------

    def plans(self) -> None:
        @_fragment(self.live, SLOW_PANEL_REFRESH_S)
        def plans_panel() -> None:
            t = self.asof()
            plans = queries.latest_plans(self.conn, t, PLAN_LIMIT)
            if plans.empty:
                st.caption("no plans recorded yet")
                return
            labels = [
                figures.group_label(int(i), m)
                for i, m in zip(plans["id"], plans["members"], strict=True)
            ]
            label = st.selectbox("Group", labels, index=0, key="plan_group")
            row = plans.iloc[labels.index(label) if label in labels else 0]
            begin = row["started_at"] if pd.notna(row["started_at"]) else row["formed_at"]
            measured = (
                row["ended_at"] - begin if row["status"] == rundb.GroupStatus.COMPLETED else None
            )

            def secs(v: object) -> str:
                return "n/a" if v is None or pd.isna(v) else f"{float(v):.2f} s"

            cols = st.columns(4)
            cols[0].metric("predicted", secs(row["predicted_s"]))
            cols[1].metric("measured", secs(measured))
            cols[2].metric("lower bound", secs(row["bound_s"]))
            ratio = (
                "n/a"
                if measured is None or pd.isna(row["bound_s"]) or not row["bound_s"]
                else f"{measured / row['bound_s']:.2f}×"
            )
            cols[3].metric("measured / bound", ratio)
            st.plotly_chart(
                figures.plan_blocks(row.to_dict(), self.workers),
                key="plan_blocks",
            )
            st.markdown("**Predicted vs measured vs lower bound** (newest plans)")
            st.plotly_chart(figures.plan_times(plans), key="plan_times")

        plans_panel()

    # -- training -----------------------------------------------------------------------------

    def rounds_title(self, t: float) -> str:
        """The rounds chart's title: a run longer than the panels' window shows its last hour."""
        if t - self.t0 > queries.MEMBERSHIP_WINDOW_S:
            return f"rounds in the last {queries.MEMBERSHIP_WINDOW_S / 60:.0f} min"
        return "rounds (completed groups)"

    def training(self) -> None:
        @_fragment(self.live, SLOW_PANEL_REFRESH_S)
        def training_panel() -> None:
            t = self.asof()
            workload = queries.workload(self.conn)
            bin_s = figures.curve_bin_s(t - self.t0)
            if bin_s > figures.curve_bin_s(0.0):
                # A long run: bin means from SQL, not every row it kept (a week: 200k rows).
                iters = queries.iteration_bins(
                    self.conn, self.t0, self.t0 - 1.0, t, bin_s, split_evaluations=workload == "lm"
                )
            else:
                iters = _cache("iterations", queries.iteration_cache).read(
                    self.conn, self.t0 - 1.0, t
                )
            quality = (
                figures.lm_quality(queries.latest_evaluations(self.conn, t))
                if workload == "lm"
                else None
            )
            if quality is not None:
                cols = st.columns(2)
                cols[0].metric("held-out loss (nats/byte)", f"{quality[0]:.3f}")
                cols[1].metric("held-out perplexity", f"{quality[1]:.2f}")
            st.plotly_chart(
                figures.training_curves(iters, self.workers, self.t0, workload=workload),
                key="training_curves",
            )
            last = " (the last hour)" if t - self.t0 > queries.MEMBERSHIP_WINDOW_S else ""
            st.markdown(f"**Rounds per worker per minute**{last}")
            st.plotly_chart(
                figures.rounds_per_minute(self.rounds(t), self.workers, self.t0, now=t),
                key="rounds_per_minute",
            )

        training_panel()

    def compute(self) -> None:
        @_fragment(self.live, SLOW_PANEL_REFRESH_S)
        def compute_panel() -> None:
            shares = queries.compute_shares(self.conn, self.asof())
            mean = compute_share.mean_compute_share(shares)
            st.metric(
                "compute utilisation (mean over workers)", "-" if mean is None else f"{mean:.1%}"
            )
            fig = compute_share.compute_shares(shares, self.workers)
            st.plotly_chart(fig, key="compute_shares")

        compute_panel()

    def pace(self) -> None:
        @_fragment(self.live, SLOW_PANEL_REFRESH_S)
        def pace_panel() -> None:
            t = self.asof()
            # A long run's pace over its last hour: a week holds millions of groups and
            # thousands of faults, more than a chart can show or a page can wait for.
            since = max(self.t0, t - queries.MEMBERSHIP_WINDOW_S)
            inputs = lab_pace.read_pace_inputs(self.conn, t, since if since > self.t0 else None)
            pace = lab_pace.pace_of(
                inputs.ends,
                [f for f, _ in inputs.faults],
                [r for r, _ in inputs.repairs],
                since,
                t,
            )
            st.caption(pace.describe())
            st.plotly_chart(
                pace_figure.pace_chart(
                    inputs.ends, inputs.faults, inputs.repairs, pace.baseline, since, t
                ),
                key="pace_chart",
            )

        pace_panel()

    # -- event log ----------------------------------------------------------------------------

    def event_log(self) -> None:
        @_fragment(self.live)
        def events_panel() -> None:
            t = self.asof()
            ev = queries.events(self.conn, t, EVENT_LIMIT)
            if ev.empty:
                st.caption("no events yet")
                return
            # A plain table in a scrolling box: st.dataframe's grid is a large script of its
            # own, and loading it made the event log the last panel to appear on a new page.
            with st.container(height=EVENT_LOG_HEIGHT_PX, key="event_log"):
                st.table(
                    pd.DataFrame(
                        {
                            "t (s)": (ev["t"] - self.t0).map(lambda v: f"{v:.1f}"),
                            "level": ev["level"],
                            "kind": ev["kind"],
                            "worker": ev["worker"].map(lambda w: "" if pd.isna(w) else str(int(w))),
                            "message": ev["message"],
                        }
                    ),
                    hide_index=True,
                )

        events_panel()

    # -- controls -----------------------------------------------------------------------------

    def send(self, kind: lc.CommandKind, args: dict[str, object]) -> None:
        """Validate and submit one command, showing the outcome where the control is."""
        try:
            command = lc.parse_command(kind, args, self.limits)
        except lc.CommandError as e:
            st.error(f"Refused {kind.value}: {e}")
            return
        cid = lc.submit(self.db, command)
        st.success(f"Sent #{cid}: {lc.describe(command)}")

    def controls(self) -> None:
        K = lc.CommandKind
        st.header("Controls")
        st.caption("workers: " + ", ".join(f"{i} = {n}" for i, n in sorted(self.names.items())))
        with st.form("set_p_form"):
            p = st.number_input("p (group size)", value=self.info.p or 1, step=1, key="set_p_value")
            go_p = st.form_submit_button("Set p", key="set_p_submit")
        if go_p:
            self.send(K.SET_P, {"p": p})

        with st.form("set_scheme_form"):
            schemes = list(self.limits.schemes)
            idx = schemes.index(self.info.scheme) if self.info.scheme in schemes else 0
            scheme = st.selectbox("Scheme", schemes, index=idx, key="set_scheme_value")
            go_scheme = st.form_submit_button("Set scheme", key="set_scheme_submit")
        if go_scheme:
            self.send(K.SET_SCHEME, {"scheme": scheme})

        with st.form("worker_form"):
            st.markdown("**Worker**")
            worker = st.number_input("worker", value=0, step=1, key="worker_id")
            factor = st.number_input("slow-down factor", value=2.0, step=0.5, key="slow_factor")
            slow = st.form_submit_button("Slow down", key="slow_worker_submit")
            c = st.columns(2)
            kill = c[0].form_submit_button("Kill", key="kill_worker_submit")
            restart = c[1].form_submit_button("Restart", key="restart_worker_submit")
            st.checkbox("confirm (Kill)", key="kill_worker_confirm")
        if kill and confirmed("kill_worker_confirm", f"kill worker {worker}"):
            self.send(K.KILL_WORKER, {"worker": worker})
        if restart:
            self.send(K.RESTART_WORKER, {"worker": worker})
        if slow:
            self.send(K.SLOW_WORKER, {"worker": worker, "factor": factor})
        # The lab restarts a killed coordinator, which resumes the run from the database.
        c = st.columns(2)
        kill_coord = c[0].button("Kill coordinator", key="kill_coordinator_submit")
        c[1].checkbox("confirm", key="kill_coordinator_confirm")
        if kill_coord and confirmed("kill_coordinator_confirm", "kill the coordinator"):
            self.send(K.KILL_COORDINATOR, {})

        with st.form("cut_link_form"):
            st.markdown("**Cut / restore a link**")
            c = st.columns(2)
            src = c[0].number_input("from", value=0, step=1, key="cut_link_src")
            dst = c[1].number_input("to", value=1, step=1, key="cut_link_dst")
            both = st.checkbox("both directions", value=False, key="cut_link_both")
            c = st.columns(2)
            cut = c[0].form_submit_button("Cut", key="cut_link_submit")
            restore = c[1].form_submit_button("Restore", key="restore_link_submit")
            st.checkbox("confirm (Cut)", key="cut_link_confirm")
        if cut and confirmed("cut_link_confirm", f"cut link {src}→{dst}"):
            self.send(K.CUT_LINK, {"src": src, "dst": dst, "both": both})
        if restore:
            self.send(K.RESTORE_LINK, {"src": src, "dst": dst, "both": both})

        with st.form("set_link_form"):
            st.markdown("**Reshape a link** (blank = unchanged)")
            c = st.columns(2)
            src = c[0].number_input("from", value=0, step=1, key="set_link_src")
            dst = c[1].number_input("to", value=1, step=1, key="set_link_dst")
            rate = st.number_input("rate (Mbit/s)", value=None, key="set_link_rate")
            no_netem = "needs sch_netem, which this lab's kernel lacks"
            delay = st.number_input(
                "delay (ms)",
                value=None,
                key="set_link_delay",
                disabled="delay" not in self.limits.impairments,
                help=None if "delay" in self.limits.impairments else no_netem,
            )
            loss = st.number_input(
                "loss (%)",
                value=None,
                key="set_link_loss",
                disabled="loss" not in self.limits.impairments,
                help=None if "loss" in self.limits.impairments else "not available in this lab",
            )
            reshape = st.form_submit_button("Apply", key="set_link_submit")
        if reshape:
            self.send(
                K.SET_LINK,
                {"src": src, "dst": dst, "rate_mbit": rate, "delay_ms": delay, "loss_pct": loss},
            )

        with st.form("contention_form"):
            st.markdown("**Background contention**")
            c = st.columns(2)
            src = c[0].number_input("from", value=0, step=1, key="contention_src")
            dst = c[1].number_input("to", value=1, step=1, key="contention_dst")
            rate = st.number_input("rate (Mbit/s)", value=50.0, key="contention_rate")
            c = st.columns(2)
            start = c[0].form_submit_button("Start", key="start_contention_submit")
            stop = c[1].form_submit_button("Stop", key="stop_contention_submit")
        if start:
            self.send(K.START_CONTENTION, {"src": src, "dst": dst, "rate_mbit": rate})
        if stop:
            self.send(K.STOP_CONTENTION, {"src": src, "dst": dst})

    def command_log(self) -> None:
        @_fragment(self.live, STATUS_REFRESH_S)
        def commands_panel() -> None:
            st.markdown("**Latest commands**")
            cmds = queries.commands(self.conn, COMMAND_LIMIT)
            if cmds.empty:
                st.caption("none yet")
                return
            now = time.time()
            st.table(
                pd.DataFrame(
                    {
                        "id": cmds["id"],
                        "command": [
                            self._describe(k, a)
                            for k, a in zip(cmds["kind"], cmds["args"], strict=True)
                        ],
                        "status": cmds["status"],
                        "reason": cmds["reason"].fillna(""),
                        "sent": [_ago(x, now) for x in cmds["t"]],
                    }
                ),
                hide_index=True,
            )

        commands_panel()

    def _describe(self, kind: str, args: str) -> str:
        try:
            return lc.describe(lc.parse_row({"kind": kind, "args": args}, self.limits))
        except (lc.CommandError, KeyError):
            return f"{kind} {args}"

    # -- export -------------------------------------------------------------------------------

    def downloads(self) -> None:
        """One CSV download per table of the run (what ``python -m lab.export`` writes). The
        CSV is made only when a button is clicked, from a connection of its own."""
        with st.expander("Download CSV"):
            for name in export.tables(self.conn):
                st.download_button(
                    f"{name}.csv",
                    functools.partial(export.table_csv, self.db, name),
                    file_name=f"{self.info.run_id}-{name}.csv",
                    mime="text/csv",
                    key=f"download_{name}",
                    on_click="ignore",
                )

    # -- replay -------------------------------------------------------------------------------

    def replay_slider(self) -> None:
        length = max(1.0, self.t_end - self.t0)
        offset = st.slider(
            "Replay time (s since start)",
            min_value=0.0,
            max_value=float(round(length, 1)),
            value=float(round(length, 1)),
            step=1.0,
            key="replay_t",
        )
        self.replay_at = self.t0 + offset


def controls_allowed() -> bool:
    """True unless the dashboard was started with a token (it listens beyond loopback) and
    the page's address does not carry it."""
    token = os.environ.get(lc.DASHBOARD_TOKEN_ENV)
    if not token:
        return True
    given = st.query_params.get("token", "")
    return hmac.compare_digest(str(given).encode(), token.encode())


def confirmed(key: str, what: str) -> bool:
    """The tick-box that a destructive control needs; unticked, the page says so."""
    if st.session_state.get(key):
        return True
    st.warning(f"Tick 'confirm' to {what}.")
    return False


def main() -> None:
    st.set_page_config(page_title="CREW Lab", layout="wide")
    st.title("CREW Lab")
    run = _run_arg()
    if not run:
        st.info(f"No run given. Start with `python -m dashboard runs/<id>` or set {RUN_ENV}.")
        st.stop()
    db = db_path(run)
    if not db.is_file():
        st.error(f"No run database at {db}")
        st.stop()
    page = Page(db, _connection(db))
    with st.sidebar:
        st.caption(f"run database: {db}")
        if page.live and controls_allowed():
            page.controls()
        elif page.live:
            st.warning(
                "Controls are off: this dashboard is reachable beyond loopback, and its address"
                " lacks the token lab.run printed (…/?token=…)."
            )
        else:
            st.info("This run has finished: replaying it. Controls are off.")
            page.replay_slider()
        page.command_log()
        page.downloads()
    page.header()
    page.section("Network")
    page.network()
    page.section("Link utilisation")
    page.utilisation()
    page.section("Groups")
    page.groups()
    plans, training = st.columns(2)
    with plans:
        page.section("Plans")
        page.plans()
    with training:
        page.section("Training")
        page.training()
    page.section("Compute utilisation")
    page.compute()
    page.section("Pace under faults")
    page.pace()
    page.section("Events")
    page.event_log()


main()
