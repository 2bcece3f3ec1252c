"""One lab run, from an empty machine to a finished database and back to an empty machine.

``LabRun`` is a context manager: entering it builds the emulated network, starts the
coordinator (root namespace), one worker per host namespace, the link monitor and, if asked,
the dashboard; leaving it stops them all and tears the network down, whatever happened in
between. ``python -m lab.run`` is a thin command line around it, and tests and benchmarks use
it directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import resource
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from crew.config import (
    RunConfig,
    Scheme,
    run_data_dir,
)
from crew.ratetrace import RateTrace
from crew.runtime.rundb import (
    GroupStatus,
    LinkRow,
    RunDB,
    WorkerRow,
    WorkerState,
)
from crew.train.workloads import DEFAULTS, Workload
from lab.net import shaping
from lab.net.cleanup import ProcRecord, cleanup_leftovers, end_group
from lab.net.lifeline import lifeline
from lab.net.mesh import LabError, LabNetwork
from lab.net.monitor import LinkMonitor
from lab.net.preflight import Capabilities, ImpairmentMode, describe
from lab.orchestrate import commands as cmds
from lab.orchestrate import hostbusy
from lab.orchestrate.admin import AdminChannel
from lab.orchestrate.drift import DriftApplier, RateChange, lab_schedule
from lab.orchestrate.faults import FaultInjector
from lab.spec.scenario import Scenario, ScenarioPlayer
from lab.spec.topology import Impairment, TopologySpec, planner_shared_links

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
MGMT_LOCK = Path("/run/crew-lab.mgmt.lock")  # machine-wide, whatever a lab's state dir
COORDINATOR_PORT = 7700
DATA_PORT = 7701
STOP_GRACE_S = 15.0
MAX_COORDINATOR_RESTARTS = 5  # a coordinator that keeps dying is a bug, not a fault
ROOT_STOP_S = 10.0  # the dashboard, and a coordinator that outlived STOP_GRACE_S
HOST_READY_WAIT_S = 600.0  # past this, the host's training window stays open from the launch
LM_EVAL_EVERY_S = 10.0  # seconds between held-out evaluations of the lm workload
SPLIT_WAIT_S = 120.0  # importing scikit-learn and splitting: about 1.5 s of CPU


@dataclass(frozen=True)
class RunOptions:
    """Everything ``python -m lab.run`` can set. Defaults give an interesting run on 2 cores.

    What the processes share takes its default from ``RunConfig`` (its fields, or their flags'
    metadata), the one source that ``lab.run``'s flags (``crew.cli_options``) read too."""

    p: int = RunConfig.default("p")
    scheme: Scheme = RunConfig.default("scheme")
    seed: int = RunConfig.default("seed")
    width: int = RunConfig.default("width")
    depth: int = RunConfig.default("depth")
    partition: str = RunConfig.default("partition")
    staleness: bool = RunConfig.default("staleness")
    part_bytes: int = RunConfig.default("part_bytes")  # 0: automatic (RunConfig.part_elems_for)
    flow_order: str = RunConfig.default("flow_order")
    nonblocking: bool = RunConfig.default("nonblocking")
    quorum_min: int = RunConfig.default("quorum_min")  # 0: groups of exactly p
    quorum_max: int = RunConfig.default("quorum_max")  # 0: all workers
    # None: the planner's default for n (crew.plan.candidates.default_helpers); -1: every worker
    helpers: int | None = None
    committed_capacity: bool = RunConfig.default("committed_capacity")
    plan_ahead: bool = RunConfig.default("plan_ahead")
    # bytes crew's route LP counts a part to wait behind at each hop (RunConfig)
    hop_backlog_bytes: int = RunConfig.default("hop_backlog_bytes")
    capacity: str = RunConfig.default("capacity")
    encrypt: bool = RunConfig.default("encrypt")
    check: str = RunConfig.default("check")  # public or secret (crew.control.secretcheck)
    aggregate: str = RunConfig.default("aggregate")  # mean or clip (crew.control.clipping)
    clip_radius: float = RunConfig.default("clip_radius")
    clip_factor: float = RunConfig.default("clip_factor")
    # The host's CPU s per GB of link bytes as a planner capacity (crew.plan.hostcpu) on all
    # of this machine's cores; 0: none.
    host_cpu_s_per_gb: float = RunConfig.default("host_cpu_s_per_gb")
    host_cores: float = 0.0  # the cores of that capacity; 0: this machine's
    lr: float | None = None  # None: the workload's default (crew.train.workloads.DEFAULTS)
    batch_size: int | None = None  # None: the workload's default
    local_steps: int = RunConfig.default("local_steps")
    workload: str = RunConfig.default("workload")  # mlp (digits), lm (stdlib text) or synthetic
    model_mb: float = RunConfig.default("model_mb")  # the synthetic workload's vector size
    sync: str = RunConfig.default("sync")  # every-step, local-sgd or diloco
    outer_lr: float = RunConfig.default("outer_lr")
    outer_momentum: float = RunConfig.default("outer_momentum")
    compress: str = RunConfig.default("compress")  # none (float32), fp16 or int8
    overlap: bool = RunConfig.default("overlap")  # train on while the group reduces
    min_iteration_s: float = RunConfig.default("min_iteration_s")  # an accelerator of its own
    dashboard: bool = True
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = 8501
    allow_missing: frozenset[Impairment] = frozenset()
    log_level: str = "INFO"
    # a link with no progress this long counts as failed
    stall_timeout_s: float = RunConfig.default("stall_timeout_s")
    heartbeat_timeout_s: float = RunConfig.default("heartbeat_timeout_s")
    extra: dict[str, Any] = field(default_factory=dict)
    # Links that drift: each directed link's rate trace (lab.spec.ratetraces), replayed at 1 Hz.
    rate_traces: Mapping[tuple[int, int], RateTrace] = field(default_factory=dict)


