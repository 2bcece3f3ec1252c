"""What one ``lab.bench`` invocation runs: the scheme list, the training runs, and the
validated options (:class:`BenchSpec`). Pure: no lab, no processes."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from crew.cli_options import training_options
from crew.config import ConfigError, RunConfig, Scheme
from crew.plan.schemes import GROUP_SCHEMES
from lab.spec.topology import Impairment, TopologySpec

GLOO = Scheme.GLOO
ALL_SCHEMES: tuple[Scheme, ...] = (*GROUP_SCHEMES, GLOO)
MB = 1_000_000
# Pace data connections at 0.95 x the link's rate (crew.runtime.node.pace_fraction; why and how
# much it gains: docs/decisions/2026-12-01-pace-data-connections.md). Only the bench turns it
# on: its links keep their configured rates, while lab.run's can change at run time and workers
# pace at the rate they started with.
BENCH_PACE = 0.95


class BenchError(ValueError):
    """A benchmark option is invalid; ``field`` names the command-line flag."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


ENCRYPTED = "+enc"
"""A scheme label's suffix for the same scheme with every connection encrypted
(``crew+enc``): one benchmark run then times a scheme with and without encryption on the same
network and trace, which a second run on a machine whose speed drifts could not."""


SECRET = "+secret"
"""A scheme label's suffix for the same scheme with every group's result checked on a secret
vector before Commit (``crew+secret``, ``RunConfig.check``): the check's round trip is timed
against the public check on the same network and trace. It may follow :data:`ENCRYPTED`."""


def _base(label: str) -> str:
    return label.removesuffix(SECRET).removesuffix(ENCRYPTED)


def scheme_arm(label: str) -> tuple[Scheme, bool]:
    """A ``--schemes`` label's scheme and whether its connections are encrypted."""
    return Scheme(_base(label)), label.removesuffix(SECRET).endswith(ENCRYPTED)


def secret_arm(label: str) -> bool:
    """Whether a ``--schemes`` label checks every group on a secret vector (:data:`SECRET`)."""
    return label.endswith(SECRET)


def parse_schemes(text: str) -> tuple[str, ...]:
    """``"all"`` or a comma-separated list of scheme labels (a scheme name, or a group scheme's
    name + ``+enc``: see :data:`ENCRYPTED`), in the given order, no repeats."""
    if text.strip() == "all":
        return ALL_SCHEMES
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise BenchError("--schemes", "empty; give scheme names or 'all'")
    unknown = [s for s in names if _base(s) not in ALL_SCHEMES]
    if unknown:
        raise BenchError(
            "--schemes",
            f"unknown {', '.join(unknown)}; known: {', '.join(ALL_SCHEMES)} or 'all',"
            f" and NAME{ENCRYPTED} for a scheme with encrypted connections, NAME{SECRET} (or"
            f" NAME{ENCRYPTED}{SECRET}) for one with the secret result check",
        )
    if any(_base(s) == GLOO and s != GLOO for s in names):
        raise BenchError(
            "--schemes", f"{GLOO}: Gloo's connections are not encrypted and it forms no groups"
        )
    dup = sorted({s for s in names if names.count(s) > 1})
    if dup:
        raise BenchError("--schemes", f"repeated {', '.join(dup)}")
    return tuple(names)


@dataclass(frozen=True)
class TrainRun:
    """One training run of the benchmark: a scheme with its training options (RunOptions
    fields). ``name`` is its folder (``DIR/train/<name>``) and its key in ``train.json``."""

    name: str
    scheme: str
    training: dict[str, Any]
    p: int | None = None  # the group size, when it is not the benchmark's --group-size

    @property
    def label(self) -> tuple[str, str, str]:
        """(scheme, sync with its H and overlap, compress) for the table."""
        t = self.training
        sync = t["sync"] if t["sync"] == "every-step" else f"{t['sync']} H={t['local_steps']}"
        if t.get("overlap"):
            sync += " overlapped"
        return self.scheme, sync, "fp32" if t["compress"] == "none" else t["compress"]


