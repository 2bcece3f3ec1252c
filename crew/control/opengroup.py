"""A group between its formation and its commit or abandonment, as the life cycle keeps it.

:class:`OpenGroup` is the mutable state of one open group (its current revision, plan and
what its workers have reported); :class:`OpenGroupState` is its frozen copy for snapshots.
Pure data with two small operations: the progress a worker reports, and the conversion between
the two forms. :class:`LifecycleSnapshot` holds the frozen copies with the life cycle's run-wide
settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from crew.config import Scheme
from crew.control.grouping import Group
from crew.control.verify import agreement_error, relative_error
from crew.plan.schemes import GroupPlan
from crew.wire import protocol as proto


@dataclass
class OpenGroup:
    """A group between its formation and its commit or abandonment."""

    group: Group
    scheme: Scheme
    rev: int
    members: tuple[int, ...]
    weights: tuple[float, ...]
    plan: GroupPlan
    participants: set[int]
    deadline: float
    have_all: set[int] = field(default_factory=set)
    result_projs: dict[int, float] = field(default_factory=dict)
    bytes_moved: int = 0  # what the plans of all its revisions put on the links
    prescatter: list[list[int]] = field(default_factory=list)  # rev 0 of a non-blocking group
    split_epoch: int = -1
    rev_started: float = 0.0
    received: dict[int, int] = field(default_factory=dict)  # worker -> bytes of this revision
    moved_at: float = 0.0  # when this revision last received data (or was assigned)
    kept: list[list[int]] = field(default_factory=list)  # Assign.kept of this revision
    verify_err: float | None = None  # the public check's, while a secret check is under way

    def progress(self, worker: int, rev: int, received: int, now: float) -> None:
        """``worker`` has received ``received`` bytes of revision ``rev`` by ``now``: the
        revision moved if that is more than it reported before (reports of an older revision
        say nothing about this one)."""
        if rev == self.rev and received > self.received.get(worker, 0):
            self.received[worker] = received
            self.moved_at = now

    def public_error(self, offered_proj: Mapping[int, float], clip: bool = False) -> float:
        """The public result check's relative error (``crew.control.verify``) of this revision,
        once every member's result projection is in; NaN when an offered one is missing.
        ``clip``: a clipped result is no linear mean, so only whether the members hold one
        result (``agreement_error``); the secret check verifies it (``crew.control.clipcheck``)."""
        check = agreement_error if clip else relative_error
        return check(
            [self.result_projs[m] for m in self.members],
            self.weights,
            [offered_proj.get(m, float("nan")) for m in self.members],
        )

    def freeze(self) -> OpenGroupState:
        """Its frozen copy (``kept`` is not part of it: a restored revision keeps nothing)."""
        return OpenGroupState(
            group=self.group,
            scheme=self.scheme,
            rev=self.rev,
            members=self.members,
            weights=self.weights,
            plan=self.plan,
            participants=frozenset(self.participants),
            deadline=self.deadline,
            have_all=frozenset(self.have_all),
            result_projs=tuple(sorted(self.result_projs.items())),
            bytes_moved=self.bytes_moved,
            prescatter=tuple(tuple(s) for s in self.prescatter),
            split_epoch=self.split_epoch,
            rev_started=self.rev_started,
            received=tuple(sorted(self.received.items())),
            moved_at=self.moved_at,
        )

    @classmethod
    def thaw(cls, s: OpenGroupState) -> OpenGroup:
        """The open group of a frozen copy."""
        return cls(
            group=s.group,
            scheme=s.scheme,
            rev=s.rev,
            members=s.members,
            weights=s.weights,
            plan=s.plan,
            participants=set(s.participants),
            deadline=s.deadline,
            have_all=set(s.have_all),
            result_projs=dict(s.result_projs),
            bytes_moved=s.bytes_moved,
            prescatter=[list(p) for p in s.prescatter],
            split_epoch=s.split_epoch,
            rev_started=s.rev_started,
            received=dict(s.received),
            moved_at=s.moved_at,
        )


@dataclass(frozen=True)
class OpenGroupState:
    """A frozen copy of an :class:`OpenGroup`, for snapshots."""

    group: Group
    scheme: Scheme
    rev: int
    members: tuple[int, ...]
    weights: tuple[float, ...]
    plan: GroupPlan
    participants: frozenset[int]
    deadline: float
    have_all: frozenset[int]
    result_projs: tuple[tuple[int, float], ...]
    bytes_moved: int
    prescatter: tuple[tuple[int, ...], ...]
    split_epoch: int
    rev_started: float
    received: tuple[tuple[int, int], ...] = ()
    moved_at: float = 0.0


@dataclass(frozen=True)
class LifecycleSnapshot:
    """The life cycle's own state (open groups and run-wide settings).

    The former (ready queue, workers' states, a trace's position) is not part of it: a restart
    rebuilds that from the workers' re-registrations and the recorded groups."""

    open_groups: tuple[OpenGroupState, ...]
    scheme: Scheme
    size_elems: int | None
    connected: frozenset[int]
    offered_proj: tuple[tuple[int, float], ...]


def check_progress(entry: list[int]) -> tuple[int, int, int]:
    """One ``LinkHealth.received`` entry as ``(group, rev, bytes)``."""
    if len(entry) != 3:
        raise proto.ProtocolError(f"link_health.received: {entry} is not [group, rev, n]")
    return entry[0], entry[1], entry[2]