TRAINING_FIELDS = (
    "workload",
    "sync",
    "local_steps",
    "outer_lr",
    "outer_momentum",
    "overlap",
    "min_iteration_s",
    "compress",
)


def lab_impairments(caps: Capabilities) -> set[str]:
    """What a link can be changed in at run time in this lab.

    Exactly what ``LabNetwork.set_link`` will apply: an impairment whose mode is OFF (no netem,
    and for loss no accepted iptables fallback) is left out, so the dashboard never offers a
    control whose command would then be refused.
    """
    out = {"rate"}
    for imp in Impairment:
        if caps.mode(imp) is not ImpairmentMode.OFF:
            out.add(imp.value)
    return out


def planned_delays(topo: TopologySpec, caps: Capabilities) -> tuple[tuple[float, ...], ...]:
    """The topology's one-way delays (ms) for the planner, where the lab applies them: none
    when no link has one, or when delay is off (no netem, ``--allow-missing delay``)."""
    d = topo.delay_matrix()
    if not d.any() or caps.mode(Impairment.DELAY) is ImpairmentMode.OFF:
        return ()
    return tuple(tuple(float(x) for x in row) for row in d)


def lab_limits(topo: TopologySpec, caps: Capabilities) -> cmds.LabLimits:
    return cmds.LabLimits(
        n=topo.n,
        schemes=tuple(s for s in Scheme if s is not Scheme.GLOO),
        impairments=frozenset(lab_impairments(caps)),
    )


