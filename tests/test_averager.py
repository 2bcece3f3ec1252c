"""crew.Averager on loopback, several ranks as threads of this process: the average is exact,
and every bad start-up case ends in a clear error within its time bound (no root, no lab)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
import torch

import crew
from crew.config import RunConfig
from crew.runtime import rundb
from crew.runtime.launch import JobHost, LaunchEnv, encryption, read_secret, rendezvous_number
from crew.wire import protocol as proto
from crew.wire.frames import FrameCodec, FrameError, control_body, control_frame
from crew.wire.session import open_session
from crew.wire.transport import FrameStream

SECRET = "test-secret-0123456789"


def free_port() -> int:
    """A MASTER_PORT whose +1 (the coordinator's port) is free too."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


def env_for(rank: int, world: int, port: int, secret: str = SECRET) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "CREW_SECRET": secret,
        "CREW_DATA_HOST": "127.0.0.1",
    }


def run_ranks(world: int, body, envs=None, **kw):
    """Run ``body(rank, averager)`` on ``world`` threads; per rank its result or exception.
    Without a ``run_dir`` in ``args`` the job keeps its run database in a folder removed
    afterwards (the Averager's own default is a temporary folder that it keeps)."""
    port = free_port()
    results: dict[int, object] = {}
    scratch = tempfile.TemporaryDirectory(prefix="crew-test-run-", ignore_cleanup_errors=True)
    args = {"run_dir": scratch.name, **kw.get("args", {})}

    def one(rank: int) -> None:
        env = envs[rank] if envs else env_for(rank, world, port)
        try:
            tensors = kw.get("tensors", lambda r: [torch.full((3, 4), float(r)), torch.ones(5)])(
                rank
            )
            with crew.Averager(tensors, env=env, **args) as averager:
                results[rank] = body(rank, averager, tensors)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[rank] = exc

    with scratch:  # removed once the ranks are joined (or a hung one given up on)
        threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results


ARGS = {"group_size": 2, "timeout": 10.0, "probe_bytes": 512 << 10, "probe_seconds": 3.0}


def test_two_ranks_average_exactly_in_place():
    def body(rank, averager, tensors):
        rnd = averager.step()
        return rnd, [t.clone() for t in tensors]

    res = run_ranks(2, body, args=ARGS)
    for rank in (0, 1):
        assert not isinstance(res[rank], Exception), res[rank]
        rnd, tensors = res[rank]
        assert rnd.averaged and set(rnd.peers) == {0, 1} and rnd.staleness == 1
        assert rnd.seconds > 0 and rnd.reason == "" and not rnd.stopped
        assert torch.equal(tensors[0], torch.full((3, 4), 0.5))  # (0 + 1) / 2, exactly
        assert torch.equal(tensors[1], torch.ones(5))


def test_rounds_report_the_time_split_between_computing_and_waiting():
    compute_s = 0.3

    def body(rank, averager, tensors):
        rounds = []
        for _ in range(3):
            time.sleep(compute_s if rank == 0 else 3 * compute_s)  # rank 0 waits for rank 1
            rounds.append(averager.step())
        return rounds

    res = run_ranks(2, body, args=ARGS)
    for rank in (0, 1):
        assert not isinstance(res[rank], Exception), res[rank]
        rounds = res[rank]
        assert all(r.averaged for r in rounds)
        splits = [r.time_split for r in rounds]
        # Cumulative: each round's split holds the one before it, and at least the sleeps.
        assert all(a.wall_s < b.wall_s for a, b in zip(splits, splits[1:], strict=False))
        mine = compute_s if rank == 0 else 3 * compute_s
        assert splits[-1].compute_s >= 3 * mine
        assert splits[-1].group_s > 0 and splits[-1].stalled_s == 0
        assert rounds[-1].utilisation == splits[-1].compute_s / splits[-1].wall_s
    # The fast rank spends its extra time ready, waiting for the slow one to offer.
    fast, slow = res[0][-1].time_split, res[1][-1].time_split
    assert fast.ready_s > slow.ready_s + 3 * compute_s
    assert res[0][-1].utilisation < res[1][-1].utilisation


