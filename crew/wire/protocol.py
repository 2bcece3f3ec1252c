"""Control-plane messages between workers, the coordinator and the lab.

They travel as JSON objects inside authenticated CONTROL frames (``crew.wire.frames``) over the
unshaped management network. Each message type is a frozen dataclass; ``decode`` turns a JSON
object back into one and refuses anything malformed with ``ProtocolError``, naming the field,
so a bad message is dropped with a warning instead of crashing the receiver.

Who sends what::

    worker -> coordinator   Register, Heartbeat, Ready, Metrics, Utilisation, HaveAll, Proof,
                            LinkFailed, LinkRates, LinkHealth, Rejected, OpTime
    coordinator -> worker   Assign, Split, Reveal, Commit, Abandon, SetSlowdown, Stop
    lab -> coordinator      Admin (set_p, set_scheme, set_link, stop)

Start-up of a launched job (``crew.runtime.rendezvous``, before the coordinator exists)::

    worker -> rendezvous    Join, RosterTaken, LinkRates
    rendezvous -> worker    Roster, Probe, Start, Refused
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar


class ProtocolError(ValueError):
    """A control message is malformed; the message names the field."""


@dataclass(frozen=True)
class AtLeast:
    """A field's constraint: a number no smaller than ``low``."""

    low: float

    def check(self, name: str, value: Any) -> None:
        if value < self.low:
            raise ProtocolError(f"{name}: must be at least {self.low:g}, got {value}")


@dataclass(frozen=True)
class Below:
    """A field's constraint: a number smaller than ``high``."""

    high: int

    def check(self, name: str, value: Any) -> None:
        if value >= self.high:
            raise ProtocolError(f"{name}: must be below {self.high}, got {value}")


@dataclass(frozen=True)
class Length:
    """A field's constraint: a list of exactly ``n`` items."""

    n: int

    def check(self, name: str, value: Any) -> None:
        if len(value) != self.n:
            raise ProtocolError(f"{name}: expected {self.n} items, got {len(value)}")


