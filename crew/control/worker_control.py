"""A worker's control logic: what to do on each coordinator message, without sockets or torch.

Pure: :class:`WorkerControl` holds the worker's side of the group protocol (which group it is
a member of, whether it has offered its model, the current a2a split) and turns each control
message into :class:`Action`s that ``crew.runtime.worker`` carries out on its reduce engine,
transport, trainer and threads. Not thread-safe by itself: the worker calls it under its lock.

The protocol, from a worker's side (docs/architecture.md §4 "The life of a group"):

* after a local iteration it *offers* its model (:meth:`WorkerControl.offer`) and sends
  ``Ready``; with a split (non-blocking mode) it pre-scatters first
  (:meth:`WorkerControl.prescatter_split`);
* an ``Assign`` naming it as a member joins it to the group with the offered vector; one that
  does not only makes it carry blocks (aggregate, forward). A member cancels pre-scattered
  parts the revision-0 plan does not reuse (``crew.control.assignment.covered_parts``), and all
  of them on a later revision;
* a ``Reveal`` (secret check, ``crew.control.secretcheck``) asks a member to prove what it
  offered and holds (:class:`ProveGroup`), before the group's ``Commit``;
* ``Commit``/``Abandon`` of its own group go to the training loop (:class:`DeliverOutcome`),
  which :meth:`WorkerControl.settle` s: apply the average on a commit with a full result, keep
  its own model otherwise. Of a group it only carried, they just end the engine's share. An
  ``Abandon`` naming it as a member that arrives before any ``Assign`` (a group given up at
  once, e.g. no plan) is its own group's outcome too;
* ``SetSlowdown`` changes its straggler padding; ``Stop`` ends it; anything else is refused.

A benchmark worker (``bench``) offers a fixed vector once and never waits for outcomes: every
``Commit``/``Abandon`` only finishes the engine's share.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from crew.control.assignment import covered_parts
from crew.wire import protocol as proto


@dataclass(frozen=True)
class Outcome:
    """How the worker's own group ended."""

    group: int
    committed: bool
    reason: str = ""


@dataclass(frozen=True)
class JoinGroup:
    """Hand the assignment to the reduce engine; with the offered vector when a member."""

    assign: proto.Assign
    member: bool


@dataclass(frozen=True)
class CancelPrescatter:
    """Drop queued pre-scattered parts, except ``keep`` (``(aggregator, part start)``)."""

    keep: frozenset[tuple[int, int]] = frozenset()


@dataclass(frozen=True)
class UseSplit:
    """Non-blocking mode: the coordinator's a2a split, which says what pre-scattered parts
    this worker, as an aggregator, may accept."""

    split: proto.Split


@dataclass(frozen=True)
class ProveGroup:
    """Answer a secret check: project the offered vector and the result of this revision on
    the check vector of ``reveal.nonce`` and send a ``Proof``."""

    reveal: proto.Reveal


@dataclass(frozen=True)
class DeliverOutcome:
    """The training loop's group ended: wake it with the outcome."""

    outcome: Outcome


@dataclass(frozen=True)
class FinishCarried:
    """A group this worker only carried (or a benchmark group) ended: free the engine's share."""

    group: int


@dataclass(frozen=True)
class SetSlowdown:
    factor: float


@dataclass(frozen=True)
class StopWorker:
    reason: str


Action = (
    JoinGroup
    | CancelPrescatter
    | UseSplit
    | ProveGroup
    | DeliverOutcome
    | FinishCarried
    | SetSlowdown
    | StopWorker
)


NO_GROUP = -1  # the outcome of an offer that no group took


class Settlement(enum.Enum):
    """What the training loop does with its group's outcome."""

    APPLY_AVERAGE = "apply"  # committed with a full result: take the average, checkpoint it
    KEEP_OWN_MISSING = "missing"  # committed, but the engine holds no full result
    KEEP_OWN_ABANDONED = "abandoned"  # the group was given up


class WorkerControl:
    def __init__(self, me: int, *, bench: bool = False, nonblocking: bool = False):
        self.me = me
        self.bench = bench
        self.nonblocking = nonblocking
        self.my_group: int | None = None
        self.offered = False  # a model is offered and no outcome for it settled yet
        self.split: proto.Split | None = None

    def offer(self) -> None:
        """The worker has offered its current model (it is about to send Ready)."""
        self.offered = True

    def prescatter_split(self) -> proto.Split | None:
        """The split to pre-scatter the offered model with, if any (non-blocking mode)."""
        if not self.nonblocking or self.split is None or not self.split.segments:
            return None
        return self.split

    def on_message(self, msg: proto.Message) -> list[Action]:
        """The actions for one message from the coordinator; ProtocolError if not for workers."""
        if isinstance(msg, proto.Assign):
            member = self.me in msg.members
            if not member:
                return [JoinGroup(msg, member=False)]
            self.my_group = msg.group
            keep = covered_parts(msg) if msg.rev == 0 else frozenset()
            return [JoinGroup(msg, member=True), CancelPrescatter(keep)]
        if isinstance(msg, proto.Split):
            if not self.nonblocking:
                return []  # pre-scatter is a non-blocking mode's: none is accepted without it
            self.split = msg
            return [UseSplit(msg)]
        if isinstance(msg, proto.Reveal):
            return [ProveGroup(msg)]  # the engine knows whether it holds that revision
        if isinstance(msg, proto.Commit | proto.Abandon):
            if (
                isinstance(msg, proto.Abandon)
                and self.me in msg.members
                and self.my_group is None
                and self.offered
            ):
                self.my_group = msg.group  # given up before its Assign reached us
            if msg.group == self.my_group and not self.bench:
                committed = isinstance(msg, proto.Commit)
                reason = msg.reason if isinstance(msg, proto.Abandon) else ""
                return [DeliverOutcome(Outcome(msg.group, committed, reason))]
            return [FinishCarried(msg.group)]
        if isinstance(msg, proto.SetSlowdown):
            return [SetSlowdown(msg.factor)]
        if isinstance(msg, proto.Stop):
            return [StopWorker(msg.reason)]
        raise proto.ProtocolError(f"type: {msg.TYPE!r} is not for workers")

    def coordinator_lost(self) -> list[Action]:
        """The worker reached a restarted coordinator, which abandoned every group open at its crash
        (``crew.runtime.coordinator.resume_from_db``) and knows of no offer: the member's group, or
        an offer no group took yet, ends as abandoned, and the worker trains on."""
        if not self.offered or self.bench:
            return []
        group = NO_GROUP if self.my_group is None else self.my_group
        return [DeliverOutcome(Outcome(group, False, "coordinator restarted"))]

    def settle(self, outcome: Outcome, *, have_result: bool) -> tuple[Settlement, Action]:
        """The training loop took its group's outcome: what to do with the model, and the
        clean-up (every pre-scattered part left is dropped). The worker is free to train."""
        if outcome.committed:
            settlement = Settlement.APPLY_AVERAGE if have_result else Settlement.KEEP_OWN_MISSING
        else:
            settlement = Settlement.KEEP_OWN_ABANDONED
        self.my_group = None
        self.offered = False
        return settlement, CancelPrescatter()


def evaluation_due(now: float, last_eval: float, every_s: float) -> bool:
    """Whether this iteration's metrics include a held-out evaluation."""
    return now - last_eval >= every_s
