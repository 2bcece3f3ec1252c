"""The lab's requests to a running coordinator (``Admin`` messages), checked before they act.

Pure: :func:`parse_admin` turns one ``Admin`` message into a typed request, or refuses it with
``ProtocolError`` naming the argument; the life cycle (``crew.control.lifecycle``) carries the
request out. Cost: constant per message.
"""

from __future__ import annotations

from dataclasses import dataclass

from crew.plan.schemes import GROUP_SCHEMES
from crew.wire import protocol as proto


@dataclass(frozen=True)
class SetP:
    """Groups formed from now on have ``p`` members."""

    p: int


@dataclass(frozen=True)
class SetScheme:
    """Groups formed from now on use ``scheme`` (one of ``GROUP_SCHEMES``)."""

    scheme: str


@dataclass(frozen=True)
class SetLink:
    """The link ``src -> dst`` now has this rate (and delay, None: unchanged)."""

    src: int
    dst: int
    rate_mbit: float
    delay_ms: float | None


@dataclass(frozen=True)
class SlowWorker:
    """Tell ``worker`` to slow its local steps down by ``factor``."""

    worker: int
    factor: float


@dataclass(frozen=True)
class StopRun:
    """End the run."""


AdminRequest = SetP | SetScheme | SetLink | SlowWorker | StopRun


def parse_admin(msg: proto.Admin, n: int) -> AdminRequest:
    """The request ``msg`` makes of a run of ``n`` workers; ``ProtocolError`` naming the
    argument for an unknown op, a missing or malformed argument, or a worker or link that is
    not in the run."""
    op, args = msg.op, msg.args
    try:
        if op == "set_p":
            return SetP(int(args["p"]))
        if op == "set_scheme":
            name = str(args["scheme"])
            if name not in GROUP_SCHEMES:
                raise proto.ProtocolError(f"admin.args.scheme: unknown {name!r}")
            return SetScheme(name)
        if op == "set_link":
            src, dst = int(args["src"]), int(args["dst"])
            if not (0 <= src < n and 0 <= dst < n) or src == dst:
                raise proto.ProtocolError(f"admin.args: {src}->{dst} is not a link of this run")
            rate = proto.admin_number("rate_mbit", args["rate_mbit"])
            delay = args.get("delay_ms")
            delay_ms = None if delay is None else proto.admin_number("delay_ms", delay)
            return SetLink(src, dst, rate, delay_ms)
        if op == "slow_worker":
            worker = int(args["worker"])
            if not 0 <= worker < n:
                raise proto.ProtocolError(f"admin.args.worker: no worker {worker} in this run")
            return SlowWorker(worker, proto.admin_number("factor", args["factor"]))
        if op == "stop":
            return StopRun()
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, proto.ProtocolError):
            raise
        raise proto.ProtocolError(f"admin.args: bad arguments for {op!r}: {exc!r}") from exc
    raise proto.ProtocolError(f"admin.op: unknown {op!r}")