def parse_train_configs(items: Sequence[str], args: argparse.Namespace) -> tuple[TrainRun, ...]:
    """``--configs SCHEMES:SYNCS:COMPRESS[:MODES]`` (each field a comma list; every
    combination runs, in the order given) into training runs. MODES are ``blocking`` and
    ``overlap`` (default: ``--overlap``'s). every-step runs take H = 1, local-sgd and diloco
    ``--local-steps``; the other training options are the command line's. Raises BenchError
    naming the bad item, or a combination that cannot run (e.g. gloo with int8)."""
    runs: list[TrainRun] = []
    for item in items:
        fields = item.split(":")
        if len(fields) not in (3, 4) or not all(f.strip() for f in fields):
            raise BenchError("--configs", f"{item!r}: want SCHEMES:SYNCS:COMPRESS[:MODES]")
        schemes = parse_schemes(fields[0])
        syncs, codecs, modes = (
            [x.strip() for x in f.split(",") if x.strip()]
            for f in (*fields[1:3], fields[3] if len(fields) == 4 else _mode(args.overlap))
        )
        for bad in (m for m in modes if m not in MODES):
            raise BenchError("--configs", f"{item!r}: mode {bad!r}, want {' or '.join(MODES)}")
        for scheme, sync, compress, mode in itertools.product(schemes, syncs, codecs, modes):
            h = 1 if sync == "every-step" else args.local_steps
            given = {"sync": sync, "compress": compress, "local_steps": h}
            one = argparse.Namespace(**(vars(args) | given | {"overlap": mode == "overlap"}))
            try:
                training = training_options(one, scheme=scheme, nonblocking=False)
            except ConfigError as exc:
                raise BenchError("--configs", f"{scheme}:{sync}:{compress}:{mode}: {exc}") from None
            tag = sync if h == 1 else f"{sync}{h}"
            name = f"{scheme}-{tag}-{'fp32' if compress == 'none' else compress}"
            name += "-overlap" if mode == "overlap" else ""
            if any(r.name == name for r in runs):
                raise BenchError("--configs", f"{name} is listed twice")
            runs.append(TrainRun(name, scheme, training))
    return tuple(runs)


MODES = ("blocking", "overlap")
QUORUM = "quorum"


def expand_group_sizes(runs: Sequence[TrainRun], text: str | None, n: int) -> tuple[TrainRun, ...]:
    """Each run once per entry of ``--groups`` (comma list of group sizes and ``quorum``, the
    quorum rule between 2 and all ``n`` workers with no p given); None keeps the runs as they
    are, at ``--group-size``. Raises BenchError naming a bad entry."""
    if text is None:
        return tuple(runs)
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if not entries:
        raise BenchError("--groups", "give group sizes and/or 'quorum', e.g. 2,3,4,5,quorum")
    out: list[TrainRun] = []
    for run in runs:
        for entry in entries:
            if entry == QUORUM:
                training = run.training | {"quorum_min": 2, "quorum_max": n}
                out.append(replace(run, name=f"{run.name}-{QUORUM}", training=training, p=2))
                continue
            try:
                size = int(entry)
            except ValueError:
                raise BenchError(
                    "--groups", f"{entry!r} is neither a group size nor 'quorum'"
                ) from None
            if not 1 <= size <= n:
                raise BenchError("--groups", f"group size {size} is not between 1 and {n} workers")
            out.append(replace(run, name=f"{run.name}-p{size}", p=size))
    names = [r.name for r in out]
    if len(set(names)) != len(names):
        raise BenchError("--groups", f"{text!r} lists a group size twice")
    return tuple(out)


def _mode(overlap: bool) -> str:
    return "overlap" if overlap else "blocking"


@dataclass(frozen=True)
class BenchSpec:
    """The benchmark's options, validated (see ``build_parser`` for each)."""

    topology: TopologySpec
    schemes: tuple[str, ...]
    p: int
    size_bytes: int
    ops: int
    seed: int
    timeout_per_op_s: float
    out: Path
    train: bool = False
    duration_s: float = 60.0
    target_accuracy: float = 0.85
    allow_missing: frozenset[Impairment] = frozenset()
    part_bytes: int = 0  # 0: the run's automatic part size (RunConfig.part_elems_for)
    # fraction of each link's configured rate its data connections are paced at (0: unpaced)
    pace: float = BENCH_PACE
    # the host's CPU s per GB of link bytes and its cores, a capacity in crew's route LP (0: none)
    host_cpu_s_per_gb: float = 0.0
    host_cores: float = 0.0
    # plan each trace group while the one before runs (crew.runtime.planahead)
    plan_ahead: bool = True
    # bytes crew's route LP counts a part to wait behind at each hop (RunConfig)
    hop_backlog_bytes: int = RunConfig.default("hop_backlog_bytes")
    encrypt: bool = False  # every connection encrypted (RunConfig.encrypt)
    training: dict[str, Any] = field(default_factory=dict)  # RunOptions training fields
    # after each scheme, move its plans' bytes per op over plain TCP (lab.bench.rawtcp)
    raw_tcp: bool = False
    target_loss: float = 2.0  # lm: held-out loss (nats per byte) whose reaching is timed
    # with --train: the runs, in order (one per scheme with ``training``, or --configs)
    train_runs: tuple[TrainRun, ...] = ()
    # untimed groups of all n workers each scheme runs before the trace (see --warmup)
    warmup: int = 0
    rounds: int = 1  # the scheme list runs this many times, rotated (lab.report.benchrounds)

    @property
    def size_elems(self) -> int:
        return self.size_bytes // 4
