"""No message stops the coordinator: malformed ones are refused at decode, naming the field;
ones no check foresaw are refused by the life cycle's guard; repeated failures are recorded a
bounded number of times. A real coordinator on loopback takes a flood of bad frames."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from lifecycle_kit import make_cfg

from crew.control import lifecycle as lc
from crew.control.throttle import Throttle
from crew.runtime import rundb
from crew.runtime.coordinator import Coordinator
from crew.runtime.rundb import RunDB
from crew.wire import protocol as proto
from crew.wire.frames import COORDINATOR, FrameCodec, FrameError, control_frame
from crew.wire.session import open_session
from crew.wire.transport import FrameStream

SECRET = b"k" * 32


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"type": "link_rates", "worker": 1, "samples": [[1.0]]}, "link_rates.samples[0]"),
        ({"type": "link_rates", "worker": 1, "samples": [[1.0, -5, 2]]}, "samples[0][1]"),
        (
            {"type": "register", "worker": 0, "pid": 1, "iteration": 0, "vector_len": -3},
            "register.vector_len",
        ),
        (
            {"type": "register", "worker": 0, "pid": -1, "iteration": 0, "vector_len": 3},
            "register.pid",
        ),
        ({"type": "set_slowdown", "factor": -1.0}, "set_slowdown.factor"),
    ],
)
def test_out_of_range_fields_are_refused_at_decode_naming_the_field(obj, field) -> None:
    with pytest.raises(proto.ProtocolError, match=field.replace("[", r"\[").replace("]", r"\]")):
        proto.decode(obj)


def test_a_message_no_check_foresaw_is_refused_and_the_life_cycle_goes_on() -> None:
    life = lc.GroupLifecycle(make_cfg(n=4, p=2))
    # Built directly, past decode's checks: the capacity view cannot unpack these samples.
    bad = proto.LinkRates(1, [[1.0]])
    out = life.handle(bad, 1.0)
    errors = [o for o in out if isinstance(o, lc.EventRecord) and o.kind == "error"]
    assert errors and "LinkRates" in errors[0].message
    # ... and the next honest message is handled as usual.
    life.handle(proto.Register(0, 10, 0, 100), 1.1)
    assert 0 in life.connected


@pytest.mark.parametrize(
    "args",
    [
        {"src": 0, "dst": 1, "rate_mbit": float("nan")},
        {"src": 0, "dst": 1, "rate_mbit": float("inf")},
        {"src": 0, "dst": 1, "rate_mbit": -5},
        {"src": 0, "dst": 1, "rate_mbit": 10, "delay_ms": float("nan")},
        {"src": 0, "dst": 1, "rate_mbit": "fast"},
    ],
)
def test_set_link_refuses_what_would_poison_the_plans(args) -> None:
    life = lc.GroupLifecycle(make_cfg(n=4, p=2))
    before = life.capacity.planning.copy()
    out = life.handle(proto.Admin("set_link", args), 1.0)
    warnings = [o for o in out if isinstance(o, lc.EventRecord) and o.kind == "warning"]
    assert warnings and "admin.args" in warnings[0].message
    assert np.array_equal(life.capacity.planning, before)
    assert not np.isnan(life.capacity.planning).any()


def test_slow_worker_refuses_a_worker_outside_the_run() -> None:
    life = lc.GroupLifecycle(make_cfg(n=4, p=2))
    out = life.handle(proto.Admin("slow_worker", {"worker": 9, "factor": 2.0}), 1.0)
    assert not [o for o in out if isinstance(o, lc.SendTo)]
    assert any(isinstance(o, lc.EventRecord) and "worker" in o.message for o in out)


def test_throttle_allows_one_record_per_key_per_period_and_bounds_its_keys() -> None:
    t = Throttle(every_s=10.0, keys=3)
    assert t.due("a", 0.0) and not t.due("a", 5.0) and t.due("a", 10.0)
    for i, key in enumerate("bcde"):
        assert t.due(key, 11.0 + i)
    assert len(t._last) == 3  # noqa: SLF001 (the bound is the point of the test)


def test_a_flood_of_bad_frames_is_recorded_once_and_the_coordinator_serves_on(
    tmp_path: Path,
) -> None:
    cfg = make_cfg(n=2, p=2)
    db = RunDB(tmp_path / "run.db")
    coord = Coordinator(cfg, db, "127.0.0.1", 0, secret=SECRET)
    loop = threading.Thread(target=coord.run, daemon=True)
    loop.start()
    try:
        wrong = FrameCodec(b"x" * 32, cfg.run_num)  # another secret: every frame fails its MAC
        for _ in range(40):
            with socket.create_connection(("127.0.0.1", coord.port), timeout=5) as sock:
                stream = FrameStream(sock, wrong)
                try:
                    stream.send(control_frame(0, cfg.run_num, {"type": "heartbeat"}))
                except OSError:
                    pass
        # An honest worker still registers.
        with socket.create_connection(("127.0.0.1", coord.port), timeout=5) as sock:
            stream = FrameStream(sock, FrameCodec(SECRET, cfg.run_num))
            open_session(stream, 0, 5.0)
            stream.send(control_frame(0, cfg.run_num, proto.Register(0, 1, 0, 64).to_dict()))
            deadline = time.monotonic() + 10
            while 0 not in coord.life.connected and time.monotonic() < deadline:
                time.sleep(0.02)
            assert 0 in coord.life.connected
    finally:
        coord.stop_event.set()
        loop.join(10)
    assert not loop.is_alive()
    with rundb.connect(tmp_path / "run.db", readonly=True) as conn:
        rows = conn.execute(
            "SELECT COUNT(*) FROM events WHERE kind='security' AND message LIKE '%failed checks%'"
        ).fetchone()[0]
    assert 1 <= rows <= 2  # 40 bad connections in well under 10 s: one row (two at a boundary)


def _session(port: int, codec: FrameCodec, sender: int) -> FrameStream:
    stream = FrameStream(socket.create_connection(("127.0.0.1", port), timeout=5), codec)
    open_session(stream, sender, 5.0)
    return stream


def _wait(condition, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_only_the_lab_administers_and_no_worker_speaks_for_another(tmp_path: Path) -> None:
    cfg = make_cfg(n=2, p=2)
    db = RunDB(tmp_path / "run.db")
    admin = b"A" * 32
    coord = Coordinator(cfg, db, "127.0.0.1", 0, secret=SECRET, admin_secret=admin)
    loop = threading.Thread(target=coord.run, daemon=True)
    loop.start()
    run_key = FrameCodec(SECRET, cfg.run_num)
    try:
        worker = _session(coord.port, run_key, 0)
        worker.send(control_frame(0, cfg.run_num, proto.Register(0, 1, 0, 64).to_dict()))
        _wait(lambda: 0 in coord.life.connected, "worker 0 registers")
        # A worker, with the run's key, asks to stop the run and speaks in worker 1's name.
        stop = proto.Admin(op="stop", args={})
        worker.send(control_frame(0, cfg.run_num, stop.to_dict()))
        worker.send(control_frame(0, cfg.run_num, proto.Register(1, 1, 0, 64).to_dict()))
        time.sleep(0.5)
        assert loop.is_alive() and not coord.stop_event.is_set()
        assert 1 not in coord.life.connected
        # The lab, with its own key, may.
        lab = _session(coord.port, FrameCodec(admin, cfg.run_num), COORDINATOR)
        lab.send(control_frame(COORDINATOR, cfg.run_num, stop.to_dict()))
        loop.join(10)
        assert not loop.is_alive()
        worker.close()
        lab.close()
    finally:
        coord.stop_event.set()
        loop.join(10)
    with rundb.connect(tmp_path / "run.db", readonly=True) as conn:
        security = [r[0] for r in conn.execute("SELECT message FROM events WHERE kind='security'")]
    assert any("Admin 'stop' from worker 0 refused" in m for m in security), security
    assert any("in worker 1's name" in m for m in security), security


def test_without_an_admin_key_nobody_administers(tmp_path: Path) -> None:
    cfg = make_cfg(n=2, p=2)
    coord = Coordinator(cfg, RunDB(tmp_path / "run.db"), "127.0.0.1", 0, secret=SECRET)
    loop = threading.Thread(target=coord.run, daemon=True)
    loop.start()
    try:
        # A launched job's coordinator holds the run's key alone: the lab's id is unknown.
        with pytest.raises((FrameError, OSError)):
            _session(coord.port, FrameCodec(SECRET, cfg.run_num), COORDINATOR)
        assert loop.is_alive()
    finally:
        coord.stop_event.set()
        loop.join(10)
