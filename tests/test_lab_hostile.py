"""lab.hostile without root: its arithmetic and verdicts, and its attackers against a real
transport on loopback (the live-lab run is tests/integration/test_hostile_suite.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from crew.wire.frames import Frame, FrameCodec, FrameKind
from crew.wire.transport import Transport
from lab import hostile
from lab.orchestrate import flood, replay
from lab.orchestrate.replay import Keys

SECRET = bytes(range(32))
RUN = 0x1234_5678
DEADLINE_S = 1.5  # the victim's handshake deadline: short, so the tests take seconds; above
# flood.REFUSED_S, so that a connection cut at the deadline never counts as refused


# -- pure parts ---------------------------------------------------------------------------------


def test_pace_counts_groups_ended_in_the_window_per_ten_seconds() -> None:
    ends = [0.5, 1.0, 5.0, 12.0, 19.9, 20.0, 20.1]
    # (0, 20]: 1.0, 5.0, 12.0, 19.9, 20.0 and 0.5 -> 6 groups in 20 s = 3 per 10 s
    assert hostile.pace(ends, 0.0, 20.0) == pytest.approx(3.0)
    assert hostile.pace(ends, 20.0, 30.0) == pytest.approx(1.0)  # 20.0 belongs to the window before
    with pytest.raises(ValueError):
        hostile.pace(ends, 5.0, 5.0)


def test_pace_ratio_needs_a_pace_before() -> None:
    assert hostile.pace_ratio(10.0, 8.5) == pytest.approx(0.85)
    assert hostile.pace_ratio(0.0, 3.0) is None


def test_split_evenly_keeps_the_total_and_differs_by_one_at_most() -> None:
    parts = hostile.split_evenly(1000, 9)
    assert sum(parts) == 1000 and max(parts) - min(parts) == 1 and parts[0] == 112
    assert hostile.split_evenly(3, 5) == [1, 1, 1, 0, 0]


def test_rss_growth_is_the_peak_over_the_value_before() -> None:
    got = hostile.rss_growth({"w0": 100.0, "coordinator": 80.0}, {
        "w0": [101.0, 130.5, 120.0], "coordinator": [79.0, 78.0], "w1": [50.0, 55.0]})  # fmt: skip
    assert got == {"w0": 30.5, "coordinator": -1.0, "w1": 5.0}


def _good_report() -> hostile.HostileReport:
    counts = flood.FloodCounts("w0", 5.0)
    counts.idle.update(cut=100, refused=3)
    counts.slowloris.update(cut=6)
    counts.slowloris_longest_s = 5.2
    counts.frames = flood.AttackReport("x:1", "mixed")
    counts.frames.sent.update(garbage=3)
    counts.frames.ended.update(closed=3)
    return hostile.HostileReport(
        "runs/x",
        "small",
        {"drip_s": 2.0},
        n=3,
        pace_before=10.0,
        pace_during=9.0,
        flood=[counts.to_dict()],
        rss_growth_mb={"w0": 3.0, "coordinator": 12.0},
        groups_after_flood=20,
        workers_back=3,
        replay={"attempts": {"replay@w0": 2}, "refused": {"replay@w0": 2}, "errors": []},
        admin_sent=2,
        admin_refusal_events=1,
        p_before="2",
        p_after="2",
        groups_after_replay=5,
        phases=["flood", "replay"],
    )


def test_a_run_that_kept_going_passes_every_verdict() -> None:
    r = _good_report()
    assert [c for c, met, _ in r.verdicts() if not met] == []
    assert r.ok and json.loads(json.dumps(r.to_dict()))["ok"] is True


@pytest.mark.parametrize(
    ("change", "check"),
    [
        (dict(pace_during=7.9), "pace during the flood"),
        (dict(pace_before=0.0), "pace during the flood"),
        (dict(rss_growth_mb={"w0": 50.1}), "RSS growth"),
        (dict(rss_growth_mb={}), "RSS growth"),
        (dict(workers_back=2), "every worker in a completed group"),
        (dict(groups_after_replay=0), "groups complete after the replays"),
        (dict(p_after="3"), "Admin from a worker refused"),
        (dict(admin_refusal_events=0), "Admin from a worker refused"),
        (dict(crashed={1: -9}), "no worker crashed"),
        (dict(coordinator_restarts=1), "no worker crashed"),
        (dict(error="boom"), "no attacker failed"),
        (
            dict(replay={"attempts": {"replay@w0": 2}, "refused": {"replay@w0": 1}}),
            "replays and impersonations refused",
        ),
    ],
)
def test_each_missed_target_fails_its_verdict_and_the_run(change: dict, check: str) -> None:
    r = replace(_good_report(), **change)
    missed = [c for c, met, _ in r.verdicts() if not met]
    assert len(missed) == 1 and missed[0].startswith(check), missed
    assert not r.ok


def test_connections_left_open_or_a_slow_cut_fail_the_flood_verdicts() -> None:
    r = _good_report()
    r.flood[0]["idle"]["kept_open"] = 1
    r.flood[0]["slowloris_longest_s"] = 5.0 + hostile.SLACK_S + 2 * 2.0 + 0.1
    r.flood[0]["frames"]["dropped"] = 2
    missed = {c for c, met, _ in r.verdicts() if not met}
    assert missed == {
        "idle connections ended by the target",
        "slowloris cut by the handshake deadline",
        "hostile frames dropped",
    }


def test_only_the_phases_run_have_verdicts_and_a_missing_poison_report_fails() -> None:
    r = _good_report()
    flood_only = replace(r, phases=["flood"], replay={}, admin_sent=0, groups_after_replay=0)
    checks = [c for c, _, _ in flood_only.verdicts()]
    assert flood_only.ok and "replays and impersonations refused" not in checks
    assert "idle connections ended by the target" in checks
    poison_only = replace(r, phases=["poison"], flood=[], rss_growth_mb={})
    assert [c for c, met, _ in poison_only.verdicts() if not met] == ["poison phase ran"]
    assert "no worker crashed, no coordinator restart" not in [
        c for c, _, _ in poison_only.verdicts()
    ]


def test_options_refuse_unknown_phases_and_take_a_torchrun_poison_alone() -> None:
    with pytest.raises(ValueError):
        hostile.HostileOptions(phases=("flood", "posion"))
    with pytest.raises(ValueError):
        hostile.HostileOptions(phases=())
    alone = hostile.HostileOptions(target=hostile.TargetKind.TORCHRUN, phases=("poison",))
    assert alone.phases == ("poison",)
    assert hostile.build_parser().parse_args(["--phases", "replay, poison"]).phases == (
        "replay",
        "poison",
    )


def test_options_refuse_windows_shorter_than_one_pace_window() -> None:
    with pytest.raises(ValueError):
        hostile.HostileOptions(baseline_s=5.0)
    with pytest.raises(ValueError):
        hostile.HostileOptions(connections=0)


def test_options_are_written_as_json_values() -> None:
    opts = hostile.HostileOptions(run_dir=Path("/tmp/x"), connections=50)
    assert json.loads(json.dumps(opts.to_dict()))["run_dir"] == "/tmp/x"


def test_the_help_names_every_phase_and_flag() -> None:
    text = hostile.build_parser().format_help()
    for word in ("flood", "slowloris", "replay", "poison", "--phases", "--poisoner", "--json"):
        assert word in text


# -- the attackers against a transport on loopback ----------------------------------------------


@pytest.fixture
def victim() -> Iterator[tuple[Transport, list[Frame]]]:
    """Worker 1 of three, its handshake deadline DEADLINE_S."""
    got: list[Frame] = []
    lock = threading.Lock()

    def on_frame(f: Frame) -> None:
        with lock:
            got.append(f)

    codec = FrameCodec(SECRET, RUN)
    t = Transport(
        1,
        ("127.0.0.1", 0),
        {0: ("127.0.0.1", 9), 2: ("127.0.0.1", 9)},
        codec,
        on_frame=on_frame,
        connect_timeout=DEADLINE_S,
        stall_timeout=5.0,
    )
    t.start()
    try:
        yield t, got
    finally:
        t.close()


def test_the_flood_is_cut_at_the_handshake_deadline_and_counted(victim) -> None:
    t, got = victim
    target = flood.Target("w1", "127.0.0.1", t.port, None, DEADLINE_S)
    plan = flood.FloodPlan(connections=20, slowloris=2, frames=6, duration_s=4.0, drip_s=0.3)
    counts = flood.flood(target, plan)
    assert counts.error is None
    # Every idle connection was opened and ended by the transport at its deadline, none kept.
    assert counts.idle == {"cut": 20}, counts.idle
    assert DEADLINE_S <= counts.idle_longest_s < DEADLINE_S + 2.0
    # Slowloris connections were cut before they could send a whole HELLO (89 bytes).
    assert counts.slowloris["cut"] >= 2 and counts.slowloris["kept_open"] == 0
    assert counts.slowloris_longest_s < DEADLINE_S + 2.0
    assert 0 < counts.slowloris_most_bytes < 89
    assert counts.frames is not None and counts.frames.dropped == 6
    assert counts.attempted == 20 + sum(counts.slowloris.values()) + 6
    assert got == [] and t.stats().frames_received == 0


def test_an_idle_connection_the_target_keeps_counts_as_kept_open() -> None:
    """A listener with no handshake deadline at all: the flood must say so."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as srv:
        srv.listen(16)
        target = flood.Target("x", "127.0.0.1", srv.getsockname()[1], None, 0.2)
        counts = flood.FloodCounts("x", 0.2)
        flood.idle_flood(target, 3, 0.1, 0.5, counts)
        assert counts.idle == {"kept_open": 3}