def admin_number(name: str, value: object) -> float:
    """An ``Admin`` argument that must be a finite number >= 0 (NaN would poison the plans)."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ProtocolError(f"admin.args.{name}: expected a number, got {value!r}") from None
    if not math.isfinite(x) or x < 0:
        raise ProtocolError(f"admin.args.{name}: must be finite and >= 0, got {x}")
    return x


Count = Annotated[int, AtLeast(0)]
# A secret check's nonce (crew.control.secretcheck): 64 random bits.
Nonce = Annotated[int, AtLeast(0), Below(1 << 64)]
Positive = Annotated[int, AtLeast(1)]
# [src, bytes, seconds] of one link's measured arrivals (LinkRates).
RateSample = Annotated[list[Annotated[float, AtLeast(0)]], Length(3)]


@dataclass(frozen=True)
class Message:
    TYPE: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """The message as a JSON object. Shallow: no field holds a dataclass, and the lists
        are shared with the message (``dataclasses.asdict`` deep-copied every one of them, a
        large share of a worker's control CPU at n = 32), so do not mutate them."""
        out = {name: getattr(self, name) for name in _field_names(type(self))}
        out["type"] = self.TYPE
        return out


@dataclass(frozen=True)
class Register(Message):
    TYPE: ClassVar[str] = "register"
    worker: int
    pid: Count
    iteration: int
    vector_len: Positive


@dataclass(frozen=True)
class Heartbeat(Message):
    TYPE: ClassVar[str] = "heartbeat"
    worker: int
    iteration: int


@dataclass(frozen=True)
class Ready(Message):
    """A worker finished a local iteration and offers its model for the next group."""

    TYPE: ClassVar[str] = "ready"
    worker: int
    iteration: int
    proj: float  # projection of the offered vector on the run's check vector (crew.control.verify)
    split_epoch: int  # the a2a split it already started scattering with; -1: none


@dataclass(frozen=True)
class Metrics(Message):
    TYPE: ClassVar[str] = "metrics"
    worker: int
    iteration: int
    loss: float
    accuracy: float | None
    t: float


Seconds = Annotated[float, AtLeast(0)]


@dataclass(frozen=True)
class Utilisation(Message):
    """A worker's wall time so far, split into computing and waiting (cumulative; see
    ``crew.control.utilisation``), and the WAN bytes it has sent."""

    TYPE: ClassVar[str] = "utilisation"
    worker: int
    t: float
    compute_s: Seconds
    ready_s: Seconds
    group_s: Seconds
    stalled_s: Seconds
    wan_bytes: Count


@dataclass(frozen=True)
class HaveAll(Message):
    """A member holds every aggregated element of this group revision."""

    TYPE: ClassVar[str] = "have_all"
    worker: int
    group: int
    rev: int
    bytes_sent: Count
    proj: float  # projection of the result: the coordinator checks it against the members'


@dataclass(frozen=True)
class Reveal(Message):
    """Secret check (``crew.control.secretcheck``): every member of this revision holds its
    result and the public check passed; project the offered vector and the result on the check
    vector drawn from the run's number and ``nonce``, and answer with a ``Proof``."""

    TYPE: ClassVar[str] = "reveal"
    group: Count
    rev: Count
    nonce: Nonce


@dataclass(frozen=True)
class Proof(Message):
    """A member's answer to ``Reveal``: the projections of its offered vector and of its result
    on the revealed check vector, and the codec's error bound of its offered vector
    (``crew.train.compress.error_norm``; 0 without compression). Clipped aggregation adds the
    clipped residual, its scale and the result's norm (``crew.control.clipcheck``; 0 in mean
    mode, and left out by a sender that knows nothing of it)."""

    TYPE: ClassVar[str] = "proof"
    worker: int
    group: Count
    rev: Count
    offered_proj: float
    result_proj: float
    error_norm: Annotated[float, AtLeast(0)]
    clip_residual: float = 0.0
    clip_scale: Annotated[float, AtLeast(0)] = 0.0
    clip_norm: Annotated[float, AtLeast(0)] = 0.0


@dataclass(frozen=True)
class LinkFailed(Message):
    """The data-plane link src -> dst failed (socket error or no progress)."""

    TYPE: ClassVar[str] = "link_failed"
    worker: int
    src: int
    dst: int
    reason: str


@dataclass(frozen=True)
class LinkRates(Message):
    """Measured arrival rates into this worker: ``[src, bytes, seconds]`` per link src -> it."""

    TYPE: ClassVar[str] = "link_rates"
    worker: int
    samples: list[RateSample]


@dataclass(frozen=True)
class LinkHealth(Message):
    """What this worker sees, sent on every change of a link's probe state and periodically.

    ``down``: peers whose probes stopped arriving (``crew.wire.probes``): the links ``src ->
    worker`` are dead. ``received``: ``[group, rev, bytes]``, the group data bytes this worker
    received per open group revision so far, so the coordinator sees which groups still move."""

    TYPE: ClassVar[str] = "link_health"
    worker: int
    down: list[int]
    received: list[list[int]]


@dataclass(frozen=True)
class Rejected(Message):
    """A peer sent this worker a frame that failed checks (bad MAC, oversized, malformed)."""

    TYPE: ClassVar[str] = "rejected"
    worker: int
    peer: str
    reason: str


@dataclass(frozen=True)
class OpTime(Message):
    """One all-reduce among all workers outside the coordinator's groups (the Gloo scheme)."""

    TYPE: ClassVar[str] = "op_time"
    worker: int
    op: int
    started: float
    ended: float
    nbytes: Count


@dataclass(frozen=True)
class Assign(Message):
    """A group revision: who contributes, with which weight, and how the data travels.

    ``routes`` are ``crew.plan.routes.Route.to_list()`` lists (range, root, reduce and broadcast
    edges); ``pipelined`` says whether parts stream through the trees or are stored and
    forwarded range by range. A new revision of the same group supersedes the previous one.
    """

    TYPE: ClassVar[str] = "assign"
    group: int
    rev: int
    scheme: str
    members: list[int]
    weights: list[float]
    routes: list[list[Any]]
    pipelined: bool
    total: int
    part_elems: int
    # Non-blocking mode: the a2a split (``[worker, start, stop]``) the members pre-scattered
    # with, and the iteration each member offered; empty when nothing was pre-scattered.
    prescatter: list[list[int]]
    iterations: list[int]
    split_epoch: int
    # ``[index here, index in revision rev - 1]`` per route this revision keeps unchanged from
    # the previous one: its parts' partial sums, contributors and delivered results stay where
    # they are and nothing of it is sent again (failover resends only what was lost).
    kept: list[list[int]] = dataclasses.field(default_factory=list)
    # Clipped aggregation: the group's radius rho (``crew.control.clipradius``), which the roots
    # clip with and the members prove with; 0 in mean mode.
    clip_rho: Annotated[float, AtLeast(0)] = 0.0


@dataclass(frozen=True)
class Split(Message):
    """Non-blocking mode: the a2a split a ready worker scatters with before its group exists."""

    TYPE: ClassVar[str] = "split"
    epoch: int
    segments: list[list[int]]
    part_elems: int


@dataclass(frozen=True)
class Commit(Message):
    """Every member holds the result of this revision: apply it."""

    TYPE: ClassVar[str] = "commit"
    group: int
    rev: int


@dataclass(frozen=True)
class Abandon(Message):
    """Give the group up: members keep their own model and go on training."""

    TYPE: ClassVar[str] = "abandon"
    group: int
    reason: str
    # Set when the group is given up before its Assign went out (no plan): its members are
    # waiting for it without knowing its id, and recognise it by this list.
    members: list[int]


@dataclass(frozen=True)
class SetSlowdown(Message):
    TYPE: ClassVar[str] = "set_slowdown"
    factor: Annotated[float, AtLeast(0)]


@dataclass(frozen=True)
class Stop(Message):
    TYPE: ClassVar[str] = "stop"
    reason: str


@dataclass(frozen=True)
class Admin(Message):
    """From the lab: ``op`` is one of ``set_p``, ``set_scheme``, ``set_link``, ``stop``."""

    TYPE: ClassVar[str] = "admin"
    op: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Join(Message):
    """A launched worker asks to join the job: its rank, the world it expects, where its
    data-plane transport listens, and the shapes of the tensors it averages."""

    TYPE: ClassVar[str] = "join"
    worker: int
    world: int
    host: str
    port: int
    shapes: list[list[int]]
    pid: int


@dataclass(frozen=True)
class Roster(Message):
    """Every rank joined: the data-plane address ``[host, port]`` of each, by rank, and the
    start-up probe to run (``probe_bytes`` per burst, each round cut at ``probe_seconds``;
    0 bytes: no probe, the job uses configured capacities)."""

    TYPE: ClassVar[str] = "roster"
    peers: list[list[Any]]
    probe_bytes: int
    probe_seconds: float


@dataclass(frozen=True)
class RosterTaken(Message):
    """A worker knows every peer's address: its transport accepts their connections now."""

    TYPE: ClassVar[str] = "roster_taken"
    worker: int


@dataclass(frozen=True)
class Probe(Message):
    """This worker's part of one start-up probe round (``crew.runtime.capacity_probe``): send
    a burst to rank ``send_to`` and time the one from rank ``time_from`` (-1: none)."""

    TYPE: ClassVar[str] = "probe"
    send_to: int
    time_from: int


@dataclass(frozen=True)
class Start(Message):
    """The job's run configuration (``RunConfig.to_json``'s object): register and train."""

    TYPE: ClassVar[str] = "start"
    config: dict[str, Any]


@dataclass(frozen=True)
class Refused(Message):
    """The job cannot start, or this worker may not join it; ``reason`` says why."""

    TYPE: ClassVar[str] = "refused"
    reason: str


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (
        Register,
        Heartbeat,
        Ready,
        Metrics,
        Utilisation,
        HaveAll,
        Reveal,
        Proof,
        LinkFailed,
        LinkRates,
        LinkHealth,
        Rejected,
        OpTime,
        Assign,
        Split,
        Commit,
        Abandon,
        SetSlowdown,
        Stop,
        Admin,
        Join,
        Roster,
        RosterTaken,
        Probe,
        Start,
        Refused,
    )
}