def test_an_overlapped_round_keeps_the_steps_taken_while_it_reduced():
    step = {0: 0.25, 1: 0.5}  # what each rank's "training" adds while its group reduces

    def body(rank, averager, tensors):
        pending = averager.start()
        with pytest.raises(crew.OverlapError):
            averager.step()  # one round in flight at a time
        time.sleep(0.3)  # computing while the group reduces: counted as compute
        with torch.no_grad():
            for t in tensors:
                t.add_(step[rank])
        rnd = pending.wait()
        assert pending.wait() is rnd  # waiting again changes nothing
        return rnd, [t.clone() for t in tensors]

    res = run_ranks(2, body, args=ARGS)
    for rank in (0, 1):
        assert not isinstance(res[rank], Exception), res[rank]
        rnd, tensors = res[rank]
        assert rnd.averaged and set(rnd.peers) == {0, 1}
        # The group's average of the snapshots, plus this rank's own step since its offer.
        assert torch.equal(tensors[0], torch.full((3, 4), 0.5 + step[rank]))
        assert torch.equal(tensors[1], torch.ones(5) + step[rank])
        assert rnd.time_split.compute_s >= 0.3


def test_an_overlapped_round_says_when_its_result_is_here():
    def body(rank, averager, tensors):
        if rank == 1:
            time.sleep(1.0)  # rank 0's group of two cannot form before this offer
        pending = averager.start()
        early = pending.ready()
        deadline = time.monotonic() + 20
        while not pending.ready() and time.monotonic() < deadline:
            time.sleep(0.01)  # "training" between polls
        ready = pending.ready()
        began = time.monotonic()
        rnd = pending.wait()
        return early, ready, time.monotonic() - began, rnd, tensors[0].clone()

    res = run_ranks(2, body, args=ARGS)
    assert not isinstance(res[0], Exception), res[0]
    assert not isinstance(res[1], Exception), res[1]
    assert res[0][0] is False  # alone in the job, its round cannot have ended
    for rank in (0, 1):
        _, ready, waited, rnd, first = res[rank]
        assert ready and rnd.averaged and waited < 1.0  # ready: wait() returns at once
        assert torch.equal(first, torch.full((3, 4), 0.5))


def test_a_rank_that_leaves_after_joining_does_not_stop_the_others():
    def body(rank, averager, tensors):
        if rank == 2:
            return averager.step()  # one round, then close() leaves the job
        probe = averager.host.probe if rank == 0 else None
        rounds = [averager.step() for _ in range(4)]
        return rounds, probe

    res = run_ranks(3, body, args=ARGS)
    assert not any(isinstance(r, Exception) for r in res.values()), res
    for rank in (0, 1):
        later = res[rank][0][-2:]
        assert all(r.averaged for r in later), later  # groups re-formed without rank 2
    # The start-up probe ran its n - 1 = 2 rounds (n odd) and timed all 6 directed links.
    probe = res[0][1]
    assert (probe.rounds, probe.links_measured) == (2, 6), probe
    assert probe.bytes_per_worker == 2 * ARGS["probe_bytes"]


def test_every_job_host_draws_a_run_number_of_its_own(tmp_path):
    """One secret, one launcher run id: the rendezvous' number is the same for both hosts
    (their ranks must find them), the jobs' own numbers are not."""
    secret = SECRET.encode()
    shared = rendezvous_number(secret, "crew")
    hosts = [
        JobHost(secret, 2, ("127.0.0.1", 0), "127.0.0.1", rendezvous_run=shared, group_size=1,
                run_dir=tmp_path / name)
        for name in ("a", "b")
    ]  # fmt: skip
    try:
        assert [h.rendezvous.codec.run for h in hosts] == [shared, shared]
        assert len({shared, *(h.run_num for h in hosts)}) == 3
    finally:
        for h in hosts:
            h.close()


def test_a_job_records_its_config_with_every_listener_and_no_secret(tmp_path):
    """What an operator (or lab.hostile) reads of a running job: where the coordinator and
    every rank's data plane listen, and the job's own run number."""
    seen = {}

    def body(rank, averager, tensors):
        averager.step()
        if rank == 0:
            seen["port"], seen["run"] = averager.host.coordinator.port, averager.host.run_num
        return None

    res = run_ranks(2, body, args={**ARGS, "run_dir": tmp_path})
    assert res == {0: None, 1: None}, res
    with closing(rundb.connect(tmp_path / "run.db", readonly=True)) as conn:
        raw = conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0]
        roster = [r[0] for r in conn.execute("SELECT address FROM workers ORDER BY id")]
    cfg = RunConfig.from_dict(json.loads(raw))
    assert (cfg.coordinator_port, cfg.run_num) == (seen["port"], seen["run"])
    assert [f"{h}:{p}" for h, p in (cfg.data_address(i) for i in range(2))] == roster
    assert cfg.secret_path == "" and SECRET not in raw


