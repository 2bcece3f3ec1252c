"""The simulated network: FCFS links, and how a group revision's routes move over them.

Pure and deterministic: no clock, no sockets; the engine passes the time in.

**Links.** In the lab every directed pair is one TCP connection with one frame queue
(``crew.wire.transport``), shared by all routes and groups, shaped to the link's rate. For a
store-and-forward plan it is first come, first served: frames queued first leave first, at the
full rate (``crew.runtime.reduce`` sends such plans at one priority). A pipelined plan's frames
go furthest along their route first; the pipelined model below approximates that.
:class:`LinkQueues` models the FCFS queue at the granularity of one route's range over one edge
(a *job*): a job queued at time ``t`` on link ``l`` starts at ``max(t, free_l)`` and ends
``bytes / c_l`` later, and ``free_l`` moves to its end. So a link never carries more than its
capacity and serves jobs in arrival order, and under constant capacities a job's end is known
the moment it is queued. Capacities are ``rate_mbit x 1e6 / 8 x goodput`` bytes/s (``goodput``:
payload share of the shaped rate; the lab measures ~0.95 with TCP/IP headers). A job then
arrives ``delay_l`` (one-way) later.

**Routes** (``crew.plan.routes``): a range climbs a reduce tree to its root and comes down a
broadcast tree. :class:`RouteTimer` times one revision's routes:

* *pipelined* plans (crew, blink-pipe, ...): a node forwards each part as soon as it has it,
  so every edge's job is queued when the revision starts (reduce edges ahead of broadcast
  edges: members' copies are there at once), and an edge cannot finish before
  the data feeding it has arrived plus one part's time on the edge:
  ``end_e = max(fcfs_end_e, max_{f feeds e} arrive_f + part / c_e)``. A link's queue is
  advanced by ``bytes / c_e`` only (the wait for data leaves the link to other jobs: the lab's
  FCFS queue sends whatever frames it holds). Alone on the network, a revision therefore takes
  the planner's pipelined time (the busiest link's load / rate) plus at most a part per hop
  (and the hop's delay).
* *store-and-forward* plans (crew-paper, preduce, blink, ...): a node passes a range on only
  when it holds the whole of it, so an edge's job is queued when its data has arrived (the
  engine calls back at that time, keeping the FCFS order across groups exact). For a star
  this is scatter, then each aggregator's broadcast as soon as its own scatter is in.

A superseded revision's jobs stay queued (the lab does not recall frames already handed to a
connection), except on a cut link, whose queue is lost.

**Private links** (:meth:`LinkQueues.private`, ``SimConfig.shared_links=False``): a revision
gets empty queues of its own over the same links, so concurrent groups never wait for each
other and each sees every link's full capacity. Not the lab's network (one connection per
pair, shared by every group); a simulator with per-group capacities times groups this way.
The byte counters still count every private job on its link, so link samples can show a link
above its rate.

**Parts.** A pipelined hop forwards a part once it holds all of it, so each hop adds one
part's time at its rate. Parts are cut per route exactly as the executor cuts them
(``crew.control.assignment.route_part_elems``: at least ``PARTS_PER_ROUTE`` parts of 64 to
256 KiB, never above the run's part size).

**The executor's host** (:class:`ExecutorModel`, all off by default, as at paper scale):

* ``hop_queue_s``: the standing queue a bulk TCP flow keeps at a shaped link. The lab's HTB
  leaf queue holds ``QUEUE_EXTRA_S`` = 50 ms at the link's rate plus the two-way delay
  (``lab/net/shaping.py``) and CUBIC keeps it full, so every byte waits that long at every hop
  on top of its serialisation (measured unpaced: 54-77 ms per hop). Paced connections (the
  lab's default) keep that queue near empty; a part then waits about 14 ms per hop behind the
  unsent bytes in its socket (``lab.report.simagree.PACED_HOP_QUEUE_S``, from a frame trace).
  It is added to each hop's one-way delay, so it delays a hop's arrival, not its link's
  throughput.
* ``hop_waits``: in place of that one constant, the spread of the lab's waits at a hop: a
  sample of every traced frame's wait beyond its serialisation, counted from when its link
  was free (the link's earlier frames are this model's own FCFS queue), plus its relay's wait
  before sending it on where a relay forwarded it (``lab.studies.grouptime --hop-waits``).
  Each hop of a route then draws one of them, from a generator seeded ``hop_wait_seed``. A
  group ends with the slowest of its routes, so it meets the sample's tail where a constant
  gives every hop the same wait. A draw may be negative (HTB's burst lets a frame through
  faster than its rate), but a hop never arrives before its job was queued.
* ``cpu_s_per_byte`` and ``host_cores``: a shared host whose cores run every worker's data
  path. Every link byte costs ``cpu_s_per_byte`` CPU seconds (``lab.bench``'s ``cpu_s_per_gb``,
  measured on the workers from ``/proc``), and the host serves those costs FCFS at
  ``host_cores`` CPU seconds per second: one more queue every job passes, so a job ends no
  earlier than the CPU has handled it. ``host_cores = 0``: no CPU model.
* ``control_s``: the control plane's latency per group revision beyond its plan: the Assign
  reaching the participants, the members' have-all reaching the coordinator, its Commit
  reaching the members. A revision ends (its members are free) that long after its last
  byte arrived; the links are free at once. Measured as ``lab.studies.grouptime``'s mean
  time outside the data less the planner's mean time, from a frame trace of the same
  setting: on a saturated host it grows with every worker's scheduling waits.
* ``turnaround_s``: a round's control latency outside its group: the Commit reaching a member
  and its result applied before its next iteration starts, and that member's Ready reaching
  the coordinator after the iteration. A worker's Ready is handled that long after its
  iteration's compute time. Measured as ``lab.studies.simcompare``'s turnaround of a lab run
  (the time the coordinator saw a worker training, less the iteration's sampled compute).

* ``ack_clock_mbit``: TCP's ACK clock on slow, busy reverse links. A direction's ACKs travel
  on its reverse link, behind that link's data. Where the lab's leaf queue is longer than its
  50 ms (below 15.5 Mbit/s it holds at least 64 frames: 0.78 s at 1 Mbit/s), those ACKs wait
  most of a second, and the direction runs at about its reverse's rate while the reverse
  carries data. From a frame trace of preduce on paper-20 (60 s, seed 1;
  ``lab.studies.ackclock``): the 125 transfers on a link more than 1.5x faster than its busy
  reverse ran at a median 0.56 of their own rate and 1.11 of the reverse's (p25 0.90, p75
  1.65); with the reverse idle, or not slower, at 0.98-1.03 of their own. So a job on a link
  whose reverse runs at or below ``ack_clock_mbit`` and is busy runs at the reverse's rate
  until the reverse's queue empties, then at its own. 0 (the default): links are independent,
  as on WAN links whose queues hold tens of milliseconds, and as on the lab's links since it
  sends pure ACKs ahead of the data (``lab.net.shaping``): the flag replays runs recorded
  before that.

What is not modelled: TCP's slow start and loss recovery, aggregation (summing) time apart from
the host's CPU per byte, the spread of the control and turnaround waits (each is one constant),
and of the per-hop wait unless ``hop_waits`` gives it; frame headers beyond ``goodput``.

Cost: O(1) per job (a draw from ``hop_waits`` is O(1)); a revision is O(edges of its routes).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from crew.control.assignment import route_part_elems
from crew.plan.planner import BYTES_PER_S_PER_MBIT
from crew.plan.routes import Route

MIN_PART_BYTES = 64 << 10  # crew.config: MIN_AUTO_PART_BYTES
MAX_PART_BYTES = 1 << 20  # crew.config: MAX_AUTO_PART_BYTES


class NetworkError(ValueError):
    """A link, route or time is invalid; the message names it."""


def part_bytes(size_bytes: int, n: int) -> int:
    """The lab's automatic part size (``RunConfig.part_elems_for``): a quarter of an n-way
    block, within [64 KiB, 1 MiB]."""
    quarter = size_bytes // 4 // (4 * n) * 4
    return max(MIN_PART_BYTES, min(MAX_PART_BYTES, quarter))


@dataclass(frozen=True)
class ExecutorModel:
    """The executor's per-hop and host costs beyond the links' rates (module docstring)."""

    hop_queue_s: float = 0.0
    cpu_s_per_byte: float = 0.0
    host_cores: float = 0.0
    control_s: float = 0.0
    turnaround_s: float = 0.0
    ack_clock_mbit: float = 0.0
    hop_waits: tuple[float, ...] = ()
    hop_wait_seed: int = 0

    def __post_init__(self) -> None:
        names = (
            "hop_queue_s",
            "cpu_s_per_byte",
            "host_cores",
            "control_s",
            "turnaround_s",
            "ack_clock_mbit",
        )
        for name in names:
            v = getattr(self, name)
            if not (v >= 0 and v < float("inf")):
                raise NetworkError(f"ExecutorModel.{name} must be finite and >= 0, got {v!r}")
        if self.hop_waits:
            if self.hop_queue_s:
                raise NetworkError(
                    "ExecutorModel: give hop_queue_s (one constant) or hop_waits (a sample to"
                    " draw from), not both"
                )
            if not all(math.isfinite(w) for w in self.hop_waits):
                raise NetworkError("ExecutorModel.hop_waits: every wait must be finite seconds")

    @property
    def cpu_bytes_per_s(self) -> float:
        """Link bytes the host's cores handle per second (inf: no CPU model)."""
        if self.host_cores <= 0 or self.cpu_s_per_byte <= 0:
            return float("inf")
        return self.host_cores / self.cpu_s_per_byte

    def describe(self) -> str:
        cpu = (
            "no host CPU model"
            if self.cpu_bytes_per_s == float("inf")
            else f"host CPU {self.cpu_s_per_byte * 1e9:.1f} CPU s/GB on {self.host_cores:g} cores"
        )
        control = f", control {self.control_s * 1e3:g} ms per revision" if self.control_s else ""
        if self.turnaround_s:
            control += f", turnaround {self.turnaround_s * 1e3:g} ms per round"
        if self.ack_clock_mbit:
            control += f", ACK-clocked behind busy reverse links <= {self.ack_clock_mbit:g} Mbit/s"
        if self.hop_waits:
            w = sorted(self.hop_waits)
            hop = (
                f"per-hop wait drawn from {len(w)} (median {w[len(w) // 2] * 1e3:.1f} ms,"
                f" p90 {w[int(0.9 * (len(w) - 1))] * 1e3:.1f} ms)"
            )
        else:
            hop = f"per-hop queue {self.hop_queue_s * 1e3:g} ms"
        return f"{hop}, {cpu}{control}"


