"""Overlapped reduce: train on while the group reduces, then apply its result as a delta.

In the blocking mode a worker offers its model and waits until its group ends. In the
overlapped mode it offers a *snapshot* and goes on computing; when the group's result
arrives, it is applied as a delta against that snapshot::

    offer:   s = x                       (the model now; the outer loop's offer is made from it)
    ...      x moves on by local steps   (progress made while the group reduces)
    result:  x <- x + (synced - s)       (synced: what the blocking mode would load)

so the local progress made meanwhile is kept and the group's correction is added on top: the
one-step-delayed outer update of eager updates (Streaming DiLoCo) and DiLoCoX. With DiLoCo the
outer loop sets its base ``theta`` to ``synced`` and the model becomes ``theta + (x - s)``, so
the next pseudo-gradient ``theta - x`` covers exactly the steps taken since the snapshot:
nothing is counted twice and nothing is lost.

An abandoned group applies nothing: the snapshot is dropped, the model keeps all its local
progress, and the outer loop keeps its base (``OuterLoop.on_abandon``), as in the blocking mode.

How many reduces may be in flight per worker: this bookkeeping takes any ``limit``, and deltas
of several rounds add up the same in any order. The runtime allows one
(``crew.Averager.start``): the coordinator holds one offer per worker, and a worker in a group
is not ready for the next, so a second offer before the first settles would have to wait for it
anyway. One in flight already hides a reduce that is shorter than a local iteration.

When to resolve: as soon as the result is here. The lab's worker asks between its local steps
(``PendingRound.ready``) and resolves there, so only the steps taken while the group reduced
start from the snapshot; resolved at the end of the next iteration, all H of them would.

Pure NumPy: flat float32 vectors in, flat float32 vectors out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["DelayedUpdates", "OverlapError"]


class OverlapError(RuntimeError):
    """An overlapped round was used out of order: too many in flight, or resolved twice."""


@dataclass
class DelayedUpdates:
    """The snapshots of the rounds in flight, by ticket, at most ``limit`` at once."""

    limit: int = 1
    _snapshots: dict[int, np.ndarray] = field(default_factory=dict)
    _next: int = 0

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise OverlapError(f"limit must be at least 1, got {self.limit}")

    @property
    def in_flight(self) -> int:
        return len(self._snapshots)

    def offer(self, snapshot: np.ndarray) -> int:
        """Keep a copy of the model as offered; returns the round's ticket."""
        if len(self._snapshots) >= self.limit:
            raise OverlapError(
                f"{len(self._snapshots)} round(s) already in flight (at most {self.limit}):"
                " wait for one first"
            )
        ticket = self._next
        self._next += 1
        self._snapshots[ticket] = np.array(snapshot, dtype=np.float32, copy=True)
        return ticket

    def resolve(self, ticket: int, current: np.ndarray, synced: np.ndarray) -> np.ndarray:
        """The model to load: ``current + (synced - snapshot)``; the ticket is spent."""
        snapshot = self._take(ticket)
        if current.shape != snapshot.shape or synced.shape != snapshot.shape:
            raise OverlapError(
                f"round {ticket}: shapes {current.shape} and {synced.shape} do not match the"
                f" snapshot's {snapshot.shape}"
            )
        return (current + (synced - snapshot)).astype(np.float32, copy=False)

    def abandon(self, ticket: int) -> None:
        """The round's group was given up: drop its snapshot, apply nothing."""
        self._take(ticket)

    def _take(self, ticket: int) -> np.ndarray:
        try:
            return self._snapshots.pop(ticket)
        except KeyError:
            raise OverlapError(f"round {ticket} is not in flight (already applied?)") from None
