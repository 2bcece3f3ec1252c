"""What ``lab.hostile`` attacks: a running lab or a torchrun job, as one small description.

The attackers (``lab.orchestrate.flood``, ``lab.orchestrate.replay``) need only a
:class:`HostileTarget`: the run database to read the pace from, every listening port with the
namespace to reach it from, and the keys an insider holds. It is built from what the run
publishes, the same way for both kinds (:func:`listeners_of` on a ``RunConfig``):

* a **lab** (``lab.orchestrate.runner``): its ``config.json``, ``secret`` and ``admin-secret``;
  the coordinator listens in the root namespace, each worker on its identity address inside its
  host's namespace;
* a **torchrun job** (``lab.orchestrate.torchjob``, one ``torchrun`` per host namespace):
  the ``config`` that rank 0 records in the job's run database once every rank has joined (the
  roster: each rank's data-plane address, the coordinator's port, the job's fresh run number)
  and the secret the job was started with; the coordinator runs inside rank 0's process, so in
  host 0's namespace. A launched job has no admin key.

A :class:`Victim` is the live side: it starts the run, polls its processes, names the ones whose
memory is watched, and tears everything down on exit. :class:`LabVictim` wraps a ``LabRun``;
:class:`JobVictim` starts the torchrun job on a lab network of its own.
"""

from __future__ import annotations

import enum
import inspect
import json
import secrets
import sqlite3
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol

from crew.config import ConfigError, RunConfig
from crew.runtime import rundb
from crew.runtime.coordinator import HANDSHAKE_S as COORDINATOR_HANDSHAKE_S
from crew.wire.transport import Transport
from lab.net.mesh import LabNetwork
from lab.net.preflight import Capabilities
from lab.orchestrate.flood import Target
from lab.orchestrate.replay import Keys
from lab.orchestrate.runner import LabRun, free_mgmt_subnet
from lab.orchestrate.torchjob import EXAMPLE, rank_env, start_ranks
from lab.spec.topology import TopologySpec

# The data plane's handshake deadline: a worker's Transport keeps its default connect_timeout.
WORKER_HANDSHAKE_S = float(inspect.signature(Transport).parameters["connect_timeout"].default)
SECRET_FILE = "secret"  # in a job's folder: the key it was started with, as an insider holds it

# A listening port, and the worker behind it (None: the coordinator).
Listener = tuple[Target, int | None]


class TargetKind(enum.StrEnum):
    LAB = "lab"
    TORCHRUN = "torchrun"


class TargetError(Exception):
    """A run has not published what the attacks need (yet), or published it malformed."""


@dataclass(frozen=True)
class HostileTarget:
    """Everything the attack phases need of a run, whatever started it."""

    kind: TargetKind
    n: int
    db_path: Path
    listeners: tuple[Listener, ...]  # the coordinator first, then worker 0, 1, ...
    keys: Keys
    p: int  # the run's group size when it started

    @property
    def coordinator(self) -> Target:
        return self.listeners[0][0]

    @property
    def admin_identity(self) -> str:
        """Who may administer the run, as the report states it."""
        if self.keys.admin_secret is not None:
            return "the lab's admin key (admin-secret): Admin only on a session opened with it"
        return (
            "none: the coordinator holds the run's key alone, so a HELLO naming the lab is"
            " refused at the handshake and Admin is refused on every session"
        )


def listeners_of(
    cfg: RunConfig, coordinator_netns: int | None, host_netns: Sequence[int | None]
) -> tuple[Listener, ...]:
    """The coordinator's and every worker's listening port from a run's config, each with the
    namespace to reach it from (a process in it; None: this one's)."""
    if len(host_netns) != cfg.n:
        raise TargetError(f"{len(host_netns)} namespaces for {cfg.n} workers")
    out: list[Listener] = [
        (
            Target(
                "coordinator",
                cfg.coordinator_host,
                cfg.coordinator_port,
                coordinator_netns,
                COORDINATOR_HANDSHAKE_S,
            ),
            None,
        )
    ]
    for i in range(cfg.n):
        host, port = cfg.data_address(i)
        out.append((Target(f"w{i}", host, port, host_netns[i], WORKER_HANDSHAKE_S), i))
    return tuple(out)


def job_config(db_path: Path) -> RunConfig:
    """The RunConfig a launched job recorded in its run database (meta ``config``);
    :class:`TargetError` if the database or the record is not there yet, or is malformed."""
    if not db_path.is_file():
        raise TargetError(f"{db_path}: no run database yet")
    try:
        with rundb.reading(db_path) as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()
    except sqlite3.Error as exc:
        raise TargetError(f"{db_path}: {exc}") from exc
    if row is None:
        raise TargetError(f"{db_path}: the job has not recorded its config yet")
    try:
        cfg = RunConfig.from_dict(json.loads(row[0]), where=f"{db_path} meta config")
    except (json.JSONDecodeError, ConfigError) as exc:
        raise TargetError(str(exc)) from exc
    if cfg.coordinator_port == 0 or len(cfg.data_ports) != cfg.n:
        raise TargetError(f"{db_path}: the recorded config names no listening ports")
    return cfg


def job_target(job_dir: Path, host_netns: Sequence[int | None]) -> HostileTarget:
    """A torchrun job's description from its folder: the run database's config and the secret
    (``SECRET_FILE``) it was started with. The coordinator lives in rank 0's process."""
    db_path = job_dir / "run" / "run.db"
    cfg = job_config(db_path)
    secret = (job_dir / SECRET_FILE).read_bytes()
    return HostileTarget(
        TargetKind.TORCHRUN,
        cfg.n,
        db_path,
        listeners_of(cfg, host_netns[0], host_netns),
        Keys.of_config(cfg, secret),
        cfg.p,
    )


