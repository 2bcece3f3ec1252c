"""The command vocabulary: everything that can be asked of a running lab.

The dashboard and scripted scenarios build commands here and ``submit`` them as rows of the run
database's ``commands`` table; the lab's command applier reads pending rows, re-parses them with
``parse_command`` (the same validation, so a hand-written row cannot slip past it) and marks each
``applied`` or ``rejected``. Nothing in this module touches the network.

Validation happens once, in ``parse_command``, against ``LabLimits``: what *this* run can do
(its worker count, the schemes it was started with, the impairments the kernel supports). A
refused command raises ``CommandError`` naming the field and what is wrong, so a UI can show the
reason next to the input and write nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from crew.config import Scheme
from crew.runtime import rundb

log = logging.getLogger(__name__)

DEFAULT_SCHEMES: tuple[Scheme, ...] = (Scheme.PREDUCE, Scheme.CREW)
# HTB rate changes need no optional qdisc, so a lab can always do them.
ALWAYS_AVAILABLE: frozenset[str] = frozenset({"rate"})
# Bounds that catch typos (an extra zero) rather than physics: HTB handles far more.
MAX_RATE_MBIT = 100_000.0
# The dashboard's controls submit these commands; bound beyond loopback, the page needs the
# token in this variable in its address (dashboard/__main__.py), which lab.run makes and prints.
DASHBOARD_TOKEN_ENV = "CREW_DASHBOARD_TOKEN"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_DELAY_MS = 60_000.0
MAX_SLOW_FACTOR = 1_000.0


class CommandKind(enum.Enum):
    SET_P = "set_p"
    SET_SCHEME = "set_scheme"
    KILL_WORKER = "kill_worker"
    RESTART_WORKER = "restart_worker"
    SLOW_WORKER = "slow_worker"
    CUT_LINK = "cut_link"
    RESTORE_LINK = "restore_link"
    SET_LINK = "set_link"
    START_CONTENTION = "start_contention"
    STOP_CONTENTION = "stop_contention"
    KILL_COORDINATOR = "kill_coordinator"


class CommandError(ValueError):
    """A command that this lab cannot accept; ``field`` names the offending argument."""

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class LabLimits:
    """What this run can do; commands outside it are refused before they are written.

    ``impairments`` names what the lab can change on a link at run time: ``rate`` (always),
    ``delay`` and ``jitter`` (need sch_netem), ``loss`` (netem, or the iptables fallback).
    """

    n: int
    schemes: tuple[Scheme, ...] = DEFAULT_SCHEMES
    impairments: frozenset[str] = ALWAYS_AVAILABLE


# -- the commands ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SetP:
    """Change the partial-reduce group size for groups formed from now on."""

    KIND: ClassVar[CommandKind] = CommandKind.SET_P
    p: int


@dataclass(frozen=True)
class SetScheme:
    """Switch the reduction scheme for groups formed from now on."""

    KIND: ClassVar[CommandKind] = CommandKind.SET_SCHEME
    scheme: Scheme


@dataclass(frozen=True)
class KillWorker:
    KIND: ClassVar[CommandKind] = CommandKind.KILL_WORKER
    worker: int


@dataclass(frozen=True)
class RestartWorker:
    KIND: ClassVar[CommandKind] = CommandKind.RESTART_WORKER
    worker: int


@dataclass(frozen=True)
class SlowWorker:
    """Make a worker's local computation ``factor`` times slower (1 restores normal speed)."""

    KIND: ClassVar[CommandKind] = CommandKind.SLOW_WORKER
    worker: int
    factor: float


@dataclass(frozen=True)
class CutLink:
    """Take the directed link src→dst down (and dst→src too when ``both``)."""

    KIND: ClassVar[CommandKind] = CommandKind.CUT_LINK
    src: int
    dst: int
    both: bool = False


@dataclass(frozen=True)
class RestoreLink:
    KIND: ClassVar[CommandKind] = CommandKind.RESTORE_LINK
    src: int
    dst: int
    both: bool = False