def _keys() -> Keys:
    return Keys(RUN, 3, FrameCodec(SECRET, RUN).max_payload, False, SECRET, bytes(32))


def test_replays_and_impersonations_of_a_worker_are_refused(victim) -> None:
    t, got = victim
    target = flood.Target("w1", "127.0.0.1", t.port, None, DEADLINE_S)
    counts = replay.attack_target(target, 1, _keys(), tries=3, p=2, wait_s=1.0)
    assert counts.errors == []
    assert counts.attempts == {"replay@w1": 3, "impersonate@w1": 3}
    assert counts.refused == counts.attempts and not counts.kept
    # Only the genuine sessions' own frames (from peer 2, the recorded ones) got through.
    assert [f.sender for f in got] == [2, 2, 2] and all(f.kind is FrameKind.PAYLOAD for f in got)


def test_a_genuine_frame_is_not_counted_as_refused(victim) -> None:
    """The control: the check that counts a refusal sees an accepted frame as accepted."""
    t, got = victim
    target = flood.Target("w1", "127.0.0.1", t.port, None, DEADLINE_S)
    keys = _keys()
    frame = Frame(FrameKind.PAYLOAD, 2, RUN, payload=b"ok")
    assert replay._impersonate(target, keys.codec(), 2, frame, 1.0) is False
    assert [f.payload for f in got] == [b"ok"]