class LinkQueues:
    """One FCFS queue per directed link; see the module docstring."""

    def __init__(
        self,
        rate_mbit: np.ndarray,
        goodput: float = 1.0,
        delay_s: np.ndarray | None = None,
        executor: ExecutorModel | None = None,
    ) -> None:
        r = np.array(rate_mbit, dtype=float)
        if r.ndim != 2 or r.shape[0] != r.shape[1]:
            raise NetworkError(f"rate_mbit must be a square matrix, got shape {r.shape}")
        if not 0 < goodput <= 1:
            raise NetworkError(f"goodput must be in (0, 1], got {goodput!r}")
        self.n = n = r.shape[0]
        off = ~np.eye(n, dtype=bool)
        if np.any(~np.isfinite(r[off])) or np.any(r[off] < 0):
            raise NetworkError("rate_mbit: off-diagonal rates must be finite and >= 0")
        r[~off] = 0.0
        self.goodput = float(goodput)
        self.cap: list[float] = (r * BYTES_PER_S_PER_MBIT * self.goodput).ravel().tolist()
        ex = executor or ExecutorModel()
        d = np.zeros((n, n)) if delay_s is None else np.asarray(delay_s, dtype=float)
        self.delay: list[float] = (d + ex.hop_queue_s).ravel().tolist()
        self._waits = ex.hop_waits
        self._draw = random.Random(ex.hop_wait_seed) if ex.hop_waits else None
        self.cpu_rate = ex.cpu_bytes_per_s
        self.cpu_free = 0.0
        self.ack_cap = ex.ack_clock_mbit * BYTES_PER_S_PER_MBIT * self.goodput
        self.free: list[float] = [0.0] * (n * n)
        # Jobs for the byte counters: link, start, end, rate (bytes = rate * (end - start)).
        self._jl: list[int] = []
        self._js: list[float] = []
        self._je: list[float] = []
        self._jr: list[float] = []
        self._done = np.zeros(n * n)  # bytes of jobs ended by the last count
        self._pending = (np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0))
        self.jobs = 0
        self._rec: LinkQueues = self  # whose byte counters this one's jobs go to

    def private(self) -> LinkQueues:
        """Empty queues of their own over these links as they are now (capacities, delays,
        host), whose jobs these queues' byte counters count. Later cuts and rate steps here do
        not reach them."""
        q = copy.copy(self)
        q.cap = list(self.cap)
        q.free = [0.0] * len(self.free)
        q.cpu_free = 0.0
        q._rec = self._rec
        return q

    def rate(self, src: int, dst: int) -> float:
        return self.cap[src * self.n + dst]

    def queue(self, src: int, dst: int, nbytes: float, at: float) -> float:
        """Queue a job of ``nbytes`` on src -> dst at time ``at``; return when it ends."""
        k = src * self.n + dst
        c = self.cap[k]
        if c <= 0:
            raise NetworkError(f"link {src}->{dst} is down; no job can use it")
        start = max(at, self.free[k])
        end = start + nbytes / c
        if self.ack_cap > 0:  # off by default: no reverse lookup per job
            rev = dst * self.n + src
            back = self.cap[rev]
            if 0 < back < c and back <= self.ack_cap and self.free[rev] > start:
                # ACK-clocked while its slower reverse is busy (ExecutorModel.ack_clock_mbit)
                slow = min(nbytes, (self.free[rev] - start) * back)
                end = start + slow / back + (nbytes - slow) / c
                c = nbytes / (end - start)
        self.free[k] = end
        rec = self._rec
        if end > start:
            rec._jl.append(k)
            rec._js.append(start)
            rec._je.append(end)
            rec._jr.append(c)
        rec.jobs += 1
        if self.cpu_rate < float("inf"):  # the host's cores, one FCFS queue for every job
            self.cpu_free = max(at, self.cpu_free) + nbytes / self.cpu_rate
            end = max(end, self.cpu_free)
        return end

    def delay_of(self, src: int, dst: int) -> float:
        """A hop's delay after its job ends: the link's one-way delay and the executor's wait
        there (one of ``hop_waits``, drawn anew each call, or the constant ``hop_queue_s``)."""
        d = self.delay[src * self.n + dst]
        if self._draw is not None:
            d += self._waits[self._draw.randrange(len(self._waits))]
        return d

    def arrival(self, src: int, dst: int, queued_at: float, end: float) -> float:
        """When a job queued on src -> dst at ``queued_at`` and ended at ``end`` arrives: a
        drawn wait may be negative, but not before the job was queued."""
        return max(queued_at, end + self.delay_of(src, dst))

    def cut(self, src: int, dst: int, at: float) -> None:
        """Link src -> dst fails for good at ``at``: its queue is lost."""
        k = src * self.n + dst
        self.cap[k] = 0.0
        self.free[k] = at
        self._flush()
        links, starts, ends, rates = self._pending
        on = links == k
        ends = np.where(on, np.minimum(ends, at), ends)
        starts = np.where(on, np.minimum(starts, at), starts)
        self._pending = (links, starts, ends, rates)

    def set_rate(self, src: int, dst: int, mbit: float) -> None:
        """Link src -> dst runs at ``mbit`` from now on (a rate trace's step). Jobs already
        queued keep the end they were given: a trace moves over seconds, a job lasts a part's
        transfer, so only the jobs queued after the step see the new rate."""
        if not (math.isfinite(mbit) and mbit > 0):
            raise NetworkError(f"link {src}->{dst}: rate must be finite and > 0, got {mbit!r}")
        k = src * self.n + dst
        if self.cap[k] > 0:  # a cut link stays cut
            self.cap[k] = mbit * BYTES_PER_S_PER_MBIT * self.goodput

    def sent_by(self, t: float) -> np.ndarray:
        """Bytes each link (flat index) has carried by time ``t`` (non-decreasing calls), each
        job at the rate it was queued with."""
        self._flush()
        links, starts, ends, rates = self._pending
        done = ends <= t
        if done.any():
            np.add.at(self._done, links[done], (ends[done] - starts[done]) * rates[done])
            keep = ~done
            links, starts, ends, rates = links[keep], starts[keep], ends[keep], rates[keep]
            self._pending = (links, starts, ends, rates)
        out = self._done.copy()
        running = starts < t
        if running.any():
            np.add.at(out, links[running], (t - starts[running]) * rates[running])
        return out

    def _flush(self) -> None:
        if not self._jl:
            return
        links, starts, ends, rates = self._pending
        self._pending = (
            np.concatenate([links, np.asarray(self._jl, dtype=np.int64)]),
            np.concatenate([starts, np.asarray(self._js)]),
            np.concatenate([ends, np.asarray(self._je)]),
            np.concatenate([rates, np.asarray(self._jr)]),
        )
        self._jl, self._js, self._je, self._jr = [], [], [], []