@dataclass(frozen=True)
class SetLink:
    """Reshape the directed link src→dst in place; a ``None`` field is left as it is."""

    KIND: ClassVar[CommandKind] = CommandKind.SET_LINK
    src: int
    dst: int
    rate_mbit: float | None = None
    delay_ms: float | None = None
    loss_pct: float | None = None
    jitter_ms: float | None = None  # last, so positional SetLink(s, d, rate, delay, loss) holds


@dataclass(frozen=True)
class StartContention:
    """Start background traffic src→dst at ``rate_mbit`` competing with the lab's own."""

    KIND: ClassVar[CommandKind] = CommandKind.START_CONTENTION
    src: int
    dst: int
    rate_mbit: float


@dataclass(frozen=True)
class StopContention:
    KIND: ClassVar[CommandKind] = CommandKind.STOP_CONTENTION
    src: int
    dst: int


@dataclass(frozen=True)
class KillCoordinator:
    """Kill the coordinator (SIGKILL); the lab restarts it, and it resumes the run."""

    KIND: ClassVar[CommandKind] = CommandKind.KILL_COORDINATOR


Command = (
    SetP
    | SetScheme
    | KillWorker
    | RestartWorker
    | SlowWorker
    | CutLink
    | RestoreLink
    | SetLink
    | StartContention
    | StopContention
    | KillCoordinator
)

COMMAND_TYPES: dict[CommandKind, type] = {
    cls.KIND: cls
    for cls in (
        SetP,
        SetScheme,
        KillWorker,
        RestartWorker,
        SlowWorker,
        CutLink,
        RestoreLink,
        SetLink,
        StartContention,
        StopContention,
        KillCoordinator,
    )
}


# -- field parsers -----------------------------------------------------------------------------


