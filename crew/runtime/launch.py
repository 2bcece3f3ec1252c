"""Launching a CREW job with ``torchrun`` (or any launcher that sets the same variables).

Read from the environment (:meth:`LaunchEnv.from_environ`):

* ``RANK``, ``WORLD_SIZE`` (and ``LOCAL_RANK``): this worker and the job's size;
* ``MASTER_ADDR``, ``MASTER_PORT``: where the CREW coordinator is, on port ``MASTER_PORT + 1``
  (``torchrun`` itself uses ``MASTER_PORT``). ``CREW_COORDINATOR=host:port`` overrides both
  and means that a separate ``python -m crew.runtime.coordinator --world N`` hosts the coordinator;
  otherwise rank 0 hosts it, in a thread of its own process;
* ``CREW_SECRET`` or ``CREW_SECRET_FILE``: the run's key (at least 16 bytes), the same on every
  rank. There is no default: frames are authenticated with it;
* ``CREW_DATA_HOST`` (optional): the address peers reach this worker's data plane at; by
  default the local address of its connection to the coordinator;
* ``CREW_DATA_PORT`` (optional): the port this worker's data plane listens on, ``P`` or a range
  ``A-B`` (several ranks on one host: each takes the first free port of the range); by default
  any free port. ``Averager(data_port=...)`` overrides it (:func:`data_port_range`);
* ``CREW_CONTROL_PORT`` (optional, host only): the port the coordinator listens on for the
  workers' control connections once the job has started; by default any free port;
* ``CREW_RUN_DIR`` (optional, host only): where the coordinator keeps its run database
  (``run.db``); a fresh temporary directory by default;
* ``CREW_AGGREGATE`` (optional, host only): ``clip`` combines each group by CenteredClip with a
  learned radius (``CREW_CLIP_RADIUS``, ``CREW_CLIP_FACTOR``; :func:`aggregation`), bounding
  what a rank that poisons its own vector can do; by default the weighted mean;
* ``TORCHELASTIC_RUN_ID`` (set by ``torchrun``): keys the rendezvous with the secret, so a
  rank of another launch is refused there.

Every job runs under a run number of its own: rank 0 draws it at random and sends it to every
rank in the job's RunConfig, and the data plane and the coordinator accept frames of that
number only. So two jobs refuse each other's frames even under one secret and one run id.

:class:`JobHost` is the host's side: the rendezvous (``crew.runtime.rendezvous``), then the
coordinator (``crew.runtime.coordinator``) on its own thread, serving until every worker has left.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from crew.config import AGGREGATES, CHECK_MODES, ConfigError, RunConfig, Scheme
from crew.config_checks import clip_number_problem
from crew.errors import JoinRefused, LaunchError, PortError, SecretError
from crew.runtime.rendezvous import (
    DEFAULT_PROBE_BYTES,
    DEFAULT_PROBE_SECONDS,
    ProbeFigures,
    RendezvousHost,
)
from crew.wire.frames import FrameCodec
from crew.wire.transport import Address

log = logging.getLogger("crew.runtime.launch")

MIN_SECRET_BYTES = 16
CLOSE_WAIT_S = 120.0  # the host's close() waits at most this long for the other workers
MAX_PORT = 65535
DATA_PORT_ENV = "CREW_DATA_PORT"
CONTROL_PORT_ENV = "CREW_CONTROL_PORT"


@dataclass(frozen=True)
class LaunchEnv:
    """Where this worker stands in the job, from the launcher's environment variables."""

    rank: int
    world: int
    local_rank: int
    coordinator: Address
    host_coordinator: bool  # rank 0 hosts it (no CREW_COORDINATOR given)
    run_id: str

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> LaunchEnv:
        """Read the variables; :class:`LaunchError` names a missing or malformed one."""
        env = os.environ if env is None else env

        def number(name: str, default: str | None = None) -> int:
            raw = env.get(name, default)
            if raw is None:
                raise LaunchError(
                    f"{name} is not set: start the script with torchrun (or set RANK, WORLD_SIZE,"
                    f" MASTER_ADDR and MASTER_PORT)"
                )
            try:
                return int(raw)
            except ValueError:
                raise LaunchError(f"{name}={raw!r} is not an integer") from None

        rank, world = number("RANK"), number("WORLD_SIZE")
        if world < 1 or not 0 <= rank < world:
            raise LaunchError(f"RANK={rank} must be in 0..WORLD_SIZE-1 (WORLD_SIZE={world})")
        given = env.get("CREW_COORDINATOR")
        if given:
            host, sep, port = given.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise LaunchError(f"CREW_COORDINATOR={given!r} must be host:port")
            coordinator = (host, int(port))
        else:
            host = env.get("MASTER_ADDR")
            if not host:
                raise LaunchError("MASTER_ADDR is not set (or set CREW_COORDINATOR=host:port)")
            coordinator = (host, number("MASTER_PORT") + 1)
        return cls(
            rank=rank,
            world=world,
            local_rank=number("LOCAL_RANK", "0"),
            coordinator=coordinator,
            host_coordinator=not given,
            run_id=env.get("TORCHELASTIC_RUN_ID", "") or "crew",
        )


