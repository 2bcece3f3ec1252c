"""The command vocabulary: what parses, what is refused and why, and how rows are written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from crew import rundb
from lab import commands as lc
from lab.commands import CommandError, CommandKind, LabLimits

LIMITS = LabLimits(n=4, schemes=("preduce", "crew"), impairments=frozenset({"rate", "loss"}))
NETEM = LabLimits(n=4, impairments=frozenset({"rate", "delay", "loss"}))

GOOD = [
    ("set_p", {"p": 1}, lc.SetP(1)),
    ("set_p", {"p": 4}, lc.SetP(4)),
    ("set_p", {"p": "3"}, lc.SetP(3)),
    ("set_p", {"p": 2.0}, lc.SetP(2)),
    ("set_scheme", {"scheme": "crew"}, lc.SetScheme("crew")),
    ("kill_worker", {"worker": 0}, lc.KillWorker(0)),
    ("restart_worker", {"worker": 3}, lc.RestartWorker(3)),
    ("slow_worker", {"worker": 2, "factor": 2.5}, lc.SlowWorker(2, 2.5)),
    ("slow_worker", {"worker": 2, "factor": 1}, lc.SlowWorker(2, 1.0)),
    ("cut_link", {"src": 0, "dst": 1}, lc.CutLink(0, 1, False)),
    ("cut_link", {"src": 3, "dst": 0, "both": True}, lc.CutLink(3, 0, True)),
    ("restore_link", {"src": 1, "dst": 2, "both": False}, lc.RestoreLink(1, 2, False)),
    ("set_link", {"src": 0, "dst": 1, "rate_mbit": 25}, lc.SetLink(0, 1, 25.0, None, None)),
    (
        "set_link",
        {"src": 0, "dst": 1, "rate_mbit": None, "delay_ms": None, "loss_pct": 1.5},
        lc.SetLink(0, 1, None, None, 1.5),
    ),
    ("set_link", {"src": 1, "dst": 0, "loss_pct": 0}, lc.SetLink(1, 0, None, None, 0.0)),
    ("start_contention", {"src": 0, "dst": 3, "rate_mbit": 50}, lc.StartContention(0, 3, 50.0)),
    ("stop_contention", {"src": 0, "dst": 3}, lc.StopContention(0, 3)),
    (CommandKind.KILL_WORKER, {"worker": 1}, lc.KillWorker(1)),
]

BAD = [
    # kind, args, field named in the error, a word of the reason
    ("reboot", {}, "kind", "unknown command"),
    ("set_p", [("p", 2)], "args", "mapping"),
    ("set_p", {}, "p", "missing"),
    ("set_p", {"p": None}, "p", "missing"),
    ("set_p", {"p": 2, "q": 1}, "q", "unknown argument"),
    ("set_p", {"p": 0}, "p", "1..4"),
    ("set_p", {"p": 5}, "p", "1..4"),
    ("set_p", {"p": 2.5}, "p", "integer"),
    ("set_p", {"p": True}, "p", "integer"),
    ("set_p", {"p": "two"}, "p", "integer"),
    ("set_scheme", {"scheme": "ring"}, "scheme", "unknown scheme"),
    ("set_scheme", {"scheme": 3}, "scheme", "unknown scheme"),
    ("kill_worker", {"worker": 4}, "worker", "unknown worker"),
    ("kill_worker", {"worker": -1}, "worker", "unknown worker"),
    ("restart_worker", {}, "worker", "missing"),
    ("slow_worker", {"worker": 1, "factor": 0}, "factor", "> 0"),
    ("slow_worker", {"worker": 1, "factor": -2}, "factor", "> 0"),
    ("slow_worker", {"worker": 1, "factor": math.nan}, "factor", "finite"),
    ("slow_worker", {"worker": 1, "factor": 1e9}, "factor", "at most"),
    ("slow_worker", {"worker": 1}, "factor", "missing"),
    ("cut_link", {"src": 1, "dst": 1}, "dst", "two workers"),
    ("cut_link", {"src": 0, "dst": 9}, "dst", "unknown worker"),
    ("cut_link", {"src": 0, "dst": 1, "both": "yes"}, "both", "true or false"),
    ("restore_link", {"src": 0}, "dst", "missing"),
    ("set_link", {"src": 0, "dst": 1}, "rate_mbit", "at least one"),
    ("set_link", {"src": 0, "dst": 1, "rate_mbit": -10}, "rate_mbit", "> 0"),
    ("set_link", {"src": 0, "dst": 1, "rate_mbit": 0}, "rate_mbit", "> 0"),
    ("set_link", {"src": 0, "dst": 1, "rate_mbit": math.inf}, "rate_mbit", "finite"),
    ("set_link", {"src": 0, "dst": 1, "rate_mbit": "nan"}, "rate_mbit", "finite"),
    ("set_link", {"src": 2, "dst": 2, "rate_mbit": 10}, "dst", "two workers"),
    ("set_link", {"src": 0, "dst": 1, "delay_ms": 20}, "delay_ms", "not available"),
    ("set_link", {"src": 0, "dst": 1, "loss_pct": 150}, "loss_pct", "0..100"),
    ("set_link", {"src": 0, "dst": 1, "loss_pct": -1}, "loss_pct", "0..100"),
    ("start_contention", {"src": 0, "dst": 1, "rate_mbit": -5}, "rate_mbit", "> 0"),
    ("start_contention", {"src": 0, "dst": 1}, "rate_mbit", "missing"),
    ("start_contention", {"src": 3, "dst": 3, "rate_mbit": 5}, "dst", "two workers"),
    ("stop_contention", {"src": 0, "dst": 1, "rate_mbit": 5}, "rate_mbit", "unknown argument"),
]


@pytest.mark.parametrize(("kind", "args", "expected"), GOOD)
def test_parse_good(kind, args, expected):
    cmd = lc.parse_command(kind, args, LIMITS)
    assert cmd == expected
    # What the lab reads back from the row is what was sent.
    assert lc.parse_command(cmd.KIND.value, json.loads(json.dumps(lc.to_args(cmd))), LIMITS) == cmd
    assert lc.describe(cmd)


@pytest.mark.parametrize(("kind", "args", "field", "reason"), BAD)
def test_parse_bad(kind, args, field, reason):
    with pytest.raises(CommandError) as info:
        lc.parse_command(kind, args, LIMITS)
    assert info.value.field == field
    assert reason in str(info.value)
    assert isinstance(info.value, ValueError)


def test_delay_allowed_only_with_netem():
    assert lc.parse_command("set_link", {"src": 0, "dst": 1, "delay_ms": 20}, NETEM) == lc.SetLink(
        0, 1, None, 20.0, None
    )
    with pytest.raises(CommandError, match="delay_ms"):
        lc.parse_command("set_link", {"src": 0, "dst": 1, "delay_ms": -1}, NETEM)
    bare = LabLimits(n=4, impairments=frozenset())
    with pytest.raises(CommandError, match="loss is not available"):
        lc.parse_command("set_link", {"src": 0, "dst": 1, "loss_pct": 1}, bare)


def test_every_kind_has_a_command_type():
    assert set(lc.COMMAND_TYPES) == set(CommandKind)
    for kind, cls in lc.COMMAND_TYPES.items():
        assert cls.KIND is kind


def test_commands_are_frozen():
    cmd = lc.SetP(2)
    with pytest.raises(AttributeError):
        cmd.p = 3  # type: ignore[misc]


def test_describe_distinguishes_one_and_both_directions():
    assert lc.describe(lc.CutLink(0, 1)) == "cut link 0→1"
    assert lc.describe(lc.CutLink(0, 1, both=True)) == "cut link 0↔1"
    assert lc.describe(lc.SetLink(0, 1, 25.0, None, 2.0)) == "set link 0→1: 25 Mbit/s, 2% loss"


def test_submit_writes_pending_row_and_parse_row_reads_it(tmp_path: Path):
    db = rundb.RunDB(tmp_path / "lab.db")
    db.close()
    first = lc.submit(tmp_path / "lab.db", lc.CutLink(0, 2, both=True), t=123.0)
    second = lc.submit(tmp_path / "lab.db", lc.SetP(3))
    assert second == first + 1
    conn = rundb.connect(tmp_path / "lab.db", readonly=True)
    try:
        rows = conn.execute("SELECT * FROM commands ORDER BY id").fetchall()
    finally:
        conn.close()
    assert [(r["kind"], r["status"]) for r in rows] == [
        ("cut_link", "pending"),
        ("set_p", "pending"),
    ]
    assert rows[0]["t"] == 123.0 and rows[0]["reason"] is None
    assert json.loads(rows[0]["args"]) == {"src": 0, "dst": 2, "both": True}
    assert lc.parse_row(rows[0], LIMITS) == lc.CutLink(0, 2, both=True)


def test_parse_row_rejects_garbage_args():
    with pytest.raises(CommandError, match="args"):
        lc.parse_row({"kind": "set_p", "args": "{not json"}, LIMITS)


def test_submit_refuses_a_missing_database(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        lc.submit(tmp_path / "nope" / "lab.db", lc.SetP(2))
    assert not (tmp_path / "nope").exists()


def test_load_limits_from_meta(tmp_path: Path):
    db = rundb.RunDB(tmp_path / "lab.db")
    try:
        db.executemany(
            "INSERT INTO workers (id, name, cloud, address) VALUES (?, ?, 'c', '')",
            [(i, f"w{i}") for i in range(3)],
        )
        conn = rundb.connect(tmp_path / "lab.db", readonly=True)
        try:
            assert lc.load_limits(conn) == LabLimits(3, lc.DEFAULT_SCHEMES, frozenset({"rate"}))
            db.set_meta({"schemes": ["preduce", "crew", "ring"], "impairments": ["loss"]})
            assert lc.load_limits(conn) == LabLimits(
                3, ("preduce", "crew", "ring"), frozenset({"rate", "loss"})
            )
        finally:
            conn.close()
    finally:
        db.close()


def test_jitter_set_at_run_time_needs_jitter_support_and_fits_the_delay():
    limits = LabLimits(n=4, impairments=frozenset({"rate", "delay", "jitter"}))
    got = lc.parse_command("set_link", {"src": 0, "dst": 1, "delay_ms": 20, "jitter_ms": 5}, limits)
    assert got == lc.SetLink(0, 1, None, 20.0, None, 5.0)
    assert lc.parse_command("set_link", lc.to_args(got), limits) == got
    assert "±5 ms jitter" in lc.describe(got)
    with pytest.raises(CommandError, match="exceeds delay_ms"):
        lc.parse_command("set_link", {"src": 0, "dst": 1, "delay_ms": 2, "jitter_ms": 5}, limits)
    with pytest.raises(CommandError, match="jitter is not available"):
        lc.parse_command("set_link", {"src": 0, "dst": 1, "jitter_ms": 1}, NETEM)
