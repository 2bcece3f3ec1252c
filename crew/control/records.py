"""What goes into the group life cycle and what comes out of it (``crew.control.lifecycle``).

In: the workers' and the lab's :mod:`crew.wire.protocol` messages and
:class:`WorkerDisconnected` (together an :data:`Event`). Out: messages to send
(:class:`SendTo`) and rows to record (the ``*Record`` classes), plus two requests to the shell
(:class:`PlanAhead`, :class:`StopRequested`); together an :data:`Output`. The
:class:`Outbox` collects one call's outputs in the order they were decided.

Pure data: frozen dataclasses, no behaviour beyond collecting and phrasing a row
(:func:`security_record`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crew.config import Scheme
from crew.control.grouping import Group, GroupOutcome, WorkerState
from crew.control.rejections import SecurityNote
from crew.control.utilisation import TimeSplit
from crew.plan.plancall import PlanCall
from crew.wire import protocol as proto

# -- events in ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerDisconnected:
    """The worker's control connection ended (or was replaced): it counts as lost."""

    worker: int
    why: str


Event = proto.Message | WorkerDisconnected


# -- outputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SendTo:
    """Send ``msg`` to ``worker`` (dropped by the shell if it has no connection)."""

    worker: int
    msg: proto.Message


class Level(enum.Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class EventRecord:
    """A row of the run database's event log."""

    t: float
    kind: str
    message: str
    level: Level = Level.INFO
    worker: int | None = None
    data: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class WorkerStatusRecord:
    """A worker's new state, from ``t``: the time of the event that changed it, as the life
    cycle was given it. Not the moment the record is written: the coordinator writes a call's
    records after the whole call, which may have planned a group meanwhile, and a state
    stamped then would count that plan as the state before (a member's wait, a trigger's
    training) instead of the group's time, which runs from its formation."""

    t: float
    worker: int
    state: WorkerState
    iteration: int | None = None
    group_id: int | None = None
    pid: int | None = None


@dataclass(frozen=True)
class GroupOpenedRecord:
    """A group was formed and planned: its ``groups`` row and its ``group_members`` rows."""

    group: Group
    scheme: Scheme
    started_at: float
    predicted_s: float
    bound_s: float
    plan_json: str


@dataclass(frozen=True)
class GroupUnplannedRecord:
    """A group was formed but no plan was found: recorded as abandoned at once."""

    group: Group
    scheme: Scheme
    ended_at: float
    reason: str


@dataclass(frozen=True)
class GroupClosedRecord:
    """An open group ended; ``dropped`` are the members whose ``group_members`` rows go."""

    group_id: int
    ended_at: float
    outcome: GroupOutcome
    bytes_moved: int
    reason: str
    members: tuple[int, ...]
    weights: tuple[float, ...]
    plan_json: str
    revisions: int
    verify_err: float | None
    dropped: tuple[int, ...]


@dataclass(frozen=True)
class MetaRecord:
    values: Mapping[str, str]


@dataclass(frozen=True)
class IterationRecord:
    t: float
    worker: int
    iteration: int
    loss: float
    accuracy: float | None


@dataclass(frozen=True)
class UtilisationRecord:
    """A worker's cumulative split of its wall time (``crew.control.utilisation``)."""

    t: float
    worker: int
    split: TimeSplit
    wan_bytes: int

    @classmethod
    def of(cls, msg: proto.Utilisation) -> UtilisationRecord:
        split = TimeSplit(msg.compute_s, msg.ready_s, msg.group_s, msg.stalled_s)
        return cls(msg.t, msg.worker, split, msg.wan_bytes)


@dataclass(frozen=True)
class AllReduceRecord:
    """A Gloo all-reduce among all workers, recorded as a completed group of everyone."""

    scheme: Scheme
    n: int
    started: float
    ended: float
    bytes_moved: int


@dataclass(frozen=True)
class PlanAhead:
    """A group that is about to form (a trace's next group) will be planned with ``call`` if
    nothing changes first: the shell may make it now, off the critical path, and answer the
    identical call from it when the group forms (``crew.runtime.planahead``). Ignoring it
    changes nothing but when the plan is computed."""

    call: PlanCall


@dataclass(frozen=True)
class StopRequested:
    """The lab asked the run to stop: the shell ends its loop and calls ``shutdown``."""


Output = (
    SendTo
    | EventRecord
    | WorkerStatusRecord
    | GroupOpenedRecord
    | GroupUnplannedRecord
    | GroupClosedRecord
    | MetaRecord
    | IterationRecord
    | UtilisationRecord
    | AllReduceRecord
    | PlanAhead
    | StopRequested
)


def security_record(note: SecurityNote, now: float) -> EventRecord:
    """The event-log row of a worker's rejected frames (rate-limited by ``RejectionLimiter``)."""
    return EventRecord(
        now,
        "security",
        f"worker {note.worker} rejected {note.count} frame(s) ({note.reason})"
        f" from {', '.join(note.peers)}",
        Level.WARNING,
        note.worker,
        {"reason": note.reason, "count": note.count, "peers": list(note.peers)},
    )


class Outbox:
    """The outputs of one call, in the order they were decided."""

    def __init__(self) -> None:
        self._items: list[Output] = []

    def take(self) -> list[Output]:
        """Everything added since the last ``take``; the outbox is empty afterwards."""
        out, self._items = self._items, []
        return out

    def add(self, item: Output) -> None:
        self._items.append(item)

    def send(self, worker: int, msg: proto.Message) -> None:
        self._items.append(SendTo(worker, msg))

    def event(
        self,
        now: float,
        kind: str,
        message: str,
        *,
        level: Level = Level.INFO,
        worker: int | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self._items.append(EventRecord(now, kind, message, level, worker, data))

    def status(
        self,
        now: float,
        worker: int,
        state: WorkerState,
        *,
        iteration: int | None = None,
        group_id: int | None = None,
        pid: int | None = None,
    ) -> None:
        self._items.append(WorkerStatusRecord(now, worker, state, iteration, group_id, pid))