@dataclass(frozen=True)
class PortRange:
    """The ports a listener may take, ``first`` to ``last`` inclusive; ``PortRange(0, 0)`` is
    any free port (the kernel's choice). ``source`` names the setting, for error messages."""

    first: int
    last: int
    source: str = "data_port"

    def __post_init__(self) -> None:
        if self.first == 0 and self.last == 0:
            return
        if not 1 <= self.first <= self.last <= MAX_PORT:
            raise PortError(
                f"{self.source}: ports must satisfy 1 <= first <= last <= {MAX_PORT}"
                f" (or be 0 for any free port), got {self.first}-{self.last}"
            )

    @property
    def ports(self) -> range:
        """The ports to try, in order (a range of one 0 for any free port)."""
        return range(self.first, self.last + 1)

    def __str__(self) -> str:
        if self.first == self.last:
            return "any free port" if self.first == 0 else str(self.first)
        return f"{self.first}-{self.last}"


def parse_port_range(value: int | str, source: str) -> PortRange:
    """``29600``, ``"29600"`` or ``"29600-29607"`` (0: any free port) as a :class:`PortRange`;
    :class:`PortError` naming ``source`` if it is anything else."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise PortError(
            f"{source}: a port or a range 'A-B' (int or str), got {type(value).__name__}"
        )
    if isinstance(value, int):
        if not 0 <= value <= MAX_PORT:
            raise PortError(f"{source}: a port in 1..{MAX_PORT} (0: any free), got {value}")
        return PortRange(value, value, source)
    text = value.strip()
    first, sep, last = text.partition("-")
    if not first.strip().isdigit() or (sep and not last.strip().isdigit()):
        raise PortError(f"{source}: a port or a range 'A-B' of ports, got {value!r}")
    lo = int(first)
    hi = int(last) if sep else lo
    if sep and lo == 0:
        raise PortError(f"{source}: a range starts at port 1 or above, got {value!r}")
    if not 0 <= lo <= MAX_PORT or not 0 <= hi <= MAX_PORT:
        raise PortError(f"{source}: ports are in 1..{MAX_PORT} (0: any free), got {value!r}")
    return PortRange(lo, hi, source)


def data_port_range(data_port: int | str | None, env: Mapping[str, str]) -> PortRange:
    """Where this rank's data plane listens: ``data_port`` if given, else ``CREW_DATA_PORT``,
    else any free port."""
    if data_port is not None:
        return parse_port_range(data_port, "data_port")
    raw = env.get(DATA_PORT_ENV, "").strip()
    return parse_port_range(raw, DATA_PORT_ENV) if raw else PortRange(0, 0, DATA_PORT_ENV)


def control_port(env: Mapping[str, str] | None = None) -> int:
    """The coordinator's control port from ``CREW_CONTROL_PORT`` (one port; 0 or unset: any
    free port)."""
    env = os.environ if env is None else env
    raw = env.get(CONTROL_PORT_ENV, "").strip()
    if not raw:
        return 0
    ports = parse_port_range(raw, CONTROL_PORT_ENV)
    if ports.first != ports.last:
        raise PortError(f"{CONTROL_PORT_ENV}: one port (the coordinator has one), got {raw!r}")
    return ports.first


ENCRYPT_ENV = "CREW_ENCRYPT"


def encryption(env: Mapping[str, str] | None = None) -> bool:
    """Whether a launched job encrypts its connections: yes unless ``CREW_ENCRYPT`` is 0 (or
    false, no, off). Every rank must agree; a rank that does not is refused at its handshake,
    with a message that says so. :class:`LaunchError` for any other value."""
    env = os.environ if env is None else env
    value = env.get(ENCRYPT_ENV, "1").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise LaunchError(f"{ENCRYPT_ENV}={value!r}: use 1 (encrypt, the default) or 0")


CHECK_ENV = "CREW_CHECK"


def check_mode(env: Mapping[str, str] | None = None) -> str:
    """How a launched job checks each group's result before Commit: ``secret`` (the default:
    a job's relays and aggregators are other parties' machines on open networks, and the
    secret check catches one that tampers, ``crew.control.secretcheck``) unless
    ``CREW_CHECK=public`` (one control round trip less per group). Only the coordinator's
    setting counts. :class:`LaunchError` for any other value."""
    env = os.environ if env is None else env
    value = env.get(CHECK_ENV, "secret").strip().lower()
    if value in CHECK_MODES:
        return value
    raise LaunchError(f"{CHECK_ENV}={value!r}: use secret (the default) or public")


AGGREGATE_ENV = "CREW_AGGREGATE"
CLIP_RADIUS_ENV = "CREW_CLIP_RADIUS"
CLIP_FACTOR_ENV = "CREW_CLIP_FACTOR"


@dataclass(frozen=True)
class Aggregation:
    """How a launched job's groups combine: the weighted mean, or CenteredClip
    (``crew.control.clipping``) with its radius ceiling and factor (``crew.control.clipradius``)."""

    aggregate: str = AGGREGATES[0]
    clip_radius: float = RunConfig.default("clip_radius")
    clip_factor: float = RunConfig.default("clip_factor")

    def scheme_for(self, scheme: str) -> str:
        """``scheme``, or CREW's star planner when clipping asks for stars and ``scheme`` is
        CREW's route LP, which may relay a member's copy (``crew.config.CLIP_SCHEMES``)."""
        if self.aggregate == AGGREGATES[1] and scheme == Scheme.CREW.value:
            return Scheme.CREW_STAR.value
        return scheme


def aggregation(env: Mapping[str, str] | None = None) -> Aggregation:
    """The job's aggregation from ``CREW_AGGREGATE`` (``mean``, the default, or ``clip``),
    ``CREW_CLIP_RADIUS`` and ``CREW_CLIP_FACTOR``. Only the coordinator's setting counts.
    :class:`LaunchError` naming the variable for a bad value."""
    env = os.environ if env is None else env
    value = env.get(AGGREGATE_ENV, AGGREGATES[0]).strip().lower()
    if value not in AGGREGATES:
        raise LaunchError(f"{AGGREGATE_ENV}={value!r}: use mean (the default) or clip")
    numbers = {}
    for name, field_name in ((CLIP_RADIUS_ENV, "clip_radius"), (CLIP_FACTOR_ENV, "clip_factor")):
        text = env.get(name, "").strip()
        if not text:
            continue
        try:
            number = float(text)
        except ValueError:
            raise LaunchError(f"{name}={text!r}: not a number") from None
        problem = clip_number_problem(field_name, number)
        if problem is not None:
            raise LaunchError(f"{name}={text!r}: {problem}")
        numbers[field_name] = number
    return Aggregation(value, **numbers)


def read_secret(env: Mapping[str, str] | None = None) -> bytes:
    """The run's secret from ``CREW_SECRET_FILE`` (its bytes, a trailing newline dropped) or
    ``CREW_SECRET``; :class:`SecretError` if neither is set or it is shorter than 16 bytes."""
    env = os.environ if env is None else env
    path = env.get("CREW_SECRET_FILE")
    if path:
        try:
            secret = Path(path).read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise SecretError(f"CREW_SECRET_FILE={path}: cannot read it: {exc}") from exc
        where = f"CREW_SECRET_FILE={path}"
    elif env.get("CREW_SECRET"):
        secret = env["CREW_SECRET"].encode()
        where = "CREW_SECRET"
    else:
        raise SecretError(
            "no secret: set CREW_SECRET_FILE (a file readable only by you) or CREW_SECRET to the"
            " same random string on every rank, e.g. `openssl rand -hex 32`"
        )
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(f"{where}: the secret has {len(secret)} bytes, at least 16 needed")
    return secret


def rendezvous_number(secret: bytes, run_id: str) -> int:
    """The u32 the rendezvous' frames carry (and the start-up probe's), from the secret and the
    launcher's run id: nothing is agreed yet, so every rank derives the same. The job then runs
    under a fresh number of its own (:class:`JobHost`, ``RunConfig.run_num``)."""
    digest = hmac.new(secret, f"crew-run:{run_id}".encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:4], "big")


def job_config(
    addresses: Sequence[Address],
    bw_mbit: Sequence[Sequence[float]],
    *,
    run_num: int,
    run_dir: Path,
    group_size: int,
    coordinator: Address,
    scheme: str = "crew",
    measured: bool = True,
    compress: str = "none",
    encrypt: bool = True,
    check: str = "secret",
    aggregation: Aggregation = Aggregation(),
) -> RunConfig:
    """The RunConfig of a launched job (one data-plane port per worker)."""
    n = len(addresses)
    try:
        return RunConfig(
            run_id=run_dir.name,
            run_num=run_num,
            run_dir=str(run_dir),
            secret_path="",  # launched jobs hold the secret in memory, never in the config
            n=n,
            p=group_size,
            scheme=aggregation.scheme_for(scheme),
            coordinator_host=coordinator[0],
            coordinator_port=coordinator[1],
            data_port=0,
            identities=tuple(h for h, _ in addresses),
            data_ports=tuple(p for _, p in addresses),
            bw_mbit=tuple(tuple(float(x) for x in row) for row in bw_mbit),
            capacity="measured" if measured else "configured",
            compress=compress,
            encrypt=encrypt,
            check=check,
            aggregate=aggregation.aggregate,
            clip_radius=aggregation.clip_radius,
            clip_factor=aggregation.clip_factor,
        )
    except ConfigError as exc:
        raise JoinRefused(f"the job's configuration is invalid: {exc}") from exc


class JobHost:
    """The host of a launched job: rendezvous, then the coordinator on a thread.

    ``capacities`` (Mbit/s, ``[src][dst]``) replaces the start-up probe when given.
    ``control_port``: where the coordinator listens for the workers once the job has started
    (0: any free port); checked free here, so a taken port fails before the rendezvous.
    ``compress``: the codec of group payloads (``crew.train.compress``), the same for all.
    ``rendezvous_run``: the number of the rendezvous' frames (:func:`rendezvous_number`);
    ``run_num``, the job's own, is drawn here at random, so that no other job has it, even one
    under the same secret and run id."""

    def __init__(
        self,
        secret: bytes,
        world: int,
        bind: Address,
        advertised_host: str,
        *,
        rendezvous_run: int,
        group_size: int,
        capacities: Sequence[Sequence[float]] | None = None,
        scheme: str = Scheme.CREW.value,
        run_dir: str | Path | None = None,
        join_timeout: float = 60.0,
        probe_bytes: int = DEFAULT_PROBE_BYTES,
        probe_seconds: float = DEFAULT_PROBE_SECONDS,
        control_port: int = 0,
        compress: str = "none",
        encrypt: bool = True,
        check: str = "secret",
        aggregation: Aggregation = Aggregation(),
    ) -> None:
        if capacities is not None and (
            len(capacities) != world or any(len(row) != world for row in capacities)
        ):
            raise LaunchError(f"capacities: must be {world}x{world} (Mbit/s, [src][dst])")
        if control_port:
            _check_free(bind[0], control_port, CONTROL_PORT_ENV)
        self.control_port = control_port
        self.compress = compress
        self.encrypt = encrypt
        self.check = check
        self.aggregation = aggregation
        self.secret = secret
        self.world = world
        self.bind = bind
        self.advertised_host = advertised_host
        self.run_num = secrets.randbits(32)
        self.group_size = group_size
        self.capacities = capacities
        self.scheme = scheme
        self.run_dir = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="crew-run-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.probe: ProbeFigures | None = None
        self.coordinator = None  # crew.runtime.coordinator.Coordinator once the job starts
        self._db = None
        self._thread: threading.Thread | None = None
        self.rendezvous = RendezvousHost(
            FrameCodec(secret, rendezvous_run, encrypt=encrypt),
            world,
            bind,
            self._make_config,
            join_timeout=join_timeout,
            probe_bytes=probe_bytes,
            probe_seconds=probe_seconds,
            measure=capacities is None,
        )

    @property
    def port(self) -> int:
        return self.rendezvous.port

    def _make_config(
        self, addresses: list[Address], bw: list[list[float]], figures: ProbeFigures
    ) -> RunConfig:
        from crew.runtime.coordinator import Coordinator
        from crew.runtime.rundb import RunDB

        self.probe = figures
        measured = self.capacities is None
        cfg = job_config(
            addresses,
            bw if measured else self.capacities,
            run_num=self.run_num,
            run_dir=self.run_dir,
            group_size=self.group_size,
            coordinator=(self.advertised_host, 0),
            scheme=self.scheme,
            measured=measured,
            compress=self.compress,
            encrypt=self.encrypt,
            check=self.check,
            aggregation=self.aggregation,
        )
        self._db = RunDB(self.run_dir / "run.db")
        try:
            coord = Coordinator(cfg, self._db, self.bind[0], self.control_port, secret=self.secret)
        except OSError as exc:  # refused to every rank, naming the setting
            raise JoinRefused(
                f"the coordinator cannot listen on {CONTROL_PORT_ENV}={self.control_port}: {exc}"
            ) from exc
        cfg = replace(cfg, coordinator_port=coord.port)
        coord.cfg = cfg  # the life cycle only reads n, p and capacities, the same in both
        self._record_job(cfg, addresses, started_at=time.time() - figures.seconds)
        self._db.event(
            "probe",
            f"start-up probe: {figures.seconds:.2f} s, {figures.rounds} rounds,"
            f" {figures.bytes_per_worker} bytes per worker,"
            f" {figures.links_measured}/{self.world * (self.world - 1)} links measured",
            data={
                "bw_mbit": [list(r) for r in cfg.bw_mbit],
                "measured": measured,
                "seconds": figures.seconds,
                "bytes_per_worker": figures.bytes_per_worker,
                "rounds": figures.rounds,
                "links_measured": figures.links_measured,
            },
        )
        self.coordinator = coord
        self._thread = threading.Thread(target=coord.run, name="crew-coordinator", daemon=True)
        self._thread.start()
        log.info("coordinator for %d workers on port %d", self.world, coord.port)
        return cfg

    def _record_job(
        self, cfg: RunConfig, addresses: Sequence[Address], *, started_at: float
    ) -> None:
        """The facts a lab run also records, so ``python -m dashboard`` reads a job's run.db
        as it reads a lab's: the run (id, scheme, p, when the start-up probe began), one worker
        per rank (its machine as its cloud) and the directed links at the rates the job
        started with. ``config`` is the job's RunConfig, as a lab's ``config.json``: where the
        coordinator and every rank's data plane listen, and the job's run number; it holds no
        secret (a launched job keeps its key in memory)."""
        from crew.runtime.rundb import LinkRow, WorkerRow

        assert self._db is not None
        self._db.set_meta(
            {
                "run_id": cfg.run_id,
                "started_at": str(started_at),
                "scheme": Scheme(cfg.scheme).value,
                "p": str(cfg.p),
                "n": str(cfg.n),
                "topology_name": "launched job",
                "config": cfg.to_json(),
            }
        )
        self._db.add_workers(
            WorkerRow(rank, f"rank {rank}", host, f"{host}:{port}")
            for rank, (host, port) in enumerate(addresses)
        )
        self._db.add_links(
            LinkRow(src, dst, float(cfg.bw_mbit[src][dst]))
            for src in range(cfg.n)
            for dst in range(cfg.n)
            if src != dst
        )

    def start(self) -> None:
        self.rendezvous.start()

    def serve(self, timeout: float | None = None) -> None:
        """Block until every worker has left after the job started (or the rendezvous
        failed), at most ``timeout`` seconds; then stop the coordinator."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.rendezvous.join(timeout)
        coord = self.coordinator
        if coord is not None:
            while deadline is None or time.monotonic() < deadline:
                # Every rank registers once the job started (a worker_status row each), and
                # leaves by closing its control connection.
                live = len(coord.life.connected)  # another thread's set: only its size
                (row,) = coord.db.query("SELECT COUNT(*) AS n FROM worker_status")
                if (row["n"] >= self.world and live == 0) or coord.stop_event.is_set():
                    break
                if self._thread is not None and not self._thread.is_alive():
                    break  # the coordinator ended without being asked: nothing to wait for
                time.sleep(0.2)
        self.close()

    def stop(self) -> None:
        """Make :meth:`serve` end soon and close this host itself (from any thread)."""
        self.rendezvous.stop()
        coord = self.coordinator
        if coord is not None:
            coord.stop_event.set()

    def close(self) -> None:
        self.rendezvous.close()
        coord = self.coordinator
        if coord is not None:
            coord.stop_event.set()
            if self._thread is not None:
                self._thread.join(timeout=5.0)
        if self._db is not None:
            if coord is not None:  # the job ran: a finished run, which the dashboard replays
                self._db.set_meta({"ended_at": str(time.time())})
            self._db.close()
            self._db = None


def _check_free(host: str, port: int, source: str) -> None:
    """:class:`PortError` naming ``source`` if ``port`` cannot be listened on at ``host`` now."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise PortError(f"{source}={port}: cannot listen on it at {host or '*'}: {exc}") from exc