def free_mgmt_subnet() -> str:
    """A management subnet no other lab on this machine uses, so labs can run side by side."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    for third in range(255, 239, -1):
        if f" 198.19.{third}.254/" not in out:
            return f"198.19.{third}.0/24"
    raise RuntimeError("16 labs already run on this machine; stop one first")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


class LabRun:
    """A running lab. Use as ``with LabRun(topo, caps, opts, run_dir) as lab: ...``."""

    def __init__(
        self,
        topo: TopologySpec,
        caps: Capabilities,
        opts: RunOptions,
        run_dir: Path,
        *,
        state_dir: Path | None = None,
        net: LabNetwork | None = None,
        scenario: Scenario | None = None,
        worker_modules: Mapping[int, Sequence[str]] | None = None,
    ):
        self.topo = topo
        # Workers that run another module than crew.runtime.worker, with its extra arguments
        # (index -> (module, *args)): the lab's attacks, such as lab.hostile's poisoning relay
        # (lab.orchestrate.poisoner). It takes the worker's --config, --id and --log-level.
        self.worker_modules = {i: tuple(m) for i, m in (worker_modules or {}).items()}
        for i, m in self.worker_modules.items():
            if not 0 <= i < topo.n or not m:
                raise ValueError(f"worker_modules: worker {i} of {topo.n}, module {m!r}")
        self.caps = caps
        if opts.helpers is None:  # recorded as the count it stands for
            from crew.plan.candidates import default_helpers  # late: the planner imports SciPy

            k = default_helpers(topo.n)
            opts = replace(opts, helpers=-1 if k is None else k)
        self.opts = opts
        self.run_dir = Path(run_dir)
        self.run_id = self.run_dir.name
        self.tag = secrets.token_hex(2)
        self.state_dir = state_dir
        self.db_path = self.run_dir / "lab.db"
        self.config_path = self.run_dir / "config.json"
        self.admin_secret_path = self.run_dir / "admin-secret"
        if self.db_path.exists():
            # Two runs in one database would read as one (and the older one as finished).
            raise LabError(f"{self.run_dir} already holds a run ({self.db_path}); use a new one")
        self.db: RunDB | None = None
        # A network passed in is the caller's (a benchmark reuses one across schemes).
        self.net: LabNetwork | None = net
        self._own_net = net is None
        self.scenario = scenario
        self.player: ScenarioPlayer | None = None
        self.cfg: RunConfig | None = None
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.dashboard: subprocess.Popen[bytes] | None = None
        self._split_maker: subprocess.Popen[bytes] | None = None
        self.monitor: LinkMonitor | None = None
        self.faults: FaultInjector | None = None
        self.drift: DriftApplier | None = None
        self._admin: AdminChannel | None = None
        # Beyond loopback, the dashboard's controls need this (dashboard/__main__.py).
        self._dashboard_token: str | None = None
        self._logs: list[IO[bytes]] = []
        self.started_at = 0.0
        self._cpu_at_start = 0.0
        # The host's training window opens once every worker has been ready (it has started
        # and taken its first step), or at the workers' launch if that never comes.
        self._host_from: hostbusy.HostMark | None = None
        self._host_all_ready = False
        self.exit_codes: dict[int, int] = {}
        # Workers that ended by themselves with an error (not stopped by the lab or a fault
        # command), with their exit codes; a restart does not clear it.
        self.crashed: dict[int, int] = {}
        self._coordinator_gone = False
        self.coordinator_restarts = 0

    # -- life cycle --------------------------------------------------------------------------

    def __enter__(self) -> LabRun:
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _start(self) -> None:
        report = cleanup_leftovers(**({"state_dir": self.state_dir} if self.state_dir else {}))
        if report.cleaned or report.errors:
            log.warning("leftovers of an earlier lab run: %s", report.summary())
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.db = RunDB(self.db_path)
        self.started_at = time.time()
        self._cpu_at_start = lab_cpu_s()
        self._record_run()
        if self.opts.dashboard:
            # First, so the page answers while the network and the workers start.
            self._start_dashboard()
        # The data split (digits, or the lm's stdlib text) is made once, by a process of its
        # own beside the network build, and every worker reads it with NumPy alone.
        if not self.opts.extra.get("bench") and self.opts.workload != "synthetic":
            maker = (
                ["crew.train.textdata"]
                if self.opts.workload == "lm"
                else ["crew.train.datasets", "--seed", str(self.opts.seed)]
            )
            self._split_maker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    maker[0],
                    "--cache-dir",
                    str(run_data_dir(self.run_dir)),
                    *maker[1:],
                ],
                stdout=subprocess.DEVNULL,
                stderr=self._log_file("data-split"),
                cwd=REPO,
                preexec_fn=lifeline(),
            )
        net_kw: dict[str, Any] = {"tag": self.tag, "capabilities": self.caps}
        if self.state_dir:
            net_kw["state_dir"] = self.state_dir
        if self._own_net:
            MGMT_LOCK.parent.mkdir(parents=True, exist_ok=True)
            with open(MGMT_LOCK, "a") as lock:
                # Labs starting at once must not pick the same management subnet: the choice
                # holds only once the bridge has its address.
                fcntl.flock(lock, fcntl.LOCK_EX)
                net_kw["mgmt_subnet"] = free_mgmt_subnet()
                self.net = LabNetwork(self.topo, **net_kw)
                self.net.__enter__()
        assert self.net is not None and self.net.state is not None
        # If this lab is killed, the next lab's clean-up closes the run it leaves open.
        self.net.state.add_run_db(str(self.db_path))
        if self.dashboard is not None:
            self._record_root(self.dashboard, "dashboard")
        self.cfg = self._write_config()
        self.db.add_workers(
            WorkerRow(w.index, w.name, w.cloud, self.net.identity_address(w.index))
            for w in self.topo.workers
        )
        self.db.set_link_intfs(
            {(lk.src, lk.dst): self.net.sender_intf(lk.src, lk.dst) for lk in self.topo.links}
        )
        if self._split_maker is not None:
            if self._split_maker.wait(timeout=SPLIT_WAIT_S) != 0:
                raise LabError(
                    f"making the data split failed; see {self.run_dir / 'logs' / 'data-split.log'}"
                )
        self._start_coordinator()
        for i in range(self.topo.n):
            self.start_worker(i)
        self.monitor = LinkMonitor(self.net, self.db)
        self.monitor.start()
        self._host_from = hostbusy.mark()
        self.faults = FaultInjector(self)
        if self.opts.rate_traces:
            # The oracle planner hears every true rate as it is set; the others must measure.
            tell = self._tell_rate if self.opts.capacity == "oracle" else None
            schedule = lab_schedule(self.opts.rate_traces)
            self.drift = DriftApplier(self.net, self.db, schedule, on_change=tell)
            self.drift.start()
        if self.scenario is not None:
            self.player = ScenarioPlayer(self.scenario, self.db_path, self.started_at)
        self.db.event(
            "start",
            f"lab started: {self.topo.n} workers, scheme {self.opts.scheme}, p={self.opts.p}",
        )
        for i, (module, *args) in sorted(self.worker_modules.items()):
            self.db.event(
                "start", f"worker {i} runs {' '.join([module, *args])}", level="warning", worker=i
            )

    def _record_run(self) -> None:
        assert self.db is not None
        o = self.opts
        self.db.set_meta(
            {
                "run_id": self.run_id,
                "started_at": str(self.started_at),
                "scheme": o.scheme,
                "p": str(o.p),
                "n": str(self.topo.n),
                "topology_name": self.topo.name,
                "topology": json.dumps(self.topo.to_dict()),
                "schemes": json.dumps([s for s in Scheme if s is not Scheme.GLOO]),
                "impairments": json.dumps(sorted(self._impairments())),
                "capabilities": describe(self.caps, self.topo),
                "ack_queue": shaping.ACK_QUEUE_DIRECT,
                "options": json.dumps(
                    {
                        k: v
                        for k, v in o.__dict__.items()
                        if k not in ("allow_missing", "rate_traces")
                    }
                    | {"allow_missing": sorted(i.value for i in o.allow_missing)}
                    | {
                        "rate_traces": {
                            f"{i}->{j}": t.source for (i, j), t in o.rate_traces.items()
                        }
                    }
                ),
            }
        )
        self.db.add_links(
            LinkRow(lk.src, lk.dst, lk.rate_mbit, lk.delay_ms, lk.jitter_ms, lk.loss_pct)
            for lk in self.topo.links
        )

    def _impairments(self) -> set[str]:
        return lab_impairments(self.caps)

    def _write_config(self) -> RunConfig:
        assert self.net is not None
        secret_path = self.run_dir / "secret"
        # The run's key, which every worker holds, and the lab's own, which only the lab and
        # the coordinator read: Admin requests are accepted under the latter alone.
        for path in (secret_path, self.admin_secret_path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(32))
        bw = self.topo.bw_matrix().copy()
        for i in range(self.topo.n):
            bw[i, i] = 0.0  # JSON has no infinity; the coordinator restores the diagonal
        o = self.opts
        defaults = DEFAULTS[Workload(o.workload)]
        cfg = RunConfig(
            run_id=self.run_id,
            run_num=secrets.randbits(32),
            run_dir=str(self.run_dir),
            secret_path=str(secret_path),
            n=self.topo.n,
            p=o.p,
            scheme=o.scheme,
            coordinator_host=self.net.coordinator_address,
            coordinator_port=COORDINATOR_PORT,
            data_port=DATA_PORT,
            identities=tuple(self.net.identity_address(i) for i in range(self.topo.n)),
            bw_mbit=tuple(tuple(float(x) for x in row) for row in bw),
            shared=planner_shared_links(self.topo),
            delay_ms=planned_delays(self.topo, self.caps),
            width=o.width,
            depth=o.depth,
            lr=defaults.lr if o.lr is None else o.lr,
            batch_size=defaults.batch_size if o.batch_size is None else o.batch_size,
            local_steps=o.local_steps,
            sync=o.sync,
            outer_lr=o.outer_lr,
            outer_momentum=o.outer_momentum,
            overlap=o.overlap,
            min_iteration_s=o.min_iteration_s,
            workload=o.workload,
            model_mb=o.model_mb,
            compress=o.compress,
            partition=o.partition,
            seed=o.seed,
            stragglers=tuple(w.straggler for w in self.topo.workers),
            staleness=o.staleness,
            part_bytes=o.part_bytes,
            flow_order=o.flow_order,
            nonblocking=o.nonblocking,
            quorum_min=o.quorum_min,
            quorum_max=o.quorum_max,
            helpers=-1 if o.helpers is None else o.helpers,
            committed_capacity=o.committed_capacity,
            plan_ahead=o.plan_ahead,
            hop_backlog_bytes=o.hop_backlog_bytes,
            capacity=o.capacity,
            encrypt=o.encrypt,
            check=o.check,
            aggregate=o.aggregate,
            clip_radius=o.clip_radius,
            clip_factor=o.clip_factor,
            host_cpu_s_per_gb=o.host_cpu_s_per_gb,
            host_cores=(
                (o.host_cores or float(os.cpu_count() or 1)) if o.host_cpu_s_per_gb > 0 else 0.0
            ),
            stall_timeout_s=o.stall_timeout_s,
            heartbeat_timeout_s=o.heartbeat_timeout_s,
            # An lm evaluation (64 windows of 128 bytes) costs about a training step and a
            # third; every 2 s it would take a third of a quarter-core worker's time.
            eval_every_s=LM_EVAL_EVERY_S if o.workload == "lm" else RunConfig.eval_every_s,
            extra=dict(o.extra),
        )
        cfg.save(self.config_path)
        return cfg

    def _log_file(self, name: str) -> IO[bytes]:
        fh = open(self.run_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - closed in _stop
        self._logs.append(fh)
        return fh

    def _crew_argv(self, module: str, *args: str) -> list[str]:
        """``python -m module`` on this run's config at the lab's log level, plus ``args``."""
        return [
            sys.executable,
            "-m",
            module,
            "--config",
            str(self.config_path),
            *args,
            "--log-level",
            self.opts.log_level,
        ]

    def _start_coordinator(self) -> None:
        assert self.net is not None and self.cfg is not None
        if self._admin is None:
            address = (self.cfg.coordinator_host, self.cfg.coordinator_port)
            self._admin = AdminChannel(
                address, self.admin_secret_path, self.cfg.run_num, encrypt=self.cfg.encrypt
            )
        out = self._log_file("coordinator")
        self.coordinator = subprocess.Popen(
            self._crew_argv(
                "crew.runtime.coordinator",
                "--db",
                str(self.db_path),
                "--admin-secret",
                str(self.admin_secret_path),
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
            preexec_fn=lifeline(),
        )
        self._record_root(self.coordinator, "coordinator")

    def kill_coordinator(self) -> None:
        """A fault: SIGKILL the coordinator; ``poll`` restarts it."""
        coord = self.coordinator
        if coord is None or coord.poll() is not None:
            raise RuntimeError("the coordinator is not running")
        os.killpg(coord.pid, signal.SIGKILL)
        coord.wait(timeout=5.0)

    def start_worker(self, i: int) -> None:
        assert self.net is not None
        out = self._log_file(f"w{i}")
        module, *args = self.worker_modules.get(i, ("crew.runtime.worker",))
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        # Eight workers saturate two cores; the lowest priority keeps the coordinator,
        # the monitor and the dashboard responsive (all workers alike, so none is favoured).
        proc = self.net.popen(
            i,
            self._crew_argv(module, "--id", str(i), *args),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            preexec_fn=_lower_priority,
        )
        self.workers[i] = proc

    def stop_worker(self, i: int, *, kill: bool = True) -> None:
        proc = self.workers.get(i)
        if proc is None or self.net is None:
            return
        if kill:
            proc.kill()
        self.net.stop_process(proc, timeout=STOP_GRACE_S)
        self.exit_codes[i] = proc.returncode if proc.returncode is not None else -9

    def _start_dashboard(self) -> None:
        env = dict(os.environ)
        env.pop(cmds.DASHBOARD_TOKEN_ENV, None)
        if self.opts.dashboard_host not in cmds.LOOPBACK_HOSTS:
            # Whoever reaches the page could cut links and kill workers: its controls need a
            # token, which only the address lab.run prints carries.
            self._dashboard_token = secrets.token_urlsafe(16)
            env[cmds.DASHBOARD_TOKEN_ENV] = self._dashboard_token
            log.warning(
                "the dashboard listens on %s, beyond loopback: its controls need the token in"
                " the address printed below",
                self.opts.dashboard_host,
            )
        out = self._log_file("dashboard")
        self.dashboard = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dashboard",
                str(self.run_dir),
                "--host",
                self.opts.dashboard_host,
                "--port",
                str(self.opts.dashboard_port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            start_new_session=True,
            preexec_fn=lifeline(),
        )

    def _record_root(self, proc: subprocess.Popen[bytes], kind: str) -> None:
        """Record a root-namespace process in the lab's state file, for leftover cleanup."""
        assert self.net is not None and self.net.state is not None
        self.net.state.add_proc(ProcRecord.of(proc.pid, kind, kind, group=True))

    def _forget_root(self, proc: subprocess.Popen[bytes] | None) -> None:
        if proc is not None and self.net is not None and self.net.state is not None:
            self.net.state.remove_proc(proc.pid)

    @property
    def dashboard_url(self) -> str:
        """The dashboard's address; beyond loopback it carries the controls' token."""
        base = f"http://{self.opts.dashboard_host}:{self.opts.dashboard_port}"
        return base if self._dashboard_token is None else f"{base}/?token={self._dashboard_token}"

    def _tell_rate(self, change: RateChange) -> None:
        try:
            self.admin("set_link", src=change.src, dst=change.dst, rate_mbit=change.mbit)
        except OSError as exc:  # the next change tells it again; the drift goes on
            log.warning("oracle: rate of %d->%d not told: %s", change.src, change.dst, exc)

    def admin(self, op: str, **args: Any) -> None:
        """Send a request to the coordinator over the management network."""
        if self._admin is None:
            raise ConnectionError("the run has no coordinator yet")
        self._admin.send(op, args)

    def poll(self) -> None:
        """Apply pending commands and notice processes that ended; call about twice a second."""
        assert self.db is not None
        if not self._host_all_ready and time.time() - self.started_at < HOST_READY_WAIT_S:
            ready = self.db.query(
                "SELECT COUNT(DISTINCT worker) AS c FROM worker_states WHERE state = ?",
                (WorkerState.READY.value,),
            )
            if ready[0]["c"] >= self.topo.n:
                self._host_all_ready = True
                self._host_from = hostbusy.mark()
        if self.player is not None and not self.player.done:
            done = self.db.query(
                "SELECT COUNT(*) AS c FROM groups WHERE status=?", (GroupStatus.COMPLETED.value,)
            )
            self.player.poll(time.time(), int(done[0]["c"]))
        if self.faults is not None:
            self.faults.apply_pending()
        for i, proc in list(self.workers.items()):
            code = proc.poll()
            if code is not None and i not in self.exit_codes:
                self.exit_codes[i] = code
                if code:
                    self.crashed[i] = code
                self.db.event(
                    "fault",
                    f"worker {i} exited with code {code}",
                    level="warning" if code else "info",
                    worker=i,
                )
        coord = self.coordinator
        if coord is not None and coord.poll() is not None and not self._coordinator_gone:
            self.db.event(
                "fault", f"coordinator exited with code {coord.returncode}", level="error"
            )
            self._forget_root(coord)
            # Exit code 0: it was asked to stop (admin "stop", SIGTERM), so the run is ending.
            if coord.returncode != 0 and self.coordinator_restarts < MAX_COORDINATOR_RESTARTS:
                # It resumes the run from the database (crew.runtime.coordinator.resume_from_db);
                # the workers reconnect to it by themselves.
                self.coordinator_restarts += 1
                self._start_coordinator()
                self.db.event("recovery", "coordinator restarted by the lab")
            else:
                self._coordinator_gone = True

    def _stop(self) -> None:
        # The training window ends as the stop begins: teardown is not the workers' load.
        host = (
            None
            if self._host_from is None
            else hostbusy.HostBusy.between(self._host_from, hostbusy.mark(), CORES)
        )
        try:
            # The coordinator abandons open groups and tells registered workers to stop, then
            # exits; SIGTERM does the same when it cannot be asked (it is not listening yet).
            if self.coordinator is not None and self.coordinator.poll() is None:
                try:
                    self.admin("stop")
                except OSError as exc:
                    log.info("coordinator not reachable (%s); stopping it by SIGTERM", exc)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.coordinator.pid, signal.SIGTERM)
                try:
                    self.coordinator.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    log.warning("coordinator pid %d did not stop in time", self.coordinator.pid)
            # A worker still starting (importing torch) never registered and did not hear the
            # coordinator: SIGTERM takes every worker down the same graceful path at once.
            for proc in self.workers.values():
                if proc.poll() is None:  # not reaped, so the pid is still this child's
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for proc in self.workers.values():
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("worker pid %d did not stop in time; killing it", proc.pid)
            # Whatever ignored the request is ended here, by its recorded pid: a shared network
            # (a benchmark's) outlives this run, so its teardown cannot be relied on.
            for proc in self.workers.values():
                if proc.poll() is None and self.net is not None:
                    self.net.stop_process(proc, timeout=3.0)
            for proc in (self.coordinator, self.dashboard):
                if proc is not None and proc.poll() is None:
                    end_group(proc, ROOT_STOP_S)
            if self._split_maker is not None and self._split_maker.poll() is None:
                self._split_maker.kill()  # the build failed before the split was needed
                self._split_maker.wait(timeout=10)
            if self.faults is not None:
                self.faults.close()
            if self.drift is not None:
                self.drift.stop()
            if self.monitor is not None:
                self.monitor.stop()
            if self._admin is not None:
                self._admin.close()
            self._forget_root(self.coordinator)
            self._forget_root(self.dashboard)
        finally:
            if self.net is not None and self._own_net:
                self.net.__exit__(None, None, None)
                self.net = None
            if self.db is not None:
                # Every child was waited for above, so its CPU is in RUSAGE_CHILDREN.
                cpu = lab_cpu_s() - self._cpu_at_start
                self.db.set_meta(
                    {"ended_at": str(time.time()), "lab_cpu_s": f"{cpu:.2f}", "cores": str(CORES)}
                    | ({} if host is None else {"host_busy": host.to_json()})
                )
                self.db.event("stop", "lab stopped")
                self.db.close()
                self.db = None
            for fh in self._logs:
                fh.close()


WORKER_NICENESS = 19
CORES = os.cpu_count() or 1


def lab_cpu_s() -> float:
    """CPU seconds (user + system) of this process and every child it has waited for: the
    coordinator, the workers (restarted ones too), the dashboard and the helpers."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _lower_priority() -> None:
    """Run in the worker's child process, after its ``setsid`` (Popen's order), before exec."""
    os.nice(WORKER_NICENESS)
    # With autogroup scheduling (kernel.sched_autogroup_enabled, on by default) every session
    # gets an equal share of the CPU and nice only ranks processes within a session. Each
    # worker leads its own session, so its session's weight must be lowered as well.
    try:
        with open("/proc/self/autogroup", "w") as fh:
            fh.write(str(WORKER_NICENESS))
    except OSError:
        pass  # no autogroup in this kernel: os.nice above is enough