def lab_target(run_dir: Path, db_path: Path, host_netns: Sequence[int | None]) -> HostileTarget:
    """A lab's description from its run folder; its coordinator is in the root namespace."""
    cfg = RunConfig.load(run_dir / "config.json")
    return HostileTarget(
        TargetKind.LAB,
        cfg.n,
        db_path,
        listeners_of(cfg, None, host_netns),
        Keys.of_run(run_dir),
        cfg.p,
    )


# -- the live side -----------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (every thread's children), [] once it is gone."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def descendant_running(pid: int, word: str, depth: int = 4) -> int | None:
    """The first process under ``pid`` (not ``pid`` itself, at most ``depth`` generations
    down) whose command line holds ``word``; None if there is none (yet)."""
    level = children(pid)
    for _ in range(depth):
        nxt: list[int] = []
        for p in level:
            try:
                cmdline = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if word.encode() in cmdline:
                return p
            nxt += children(p)
        level = nxt
    return None


class Victim(Protocol):
    """A run under attack, started on ``__enter__`` and torn down on ``__exit__``."""

    kind: TargetKind
    n: int
    db_path: Path
    crashed: dict[int, int]  # worker -> exit code, for each that ended under attack
    restarts: int  # coordinator restarts

    def __enter__(self) -> Victim: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def poll(self) -> None: ...

    def processes(self) -> list[tuple[str, int]]:
        """(name, pid) of every process whose memory is watched."""
        ...

    def published(self) -> bool:
        """Whether the run has published what :meth:`describe` reads."""
        ...

    def describe(self) -> HostileTarget: ...


class LabVictim:
    """A lab run by ``LabRun`` (the synthetic workload, no dashboard)."""

    kind = TargetKind.LAB

    def __init__(self, lab: LabRun, run_dir: Path) -> None:
        self.lab = lab
        self.run_dir = run_dir
        self.n = lab.topo.n
        self.db_path = lab.db_path
        self.crashed: dict[int, int] = {}
        self.restarts = 0

    def __enter__(self) -> LabVictim:
        self.lab.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.lab.__exit__(exc_type, exc, tb)

    def poll(self) -> None:
        self.lab.poll()
        self.crashed = dict(self.lab.crashed)
        self.restarts = self.lab.coordinator_restarts

    def processes(self) -> list[tuple[str, int]]:
        lab = self.lab
        procs = [] if lab.coordinator is None else [("coordinator", lab.coordinator.pid)]
        return procs + [(f"w{i}", p.pid) for i, p in sorted(lab.workers.items())]

    def published(self) -> bool:
        return True  # the lab writes config.json before it starts a process

    def describe(self) -> HostileTarget:
        assert self.lab.net is not None
        net = self.lab.net
        return lab_target(self.run_dir, self.db_path, [net.host_pid(i) for i in range(self.n)])


class JobVictim:
    """``examples/train_digits.py`` through one ``torchrun`` per host namespace of a lab network
    of its own, given a fresh secret that it also writes to ``job_dir/secret`` (0600): the
    insider's copy the replay phase reads. The ranks run ``steps`` steps at most; whatever is
    still running on exit is stopped with the network. ``script_args``: more of the script's
    options; ``wrappers``: see ``lab.orchestrate.torchjob.start_ranks``."""

    kind = TargetKind.TORCHRUN

    def __init__(
        self,
        topo: TopologySpec,
        caps: Capabilities,
        job_dir: Path,
        *,
        group_size: int,
        steps: int,
        wrappers: Mapping[int, Sequence[str]] | None = None,
        script_args: Sequence[str] = (),
    ) -> None:
        self.wrappers = dict(wrappers or {})  # host -> a module its torchrun runs the script in
        self.topo = topo
        self.caps = caps
        self.job_dir = job_dir
        self.n = topo.n
        self.db_path = job_dir / "run" / "run.db"
        self.script_args = ["--group-size", str(group_size), "--steps", str(steps), *script_args]
        self.crashed: dict[int, int] = {}
        self.restarts = 0  # torchrun restarts no worker (--max-restarts 0): a crash is a crash
        self.net: LabNetwork | None = None
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> JobVictim:
        self.job_dir.mkdir(parents=True, exist_ok=True)
        secret = secrets.token_hex(32)
        path = self.job_dir / SECRET_FILE
        path.touch(mode=0o600)
        path.write_text(secret)
        self.net = LabNetwork(
            self.topo,
            tag="h" + secrets.token_hex(2),
            state_dir=self.job_dir / "state",
            capabilities=self.caps,
            mgmt_subnet=free_mgmt_subnet(),
        )
        self.net.__enter__()
        try:
            run_dir = self.job_dir / "run"
            envs = [rank_env(self.net, i, secret, run_dir) for i in range(self.n)]
            self.procs = start_ranks(self.net, self.job_dir, self.script_args, envs, self.wrappers)
        except BaseException:
            self.net.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self.net is not None
        try:
            for proc in self.procs:
                self.net.stop_process(proc)
        finally:
            self.net.stop()

    def poll(self) -> None:
        for i, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None:
                self.crashed[i] = code  # 0 too: a job that ended under attack ran too short

    def processes(self) -> list[tuple[str, int]]:
        out = []
        for i, proc in enumerate(self.procs):
            # The trainer torchrun started (its own command line names the script too).
            pid = descendant_running(proc.pid, EXAMPLE)
            if pid is not None:
                out.append((f"w{i}", pid))
        return out

    def published(self) -> bool:
        try:
            job_config(self.db_path)
        except TargetError:
            return False
        return True

    def describe(self) -> HostileTarget:
        assert self.net is not None
        return job_target(self.job_dir, [self.net.host_pid(i) for i in range(self.n)])