def test_a_jobs_data_plane_refuses_another_jobs_run_under_the_same_secret_and_run_id():
    """Two jobs launched at once with one secret and the default run id: each runs under its
    own number, a data-plane HELLO under job a's is refused by job b's rank 1, and each job's
    ranks still average together."""
    averagers: dict[str, dict[int, crew.Averager]] = {"a": {}, "b": {}}
    all_up = threading.Barrier(5, timeout=60)  # the four ranks and this test
    probed = threading.Event()
    results: dict[str, dict] = {}

    def job(name: str) -> None:
        def body(rank, averager, tensors):
            averagers[name][rank] = averager
            all_up.wait()
            probed.wait(60)
            return averager.step()

        results[name] = run_ranks(2, body, args=ARGS)

    jobs = [threading.Thread(target=job, args=(name,), daemon=True) for name in averagers]
    for t in jobs:
        t.start()
    try:
        all_up.wait()
        a, b = averagers["a"], averagers["b"]
        run_a, run_b = a[0].config.run_num, b[0].config.run_num
        assert (a[1].config.run_num, b[1].config.run_num) == (run_a, run_b)
        assert len({run_a, run_b, rendezvous_number(SECRET.encode(), "crew")}) == 3
        codec = FrameCodec(SECRET.encode(), run_a, encrypt=True)
        with closing(FrameStream.connect(b[1].config.data_address(1), codec)) as stream:
            with pytest.raises((FrameError, OSError)):
                open_session(stream, 0, 10.0)  # as job a's rank 0 would open it
        transport = b[1]._node.transport
        for _ in range(100):  # the refusal is counted by the reader thread, at most 10 s
            if transport.stats().rejected_by_reason.get("WrongRun"):
                break
            time.sleep(0.1)
        assert transport.stats().rejected_by_reason.get("WrongRun", 0) >= 1
    finally:
        probed.set()
        for t in jobs:
            t.join(timeout=90)
    for name in averagers:
        for rank in (0, 1):
            rnd = results[name][rank]
            assert not isinstance(rnd, Exception), rnd
            assert rnd.averaged and set(rnd.peers) == {0, 1}, rnd


def die_during_start_up(env: dict[str, str], world: int, shapes, stage: str) -> None:
    """A rank's process that dies during start-up, speaking the protocol itself: it connects
    and, at ``stage`` ("connected": before its Join; "roster": after joining), drops the
    connection as a killed process's kernel would."""
    launch = LaunchEnv.from_environ(env)
    secret = read_secret(env)
    codec = FrameCodec(secret, rendezvous_number(secret, launch.run_id), encrypt=encryption(env))
    deadline = time.monotonic() + 10
    while True:
        try:
            stream = FrameStream.connect(launch.coordinator, codec, timeout=1.0)
            break
        except OSError:
            assert time.monotonic() < deadline, "no rendezvous host"
            time.sleep(0.1)
    if stage == "roster":
        open_session(stream, launch.rank, 10.0)
        join = proto.Join(launch.rank, world, "127.0.0.1", 9, shapes, 0)
        stream.send(control_frame(launch.rank, codec.run, join.to_dict()))
        while not isinstance(proto.decode(control_body(stream.recv())), proto.Roster):
            pass
    stream.close()


@pytest.mark.parametrize(
    ("stage", "expected"),
    [("connected", "ranks [2] did not join within 3 s"), ("roster", "rank 2 left during start-up")],
)
def test_a_rank_killed_during_start_up_is_named(stage, expected):
    port = free_port()
    envs = [env_for(r, 3, port) for r in range(3)]
    dying = threading.Thread(
        target=die_during_start_up, args=(envs[2], 3, [[3, 4], [5]], stage), daemon=True
    )
    dying.start()
    started = time.monotonic()
    res = run_ranks(2, lambda *a: None, envs=envs, args={**ARGS, "timeout": 3.0})
    dying.join(timeout=10)
    for rank in (0, 1):
        assert isinstance(res[rank], crew.JoinRefused), res[rank]
        assert expected in str(res[rank]), res[rank]
    assert time.monotonic() - started < 20  # nothing waits for the dead rank for long


def test_wrong_secret_is_named():
    port = free_port()
    envs = [env_for(0, 2, port), env_for(1, 2, port, secret="another-secret-0123456789")]
    res = run_ranks(2, lambda *a: None, envs=envs, args={**ARGS, "timeout": 4.0})
    assert isinstance(res[1], crew.SecretError), res[1]
    assert "CREW_SECRET" in str(res[1])
    assert isinstance(res[0], crew.JoinRefused) and "[1] did not join" in str(res[0])


def test_unreachable_coordinator_is_named_within_the_timeout():
    env = {**env_for(1, 2, free_port())}
    started = time.monotonic()
    with pytest.raises(crew.CoordinatorUnreachable, match="127.0.0.1"):
        crew.Averager([torch.zeros(3)], env=env, timeout=2.0)
    assert time.monotonic() - started < 10


