"""The run configuration shared by the lab, the coordinator and every worker.

The lab writes one ``config.json`` per run; each process reads it at start. The per-run secret
lives in a separate file (mode 0600) named by ``secret_path``, so the config can be stored in
the run database and shown without leaking the key.
"""

from __future__ import annotations

import enum
import json
import math
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from crew.plan.inputs import PlanError, SharedLink
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
CHECK_MODES = ("public", "secret")  # crew.control.secretcheck.CheckMode
AGGREGATES = ("mean", "clip")  # crew.control.clipping.Aggregate
# The schemes whose plans are stars of members under each root, the only ones a root can clip
# (crew.control.clipping.star_violation): crew's route LP may relay, a2a roots every member.
CLIP_SCHEMES = (Scheme.CREW_STAR, Scheme.CREW_PAPER, Scheme.PREDUCE, Scheme.PS)
SYNC_MODES = ("every-step", "local-sgd", "diloco")
WORKLOADS = ("mlp", "lm", "synthetic")
PARTITIONS = ("iid", "non-iid")  # crew.train.datasets.Partition
FLOW_ORDERS = ("fcfs", "egf", "fair")  # crew.wire.transport.FlowOrder
CAPACITY_SOURCES = ("configured", "measured", "oracle")

MIN_AUTO_PART_BYTES = 64 << 10
MAX_AUTO_PART_BYTES = 1 << 20

GROUP_SIZE_DEFAULT = 3
"""The group size every command starts with: it fits every shipped topology of three or more
workers, and on an eight-worker lab it leaves most workers training while a group averages."""


def run_data_dir(run_dir: str | Path) -> Path:
    """Where a run keeps its data split (crew.train.datasets' cache), beside its database."""
    return Path(run_dir) / "data"


class ConfigError(ValueError):
    """A run configuration is malformed; the message names the field."""


OPTION = "option"
"""The key of a ``RunConfig`` field's :class:`Option` in its ``dataclasses.field`` metadata."""


@dataclass(frozen=True)
class Option:
    """What one ``RunConfig`` field means, in which unit, and which flag sets it.

    ``flag`` None: the lab fills the field in, no command line sets it. ``cli_default`` (with
    ``has_cli_default``): the flag's default where the field has none, or where the commands
    decide it from other options (None, as ``default_text`` says); otherwise the flag's default
    is the field's. ``crew.cli_options`` builds every command's flags from these."""

    help: str
    unit: str = ""
    flag: str | None = None
    aliases: tuple[str, ...] = ()  # more spellings of the flag, shown in --help
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    cli_default: Any = None
    has_cli_default: bool = False
    default_text: str = ""  # how --help states a default of None


def opt(help: str, unit: str = "", **kw: Any) -> dict[str, Option]:
    """A field's metadata: its :class:`Option` (``flag=...`` for one a command line sets)."""
    return {OPTION: Option(help, unit, has_cli_default="cli_default" in kw, **kw)}


@dataclass(frozen=True)
class HostCpu:
    """``--host-cpu S_PER_GB[:CORES]``: a host whose cores run every worker's data path, as one
    more capacity of crew's route LP (crew.plan.hostcpu) or the simulator's executor. ``CORES``
    left out: this machine's. ``0``: no host capacity."""

    s_per_gb: float = 0.0
    cores: float = 0.0

    @classmethod
    def parse(cls, text: str) -> HostCpu:
        """``"12.2"`` or ``"12.2:2"``; ValueError (argparse shows it) names what is wrong."""
        head, sep, tail = text.partition(":")
        try:
            per_gb = float(head)
            cores = float(tail) if sep else float(os.cpu_count() or 1)
        except ValueError:
            raise ValueError(f"want S_PER_GB or S_PER_GB:CORES, got {text!r}") from None
        if not (math.isfinite(per_gb) and per_gb >= 0 and math.isfinite(cores) and cores > 0):
            raise ValueError(f"want S_PER_GB >= 0 and CORES > 0, got {text!r}")
        return cls(per_gb, cores if per_gb > 0 else 0.0)

    def __str__(self) -> str:
        return f"{self.s_per_gb:g}:{self.cores:g}" if self.s_per_gb else "0"


