"""The scatter-aggregate-broadcast engine that carries one worker's share of every group.

One engine per worker. It plays two roles at once, for any number of groups in flight:

* **member**: it scatters its weighted vector, range by range, to the aggregator the plan names
  for each range, and collects the aggregated ranges that come back;
* **aggregator**: for each range the plan gives it, it sums the members' contributions part by
  part and, as soon as a part has every member's copy, sends the sum to every member.

Which worker aggregates which range is the only thing that differs between the original partial
reduce (members only, ``solve_p2p``) and CREW (every active worker, ``solve_p2a``), so both run
on this engine. Parts (``part_elems`` elements, about 1 MB) let aggregation and broadcast start
before a whole block has arrived.

Revisions: when a group changes (a member dies, a link fails) the coordinator sends a new
revision with a new plan. All state of older revisions is discarded and the members scatter
again, so a result always averages exactly the members of one revision, and no contribution
is ever counted twice: every part remembers who contributed.

Frames can arrive before the assignment that explains them (the control and data planes are
separate networks), so an aggregator parks early frames, within a byte budget, until the
assignment arrives.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from crew.frames import Frame, FrameKind
from crew.protocol import Assign

log = logging.getLogger(__name__)

DTYPE = np.dtype("<f4")
EARLY_FRAME_BUDGET = 512 << 20  # bytes of frames parked before their assignment arrives


class ReduceError(ValueError):
    """An assignment or frame is inconsistent; the message says what."""


@dataclass(frozen=True)
class Part:
    aggregator: int
    start: int
    stop: int


def parts_of(assign: Assign) -> Iterator[Part]:
    """Cut every segment of the plan into parts of at most ``part_elems`` elements."""
    step = assign.part_elems
    for worker, start, stop in assign.segments:
        for s in range(start, stop, step):
            yield Part(worker, s, min(s + step, stop))


def validate_assign(assign: Assign, n: int) -> None:
    if assign.part_elems <= 0:
        raise ReduceError(f"assign.part_elems: must be positive, got {assign.part_elems}")
    if not assign.members or len(set(assign.members)) != len(assign.members):
        raise ReduceError(f"assign.members: must be distinct and non-empty: {assign.members}")
    if len(assign.weights) != len(assign.members):
        raise ReduceError("assign.weights: one weight per member")
    if any(not 0 <= m < n for m in assign.members):
        raise ReduceError(f"assign.members: worker out of range 0..{n - 1}")
    pos = 0
    for worker, start, stop in assign.segments:
        if not 0 <= worker < n:
            raise ReduceError(f"assign.segments: aggregator {worker} out of range")
        if start != pos or stop <= start:
            raise ReduceError(f"assign.segments: [{start}, {stop}) does not continue at {pos}")
        pos = stop
    if pos != assign.total:
        raise ReduceError(f"assign.segments: cover {pos} elements, vector has {assign.total}")


@dataclass
class _PartSum:
    total: np.ndarray
    contributors: set[int] = field(default_factory=set)


@dataclass
class _Group:
    assign: Assign
    # member side
    result: np.ndarray | None = None
    received: set[int] = field(default_factory=set)  # part starts received
    expected_parts: int = 0
    done: bool = False
    # aggregator side
    my_parts: dict[int, Part] = field(default_factory=dict)  # part start -> part
    sums: dict[int, _PartSum] = field(default_factory=dict)
    bytes_sent: int = 0


class ReduceEngine:
    """One worker's side of every group in flight. Thread-safe; frames arrive on many threads.

    ``send(dst, frame)`` enqueues a frame for another worker (never called with ``dst == me``:
    local traffic is delivered in-process). ``on_have_all(group, rev, bytes_sent)`` fires once
    per revision when this member holds the whole result.
    """

    def __init__(
        self,
        me: int,
        n: int,
        run: int,
        send: Callable[[int, Frame], None],
        on_have_all: Callable[[int, int, int], None],
    ):
        self.me = me
        self.n = n
        self.run = run
        self._send = send
        self._on_have_all = on_have_all
        self._lock = threading.RLock()
        self._groups: dict[int, _Group] = {}
        self._vectors: dict[int, np.ndarray] = {}  # group -> this member's unweighted vector
        self._early: dict[tuple[int, int], list[Frame]] = {}
        self._early_bytes = 0
        self._finished: set[int] = set()
        self.dropped_frames = 0

    # -- control ---------------------------------------------------------------------------

    def assign(self, assign: Assign, vector: np.ndarray | None = None) -> None:
        """Take part in a group revision; members pass the vector they offered when ready."""
        validate_assign(assign, self.n)
        me_member = self.me in assign.members
        with self._lock:
            if assign.group in self._finished:
                return
            current = self._groups.get(assign.group)
            if current is not None and current.assign.rev >= assign.rev:
                return  # stale or repeated revision
            if me_member:
                if vector is not None:
                    self._vectors[assign.group] = np.asarray(vector, dtype=DTYPE)
                if assign.group not in self._vectors:
                    raise ReduceError(f"group {assign.group}: member {self.me} has no vector")
                if self._vectors[assign.group].size != assign.total:
                    raise ReduceError(
                        f"group {assign.group}: vector has {self._vectors[assign.group].size}"
                        f" elements, plan covers {assign.total}"
                    )
            g = _Group(assign=assign)
            parts = list(parts_of(assign))
            g.expected_parts = len(parts)
            g.my_parts = {p.start: p for p in parts if p.aggregator == self.me}
            if me_member:
                g.result = np.empty(assign.total, dtype=DTYPE)
            self._groups[assign.group] = g
            # Drop parked frames of older revisions; replay those of this one.
            for key in [k for k in self._early if k[0] == assign.group and k[1] <= assign.rev]:
                frames = self._early.pop(key)
                self._early_bytes -= sum(len(f.payload) for f in frames)
                if key[1] == assign.rev:
                    for frame in frames:
                        self._handle(frame)
            if me_member:
                self._scatter(g, parts)

    def finish(self, group: int) -> np.ndarray | None:
        """Forget a group (committed or abandoned); return this member's result if complete."""
        with self._lock:
            g = self._groups.pop(group, None)
            self._vectors.pop(group, None)
            self._finished.add(group)
            for key in [k for k in self._early if k[0] == group]:
                self._early_bytes -= sum(len(f.payload) for f in self._early.pop(key))
            if g is not None and g.done:
                return g.result
            return None

    def groups(self) -> list[int]:
        with self._lock:
            return sorted(self._groups)

    # -- data ------------------------------------------------------------------------------

    def on_frame(self, frame: Frame) -> None:
        with self._lock:
            self._handle(frame)

    def _handle(self, frame: Frame) -> None:
        if frame.group in self._finished:
            return
        g = self._groups.get(frame.group)
        if g is None or frame.rev > g.assign.rev:
            self._park(frame)
            return
        if frame.rev < g.assign.rev:
            return  # superseded revision: its contributions are not part of the new average
        try:
            if frame.kind == FrameKind.SCATTER:
                self._on_scatter(g, frame)
            elif frame.kind == FrameKind.RESULT:
                self._on_result(g, frame)
            else:
                raise ReduceError(f"unexpected frame kind {frame.kind!r} on the data plane")
        except ReduceError as exc:
            self.dropped_frames += 1
            log.warning("worker %d: dropped frame from %d: %s", self.me, frame.sender, exc)

    def _park(self, frame: Frame) -> None:
        size = len(frame.payload)
        if self._early_bytes + size > EARLY_FRAME_BUDGET:
            self.dropped_frames += 1
            log.warning(
                "worker %d: dropped early frame of group %d (budget full)", self.me, frame.group
            )
            return
        self._early.setdefault((frame.group, frame.rev), []).append(frame)
        self._early_bytes += size

    def _payload(self, frame: Frame, part: Part) -> np.ndarray:
        data = frame.payload
        if len(data) != (part.stop - part.start) * DTYPE.itemsize:
            raise ReduceError(
                f"part at {part.start}: {len(data)} bytes, expected"
                f" {(part.stop - part.start) * DTYPE.itemsize}"
            )
        values = np.frombuffer(data, dtype=DTYPE)
        if not np.all(np.isfinite(values)):
            raise ReduceError(f"part at {part.start}: non-finite values")
        return values

    def _scatter(self, g: _Group, parts: list[Part]) -> None:
        a = g.assign
        weight = a.weights[a.members.index(self.me)]
        weighted = self._vectors[a.group] * np.float32(weight)
        for part in parts:
            chunk = weighted[part.start : part.stop]
            if part.aggregator == self.me:
                self._contribute(g, part, self.me, chunk)
            else:
                g.bytes_sent += chunk.nbytes
                self._send(part.aggregator, self._frame(FrameKind.SCATTER, a, part, chunk))

    def _frame(self, kind: FrameKind, a: Assign, part: Part, values: np.ndarray) -> Frame:
        return Frame(
            kind=kind,
            sender=self.me,
            run=self.run,
            group=a.group,
            rev=a.rev,
            block=part.aggregator,
            part=(part.start - self._segment_start(a, part)) // a.part_elems,
            offset=part.start,
            payload=np.ascontiguousarray(values, dtype=DTYPE).tobytes(),
        )

    @staticmethod
    def _segment_start(a: Assign, part: Part) -> int:
        for worker, start, stop in a.segments:
            if worker == part.aggregator and start <= part.start < stop:
                return start
        return part.start

    def _on_scatter(self, g: _Group, frame: Frame) -> None:
        part = g.my_parts.get(frame.offset)
        if part is None:
            raise ReduceError(f"no part at offset {frame.offset} is aggregated here")
        if frame.sender not in g.assign.members:
            raise ReduceError(f"sender {frame.sender} is not a member of group {frame.group}")
        self._contribute(g, part, frame.sender, self._payload(frame, part))

    def _contribute(self, g: _Group, part: Part, sender: int, values: np.ndarray) -> None:
        acc = g.sums.get(part.start)
        if acc is None:
            acc = g.sums[part.start] = _PartSum(np.zeros(part.stop - part.start, dtype=DTYPE))
        if sender in acc.contributors:
            raise ReduceError(f"duplicate contribution from {sender} at offset {part.start}")
        acc.total += values
        acc.contributors.add(sender)
        if len(acc.contributors) == len(g.assign.members):
            self._broadcast(g, part, acc.total)

    def _broadcast(self, g: _Group, part: Part, total: np.ndarray) -> None:
        a = g.assign
        for member in a.members:
            if member == self.me:
                self._accept_result(g, part.start, total)
            else:
                g.bytes_sent += total.nbytes
                self._send(member, self._frame(FrameKind.RESULT, a, part, total))

    def _on_result(self, g: _Group, frame: Frame) -> None:
        if g.result is None:
            raise ReduceError(f"result for group {frame.group}, but this worker is no member")
        part = self._part_at(g.assign, frame.offset)
        if part is None or frame.sender != part.aggregator:
            raise ReduceError(f"result at offset {frame.offset} from wrong sender {frame.sender}")
        self._accept_result(g, part.start, self._payload(frame, part))

    def _part_at(self, a: Assign, offset: int) -> Part | None:
        for worker, start, stop in a.segments:
            if start <= offset < stop and (offset - start) % a.part_elems == 0:
                return Part(worker, offset, min(offset + a.part_elems, stop))
        return None

    def _accept_result(self, g: _Group, start: int, values: np.ndarray) -> None:
        if start in g.received:
            return
        assert g.result is not None
        g.result[start : start + values.size] = values
        g.received.add(start)
        if len(g.received) == g.expected_parts and not g.done:
            g.done = True
            self._on_have_all(g.assign.group, g.assign.rev, g.bytes_sent)
