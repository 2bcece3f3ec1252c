"""The star planners' plan: which worker aggregates which element range of the vector, and the
predicted times. Validated on construction, serialisable to JSON. Pure, no I/O."""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from crew.plan.inputs import PlanError, check_group, is_int, plan_json_object


class PlanKind(enum.Enum):
    P2A = "p2a"
    P2P = "p2p"
    A2A = "a2a"
    P2A_NONBLOCKING = "p2a_nonblocking"
    PIPELINED = "pipelined"


@dataclass(frozen=True)
class Segment:
    """Elements ``[start, stop)`` of the model vector, aggregated by ``worker``."""

    worker: int
    start: int
    stop: int

    def __post_init__(self) -> None:
        for name in ("worker", "start", "stop"):
            if not is_int(getattr(self, name)):
                raise PlanError("segments", f"{name} must be an int, got {getattr(self, name)!r}")
            object.__setattr__(self, name, int(getattr(self, name)))
        if self.worker < 0 or self.start < 0 or self.stop <= self.start:
            raise PlanError("segments", f"invalid segment {self}")

    @property
    def elems(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Plan:
    """How one group's vector is split among aggregators, and the predicted reduce time.

    ``elems[i]`` is the number of elements worker i aggregates (0 = none); ``segments`` lists the
    element ranges sorted by start, covering ``[0, total_elems)`` exactly once. ``scatter_s`` and
    ``broadcast_s`` are the predicted scatter time X and broadcast time Y; ``predicted_s`` is
    X + Y for the phased plans, and the per-link objective T for ``PIPELINED`` (where X and Y are
    the per-link maxima of the scatter and broadcast loads alone, which overlap in time).
    """

    kind: PlanKind
    group: tuple[int, ...]
    n: int
    elem_bytes: int
    elems: tuple[int, ...]
    segments: tuple[Segment, ...]
    scatter_s: float
    broadcast_s: float
    predicted_s: float

    def __post_init__(self) -> None:
        if not isinstance(self.kind, PlanKind):
            raise PlanError("kind", f"must be a PlanKind, got {self.kind!r}")
        if not is_int(self.n) or self.n < 1:
            raise PlanError("n", f"must be a positive int, got {self.n!r}")
        if not is_int(self.elem_bytes) or self.elem_bytes < 1:
            raise PlanError("elem_bytes", f"must be a positive int, got {self.elem_bytes!r}")
        # Normalise numpy ints so that to_json works whoever built the plan.
        object.__setattr__(self, "group", check_group(self.group, self.n))
        if not isinstance(self.elems, Iterable):
            raise PlanError("elems", f"must be a sequence, got {self.elems!r}")
        object.__setattr__(self, "elems", tuple(self.elems))
        object.__setattr__(self, "segments", tuple(self.segments))
        if len(self.elems) != self.n or not all(is_int(e) and e >= 0 for e in self.elems):
            raise PlanError("elems", f"need {self.n} non-negative ints, got {self.elems!r}")
        object.__setattr__(self, "elems", tuple(int(e) for e in self.elems))
        owned = [0] * self.n
        pos = 0
        for seg in self.segments:
            if not isinstance(seg, Segment):
                raise PlanError("segments", f"not a Segment: {seg!r}")
            if seg.start != pos:
                raise PlanError("segments", f"gap or overlap at element {pos}: {seg}")
            if seg.worker >= self.n:
                raise PlanError("segments", f"worker out of range in {seg}")
            owned[seg.worker] += seg.elems
            pos = seg.stop
        if pos != sum(self.elems) or tuple(owned) != tuple(self.elems):
            raise PlanError("segments", "do not match elems")
        for name in ("scatter_s", "broadcast_s", "predicted_s"):
            value = getattr(self, name)
            if not isinstance(value, float) or not math.isfinite(value) or value < 0:
                raise PlanError(name, f"must be a finite non-negative float, got {value!r}")

    @property
    def total_elems(self) -> int:
        return sum(self.elems)

    @property
    def total_bytes(self) -> int:
        return self.total_elems * self.elem_bytes

    @property
    def aggregators(self) -> tuple[int, ...]:
        """Workers that aggregate at least one element, in index order."""
        return tuple(i for i, e in enumerate(self.elems) if e > 0)

    def bytes_of(self, worker: int) -> int:
        """Bytes aggregated by ``worker``."""
        if not is_int(worker) or not 0 <= worker < self.n:
            raise PlanError("worker", f"must be in [0, {self.n}), got {worker!r}")
        return self.elems[worker] * self.elem_bytes

    def segments_of(self, worker: int) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.worker == worker)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "group": list(self.group),
            "n": self.n,
            "elem_bytes": self.elem_bytes,
            "elems": list(self.elems),
            "segments": [[s.worker, s.start, s.stop] for s in self.segments],
            "scatter_s": self.scatter_s,
            "broadcast_s": self.broadcast_s,
            "predicted_s": self.predicted_s,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        try:
            return cls(
                kind=PlanKind(data["kind"]),
                group=tuple(data["group"]),
                n=data["n"],
                elem_bytes=data["elem_bytes"],
                elems=tuple(data["elems"]),
                segments=tuple(Segment(w, a, b) for w, a, b in data["segments"]),
                scatter_s=float(data["scatter_s"]),
                broadcast_s=float(data["broadcast_s"]),
                predicted_s=float(data["predicted_s"]),
            )
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError("plan", f"malformed plan: {exc!r}") from exc

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(plan_json_object(text))