def test_replays_impersonations_and_worker_admin_at_a_coordinator_are_refused(
    tmp_path: Path,
) -> None:
    from lifecycle_kit import make_cfg

    from crew.runtime.coordinator import Coordinator
    from crew.runtime.rundb import RunDB

    cfg = make_cfg(n=3, p=2)
    admin = b"A" * 32
    db = RunDB(tmp_path / "run.db")
    coord = Coordinator(cfg, db, "127.0.0.1", 0, secret=SECRET, admin_secret=admin)
    loop = threading.Thread(target=coord.run, daemon=True)
    loop.start()
    keys = Keys(cfg.run_num, 3, cfg.max_payload, False, SECRET, admin)
    target = flood.Target("coordinator", "127.0.0.1", coord.port, None, 10.0)
    try:
        since = time.time()
        counts = replay.attack_target(target, None, keys, tries=2, p=2, wait_s=1.0)
        assert counts.errors == []
        kinds = ("replay", "impersonate", "replay-admin", "lab-hello")
        assert counts.attempts == {f"{k}@coordinator": 2 for k in kinds}
        assert counts.refused == counts.attempts and not counts.kept
        assert replay.admin_from_worker(target, keys, 2, new_p=3) == 2
        time.sleep(0.5)
        assert coord.life.former.p == 2  # the worker's set_p was refused
        assert loop.is_alive() and not coord.stop_event.is_set()
    finally:
        coord.stop_event.set()
        loop.join(10)
        db.close()
    _p, refusals = replay.admin_refused_in_db(tmp_path / "run.db", since)
    assert refusals >= 1


def test_the_printed_report_shows_the_counts_and_a_missed_target() -> None:
    import io

    from rich.console import Console

    r = replace(_good_report(), pace_during=4.0)
    out = io.StringIO()
    hostile.print_report(r, Console(file=out, width=200))
    text = out.getvalue()
    assert "│ w0 " in text and "│  103 │       3 │ 100 │" in text  # idle, refused, cut
    assert "0.40" in text and "NO" in text  # the pace ratio, and its verdict missed