@dataclass(frozen=True)
class RunConfig:
    run_id: str = field(metadata=opt("the run's name, its folder's under runs/"))
    run_num: int = field(
        metadata=opt("u32 carried in every frame, so frames of another run are refused")
    )
    run_dir: str = field(metadata=opt("folder of the run's database, config and logs"))
    secret_path: str = field(metadata=opt("file (mode 0600) holding the run's frame key"))
    n: int = field(metadata=opt("workers in the run", "workers"))
    p: int = field(
        metadata=opt(
            "group size: the first p ready workers average together; the default, the same in"
            " every command, fits every shipped topology of three or more workers and leaves"
            " most of an eight-worker lab training while a group averages",
            "workers",
            flag="--group-size",
            aliases=("--p",),
            metavar="P",
            cli_default=GROUP_SIZE_DEFAULT,
        )
    )
    scheme: Scheme = field(
        metadata=opt(
            "how a group averages (crew.plan.schemes): crew, the route LP over every active"
            " worker's links; preduce, members only (the original partial reduce); the"
            " baselines; gloo, a torch all-reduce among all workers, no partial groups",
            flag="--scheme",
            choices=Scheme.names(),
            cli_default=Scheme.CREW,
        )
    )
    coordinator_host: str = field(metadata=opt("the coordinator's address"))
    coordinator_port: int = field(metadata=opt("the coordinator's control port", "port"))
    data_port: int = field(metadata=opt("the port every worker's data plane listens on", "port"))
    identities: tuple[str, ...] = field(
        metadata=opt("each worker's identity address (data plane), by worker")
    )
    bw_mbit: tuple[tuple[float, ...], ...] = field(
        metadata=opt("configured capacity of each directed link i->j; diagonal ignored", "Mbit/s")
    )
    # Capacities several pairs share (a cloud pair's WAN behind gateways); bw_mbit caps each
    # pair alone, these cap the sum. Empty when every pair has its own link.
    shared: tuple[SharedLink, ...] = field(
        default=(), metadata=opt("capacities several pairs share (empty: none)")
    )
    # One-way delay of each directed link in ms (the topology's delay_ms), for the planner's
    # latency term and the lower bound; empty when no link has a delay (no latency term).
    delay_ms: tuple[tuple[float, ...], ...] = field(
        default=(), metadata=opt("one-way delay of each directed link (empty: none)", "ms")
    )
    # -- training
    width: int = field(
        default=640,
        metadata=opt(
            "hidden width of the MLP; sets the model size the network carries, 3.5 MB at the"
            " default",
            "units",
            flag="--width",
        ),
    )
    depth: int = field(
        default=3, metadata=opt("hidden layers of the MLP", "layers", flag="--depth")
    )
    lr: float = field(
        default=0.05,
        metadata=opt(
            "inner learning rate", flag="--lr", cli_default=None, default_text="the workload's"
        ),
    )
    batch_size: int = field(
        default=32,
        metadata=opt(
            "minibatch size",
            "samples",
            flag="--batch-size",
            cli_default=None,
            default_text="the workload's",
        ),
    )
    local_steps: int = field(
        default=1,
        metadata=opt(
            "H: local steps between reduces (crew.train.outer)",
            "steps",
            flag="--local-steps",
            metavar="H",
        ),
    )
    sync: str = field(
        default="every-step",
        metadata=opt(
            "every-step: average after each iteration; local-sgd: average the models every"
            " --local-steps steps; diloco: outer Nesterov step on the averaged pseudo-gradient",
            flag="--sync",
            choices=SYNC_MODES,
            cli_default=None,
            default_text="every-step, or local-sgd when --local-steps > 1",
        ),
    )
    outer_lr: float = field(
        default=0.7, metadata=opt("DiLoCo's outer learning rate", flag="--outer-lr")
    )
    outer_momentum: float = field(
        default=0.9, metadata=opt("DiLoCo's Nesterov momentum", flag="--outer-momentum")
    )
    overlap: bool = field(
        default=False,
        metadata=opt(
            "overlapped reduce: a worker offers its model (or DiLoCo step) and trains on while"
            " its group reduces, then applies the result as a delta against what it offered"
            " (crew.train.overlap; one round in flight per worker)",
            flag="--overlap",
        ),
    )
    min_iteration_s: float = field(
        default=0.0,
        metadata=opt(
            "each local iteration lasts at least this long, padded with sleep that counts as"
            " compute: every worker emulates an accelerator of its own instead of sharing the"
            " host's cores with the others (0: iterations take their real time or the"
            " straggler profile's)",
            "s",
            flag="--min-iteration-s",
        ),
    )
    workload: str = field(
        default="mlp",
        metadata=opt(
            "mlp: the digits MLP (3.5 MB, the quick default); lm: a byte-level transformer on"
            " the Python standard library's source, held-out loss and perplexity (1 MB);"
            " synthetic: a vector of --model-mb MB and no model, no torch (runs at scale)",
            flag="--workload",
            choices=WORKLOADS,
        ),
    )
    model_mb: float = field(
        default=4.0,
        metadata=opt(
            "size of the synthetic workload's vector (10^6 bytes per MB)",
            "MB",
            flag="--model-mb",
        ),
    )
    partition: str = field(
        default="iid",
        metadata=opt(
            "how the training set is split among workers",
            flag="--partition",
            choices=PARTITIONS,
        ),
    )
    seed: int = field(
        default=0,
        metadata=opt(
            "seed of everything drawn at random: data split, model, stragglers, lab.bench's"
            " trace, crew.sim's topology, planbench's matrices",
            flag="--seed",
        ),
    )
    stragglers: tuple[str | None, ...] = field(
        default=(), metadata=opt("each worker's straggler spec (topology YAML), by worker")
    )
    eval_every_s: float = field(
        default=2.0,
        metadata=opt("time between held-out evaluations", "s", flag="--eval-every-s"),
    )
    staleness: bool = field(
        default=False,
        metadata=opt("weight members by 0.9^staleness instead of equally", flag="--staleness"),
    )
    # -- data plane
    part_bytes: int = field(
        default=0,
        metadata=opt(
            "size of the parts blocks travel in (frame payload), a multiple of 4; 0: automatic,"
            " a quarter of a block between 64 KiB and 1 MiB (RunConfig.part_elems_for)",
            "bytes",
            flag="--part-bytes",
        ),
    )
    max_payload: int = field(
        default=4 << 20, metadata=opt("largest frame payload accepted", "bytes")
    )
    flow_order: str = field(
        default="fcfs",
        metadata=opt(
            "how a sender orders frames of concurrent groups: fcfs (enqueue order), egf (lowest"
            " group first), fair (round-robin between groups)",
            flag="--flow-order",
            choices=FLOW_ORDERS,
        ),
    )
    compress: str = field(
        default="none",
        metadata=opt(
            "group payloads on the wire: none (float32), fp16, or int8 (per 256 values with min"
            " and max, 0.258x the bytes); sums are added in float32 (crew.train.compress)",
            flag="--compress",
            choices=COMPRESS,
        ),
    )
    nonblocking: bool = field(
        default=False,
        metadata=opt(
            "a ready worker starts scattering with the a2a split before its group exists; the"
            " group's plan is re-solved around what was sent (crew and crew-paper only)",
            flag="--nonblocking",
        ),
    )
    quorum_min: int = field(
        default=0,
        metadata=opt(
            "groups that size themselves: once at least this many workers are ready, wait a"
            " grace window learned from recent ready times for one more, then close a group of"
            " every worker ready (crew.control.quorum); 0: every group has --group-size members",
            "workers",
            flag="--quorum-min",
        ),
    )
    quorum_max: int = field(
        default=0,
        metadata=opt(
            "the quorum rule's largest group; 0: all workers", "workers", flag="--quorum-max"
        ),
    )
    helpers: int = field(
        default=-1,
        metadata=opt(
            "plan each group over its members and only this many other workers, the best"
            " connected to them (crew.plan.candidates): fewer helpers to tell and relay"
            " through, a smaller route LP; -1: over every worker",
            "workers",
            flag="--helpers",
            # crew.plan.candidates.default_helpers: CANDIDATES_FROM_N, DEFAULT_HELPERS
            cli_default=None,
            default_text="every worker up to 64 workers, 16 above",
        ),
    )
    committed_capacity: bool = field(
        default=True,
        metadata=opt(
            "plan each group on the full capacity matrix, ignoring what groups already in"
            " flight still send (the paper's behaviour)",
            flag="--no-committed-capacity",
        ),
    )
    # Plan a group known in advance (a lab.bench trace's next one) on a background thread
    # while the current one runs (crew.runtime.planahead); the plan is the same either way.
    plan_ahead: bool = field(
        default=True,
        metadata=opt(
            "plan each trace group when it starts, on the coordinator's event loop, instead of"
            " on a background thread while the group before it runs (crew.runtime.planahead;"
            " the plans are the same, only the planning time moves onto the ops' critical"
            " path)",
            flag="--no-plan-ahead",
        ),
    )
    # Frames are authenticated always; encrypted too when this is on (crew.wire.session).
    encrypt: bool = field(
        default=False,
        metadata=opt(
            "encrypt every connection's frames, data and control, with AES-256-GCM under keys"
            " of the connection's own (crew.wire.session); a launched job (crew.Averager,"
            " torchrun) encrypts unless CREW_ENCRYPT=0",
            flag="--encrypt",
        ),
    )
    # Public by default in the lab: the secret check costs one control round trip and a pass
    # over the vector per group before Commit, and the lab's workers are its own.
    check: str = field(
        default="public",
        metadata=opt(
            "how a group's result is checked before any member applies it: on the run's public"
            " check vector, or also on a secret one drawn once all of its data moved, which"
            " catches a relay or aggregator that tampered with it (crew.control.secretcheck;"
            " one control round trip per group); a launched job checks secretly unless"
            " CREW_CHECK=public",
            flag="--check",
            choices=CHECK_MODES,
        ),
    )
    aggregate: str = field(
        default="mean",
        metadata=opt(
            "how a group's root combines its members' vectors: their weighted mean, or"
            " CenteredClip, which bounds how far one member that poisons its own vector can move"
            " the result (crew.control.clipping; needs --check secret, --compress none and a"
            f" star scheme: {', '.join(CLIP_SCHEMES)})",
            flag="--aggregate",
            choices=AGGREGATES,
        ),
    )
    clip_radius: float = field(
        default=0.1,
        metadata=opt(
            "--aggregate clip's largest radius rho: a member's difference from the result counts"
            " up to rho times the result's norm, per part (crew.control.clipping.DEFAULT_RHO);"
            " the radius until the first groups are known, and always with --clip-factor 0",
            flag="--clip-radius",
            metavar="RHO",
        ),
    )
    clip_factor: float = field(
        default=4.0,
        metadata=opt(
            "--aggregate clip learns its radius: this many times how far apart the members'"
            " vectors are, measured on the secret check vector over the last groups, at most"
            " --clip-radius, so that a member poisoning every group cannot compound its pull"
            " (crew.control.clipradius.DEFAULT_FACTOR); 0 keeps the radius at --clip-radius",
            flag="--clip-factor",
            metavar="K",
        ),
    )
    capacity: str = field(
        default="configured",
        metadata=opt(
            "what the planner believes about link rates: the topology's configured rates;"
            " rates measured online from arriving data (re-planning when a link drifts by more"
            " than 25%); or, in the lab, the true current rates of links that follow a rate"
            " trace, told to the planner as each changes (oracle)",
            flag="--capacity",
            choices=CAPACITY_SOURCES,
        ),
    )
    # One host runs every worker's data path (the lab): its CPU seconds per GB of link bytes
    # and its cores. > 0 gives crew's route LP one more resource, the host's CPU
    # (crew.plan.hostcpu); 0 (the default, and any real deployment): none.
    host_cpu_s_per_gb: float = field(
        default=0.0,
        metadata=opt(
            "a host whose cores run every worker's data path, as one more capacity of crew's"
            " route LP (crew.plan.hostcpu) and of crew.sim's executor: S_PER_GB CPU seconds per"
            " GB of link bytes (lab.bench's CPU s/GB column: about 12 for crew on"
            " bench-hetero) on CORES cores (left out: this machine's); 0: none",
            "CPU s/GB",
            flag="--host-cpu",
            metavar="S_PER_GB[:CORES]",
        ),
    )
    host_cores: float = field(
        default=0.0, metadata=opt("the cores of --host-cpu's host (0: no host capacity)", "cores")
    )
    # The payload share of a link's configured rate, which the planners count a link to carry.
    # Configured rates are frame rates (what HTB shapes), and TCP/IP headers take about 5% of
    # the frames (crew.control.capacity.TCP_GOODPUT). Use 1.0 for rates that are already
    # measured payload rates.
    goodput: float = field(
        default=0.95,
        metadata=opt(
            "payload share of a link's rate: what the planners count a link to carry (and"
            " crew.sim's links deliver); 1.0 for rates that are measured payload rates",
            "fraction",
            flag="--goodput",
        ),
    )
    # Bytes a part waits behind at each hop of a route: the unsent bytes a busy data connection
    # holds (TCP_NOTSENT_LOWAT, crew.wire.frames.SEND_BACKLOG_BYTES). crew's route LP counts
    # them, at each hop's rate, with the part's own serialisation in a route's latency, so it
    # weighs an extra relay hop at what it costs the engine. A frame trace of paced bench-hetero
    # groups measured a median 13.6 ms per hop beyond serialisation, which is 64 KiB at the
    # network's mean 36.7 Mbit/s. 0: count the part alone.
    hop_backlog_bytes: int = field(
        default=SEND_BACKLOG_BYTES,
        metadata=opt(
            "bytes crew's route LP counts a part to wait behind at each hop, beside its own:"
            " the unsent bytes a busy connection holds (TCP_NOTSENT_LOWAT); 0 counts the part"
            " alone",
            "bytes",
            flag="--hop-backlog-bytes",
        ),
    )
    stall_timeout_s: float = field(
        default=8.0,
        metadata=opt(
            "a link with no progress this long counts as failed", "s", flag="--stall-timeout-s"
        ),
    )
    # -- control plane
    heartbeat_s: float = field(default=1.0, metadata=opt("time between a worker's heartbeats", "s"))
    heartbeat_timeout_s: float = field(
        default=6.0,
        metadata=opt("a worker silent this long counts as dead", "s", flag="--heartbeat-timeout-s"),
    )
    group_timeout_min_s: float = field(
        default=30.0, metadata=opt("the shortest time a group may take before it is abandoned", "s")
    )
    # per-worker data-plane ports (several workers on one host, e.g. torchrun); empty: all
    # listen on data_port
    data_ports: tuple[int, ...] = field(
        default=(), metadata=opt("each worker's data-plane port (empty: all use data_port)")
    )
    extra: dict[str, Any] = field(
        default_factory=dict,
        metadata=opt("what a command passes its processes (lab.bench's trace)"),
    )

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of field ``name``: written once, here; for a field without one (``p``,
        ``scheme``), its flag's. The lab's ``RunOptions`` and every command's flags
        (``crew.cli_options``) take theirs from this."""
        for f in fields(cls):
            if f.name != name:
                continue
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
            if f.metadata[OPTION].has_cli_default:
                return f.metadata[OPTION].cli_default
        raise KeyError(f"RunConfig has no field {name!r} with a default")

    @classmethod
    def in_process(
        cls,
        n: int,
        p: int,
        bw_mbit: Any,
        *,
        identities: tuple[str, ...] | None = None,
        **settings: Any,
    ) -> RunConfig:
        """The configuration of a controller that runs inside this process (the simulator, a
        test): no run folder, secret, sockets or addresses; ``settings`` set other fields."""
        bw = tuple(tuple(float(x) for x in row) for row in bw_mbit)
        return cls(
            **{
                "run_id": "in-process",
                "run_num": 0,
                "run_dir": "",
                "secret_path": "",
                "coordinator_host": "",
                "coordinator_port": 0,
                "data_port": 0,
                **settings,
            },
            n=n,
            p=p,
            identities=identities or tuple(f"w{i}" for i in range(n)),
            bw_mbit=bw,
        )

    @classmethod
    def option(cls, name: str) -> Option:
        """Field ``name``'s :class:`Option`: its meaning, unit and flag."""
        for f in fields(cls):
            if f.name == name:
                return f.metadata[OPTION]  # type: ignore[no-any-return]
        raise KeyError(f"RunConfig has no field {name!r}")

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"n: must be at least 1, got {self.n}")
        if not 1 <= self.p <= self.n:
            raise ConfigError(f"p: must be between 1 and n={self.n}, got {self.p}")
        if self.quorum_min or self.quorum_max:
            top = self.quorum_max or self.n
            if not 1 <= self.quorum_min <= top <= self.n:
                raise ConfigError(
                    f"quorum_min: need 1 <= quorum_min ({self.quorum_min}) <= quorum_max"
                    f" ({top}) <= n ({self.n})"
                )
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
        if self.check not in CHECK_MODES:
            raise ConfigError(f"check: one of {', '.join(CHECK_MODES)}, got {self.check!r}")
        if self.capacity not in CAPACITY_SOURCES:
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
        from crew.config_checks import (  # they import this module's constants
            check_aggregate,
            check_helpers,
        )

        check_helpers(self.helpers, shared=bool(self.shared) or self.host_cpu_s_per_gb > 0)
        check_aggregate(
            self.aggregate,
            self.clip_radius,
            self.clip_factor,
            self.check,
            self.compress,
            self.scheme,
            self.nonblocking,
        )

    @property
    def clip_rho(self) -> float | None:
        """Clipped aggregation's radius (``crew.control.clipping``), None for the mean."""
        return self.clip_radius if self.aggregate == AGGREGATES[1] else None

    def _check_training(self) -> None:
        from crew.config_checks import check_training  # it imports this module's constants

        check_training(
            compress=self.compress,
            nonblocking=self.nonblocking,
            scheme=self.scheme,
            sync=self.sync,
            workload=self.workload,
            model_mb=self.model_mb,
            local_steps=self.local_steps,
            outer_lr=self.outer_lr,
            outer_momentum=self.outer_momentum,
            min_iteration_s=self.min_iteration_s,
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