def _check(name: str, value: Any, hint: Any) -> Any:
    """Check one JSON value against a field's annotation (the small subset the messages use)."""
    if hint is Any:
        return value  # checked where it is interpreted (e.g. crew.plan.routes.Route.from_list)
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *constraints = typing.get_args(hint)
        value = _check(name, value, base)
        for c in constraints:
            c.check(name, value)
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        return _check(name, value, inner[0])
    if hint is bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{name}: expected a boolean, got {type(value).__name__}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{name}: expected an integer, got {type(value).__name__}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(f"{name}: expected a number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ProtocolError(f"{name}: must be finite")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ProtocolError(f"{name}: expected a string, got {type(value).__name__}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{name}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(hint)
        return [_check(f"{name}[{i}]", v, item) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{name}: expected an object, got {type(value).__name__}")
        return value
    raise ProtocolError(f"{name}: unsupported field type {hint!r}")  # a bug in this module


_Schema = tuple[dict[str, Any], tuple[str, ...], frozenset[str]]


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _schema(cls: type) -> _Schema:
    """A message class's field annotations, field names and optional fields (computed once:
    ``typing.get_type_hints`` re-evaluates every annotation at each call)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    optional = frozenset(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    )
    return hints, _field_names(cls), optional


def decode(obj: Any) -> Message:
    """Turn a decoded JSON object into a typed message, or raise ``ProtocolError``."""
    if not isinstance(obj, dict):
        raise ProtocolError(f"message: expected a JSON object, got {type(obj).__name__}")
    kind = obj.get("type")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"type: unknown message type {kind!r}")
    hints, names, optional = _schema(cls)
    extra = sorted(set(obj) - set(names) - {"type"})
    if extra:
        raise ProtocolError(f"{kind}: unknown fields {extra}")
    values = {}
    for name in names:
        if name not in obj:
            if name in optional:
                continue  # a field added later, with a default: older senders leave it out
            raise ProtocolError(f"{kind}.{name}: missing")
        values[name] = _check(f"{kind}.{name}", obj[name], hints[name])
    return cls(**values)