def _as_int(field: str, value: Any) -> int:
    # bool is an int subclass; True as a worker id is a bug in the caller, not worker 1.
    if isinstance(value, bool):
        raise CommandError(field, f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise CommandError(field, f"expected an integer, got {value!r}")


def _as_float(field: str, value: Any) -> float:
    if isinstance(value, bool):
        raise CommandError(field, f"expected a number, got {value!r}")
    if isinstance(value, int | float):
        x = float(value)
    elif isinstance(value, str):
        try:
            x = float(value.strip())
        except ValueError:
            raise CommandError(field, f"expected a number, got {value!r}") from None
    else:
        raise CommandError(field, f"expected a number, got {value!r}")
    if not math.isfinite(x):
        raise CommandError(field, f"must be finite, got {x}")
    return x


def _as_bool(field: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise CommandError(field, f"expected true or false, got {value!r}")


def _worker(field: str, value: Any, limits: LabLimits) -> int:
    w = _as_int(field, value)
    if not 0 <= w < limits.n:
        raise CommandError(field, f"unknown worker {w} (this run has workers 0..{limits.n - 1})")
    return w


def _positive(field: str, value: Any, upper: float) -> float:
    x = _as_float(field, value)
    if x <= 0:
        raise CommandError(field, f"must be > 0, got {x:g}")
    if x > upper:
        raise CommandError(field, f"must be at most {upper:g}, got {x:g}")
    return x


def _link(args: Mapping[str, Any], limits: LabLimits) -> tuple[int, int]:
    src = _worker("src", args["src"], limits)
    dst = _worker("dst", args["dst"], limits)
    if src == dst:
        raise CommandError("dst", f"a link needs two workers; src and dst are both {src}")
    return src, dst


def _needs(field: str, impairment: str, limits: LabLimits) -> None:
    if impairment not in limits.impairments:
        have = ", ".join(sorted(limits.impairments)) or "none"
        raise CommandError(field, f"{impairment} is not available in this lab (available: {have})")


# -- the public API ----------------------------------------------------------------------------


def parse_command(kind: str | CommandKind, args: Mapping[str, Any], limits: LabLimits) -> Command:
    """Validate ``kind`` and ``args`` against ``limits`` and build the command.

    Raises ``CommandError`` (a ``ValueError``) naming the first bad field: ``kind`` for an
    unknown kind, ``args`` for a non-mapping, the argument's name for an unknown, missing or
    out-of-range argument.
    """
    try:
        ck = kind if isinstance(kind, CommandKind) else CommandKind(kind)
    except ValueError:
        known = ", ".join(k.value for k in CommandKind)
        raise CommandError("kind", f"unknown command {kind!r} (known: {known})") from None
    if not isinstance(args, Mapping):
        raise CommandError("args", f"expected a mapping, got {type(args).__name__}")
    cls = COMMAND_TYPES[ck]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in args:
        if name not in fields:
            raise CommandError(str(name), f"unknown argument for {ck.value}")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING
        if required and (name not in args or args[name] is None):
            raise CommandError(name, f"missing (required by {ck.value})")
    return _BUILDERS[ck](args, limits)


def _set_p(a: Mapping[str, Any], lim: LabLimits) -> SetP:
    p = _as_int("p", a["p"])
    if not 1 <= p <= lim.n:
        raise CommandError("p", f"must be in 1..{lim.n} (the number of workers), got {p}")
    return SetP(p)


def _set_scheme(a: Mapping[str, Any], lim: LabLimits) -> SetScheme:
    s = a["scheme"]
    if not isinstance(s, str) or s not in lim.schemes:
        have = ", ".join(lim.schemes)
        raise CommandError("scheme", f"unknown scheme {s!r} (this run has: {have})")
    return SetScheme(Scheme(s))


def _slow(a: Mapping[str, Any], lim: LabLimits) -> SlowWorker:
    return SlowWorker(
        _worker("worker", a["worker"], lim), _positive("factor", a["factor"], MAX_SLOW_FACTOR)
    )


def _cut(a: Mapping[str, Any], lim: LabLimits) -> CutLink:
    return CutLink(*_link(a, lim), both=_as_bool("both", a.get("both", False)))


def _restore(a: Mapping[str, Any], lim: LabLimits) -> RestoreLink:
    return RestoreLink(*_link(a, lim), both=_as_bool("both", a.get("both", False)))


def _set_link(a: Mapping[str, Any], lim: LabLimits) -> SetLink:
    src, dst = _link(a, lim)
    rate = delay = loss = jitter = None
    if a.get("rate_mbit") is not None:
        rate = _positive("rate_mbit", a["rate_mbit"], MAX_RATE_MBIT)
    if a.get("delay_ms") is not None:
        delay = _as_float("delay_ms", a["delay_ms"])
        if not 0 <= delay <= MAX_DELAY_MS:
            raise CommandError("delay_ms", f"must be in 0..{MAX_DELAY_MS:g} ms, got {delay:g}")
        _needs("delay_ms", "delay", lim)
    if a.get("loss_pct") is not None:
        loss = _as_float("loss_pct", a["loss_pct"])
        if not 0 <= loss <= 100:
            raise CommandError("loss_pct", f"must be in 0..100 %, got {loss:g}")
        _needs("loss_pct", "loss", lim)
    if a.get("jitter_ms") is not None:
        jitter = _as_float("jitter_ms", a["jitter_ms"])
        if not 0 <= jitter <= MAX_DELAY_MS:
            raise CommandError("jitter_ms", f"must be in 0..{MAX_DELAY_MS:g} ms, got {jitter:g}")
        # The link's current delay is known only to the lab (which checks again); a delay given
        # in the same command must already cover the jitter, or the delay could go negative.
        if delay is not None and jitter > delay:
            raise CommandError(
                "jitter_ms", f"{jitter:g} ms exceeds delay_ms {delay:g} ms (jitter <= delay)"
            )
        _needs("jitter_ms", "jitter", lim)
    if rate is None and delay is None and loss is None and jitter is None:
        raise CommandError(
            "rate_mbit", "give at least one of rate_mbit, delay_ms, jitter_ms, loss_pct"
        )
    return SetLink(src, dst, rate, delay, loss, jitter)


def _start_contention(a: Mapping[str, Any], lim: LabLimits) -> StartContention:
    src, dst = _link(a, lim)
    return StartContention(src, dst, _positive("rate_mbit", a["rate_mbit"], MAX_RATE_MBIT))


_BUILDERS = {
    CommandKind.SET_P: _set_p,
    CommandKind.SET_SCHEME: _set_scheme,
    CommandKind.KILL_WORKER: lambda a, lim: KillWorker(_worker("worker", a["worker"], lim)),
    CommandKind.RESTART_WORKER: lambda a, lim: RestartWorker(_worker("worker", a["worker"], lim)),
    CommandKind.SLOW_WORKER: _slow,
    CommandKind.CUT_LINK: _cut,
    CommandKind.RESTORE_LINK: _restore,
    CommandKind.SET_LINK: _set_link,
    CommandKind.START_CONTENTION: _start_contention,
    CommandKind.STOP_CONTENTION: lambda a, lim: StopContention(*_link(a, lim)),
    CommandKind.KILL_COORDINATOR: lambda a, lim: KillCoordinator(),
}


def to_args(command: Command) -> dict[str, Any]:
    """The command's arguments as a JSON-able dict; ``parse_command(kind, to_args(c))`` == c."""
    return dataclasses.asdict(command)


def describe(command: Command) -> str:
    """A one-line human description, for UIs and the event log."""
    match command:
        case SetP(p=p):
            return f"set p = {p}"
        case SetScheme(scheme=s):
            return f"set scheme = {s}"
        case KillWorker(worker=w):
            return f"kill worker {w}"
        case RestartWorker(worker=w):
            return f"restart worker {w}"
        case SlowWorker(worker=w, factor=f):
            return f"slow worker {w} ×{f:g}"
        case CutLink(src=s, dst=d, both=b):
            return f"cut link {s}{'↔' if b else '→'}{d}"
        case RestoreLink(src=s, dst=d, both=b):
            return f"restore link {s}{'↔' if b else '→'}{d}"
        case SetLink(src=s, dst=d, rate_mbit=r, delay_ms=dl, loss_pct=ls, jitter_ms=jt):
            parts = [
                f"{r:g} Mbit/s" if r is not None else "",
                f"{dl:g} ms" if dl is not None else "",
                f"±{jt:g} ms jitter" if jt is not None else "",
                f"{ls:g}% loss" if ls is not None else "",
            ]
            return f"set link {s}→{d}: " + ", ".join(p for p in parts if p)
        case StartContention(src=s, dst=d, rate_mbit=r):
            return f"start contention {s}→{d} at {r:g} Mbit/s"
        case StopContention(src=s, dst=d):
            return f"stop contention {s}→{d}"
        case KillCoordinator():
            return "kill coordinator"
    raise TypeError(f"not a command: {command!r}")


def submit(db_path: str | Path, command: Command, *, t: float | None = None) -> int:
    """Append ``command`` to the run's ``commands`` table as ``pending``; return its id.

    The database must already exist (the lab creates it); a typo in the path must not create a
    fresh, unwatched database that silently swallows commands.
    """
    path = Path(db_path)
    if not path.is_file():
        raise FileNotFoundError(f"no run database at {path}")
    db = rundb.RunDB(path)
    try:
        cid = db.add_command(command.KIND.value, to_args(command), t=t)
    finally:
        db.close()
    log.info("submitted command #%d: %s", cid, describe(command))
    return cid


def load_limits(conn: sqlite3.Connection) -> LabLimits:
    """Read this run's limits from its database.

    ``n`` is the number of rows in ``workers``; ``meta`` keys ``schemes`` and ``impairments``
    (JSON lists, written by the lab) give the rest, defaulting to the built-in schemes and to
    rate changes only.
    """
    n = int(conn.execute("SELECT COUNT(*) FROM workers").fetchone()[0])
    meta = {
        r[0]: r[1]
        for r in conn.execute(
            "SELECT key, value FROM meta WHERE key IN ('schemes', 'impairments')"
        ).fetchall()
    }
    schemes = (
        tuple(Scheme(s) for s in json.loads(meta["schemes"]) if s in Scheme.names())
        if "schemes" in meta
        else DEFAULT_SCHEMES
    )
    imp = frozenset(json.loads(meta["impairments"])) if "impairments" in meta else frozenset()
    return LabLimits(n=n, schemes=schemes, impairments=imp | ALWAYS_AVAILABLE)


def parse_row(row: Mapping[str, Any], limits: LabLimits) -> Command:
    """Parse a ``commands`` row (``kind`` and JSON ``args``) as the lab's applier does."""
    try:
        args = json.loads(row["args"])
    except (TypeError, json.JSONDecodeError) as e:
        raise CommandError("args", f"not valid JSON: {e}") from None
    return parse_command(row["kind"], args, limits)
