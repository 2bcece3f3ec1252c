"""How fast a worker process starts: spawn to its first Ready, per workload, on loopback.

``python -m lab.studies.workerstart --workload synthetic --n 4 --model-mb 4`` runs the real
coordinator and ``n`` real worker processes (``python -m crew.runtime.worker``) on 127.0.0.1,
no network namespaces and no root, until ``--groups`` groups completed, and prints per worker
the seconds from its spawn to its first Ready (the coordinator's ``worker_states`` record) and
its peak resident memory. Run it with ``--workload mlp`` beside it for the torch worker's
figures. :class:`LoopbackRun` is the harness (tests use it too).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import resource
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from crew.config import RunConfig
from crew.runtime.rundb import GroupStatus, WorkerState

REPO = Path(__file__).resolve().parents[2]
STOP_GRACE_S = 20.0
COORDINATOR_WAIT_S = 15.0


# Ports are picked below Linux's ephemeral range (32768 and up by default), so a socket the
# kernel numbers for another process meanwhile rarely takes one.
PORT_LOW, PORT_HIGH = 20000, 32000
PORT_ATTEMPTS = 200


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports on 127.0.0.1, each free for TCP and for UDP now (all held open
    together while picked): a worker's data port carries its TCP listener and its UDP probes
    (``crew.wire.probes``)."""
    rng = random.Random()
    with contextlib.ExitStack() as held:
        picked: list[int] = []
        for _ in range(PORT_ATTEMPTS):
            if len(picked) == count:
                break
            port = rng.randrange(PORT_LOW, PORT_HIGH)
            if port in picked:
                continue
            try:
                for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                    sock = held.enter_context(socket.socket(socket.AF_INET, kind))
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            picked.append(port)
        if len(picked) < count:
            raise RuntimeError(f"found {len(picked)} of {count} free loopback ports")
        return picked


class LoopbackRun:
    """A coordinator and ``n`` workers as plain processes on 127.0.0.1, every link 1 Gbit/s in
    the planner's view; ``config`` fields override the defaults (``workload``, ``model_mb``,
    ``stragglers``, ``bw_mbit``, ...). A context manager: leaving it stops every process it
    started."""

    def __init__(self, run_dir: Path, n: int, p: int, **config: object) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        secret = run_dir / "secret"
        secret.write_bytes(secrets.token_bytes(32))
        secret.chmod(0o600)
        ports = free_ports(n + 1)
        self.cfg = RunConfig(
            run_id=run_dir.name,
            run_num=secrets.randbits(32),
            run_dir=str(run_dir),
            secret_path=str(secret),
            n=n,
            p=p,
            scheme=str(config.pop("scheme", "crew")),
            coordinator_host="127.0.0.1",
            coordinator_port=ports[0],
            data_port=0,
            data_ports=tuple(ports[1:]),
            identities=("127.0.0.1",) * n,
            bw_mbit=config.pop(  # type: ignore[arg-type]
                "bw_mbit",
                tuple(tuple(0.0 if i == j else 1000.0 for j in range(n)) for i in range(n)),
            ),
            **config,  # type: ignore[arg-type]
        )
        self.config_path = run_dir / "config.json"
        self.cfg.save(self.config_path)
        self.db_path = run_dir / "run.db"
        self.run_dir = run_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.spawned: dict[int, float] = {}  # worker -> time.time() at its spawn
        self._logs: list[IO[bytes]] = []

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.run_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed in __exit__
        self._logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, *argv, "--config", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
        )
        self.procs.append(proc)
        return proc

    def __enter__(self) -> LoopbackRun:
        self._spawn("coordinator", ["-m", "crew.runtime.coordinator", "--db", str(self.db_path)])
        # As in the lab, the workers start once the coordinator listens.
        address = (self.cfg.coordinator_host, self.cfg.coordinator_port)
        deadline = time.monotonic() + COORDINATOR_WAIT_S
        while time.monotonic() < deadline and self.procs[0].poll() is None:
            try:
                socket.create_connection(address, timeout=1.0).close()
                break
            except OSError:
                time.sleep(0.05)
        for i in range(self.cfg.n):
            self.spawned[i] = time.time()
            self._spawn(f"w{i}", ["-m", "crew.runtime.worker", "--id", str(i)])
        return self

    def query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        if not self.db_path.exists():
            return []
        conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError:  # the coordinator has not made its tables yet
            return []
        finally:
            conn.close()

    def completed(self) -> int:
        rows = self.query(
            "SELECT COUNT(*) FROM groups WHERE status = ?", (GroupStatus.COMPLETED.value,)
        )
        return int(rows[0][0]) if rows else 0  # type: ignore[call-overload]

    def wait_completed(self, groups: int, timeout_s: float) -> int:
        """Poll (every 0.2 s, at most ``timeout_s``) until ``groups`` groups completed or a
        process ended; the count reached."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = self.completed()
            if done >= groups or any(p.poll() is not None for p in self.procs):
                return done
            time.sleep(0.2)
        return self.completed()

    def first_ready(self) -> dict[int, float]:
        """Seconds from each worker's spawn to its first Ready."""
        rows = self.query(
            "SELECT worker, MIN(t) FROM worker_states WHERE state = ? GROUP BY worker",
            (WorkerState.READY.value,),
        )
        return {int(w): float(t) - self.spawned[int(w)] for w, t in rows}  # type: ignore[arg-type]

    def __exit__(self, *exc: object) -> None:
        # The coordinator first: it tells the workers to stop.
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for log in self._logs:
            log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.studies.workerstart", description=__doc__)
    parser.add_argument("--workload", default="synthetic", choices=("synthetic", "mlp"))
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--p", type=int, default=2)
    parser.add_argument("--model-mb", type=float, default=4.0)
    parser.add_argument("--groups", type=int, default=10, help="stop after this many groups")
    parser.add_argument("--out", type=Path, default=Path("/tmp") / f"workerstart-{os.getpid()}")
    args = parser.parse_args(argv)
    with LoopbackRun(
        args.out, args.n, args.p, workload=args.workload, model_mb=args.model_mb
    ) as run:
        done = run.wait_completed(args.groups, timeout_s=120.0)
        ready = run.first_ready()
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    for w in sorted(ready):
        print(f"w{w}: spawn to first Ready {ready[w]:.3f} s")
    if ready:
        times = sorted(ready.values())
        print(
            f"SUMMARY workload={args.workload} n={args.n} model_mb={args.model_mb}"
            f" groups={done} first_ready_median_s={times[len(times) // 2]:.3f}"
            f" first_ready_max_s={times[-1]:.3f} peak_child_rss_mb={peak_kb / 1024:.0f}"
        )
    return 0 if len(ready) == args.n else 1


if __name__ == "__main__":
    sys.exit(main())
