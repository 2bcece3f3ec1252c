"""The run configuration shared by the lab, the coordinator and every worker.

The lab writes one ``config.json`` per run; each process reads it at start. The per-run secret
lives in a separate file (mode 0600) named by ``secret_path``, so the config can be stored in
the run database and shown without leaking the key.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from crew.plan.planner import PlanError, SharedLink
from crew.wire.frames import SEND_BACKLOG_BYTES


class Scheme(enum.StrEnum):
    """How a group's members average their vectors (see ``crew.plan.schemes``): the one
    vocabulary of schemes. A ``StrEnum``, so its members are the names the CLI and the run
    database use."""

    CREW = "crew"  # the route LP over stars, relays, trees and ring segments (crew.plan.routelp)
    CREW_STAR = "crew-star"  # one star per active aggregator; pipelined per-link-load LP
    CREW_RELAY = "crew-relay"  # crew-star through one-hop relays, priced honestly
    CREW_PAPER = "crew-paper"  # the paper's form: p2a LP (X + Y), blocks stored and forwarded
    PREDUCE = "preduce"  # original partial reduce: members only, load-balanced (p2p LP)
    PS = "ps"
    RING = "ring"
    A2A = "a2a"
    BLINK = "blink"
    BLINK_PIPE = "blink-pipe"
    TOPOADOPT = "topoadopt"
    GLOO = "gloo"  # torch.distributed all-reduce among all workers, no partial groups

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(s.value for s in cls)


# Names of crew.train's enums (this module stays free of crew.train; a test checks they match).
COMPRESS = ("none", "fp16", "int8")
SYNC_MODES = ("every-step", "local-sgd", "diloco")
WORKLOADS = ("mlp", "lm")

MIN_AUTO_PART_BYTES = 64 << 10
MAX_AUTO_PART_BYTES = 1 << 20


def run_data_dir(run_dir: str | Path) -> Path:
    """Where a run keeps its data split (crew.train.datasets' cache), beside its database."""
    return Path(run_dir) / "data"


class ConfigError(ValueError):
    """A run configuration is malformed; the message names the field."""


@dataclass(frozen=True)
class RunConfig:
    run_id: str
    run_num: int  # u32 carried in every frame, so frames of another run are refused
    run_dir: str
    secret_path: str
    n: int
    p: int
    scheme: Scheme
    coordinator_host: str
    coordinator_port: int
    data_port: int
    identities: tuple[str, ...]  # identity address of each worker (data plane)
    bw_mbit: tuple[tuple[float, ...], ...]  # configured capacity matrix; diagonal ignored
    # Capacities several pairs share (a cloud pair's WAN behind gateways); bw_mbit caps each
    # pair alone, these cap the sum. Empty when every pair has its own link.
    shared: tuple[SharedLink, ...] = ()
    # One-way delay of each directed link in ms (the topology's delay_ms), for the planner's
    # latency term and the lower bound; empty when no link has a delay (no latency term).
    delay_ms: tuple[tuple[float, ...], ...] = ()
    # training
    width: int = 640
    depth: int = 3
    lr: float = 0.05
    batch_size: int = 32
    local_steps: int = 1  # H: local steps between reduces (crew.train.outer)
    sync: str = "every-step"  # crew.train.outer.SyncMode: every-step, local-sgd, diloco
    outer_lr: float = 0.7  # diloco only
    outer_momentum: float = 0.9  # diloco only (Nesterov)
    workload: str = "mlp"  # crew.train.workloads.Workload: mlp (digits) or lm (stdlib text)
    partition: str = "iid"
    seed: int = 0
    stragglers: tuple[str | None, ...] = ()
    eval_every_s: float = 2.0
    staleness: bool = False
    # data plane
    part_bytes: int = 0  # 0: automatic, see part_elems_for
    max_payload: int = 4 << 20
    flow_order: str = "fcfs"
    compress: str = "none"  # crew.train.compress.Codec of group payloads: none, fp16, int8
    nonblocking: bool = False
    committed_capacity: bool = True  # plan new groups on capacity left by groups in flight
    # Plan a group known in advance (a lab.bench trace's next one) on a background thread
    # while the current one runs (crew.runtime.planahead); the plan is the same either way.
    plan_ahead: bool = True
    capacity: str = "configured"  # the planner's truth: "configured" rates or "measured" ones
    # One host runs every worker's data path (the lab): its CPU seconds per GB of link bytes
    # and its cores. > 0 gives crew's route LP one more resource, the host's CPU
    # (crew.plan.hostcpu); 0 (the default, and any real deployment): none.
    host_cpu_s_per_gb: float = 0.0
    host_cores: float = 0.0
    # The payload share of a link's configured rate, which the planners count a link to carry.
    # Configured rates are frame rates (what HTB shapes), and TCP/IP headers take about 5% of
    # the frames (crew.control.capacity.TCP_GOODPUT; crew.sim's --goodput default). Use 1.0 for
    # rates that are already measured payload rates.
    goodput: float = 0.95
    # Bytes a part waits behind at each hop of a route: the unsent bytes a busy data connection
    # holds (TCP_NOTSENT_LOWAT, crew.wire.frames.SEND_BACKLOG_BYTES). crew's route LP counts
    # them, at each hop's rate, with the part's own serialisation in a route's latency, so it
    # weighs an extra relay hop at what it costs the engine. A frame trace of paced bench-hetero
    # groups measured a median 13.6 ms per hop beyond serialisation, which is 64 KiB at the
    # network's mean 36.7 Mbit/s. 0: count the part alone.
    hop_backlog_bytes: int = SEND_BACKLOG_BYTES
    stall_timeout_s: float = 8.0
    # control plane
    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 6.0
    group_timeout_min_s: float = 30.0
    # per-worker data-plane ports (several workers on one host, e.g. torchrun); empty: all
    # listen on data_port
    data_ports: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of field ``name``: written once, here. The lab's ``RunOptions`` take
        theirs from this, and ``python -m lab.run``'s options from ``RunOptions``."""
        for f in fields(cls):
            if f.name == name and f.default is not MISSING:
                return f.default
        raise KeyError(f"RunConfig has no field {name!r} with a default")

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"n: must be at least 1, got {self.n}")
        if not 1 <= self.p <= self.n:
            raise ConfigError(f"p: must be between 1 and n={self.n}, got {self.p}")
        try:
            object.__setattr__(self, "scheme", Scheme(self.scheme))
        except ValueError:
            raise ConfigError(
                f"scheme: unknown {self.scheme!r}; known: {', '.join(Scheme.names())}"
            ) from None
        if len(self.identities) != self.n:
            raise ConfigError(f"identities: need {self.n} addresses, got {len(self.identities)}")
        if len(self.bw_mbit) != self.n or any(len(r) != self.n for r in self.bw_mbit):
            raise ConfigError(f"bw_mbit: must be {self.n}x{self.n}")
        for k, sl in enumerate(self.shared):
            if not isinstance(sl, SharedLink):
                raise ConfigError(f"shared[{k}]: expected a SharedLink, got {sl!r}")
            if any(not (0 <= a < self.n and 0 <= b < self.n) for a, b in sl.pairs):
                raise ConfigError(f"shared[{k}]: a pair names a worker outside 0..{self.n - 1}")
        if self.delay_ms:
            if len(self.delay_ms) != self.n or any(len(r) != self.n for r in self.delay_ms):
                raise ConfigError(f"delay_ms: must be {self.n}x{self.n} or empty")
            bad = [
                (i, j)
                for i, row in enumerate(self.delay_ms)
                for j, d in enumerate(row)
                if i != j and not (math.isfinite(d) and d >= 0)
            ]
            if bad:
                raise ConfigError(f"delay_ms: must be finite and >= 0, not at {bad[:3]}")
        if self.part_bytes < 0 or self.part_bytes % 4:
            raise ConfigError(
                f"part_bytes: must be 0 (automatic) or a positive multiple of 4,"
                f" got {self.part_bytes}"
            )
        if self.data_ports and len(self.data_ports) != self.n:
            raise ConfigError(f"data_ports: need {self.n} or none, got {len(self.data_ports)}")
        if self.capacity not in ("configured", "measured"):
            raise ConfigError(f"capacity: 'configured' or 'measured', got {self.capacity!r}")
        for name in ("host_cpu_s_per_gb", "host_cores"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"{name}: must be finite and >= 0, got {v!r}")
        if isinstance(self.goodput, bool) or not (
            isinstance(self.goodput, int | float) and 0 < self.goodput <= 1
        ):
            raise ConfigError(f"goodput: must be in (0, 1], got {self.goodput!r}")
        if (
            isinstance(self.hop_backlog_bytes, bool)
            or not isinstance(self.hop_backlog_bytes, int)
            or self.hop_backlog_bytes < 0
        ):
            raise ConfigError(
                f"hop_backlog_bytes: must be an int >= 0, got {self.hop_backlog_bytes!r}"
            )
        if (self.host_cpu_s_per_gb > 0) != (self.host_cores > 0):
            raise ConfigError("host_cpu_s_per_gb and host_cores: set both or neither")
        if self.part_bytes > self.max_payload:
            raise ConfigError("part_bytes: must not exceed max_payload")
        self._check_training()

    def _check_training(self) -> None:
        check_training(
            compress=self.compress,
            nonblocking=self.nonblocking,
            scheme=self.scheme,
            sync=self.sync,
            workload=self.workload,
            local_steps=self.local_steps,
            outer_lr=self.outer_lr,
            outer_momentum=self.outer_momentum,
        )

    def part_elems_for(self, size_elems: int) -> int:
        """Elements per part: as configured, or automatically about a quarter of a block.

        Parts must be small against a block for aggregation and broadcast to overlap: with
        n blocks of a vector, four parts per block, but no smaller than 64 KiB (per-frame
        costs) and no larger than 1 MiB."""
        if self.part_bytes:
            return self.part_bytes // 4
        quarter_block = size_elems // (4 * self.n)
        return max(MIN_AUTO_PART_BYTES // 4, min(MAX_AUTO_PART_BYTES // 4, quarter_block))

    def data_address(self, worker: int) -> tuple[str, int]:
        """Where ``worker``'s data-plane transport listens."""
        port = self.data_ports[worker] if self.data_ports else self.data_port
        return (self.identities[worker], port)

    def secret(self) -> bytes:
        return Path(self.secret_path).read_bytes()

    @property
    def data_dir(self) -> Path:
        return run_data_dir(self.run_dir)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read run config: {exc}") from exc
        return cls.from_dict(raw, where=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config") -> RunConfig:
        """A config from its JSON object (``to_json``); ConfigError names what is wrong."""
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown fields {unknown}")
        raw = dict(raw)
        try:
            raw["shared"] = tuple(
                SharedLink(
                    tuple((int(a), int(b)) for a, b in sl["pairs"]),
                    float(sl["mbit"]),
                    float(sl.get("delay_s", 0.0)),
                )
                for sl in raw.get("shared", ())
            )
        except (KeyError, TypeError, ValueError, PlanError) as exc:
            raise ConfigError(f"{where}: shared: malformed shared link: {exc}") from exc
        try:
            raw["identities"] = tuple(raw["identities"])
            raw["bw_mbit"] = tuple(tuple(float(x) for x in row) for row in raw["bw_mbit"])
            raw["stragglers"] = tuple(raw.get("stragglers", ()))
            raw["data_ports"] = tuple(raw.get("data_ports", ()))
            raw["delay_ms"] = tuple(tuple(float(x) for x in row) for row in raw.get("delay_ms", ()))
            return cls(**raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from exc


def check_training(
    *,
    compress: str,
    nonblocking: bool,
    scheme: str,
    sync: str,
    workload: str,
    local_steps: int,
    outer_lr: float,
    outer_momentum: float,
) -> None:
    """The training-mode and compression fields (crew.train.outer, crew.train.compress);
    ConfigError names the first one that is wrong. The lab checks its options with this before
    it builds anything."""
    if compress not in COMPRESS:
        raise ConfigError(f"compress: one of {', '.join(COMPRESS)}, got {compress!r}")
    if compress != "none" and nonblocking:
        raise ConfigError("compress: non-blocking pre-scatter sends float32 only; drop one")
    if compress != "none" and scheme == Scheme.GLOO.value:
        raise ConfigError("compress: gloo all-reduces float32; use compress none")
    if sync not in SYNC_MODES:
        raise ConfigError(f"sync: one of {', '.join(SYNC_MODES)}, got {sync!r}")
    if workload not in WORKLOADS:
        raise ConfigError(f"workload: one of {', '.join(WORKLOADS)}, got {workload!r}")
    if not isinstance(local_steps, int) or isinstance(local_steps, bool) or local_steps < 1:
        raise ConfigError(f"local_steps: an int >= 1, got {local_steps!r}")
    if sync == "every-step" and local_steps != 1:
        raise ConfigError(
            f"local_steps: {local_steps} needs sync local-sgd or diloco (every-step is 1)"
        )
    if not 0 < outer_lr <= 2:
        raise ConfigError(f"outer_lr: must be in (0, 2], got {outer_lr}")
    if not 0 <= outer_momentum < 1:
        raise ConfigError(f"outer_momentum: must be in [0, 1), got {outer_momentum}")
