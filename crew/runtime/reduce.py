"""The engine that carries one worker's share of every group, for every scheme.

One engine per worker. A group revision arrives as a set of routes (``crew.plan.routes``): for
each element range, a reduce tree towards a root and a broadcast tree from it. For every route
the engine plays whatever part the plan gives this worker:

* **member leaf**: send its weighted copy of the range up to its parent;
* **inner node or root**: add its own copy (if it is a member) and its children's partial sums,
  part by part; when a part has them all, pass the sum up, or, at the root, start the
  broadcast;
* **on the broadcast tree**: keep the sum (if it is a member) and pass it on to its children.

CREW and the original partial reduce are stars (one per block, rooted at the block's
aggregator), PS is one star, Ring is paths, BLINK and TopoAdopt are spanning trees: all run on
this engine, so they are compared on the same transport, framing and bookkeeping. Clipped
aggregation (``clip``, ``crew.control.clipping``) takes stars of members only: the leaves send
unweighted copies, and each root clips its parts' copies instead of summing them.

Parts stream through the trees when the plan is ``pipelined``: a node passes a part on as soon
as it is complete (cut-through at part granularity). Otherwise a node waits until the whole
range is complete before passing anything on (store and forward, as the paper's phased design
and non-pipelined BLINK do). Each route is cut into its own parts
(``crew.control.assignment.route_part_elems``: about an eighth of the route, 64 KiB at least,
the assignment's ``part_elems`` at most), so a small route of a multi-hop plan still pipelines
through its relays.

Every frame goes to the transport with a priority: the number of hops its data has already
travelled on its route (reduce hops, then broadcast hops), furthest along first
(``crew.wire.transport.Transport.send``). Why: every node queues all of its own first-hop
data at once; a relay's forwarded parts or a root's broadcast queued behind it (first come,
first served) would wait until the link had sent everything else, and the route's later links
would idle meanwhile. Forwarded data first keeps every route flowing through its hops while
the first hops fill the rest of each link's time.

That holds for **pipelined** plans only. A store-and-forward plan sends everything at one
priority, so each link is first come, first served, as its phases (and ``crew.sim.network``)
assume. With hop priorities a root's broadcast, queued once its own range is in, would overtake
the rest of that node's scatter to the other roots on the same link, and those roots would start
their own broadcasts only after it (docs/decisions/2026-12-02-store-and-forward-at-one-priority.md).

Revisions: when a group changes (a member dies, a link fails) the coordinator sends a new
revision with a new plan. A revision may keep routes of the previous one unchanged
(``Assign.kept``: same range, trees and members, none of its nodes or links lost): their state
(partial sums with their contributors, held and delivered results) carries over, frames of
them stamped with the older revision still count (``_Group.alias``), and nothing of them is
sent again. Only the other routes start from scratch: the failover resends only what was lost.
A member change always re-plans everything (the weights change). So a result always sums
exactly the members of one revision, and no contribution is counted twice: every part
remembers which children contributed, across revisions too.

Compression (``--compress fp16|int8``): a :class:`~crew.train.partcodec.PartCodec` turns a part
into payload bytes where a frame is made and back where one is read, and nowhere else: nodes
add decoded parts in float32, the root encodes the sum once for the broadcast and loads the
decoded values itself, and broadcast relays forward the payload bytes unchanged. Each payload
carries the projection of its encode errors, which members subtract from their result's
projection (:meth:`ReduceEngine.codec_error`; the derivation is in ``crew.train.partcodec``).

Frames can arrive before the assignment that explains them (the control and data planes are
separate networks), so early frames are parked, within a byte budget, until it arrives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from crew.control.assignment import (
    ReduceError,
    covered_parts,
    down_depth,
    part_starts,
    route_part_sizes,
    up_heights,
    validate_assign,
)
from crew.control.clipping import ClipRule
from crew.control.verify import project
from crew.plan.routes import Route
from crew.runtime.prescatter import prescatter_part_len
from crew.train.compress import CompressError
from crew.train.partcodec import PartCodec
from crew.wire.frames import Frame, FrameKind
from crew.wire.protocol import Assign, Split

log = logging.getLogger(__name__)

DTYPE = np.dtype("<f4")
EARLY_FRAME_BUDGET = 512 << 20  # bytes of frames parked before their assignment arrives
# An unused pre-scattered offer expires after this: a backstop, as a new offer or split
# replaces it first (a group that counts on its parts forms within seconds, or is abandoned).
PRESCATTER_TTL_S = 600.0
# Ended group ids kept (a week would hold millions); older ones are known ended by a floor,
# since ids only grow and a group is long over when 4,096 after it have ended.
FINISHED_KEPT = 4096


@dataclass
class _Acc:
    """One part's partial sum at one node, and who is in it. Once the part has gone on up,
    ``total`` is released but the contributors stay, so a late duplicate is still refused."""

    total: np.ndarray | None
    contributors: set[int] = field(default_factory=set)
    complete: bool = False
    err: float = 0.0  # codec error projection carried by the contributions (PartCodec)
    copies: dict[int, np.ndarray] = field(default_factory=dict)  # clip mode, at a root: who -> copy


@dataclass
class _RouteState:
    route: Route
    step: int  # elements per part of this route
    parts: list[int]  # part starts
    expect: frozenset[int]  # contributors expected at this node: up-children (+ me if member)
    parent: int | None
    down: tuple[int, ...]
    receiver: bool  # this node holds the sum when done (root or broadcast child)
    up_priority: int = 0  # transport priority of this node's partial sums (lower goes first)
    down_priority: int = 0  # ... and of the results it passes on
    acc: dict[int, _Acc] = field(default_factory=dict)
    completed_up: int = 0  # parts whose sum is complete here
    held_down: dict[int, np.ndarray] = field(default_factory=dict)  # store-and-forward buffer
    held_wire: dict[int, bytes] = field(default_factory=dict)  # their payloads (codec only)


@dataclass
class _Pre:
    """Parts one sender pre-scattered to this aggregator for one offer (non-blocking mode)."""

    epoch: int
    iteration: int
    since: float  # monotonic time of its first part (PRESCATTER_TTL_S)
    parts: dict[int, np.ndarray] = field(default_factory=dict)  # offset -> unweighted values


@dataclass
class _Group:
    assign: Assign
    routes: dict[int, _RouteState]  # route index -> state, only routes this node is on
    member: bool
    covered: frozenset[tuple[int, int]] = frozenset()
    result: np.ndarray | None = None
    received: set[tuple[int, int]] = field(default_factory=set)
    expected_results: int = 0
    done: bool = False
    bytes_sent: int = 0
    errs: dict[tuple[int, int], float] = field(default_factory=dict)  # (route, part) -> err
    projs: dict[tuple[int, int], float] = field(default_factory=dict)  # (route, part) -> r . part
    # (rev, route index) of a kept route in an earlier revision -> its index in this one, so
    # frames stamped before the revision still count (see ``ReduceEngine.assign``).
    alias: dict[tuple[int, int], int] = field(default_factory=dict)


class ReduceEngine:
    """One worker's side of every group in flight. Thread-safe; frames arrive on many threads.

    ``send(dst, frame, priority)`` enqueues a frame for another worker (never called with
    ``dst == me``); frames of lower ``priority`` go first on their link (see the module doc).
    ``on_have_all(group, rev, bytes_sent)`` fires once per revision when this member holds the
    whole result.
    """

    def __init__(
        self,
        me: int,
        n: int,
        run: int,
        send: Callable[[int, Frame, int], None],
        on_have_all: Callable[[int, int, int], None],
        codec: PartCodec | None = None,
        check: np.ndarray | None = None,
        *,
        prescatter: bool = False,
        clip: ClipRule | None = None,
    ):
        self.me = me
        self._clip = clip  # None: the weighted sum; else roots clip unweighted copies
        self.prescatter = prescatter  # non-blocking mode: pre-scattered parts are accepted
        self._pre_early: list[Frame] = []  # parts that came before their split
        self._pre_early_bytes = 0
        self._codec = codec  # None: float32 payloads
        self._check = check  # the run's check vector (crew.control.verify), or None: no projections
        self.n = n
        self.run = run
        self._send = send
        self._on_have_all = on_have_all
        self._lock = threading.RLock()
        self._groups: dict[int, _Group] = {}
        self._vectors: dict[int, np.ndarray] = {}  # group -> this member's unweighted vector
        self._early: dict[tuple[int, int], list[Frame]] = {}
        self._early_bytes = 0
        self._finished: set[int] = set()  # the newest FINISHED_KEPT ended groups
        self._finished_order: deque[int] = deque()
        self._finished_floor = -1  # every group up to this id that is not open has ended
        self._pre: dict[int, _Pre] = {}  # sender -> its latest pre-scattered offer
        self._split: Split | None = None  # the coordinator's a2a split (non-blocking mode)
        self.dropped_frames = 0

    # -- control ---------------------------------------------------------------------------

    def assign(self, assign: Assign, vector: np.ndarray | None = None) -> None:
        """Take part in a group revision; members pass the vector they offered when ready."""
        routes = validate_assign(assign, self.n)
        if self._clip is not None:
            self._clip.validate(assign, routes)
        steps = route_part_sizes(assign, routes)
        member = self.me in assign.members
        with self._lock:
            if self._ended(assign.group):
                return
            current = self._groups.get(assign.group)
            if current is not None and current.assign.rev >= assign.rev:
                return  # stale or repeated revision
            if member:
                if vector is not None:
                    self._vectors[assign.group] = np.asarray(vector, dtype=DTYPE)
                held = self._vectors.get(assign.group)
                if held is None:
                    raise ReduceError(f"group {assign.group}: member {self.me} has no vector")
                if held.size != assign.total:
                    raise ReduceError(
                        f"group {assign.group}: vector has {held.size} elements,"
                        f" plan covers {assign.total}"
                    )
            g = _Group(assign=assign, routes={}, member=member, covered=covered_parts(assign))
            carried = self._carry(current, assign, routes, g)
            for k, r in enumerate(routes):
                on_route = self.me in r.nodes()
                if not on_route:
                    continue
                if k in carried:
                    g.routes[k] = carried[k]
                    if member and carried[k].receiver:
                        g.expected_results += len(carried[k].parts)
                    continue
                expect = set(r.children_up(self.me))
                if member:
                    expect.add(self.me)
                heights = up_heights(r)
                # Store and forward: one level, so every link is first come, first served (see
                # the module docstring); pipelined: furthest along first.
                hop = assign.pipelined
                st = _RouteState(
                    route=r,
                    step=steps[k],
                    parts=part_starts(r, steps[k]),
                    expect=frozenset(expect),
                    parent=r.parent(self.me),
                    down=r.children_down(self.me),
                    receiver=self.me in r.receivers(),
                    up_priority=-heights.get(self.me, 0) if hop else 0,
                    down_priority=-(heights[r.root] + down_depth(r, self.me)) if hop else 0,
                )
                g.routes[k] = st
                if member and st.receiver:
                    g.expected_results += len(st.parts)
            if member and g.result is None:
                g.result = np.empty(assign.total, dtype=DTYPE)
            self._groups[assign.group] = g
            early = sorted(k for k in self._early if k[0] == assign.group and k[1] <= assign.rev)
            for key in early:
                frames = self._early.pop(key)
                self._early_bytes -= sum(len(f.payload) for f in frames)
                for frame in frames:
                    self._handle(frame)  # older revisions: only the kept routes' frames count
            if member:
                self._contribute_own(g)
            for sender in list(self._pre):
                self._use_prescattered(g, sender)
            self._check_done(g)

    def _carry(
        self, current: _Group | None, assign: Assign, routes: list[Route], g: _Group
    ) -> dict[int, _RouteState]:
        """The route states ``assign`` keeps from ``current`` (its previous revision), by their
        new index; sets ``g``'s aliases, delivered parts, codec errors and result buffer."""
        if current is None or not assign.kept or current.assign.rev != assign.rev - 1:
            return {}
        old_rev = current.assign.rev
        carried: dict[int, _RouteState] = {}
        moved: dict[int, int] = {}  # old index -> new
        for new_k, old_k in assign.kept:
            st = current.routes.get(old_k)
            if st is None:
                continue  # not on this route: nothing of it is held here
            if st.route != routes[new_k]:
                raise ReduceError(
                    f"group {assign.group} rev {assign.rev}: kept route {new_k} is not route"
                    f" {old_k} of rev {old_rev}"
                )
            carried[new_k] = st
            moved[old_k] = new_k
        for (rev, k), old_k in current.alias.items():
            if old_k in moved:
                g.alias[(rev, k)] = moved[old_k]
        for old_k, new_k in moved.items():
            g.alias[(old_rev, old_k)] = new_k
        g.received = {(moved[k], s) for k, s in current.received if k in moved}
        g.errs = {(moved[k], s): e for (k, s), e in current.errs.items() if k in moved}
        g.projs = {(moved[k], s): p for (k, s), p in current.projs.items() if k in moved}
        if carried and current.member and self.me in assign.members:
            g.result = current.result  # the kept ranges' results are in it already
        return carried

    def superseded(self) -> Callable[[Frame], bool]:
        """A test for queued group frames that are of no use any more: their group ended, or
        they belong to an older revision's route that the current one did not keep. The worker
        drops such frames from its send queues on a new revision, so the links carry what
        counts. The test works on a copy of the state taken now, without the engine's lock:
        the transport calls it under its own queue locks, which the engine takes while holding
        its lock (``_send``)."""
        with self._lock:
            finished = set(self._finished)
            floor = self._finished_floor
            current = {gid: (g.assign.rev, frozenset(g.alias)) for gid, g in self._groups.items()}

        def useless(frame: Frame) -> bool:
            if frame.kind not in (FrameKind.SCATTER, FrameKind.RESULT):
                return False
            if frame.group in finished or (frame.group <= floor and frame.group not in current):
                return True
            rev, kept = current.get(frame.group, (-1, frozenset()))
            return frame.rev < rev and (frame.rev, frame.block) not in kept

        return useless

    def finish(self, group: int) -> np.ndarray | None:
        """Forget a group (committed or abandoned); return this member's result if complete."""
        with self._lock:
            g = self._groups.pop(group, None)
            self._vectors.pop(group, None)
            if g is not None and g.covered:
                for m, it in zip(g.assign.members, g.assign.iterations, strict=True):
                    pre = self._pre.get(m)
                    if pre is not None and pre.iteration == it:
                        del self._pre[m]
            self._end(group)
            for key in [k for k in self._early if k[0] == group]:
                self._early_bytes -= sum(len(f.payload) for f in self._early.pop(key))
            if g is not None and g.done:
                return g.result
            return None

    def result(self, group: int) -> np.ndarray | None:
        """This member's whole result of the group's current revision, once it has it."""
        with self._lock:
            g = self._groups.get(group)
            return g.result if g is not None and g.done else None

    def codec_error(self, group: int) -> float:
        """Sum of the codec error projections of this member's result parts (0 without a
        codec): subtract it from ``r . result`` (see ``crew.train.partcodec``)."""
        with self._lock:
            g = self._groups.get(group)
            if g is None:
                return 0.0
            return sum(e for (k, _), e in g.errs.items() if g.routes[k].receiver)

    def held(self, group: int, rev: int) -> tuple[np.ndarray, np.ndarray] | None:
        """This member's offered vector and whole result of revision ``rev``, for a secret
        check (``crew.control.secretcheck``); None if it holds no whole result of it. Neither
        changes until the group is finished (a later revision is another revision)."""
        with self._lock:
            g = self._groups.get(group)
            vector = self._vectors.get(group)
            if g is None or vector is None or g.assign.rev != rev or not g.done:
                return None
            assert g.result is not None
            return vector, g.result

    def result_projection(self, group: int) -> float | None:
        """``check · result`` of this member's whole result, summed part by part as the parts
        arrived (``check`` given to the engine), or None: no check, or no whole result yet."""
        with self._lock:
            g = self._groups.get(group)
            if self._check is None or g is None or not g.done:
                return None
            return sum(p for (k, _), p in g.projs.items() if g.routes[k].receiver)

    def groups(self) -> list[int]:
        with self._lock:
            return sorted(self._groups)

    # -- data ------------------------------------------------------------------------------

    def on_frame(self, frame: Frame) -> None:
        with self._lock:
            self._handle(frame)

    def _handle(self, frame: Frame) -> None:
        if frame.kind == FrameKind.PRESCATTER:
            try:
                self._on_prescatter(frame)
            except ReduceError as exc:
                self.dropped_frames += 1
                log.warning(
                    "worker %d: dropped pre-scattered part from %d: %s", self.me, frame.sender, exc
                )
            return
        if self._ended(frame.group):
            return
        g = self._groups.get(frame.group)
        if g is None or frame.rev > g.assign.rev:
            self._park(frame)
            return
        if frame.rev < g.assign.rev:
            k = g.alias.get((frame.rev, frame.block))
            if k is None:
                return  # a superseded revision's route: not part of the new sum
            frame = replace(frame, rev=g.assign.rev, block=k)  # a kept route: still counts
        try:
            st = g.routes.get(frame.block)
            if st is None:
                raise ReduceError(f"route {frame.block} does not pass through worker {self.me}")
            if frame.kind == FrameKind.SCATTER:
                self._on_up(g, st, frame)
            elif frame.kind == FrameKind.RESULT:
                self._on_down(g, st, frame)
            else:
                raise ReduceError(f"unexpected frame kind {frame.kind!r} on the data plane")
        except ReduceError as exc:
            self.dropped_frames += 1
            log.warning("worker %d: dropped frame from %d: %s", self.me, frame.sender, exc)

    def _end(self, group: int) -> None:
        """Remember that ``group`` ended, within FINISHED_KEPT ids."""
        if group in self._finished:
            return
        self._finished.add(group)
        self._finished_order.append(group)
        while len(self._finished_order) > FINISHED_KEPT:
            old = self._finished_order.popleft()
            self._finished.discard(old)
            self._finished_floor = max(self._finished_floor, old)

    def _ended(self, group: int) -> bool:
        return group in self._finished or (
            group <= self._finished_floor and group not in self._groups
        )

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

    def set_split(self, split: Split) -> None:
        """Non-blocking mode: the split pre-scattered parts are held to. Offers under another
        split are dropped; parts that came before it (data overtook control) are handled."""
        with self._lock:
            self._split = split
            for sender in [s for s, p in self._pre.items() if p.epoch != split.epoch]:
                del self._pre[sender]
            early, self._pre_early = self._pre_early, []
            self._pre_early_bytes = 0
            for frame in early:
                if frame.rev >= split.epoch:
                    self._handle(frame)

    def _park_prescatter(self, frame: Frame) -> bool:
        """Keep a part whose split has not come yet, within a quarter of the early budget."""
        known = -1 if self._split is None else self._split.epoch
        if not self.prescatter or frame.rev <= known:
            return False
        size = len(frame.payload)
        if self._pre_early_bytes + size > EARLY_FRAME_BUDGET // 4:
            return False
        self._pre_early.append(frame)
        self._pre_early_bytes += size
        return True

    def _prescatter_len(self, frame: Frame) -> int:
        """The exact number of values a pre-scattered part must hold: the split's part at
        ``frame.offset`` of this aggregator's segment. ReduceError if there is none."""
        split = self._split
        if not self.prescatter:
            raise ReduceError("pre-scattered part outside non-blocking mode")
        if split is None:
            raise ReduceError("pre-scattered part before any split, and no room to keep it")
        if frame.rev != split.epoch:
            raise ReduceError(f"pre-scattered part of split {frame.rev}, not {split.epoch}")
        length = prescatter_part_len(split, self.me, frame.offset)
        if length is None:
            raise ReduceError(f"offset {frame.offset} is no part of worker {self.me}'s segment")
        return length

    def _on_prescatter(self, frame: Frame) -> None:
        if not 0 <= frame.sender < self.n or frame.sender == self.me:
            raise ReduceError(f"pre-scattered part from invalid sender {frame.sender}")
        if frame.block != self.me:
            raise ReduceError(f"pre-scattered part for aggregator {frame.block} reached {self.me}")
        if self._park_prescatter(frame):
            return
        values = self._values(frame, self._prescatter_len(frame))
        now = time.monotonic()
        for sender in [s for s, p in self._pre.items() if now - p.since > PRESCATTER_TTL_S]:
            del self._pre[sender]
        pre = self._pre.get(frame.sender)
        if pre is None or (pre.epoch, pre.iteration) != (frame.rev, frame.part):
            pre = self._pre[frame.sender] = _Pre(frame.rev, frame.part, now)  # a newer offer
        # One offer is one vector at most: a sender cannot make this worker hold more.
        held = sum(v.nbytes for o, v in pre.parts.items() if o != frame.offset) + values.nbytes
        if held > self._prescatter_budget():
            raise ReduceError(
                f"pre-scattered parts from {frame.sender} exceed {self._prescatter_budget()} bytes"
            )
        pre.parts[frame.offset] = values
        for g in self._groups.values():
            self._use_prescattered(g, frame.sender)

    def _prescatter_budget(self) -> int:
        """Bytes one sender's pre-scattered offer may hold here: a whole vector (known from
        the check vector), else an equal share of the early-frame budget."""
        if self._check is not None:
            return int(self._check.nbytes)
        return EARLY_FRAME_BUDGET // max(self.n, 1)

    def _use_prescattered(self, g: _Group, sender: int) -> None:
        """Count ``sender``'s pre-scattered parts that ``g``'s plan says it will not resend."""
        a = g.assign
        pre = self._pre.get(sender)
        if not g.covered or pre is None or sender not in a.members or a.split_epoch != pre.epoch:
            return
        if a.iterations[a.members.index(sender)] != pre.iteration:
            return
        weight = np.float32(a.weights[a.members.index(sender)])
        for k, st in g.routes.items():
            if st.route.root != self.me or sender not in st.expect:
                continue
            for start in st.parts:
                values = pre.parts.get(start)
                acc = st.acc.get(start)
                if (self.me, start) not in g.covered or values is None:
                    continue
                if acc is not None and sender in acc.contributors:
                    continue
                length = self._part_len(g, st, start)
                if len(values) < length:  # never let numpy stretch a short part over a long one
                    self.dropped_frames += 1
                    del pre.parts[start]
                    log.warning(
                        "worker %d: dropped pre-scattered part %d from %d: %d values, expected %d",
                        self.me,
                        start,
                        sender,
                        len(values),
                        length,
                    )
                    continue
                self._add(g, k, st, start, sender, values[:length] * weight, owned=True)

    def _part_len(self, g: _Group, st: _RouteState, start: int) -> int:
        if start not in range(st.route.start, st.route.stop, st.step):
            raise ReduceError(
                f"offset {start} is not a part of route [{st.route.start}, {st.route.stop})"
            )
        return min(start + st.step, st.route.stop) - start

    def _values(self, frame: Frame, length: int) -> np.ndarray:
        if len(frame.payload) != length * DTYPE.itemsize:
            raise ReduceError(
                f"part at {frame.offset}: {len(frame.payload)} bytes, expected"
                f" {length * DTYPE.itemsize}"
            )
        values = np.frombuffer(frame.payload, dtype=DTYPE)
        if not np.all(np.isfinite(values)):
            raise ReduceError(f"part at {frame.offset}: non-finite values")
        return values

    def _decode(self, frame: Frame, length: int) -> tuple[np.ndarray, float]:
        """A group frame's values and carried codec error (0.0 without a codec)."""
        if self._codec is None:
            return self._values(frame, length), 0.0
        try:
            return self._codec.decode(frame.payload, frame.offset, length)
        except CompressError as exc:
            raise ReduceError(f"part at {frame.offset}: {exc}") from exc

    def _encode(
        self, values: np.ndarray, start: int, err: float
    ) -> tuple[bytes, np.ndarray, float]:
        """``(payload, values as the receiver decodes them, carried err)`` (codec only)."""
        assert self._codec is not None
        try:
            return self._codec.encode(values, start, err)
        except CompressError as exc:
            raise ReduceError(f"part at {start}: {exc}") from exc

    def _frame(
        self,
        kind: FrameKind,
        g: _Group,
        k: int,
        start: int,
        values: np.ndarray,
        err: float = 0.0,
        wire: bytes | None = None,
    ) -> Frame:
        """A frame of ``values``; with a codec, ``wire`` (bytes already encoded, forwarded
        unchanged) or ``values`` encoded here with ``err`` carried."""
        if self._codec is not None:
            payload = wire if wire is not None else self._encode(values, start, err)[0]
        else:
            # No copy: ``values`` is never written again once framed (a passed-on sum is
            # released, received parts are read-only), as Transport.send requires.
            payload = memoryview(np.ascontiguousarray(values, dtype=DTYPE)).cast("B")
        return Frame(
            kind=kind,
            sender=self.me,
            run=self.run,
            group=g.assign.group,
            rev=g.assign.rev,
            block=k,
            part=(start - g.routes[k].route.start) // g.routes[k].step,
            offset=start,
            payload=payload,
        )

    def _send_to(self, g: _Group, dst: int, frame: Frame, priority: int) -> None:
        g.bytes_sent += len(frame.payload)
        self._send(dst, frame, priority)

    # reduce tree

    def _contribute_own(self, g: _Group) -> None:
        a = g.assign
        weight = np.float32(1 if self._clip else a.weights[a.members.index(self.me)])
        vec = self._vectors[a.group]
        # Interleave the routes: part j of a route with m parts goes at (j + 1/2) / m of the
        # way, so every route progresses at the same pace on every link it shares. Route by
        # route, the routes queued last on a busy link would reach their roots only at its end,
        # and their broadcasts would run after it
        # (docs/decisions/2026-12-02-interleave-first-hop-parts.md).
        order = sorted(
            ((j + 0.5) / len(st.parts), k, start)
            for k, st in g.routes.items()
            if self.me in st.expect
            for j, start in enumerate(st.parts)
        )
        for _, k, start in order:
            st = g.routes[k]
            acc = st.acc.get(start)
            if acc is not None and self.me in acc.contributors:
                continue  # a kept route: counted in an earlier revision
            stop = start + self._part_len(g, st, start)
            self._add(g, k, st, start, self.me, vec[start:stop] * weight, owned=True)

    def _on_up(self, g: _Group, st: _RouteState, frame: Frame) -> None:
        if frame.sender not in st.expect or frame.sender == self.me:
            raise ReduceError(
                f"worker {frame.sender} is no child of {self.me} on route {frame.block}"
            )
        length = self._part_len(g, st, frame.offset)
        values, err = self._decode(frame, length)
        self._add(g, frame.block, st, frame.offset, frame.sender, values, err=err)

    def _add(
        self,
        g: _Group,
        k: int,
        st: _RouteState,
        start: int,
        who: int,
        values: np.ndarray,
        *,
        owned: bool = False,
        err: float = 0.0,
    ) -> None:
        """Count ``who``'s part. ``owned``: ``values`` is a fresh array nobody else holds, so it
        may become the running sum itself; otherwise (a received, read-only part) it is copied
        only if something will be added to it."""
        acc = st.acc.get(start)
        if acc is None:
            # The first contribution is the sum so far. A node with one contributor (a leaf,
            # or a relay with one child) passes it on without a copy.
            first = values if owned or len(st.expect) == 1 else values.copy()
            acc = st.acc[start] = _Acc(first, {who}, err=err)
        elif who in acc.contributors or acc.total is None:
            raise ReduceError(f"duplicate contribution from {who} at offset {start}")
        else:
            if self._clip is None:
                acc.total += values
            acc.contributors.add(who)
            acc.err += err
        if self._clip is not None and st.parent is None:
            acc.copies[who] = values  # clip mode sums nothing: the root clips the copies
        if len(acc.contributors) < len(st.expect) or acc.complete:
            return
        acc.complete = True
        st.completed_up += 1
        if self._pipelined(g):
            self._pass_up(g, k, st, start)
        elif st.completed_up == len(st.parts):
            for s in st.parts:
                self._pass_up(g, k, st, s)

    def _pass_up(self, g: _Group, k: int, st: _RouteState, start: int) -> None:
        acc = st.acc[start]
        total = acc.total
        assert total is not None
        if (
            st.parent is not None
            and (st.parent, start) in g.covered
            and st.parent == st.route.root
            and not st.route.children_up(self.me)
        ):
            acc.total = None  # pre-scattered already: the aggregator uses that copy
            return
        if st.parent is not None:
            frame = self._frame(FrameKind.SCATTER, g, k, start, total, acc.err)
            self._send_to(g, st.parent, frame, st.up_priority)
            acc.total = None  # a non-root node is done with this part's values
        elif self._codec is not None:
            # Encode the sum once for the broadcast; the root keeps what its children decode.
            wire, values, err = self._encode(total, start, acc.err)
            self._deliver(g, k, st, start, values, err, wire)
            acc.total = None
        else:
            if self._clip is not None:
                total, acc.copies = self._clip.combine(g.assign, acc.copies), {}
            self._deliver(g, k, st, start, total)
            acc.total = None  # _deliver copied what it keeps

    # broadcast tree

    def _on_down(self, g: _Group, st: _RouteState, frame: Frame) -> None:
        parent = next((p for p, c in st.route.down if c == self.me), None)
        if frame.sender != parent:
            raise ReduceError(
                f"result from {frame.sender}, but {self.me}'s broadcast parent on"
                f" route {frame.block} is {parent}"
            )
        length = self._part_len(g, st, frame.offset)
        values, err = self._decode(frame, length)
        wire = None if self._codec is None else bytes(frame.payload)
        self._deliver(g, frame.block, st, frame.offset, values, err, wire)

    def _deliver(
        self,
        g: _Group,
        k: int,
        st: _RouteState,
        start: int,
        values: np.ndarray,
        err: float = 0.0,
        wire: bytes | None = None,
    ) -> None:
        """``wire``: the payload to forward unchanged (codec only; None: frame ``values``)."""
        if (k, start) in g.received:
            return
        g.received.add((k, start))
        g.errs[(k, start)] = err
        if g.member and g.result is not None:
            g.result[start : start + values.size] = values
            if self._check is not None:
                # Verified as it lands: the whole-vector projection at the end sat on the op's
                # tail (4-160 ms per member on bench-hetero, under this lock, 2 cores busy).
                g.projs[(k, start)] = project(self._check[start : start + values.size], values)
        if st.down:
            if self._pipelined(g):
                frame = self._frame(FrameKind.RESULT, g, k, start, values, wire=wire)
                for child in st.down:
                    self._send_to(g, child, frame, st.down_priority)
            else:
                st.held_down[start] = np.array(values, dtype=DTYPE)
                if wire is not None:
                    st.held_wire[start] = wire
                if len(st.held_down) == len(st.parts):
                    for s in st.parts:
                        for child in st.down:
                            frame = self._frame(
                                FrameKind.RESULT, g, k, s, st.held_down[s], wire=st.held_wire.get(s)
                            )
                            self._send_to(g, child, frame, st.down_priority)
                    st.held_down.clear()
                    st.held_wire.clear()
        self._check_done(g)

    def _check_done(self, g: _Group) -> None:
        if g.done or not g.member:
            return
        got = sum(1 for k, _ in g.received if g.routes[k].receiver)
        if got == g.expected_results:
            g.done = True
            self._on_have_all(g.assign.group, g.assign.rev, g.bytes_sent)

    @staticmethod
    def _pipelined(g: _Group) -> bool:
        return g.assign.pipelined