def test_a_model_of_another_shape_is_refused_naming_both():
    def tensors(rank):
        return [torch.zeros(4, 4 if rank == 0 else 5)]

    res = run_ranks(2, lambda *a: None, tensors=tensors, args=ARGS)
    for rank in (0, 1):
        assert isinstance(res[rank], crew.JoinRefused), res[rank]
    assert "4x5" in str(res[1]) and "4x4" in str(res[1])


def test_a_rank_missing_at_start_is_named():
    port = free_port()
    envs = [env_for(r, 3, port) for r in range(3)]
    res = run_ranks(2, lambda *a: None, envs=envs, args={**ARGS, "timeout": 3.0})
    for rank in (0, 1):
        assert isinstance(res[rank], crew.JoinRefused), res[rank]
        assert "ranks [2] did not join within 3 s" in str(res[rank])


def test_no_secret_and_no_launcher_are_clear_errors():
    with pytest.raises(crew.SecretError, match="CREW_SECRET"):
        read_secret({})
    with pytest.raises(crew.SecretError, match="at least 16"):
        read_secret({"CREW_SECRET": "short"})
    with pytest.raises(crew.LaunchError, match="RANK is not set"):
        LaunchEnv.from_environ({})
    env = LaunchEnv.from_environ({"RANK": "1", "WORLD_SIZE": "2", "CREW_COORDINATOR": "h:7"})
    assert env.coordinator == ("h", 7) and not env.host_coordinator


def test_params_are_checked():
    with pytest.raises(TypeError, match="not a floating-point"):
        crew.Averager([torch.zeros(3, dtype=torch.int64)], env={})
    with pytest.raises(ValueError, match="nothing to average"):
        crew.Averager([], env={})
    assert np.float32  # numpy is the wire format


RANK_SCRIPT = """
import os, sys, time, torch, crew
tensors = [torch.full((4,), float(os.environ["RANK"]))]
with crew.Averager(tensors, group_size=2, timeout=20, probe_bytes=256 << 10) as averager:
    print("joined", flush=True)
    for _ in range(int(sys.argv[1])):
        r = averager.step()
        if r.stopped:
            break
        print("round", r.averaged, flush=True)
        time.sleep(0.05)
print("done", flush=True)
"""


def start_rank_processes(
    world: int, steps: dict[int, int], run_dir: Path
) -> list[subprocess.Popen]:
    """One process per rank running RANK_SCRIPT for ``steps[rank]`` steps; rank 0 keeps the
    run database in ``run_dir``."""
    repo = Path(__file__).resolve().parents[1]
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            **env_for(rank, world, port),
            "PYTHONPATH": str(repo),
            "CREW_RUN_DIR": str(run_dir),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT, str(steps[rank])],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def kill_after_its_first_round(proc: subprocess.Popen) -> None:
    for _ in range(200):
        line = proc.stdout.readline()
        if line.startswith("round") or not line:
            break
    assert line.startswith("round"), line
    proc.send_signal(signal.SIGKILL)


def test_a_rank_killed_after_joining_is_dropped_and_the_others_finish(tmp_path):
    procs = start_rank_processes(3, {0: 30, 1: 30, 2: 100000}, tmp_path)
    try:
        kill_after_its_first_round(procs[2])
        outs = [p.communicate(timeout=90)[0] for p in procs[:2]]
    finally:
        for p in procs:
            p.kill()
    for rank, out in enumerate(outs):
        assert procs[rank].returncode == 0, out[-2000:]
        rounds = [line for line in out.splitlines() if line.startswith("round")]
        assert len(rounds) == 30 and "done" in out, out[-2000:]
        assert rounds[-1] == "round True"  # still averaging, without the killed rank


def test_the_coordinators_rank_killed_mid_run_ends_the_others_with_a_clear_error(tmp_path):
    # Rank 0 hosts the coordinator: once it is gone for good (after the node's reconnect
    # attempts, 30 s), the others' step() raises crew.CoordinatorLost, naming rank 0.
    procs = start_rank_processes(3, {0: 100000, 1: 100000, 2: 100000}, tmp_path)
    try:
        kill_after_its_first_round(procs[0])
        started = time.monotonic()
        outs = [p.communicate(timeout=90)[0] for p in procs[1:]]
        took = time.monotonic() - started
    finally:
        for p in procs:
            p.kill()
    for proc, out in zip(procs[1:], outs, strict=True):
        assert proc.returncode != 0 and "done" not in out, out[-2000:]
        assert "crew.errors.CoordinatorLost" in out and "rank 0" in out, out[-2000:]
    assert took < 60, took