@dataclass
class _RouteState:
    route: Route
    waiting: dict[int, int]  # reduce: node -> children still to deliver
    arrived: dict[int, float] = field(default_factory=dict)  # reduce: node -> last child in
    down_left: int = 0  # broadcast edges not queued yet
    done_at: float = 0.0  # latest arrival at a receiver


class RouteTimer:
    """Times one group revision's routes on :class:`LinkQueues`.

    Pipelined: :meth:`start` returns the revision's end at once. Store-and-forward:
    :meth:`start` queues what can leave now and returns ``None``; the engine then calls
    :meth:`release` for each entry of :attr:`wakeups` at its time (in time order across all
    revisions, so the links stay FCFS), and the revision ends at :attr:`end` once
    :attr:`finished`.
    """

    REDUCE, BROADCAST = 0, 1

    def __init__(
        self,
        links: LinkQueues,
        routes: Sequence[Route],
        pipelined: bool,
        part: int,
        elem_bytes: int = 4,
    ) -> None:
        self.links = links
        self.pipelined = pipelined
        self.part = part
        self.eb = elem_bytes
        self.routes = [
            _RouteState(r, {p: len(cs) for p, cs in _children(r.up, False).items()}) for r in routes
        ]
        self.left = len(self.routes)
        self.end = 0.0
        self.wakeups: list[tuple[float, int, int, int]] = []  # (time, route, node, phase)

    @property
    def finished(self) -> bool:
        return self.left == 0

    def start(self, at: float) -> float | None:
        self.end = at
        if self.pipelined:
            self.end = max(self.end, self._pipelined_all(at))
            self.left = 0
            return self.end
        for i, rs in enumerate(self.routes):
            r = rs.route
            rs.down_left = len(r.down)
            rs.done_at = at
            if not r.up:
                self.release(at, i, r.root, self.BROADCAST)
                continue
            for c, p in r.up:
                if c not in rs.waiting:  # a leaf: its own copy is there now
                    self._send_up(i, rs, c, p, at)
        return None

    def take_wakeups(self) -> list[tuple[float, int, int, int]]:
        out, self.wakeups = self.wakeups, []
        return out

    def release(self, at: float, i: int, node: int, phase: int) -> None:
        """Store-and-forward: ``node`` of route ``i`` holds the whole range (its partial sum
        in the reduce phase, the result in the broadcast phase) at ``at``."""
        rs = self.routes[i]
        r = rs.route
        if phase == self.REDUCE and node != r.root:
            self._send_up(i, rs, node, _parent(r.up, node), at)
            return
        for p, c in r.down:
            if p != node:
                continue
            end = self.links.queue(p, c, r.elems * self.eb, at)
            arrive = self.links.arrival(p, c, at, end)
            rs.done_at = max(rs.done_at, arrive)
            rs.down_left -= 1
            if any(pp == c for pp, _ in r.down):
                self.wakeups.append((arrive, i, c, self.BROADCAST))
        if node == r.root:
            rs.done_at = max(rs.done_at, at)
        if rs.down_left == 0:
            self.left -= 1
            self.end = max(self.end, rs.done_at)

    # ---- internals ------------------------------------------------------------------------

    def _send_up(self, i: int, rs: _RouteState, c: int, p: int | None, at: float) -> None:
        if p is None:
            raise NetworkError(f"route [{rs.route.start}, {rs.route.stop}): {c} has no parent")
        end = self.links.queue(c, p, rs.route.elems * self.eb, at)
        arrive = self.links.arrival(c, p, at, end)
        rs.arrived[p] = max(rs.arrived.get(p, at), arrive)
        rs.waiting[p] -= 1
        if rs.waiting[p] == 0:
            phase = self.BROADCAST if p == rs.route.root else self.REDUCE
            self.wakeups.append((rs.arrived[p], i, p, phase))

    def _pipelined_all(self, at: float) -> float:
        """Every reduce edge of every route is queued before any broadcast edge: members' own
        copies are there at once, the sums come later, so in the lab's FCFS queues the
        scatter frames are ahead of the broadcast frames of the same revision."""
        done = at
        arrive: list[dict[int, float]] = []
        for rs in self.routes:
            r = rs.route
            nbytes = r.elems * self.eb
            got: dict[int, float] = {}  # node -> when its partial sum is complete there
            for c, p in _up_order(r):
                fcfs = self.links.queue(c, p, nbytes, at)
                end = max(fcfs, got[c] + self._part_time(c, p, r)) if c in got else fcfs
                a = self.links.arrival(c, p, at, end)
                got[p] = max(got.get(p, at), a)
                done = max(done, a)
            arrive.append(got)
        for rs, got in zip(self.routes, arrive, strict=True):
            r = rs.route
            nbytes = r.elems * self.eb
            have = {r.root: got.get(r.root, at)}
            for p, c in _down_order(r):
                fcfs = self.links.queue(p, c, nbytes, at)
                end = max(fcfs, have[p] + self._part_time(p, c, r))
                have[c] = self.links.arrival(p, c, at, end)
                done = max(done, have[c])
        return done

    def _part_time(self, a: int, b: int, r: Route) -> float:
        """One part of route ``r`` on a -> b: the executor's part for that route."""
        part = route_part_elems(r, max(1, self.part // self.eb)) * self.eb
        return min(part, r.elems * self.eb) / self.links.rate(a, b)


def _children(edges: Sequence[tuple[int, int]], parent_first: bool = True) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for a, b in edges:
        p, c = (a, b) if parent_first else (b, a)
        out.setdefault(p, []).append(c)
    return out


def _parent(up: Sequence[tuple[int, int]], node: int) -> int | None:
    for c, p in up:
        if c == node:
            return p
    return None


def _up_order(r: Route) -> list[tuple[int, int]]:
    """Reduce edges, every edge after the edges feeding it (leaves first)."""
    kids = _children(r.up, parent_first=False)
    order: list[tuple[int, int]] = []
    parent = {c: p for c, p in r.up}

    def visit(x: int, budget: int) -> None:
        if budget < 0:
            raise NetworkError(f"route [{r.start}, {r.stop}): cycle in its reduce tree")
        for c in kids.get(x, ()):
            visit(c, budget - 1)
            order.append((c, parent[c]))

    visit(r.root, len(r.up) + 1)
    return order


def _down_order(r: Route) -> list[tuple[int, int]]:
    kids = _children(r.down)
    order: list[tuple[int, int]] = []
    frontier = [r.root]
    for _ in range(len(r.down) + 1):
        nxt = []
        for p in frontier:
            for c in kids.get(p, ()):
                order.append((p, c))
                nxt.append(c)
        if not nxt:
            break
        frontier = nxt
    return order
