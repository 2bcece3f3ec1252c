"""The simulated network: directed links of fixed capacity, shared by groups' data as a fluid.

Pure and deterministic: no clock, no sockets. The engine calls :meth:`FluidNetwork.advance`
to move time forward and asks :meth:`FluidNetwork.next_completion` when the next transfer
stage ends.

What moves. A group revision's plan (``crew.schemes.GroupPlan``) is a set of routes; each
route carries its element range over the edges of a reduce tree and a broadcast tree
(``crew.routes``). The network sees a revision as one or more **stages**, each a load vector
(bytes per directed link):

* a **pipelined** plan (crew, blink-pipe, ...) is one stage holding the plan's whole link load
  (``GroupPlan.link_bytes``). In the lab a node forwards each part (~1 MB) as soon as it has
  it, so every edge of a route streams at once; in the fluid limit the stage progresses at one
  rate on all its links, and alone on the network it takes ``max_l load_l / c_l``: exactly the
  planner's pipelined prediction (``crew.baselines.cost_pipelined``). Pipeline fill (one part
  per hop) is not modelled; a latency term is (below).
* a **store-and-forward** plan (crew-paper, preduce, blink, ...) is one stage per tree level:
  for a star, scatter then broadcast. A node waits for the whole range before forwarding, so
  level k+1 starts when level k is done. Levels are group-wide barriers, which is the paper's
  X + Y model (``planner.solve_p2a``'s prediction) for stars; the lab's aggregators start
  their broadcast as soon as their own scatter is in, so the lab can be faster than this by up
  to the spread of the scatter times.

How stages share a link. In the lab every directed pair is one TCP connection with one FCFS
frame queue (``crew.transport``), shared by all routes and groups: frames queued first leave
first, at the link's full rate. The fluid counterpart is **strict priority by the time a stage
became ready** (its frames were queued then): the oldest stage takes
``x = min_l residual_l / load_l`` (fraction of its load per second, limited by its bottleneck
link) and leaves ``residual_l - x * load_l`` to younger stages; the next stage does the same on
what is left, and so on. So a link is never loaded beyond its capacity, a younger group uses
whatever the older ones cannot, and a stage alone gets the planner's time. What this does not
capture: a pipelined stage in the lab may run ahead on a non-bottleneck link (its frames are
all queued), delaying a younger group there, where the fluid stage paces all its links to its
bottleneck and lends the rest; both are work-conserving for the younger group only in part.

Latency. A stage ends ``latency_s`` after its last byte left: the largest sum of one-way link
delays along a root path of its routes (pipelined: up path + down path; store-and-forward:
the largest delay of the level's edges).

Units: capacities in bytes/s (Mbit/s x 1e6 / 8 x ``goodput``); ``goodput`` is the payload
share of what the shaper passes (the lab measures ~0.95 with TCP/IP headers).

Cost: each (re)allocation is O(stages in flight x links per stage) with numpy, run only when
the set of stages or a capacity changes; advancing is O(n^2) (per-link byte counters).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from crew.planner import BYTES_PER_S_PER_MBIT
from crew.routes import Route

_DONE_EPS = 1e-12  # a stage with less than this fraction of its load left is done
_RATE_EPS = 1e-15  # a stage whose rate is below this (fraction/s) is stalled


class NetworkError(ValueError):
    """A link or stage is invalid; the message names it."""


@dataclass(frozen=True)
class StageLoad:
    """One stage: bytes on each link it uses (flat indices ``src * n + dst``), and its latency."""

    links: np.ndarray  # int64 flat link indices
    bytes: np.ndarray  # float64, > 0, same length
    latency_s: float = 0.0


@dataclass
class _Stage:
    key: tuple[float, int, int]  # (ready time, group id, stage index): FCFS order
    gid: int
    rev: int
    index: int
    load: StageLoad
    left: float = 1.0  # fraction of the load still to send
    rate: float = 0.0  # fraction per second under the current allocation


@dataclass
class _Transfer:
    """A group revision in the network: its stages, and the one running now."""

    gid: int
    rev: int
    stages: list[StageLoad]
    current: int = 0
    latency_until: float | None = None  # the current stage's bytes are out; waiting latency
    stage: _Stage | None = None
    extra: dict = field(default_factory=dict)


def stage_loads(
    routes: Sequence[Route],
    pipelined: bool,
    n: int,
    delay_s: np.ndarray | None = None,
    elem_bytes: int = 4,
) -> list[StageLoad]:
    """The stages a plan's routes put on the network (see the module docstring)."""
    if pipelined:
        per = [(r, [(a, b) for a, b in (*r.up, *r.down)]) for r in routes]
        stages = [_load(per, n, elem_bytes)]
        lat = _pipelined_latency(routes, delay_s) if delay_s is not None else 0.0
        return [StageLoad(stages[0].links, stages[0].bytes, lat)] if stages[0].links.size else []
    levels: dict[int, list[tuple[Route, list[tuple[int, int]]]]] = {}
    for r in routes:
        for level, edges in _route_levels(r).items():
            levels.setdefault(level, []).append((r, edges))
    out = []
    for level in sorted(levels):
        st = _load(levels[level], n, elem_bytes)
        if not st.links.size:
            continue
        lat = 0.0
        if delay_s is not None:
            lat = float(max(delay_s[a, b] for _, es in levels[level] for a, b in es))
        out.append(StageLoad(st.links, st.bytes, lat))
    return out


def _load(per: Iterable[tuple[Route, list[tuple[int, int]]]], n: int, eb: int) -> StageLoad:
    acc: dict[int, float] = {}
    for r, edges in per:
        size = float(r.elems * eb)
        for a, b in edges:
            k = a * n + b
            acc[k] = acc.get(k, 0.0) + size
    keys = np.fromiter(acc.keys(), dtype=np.int64, count=len(acc))
    vals = np.fromiter(acc.values(), dtype=np.float64, count=len(acc))
    order = np.argsort(keys)
    return StageLoad(keys[order], vals[order])


def _route_levels(r: Route) -> dict[int, list[tuple[int, int]]]:
    """Store-and-forward levels of one route: an up edge leaves a node once all the node's
    children delivered (level = 1 + deepest child edge); the broadcast follows, hop by hop."""
    children: dict[int, list[int]] = {}
    for c, p in r.up:
        children.setdefault(p, []).append(c)

    def height(x: int, budget: int) -> int:  # edges below x on the longest chain
        if budget < 0:
            raise NetworkError(f"route [{r.start}, {r.stop}) has a cycle in its reduce tree")
        return max((1 + height(c, budget - 1) for c in children.get(x, ())), default=0)

    bound = len(r.up) + 1
    levels: dict[int, list[tuple[int, int]]] = {}
    for c, p in r.up:
        levels.setdefault(height(c, bound), []).append((c, p))
    top = height(r.root, bound)
    kids: dict[int, list[int]] = {}
    for p, c in r.down:
        kids.setdefault(p, []).append(c)
    frontier, depth = [r.root], 0
    for _ in range(len(r.down) + 1):
        nxt = []
        for p in frontier:
            for c in kids.get(p, ()):
                levels.setdefault(top + depth, []).append((p, c))
                nxt.append(c)
        if not nxt:
            break
        frontier, depth = nxt, depth + 1
    return levels


def _pipelined_latency(routes: Sequence[Route], delay_s: np.ndarray) -> float:
    worst = 0.0
    for r in routes:
        parent = {c: p for c, p in r.up}
        up = 0.0
        for x in parent:
            d, node = 0.0, x
            for _ in range(len(parent) + 1):
                if node == r.root or node not in parent:
                    break
                d += float(delay_s[node, parent[node]])
                node = parent[node]
            up = max(up, d)
        dparent = {c: p for p, c in r.down}
        down = 0.0
        for x in dparent:
            d, node = 0.0, x
            for _ in range(len(dparent) + 1):
                if node == r.root or node not in dparent:
                    break
                d += float(delay_s[dparent[node], node])
                node = dparent[node]
            down = max(down, d)
        worst = max(worst, up + down)
    return worst


class FluidNetwork:
    """Directed links of capacity ``rate_mbit * goodput``; see the module docstring."""

    def __init__(self, rate_mbit: np.ndarray, goodput: float = 1.0) -> None:
        r = np.array(rate_mbit, dtype=float)
        if r.ndim != 2 or r.shape[0] != r.shape[1]:
            raise NetworkError(f"rate_mbit must be a square matrix, got shape {r.shape}")
        if not 0 < goodput <= 1:
            raise NetworkError(f"goodput must be in (0, 1], got {goodput!r}")
        self.n = r.shape[0]
        off = ~np.eye(self.n, dtype=bool)
        if np.any(~np.isfinite(r[off])) or np.any(r[off] < 0):
            raise NetworkError("rate_mbit: off-diagonal rates must be finite and >= 0")
        r[~off] = 0.0
        self.goodput = float(goodput)
        self.cap = (r * BYTES_PER_S_PER_MBIT * self.goodput).ravel()  # bytes/s per flat link
        self.sent = np.zeros(self.n * self.n)  # cumulative bytes per flat link
        self.usage = np.zeros(self.n * self.n)  # bytes/s per flat link now
        self.now = 0.0
        self._transfers: dict[int, _Transfer] = {}
        self._dirty = True
        self.max_overload = 0.0  # largest usage / capacity - 1 ever seen (an invariant: <= 0)

    # ---- transfers ------------------------------------------------------------------------

    def start(self, gid: int, rev: int, stages: list[StageLoad]) -> None:
        """Start (or restart, for a new revision) group ``gid``'s transfer at ``self.now``."""
        for st in stages:
            if st.links.size and np.any(self.cap[st.links] <= 0):
                dead = [divmod(int(k), self.n) for k in st.links[self.cap[st.links] <= 0]]
                raise NetworkError(f"group {gid} rev {rev}: stage uses dead link(s) {dead[:3]}")
        self._transfers[gid] = _Transfer(gid, rev, list(stages))
        self._begin_stage(self._transfers[gid])
        self._dirty = True

    def stop(self, gid: int) -> None:
        """Drop group ``gid``'s transfer (abandoned, or replaced by a revision)."""
        if self._transfers.pop(gid, None) is not None:
            self._dirty = True

    def active(self) -> list[int]:
        return sorted(self._transfers)

    def uses(self, gid: int, src: int, dst: int) -> bool:
        """Whether the rest of group ``gid``'s transfer still needs link src -> dst."""
        t = self._transfers.get(gid)
        if t is None:
            return False
        k = src * self.n + dst
        return any(np.any(s.links == k) for s in t.stages[t.current :])

    def remaining_bytes(self) -> np.ndarray:
        """n x n bytes still to send by the transfers in flight (for residual capacity)."""
        out = np.zeros(self.n * self.n)
        for t in self._transfers.values():
            for i, s in enumerate(t.stages[t.current :]):
                left = t.stage.left if i == 0 and t.stage is not None else 1.0
                np.add.at(out, s.links, s.bytes * left)
        return out.reshape(self.n, self.n)

    def set_rate(self, src: int, dst: int, rate_mbit: float) -> None:
        """Change a link's capacity (0 cuts it). Transfers on a cut link stall until replanned."""
        if not (0 <= src < self.n and 0 <= dst < self.n and src != dst):
            raise NetworkError(f"link {src}->{dst} is not a link of {self.n} workers")
        self.cap[src * self.n + dst] = max(0.0, rate_mbit) * BYTES_PER_S_PER_MBIT * self.goodput
        self._dirty = True

    # ---- time -----------------------------------------------------------------------------

    def next_completion(self) -> tuple[float, int] | None:
        """(time, group id) of the next stage end (bytes out, or latency over), if any."""
        self._allocate()
        best: tuple[float, int] | None = None
        for t in self._transfers.values():
            if t.latency_until is not None:
                when = t.latency_until
            elif t.stage is None:
                when = self.now  # nothing (left) to send: done now
            elif t.stage.rate > _RATE_EPS:
                when = self.now + t.stage.left / t.stage.rate
            else:
                continue
            if best is None or (when, t.gid) < best:
                best = (when, t.gid)
        return best

    def advance(self, to: float) -> list[int]:
        """Move time to ``to`` (no later than ``next_completion``); return the groups whose
        whole transfer finished at ``to``."""
        if to < self.now - 1e-12:
            raise NetworkError(f"time went backwards: {to} < {self.now}")
        self._allocate()
        dt = max(0.0, to - self.now)
        if dt > 0:
            self.sent += self.usage * dt
            for t in self._transfers.values():
                if t.stage is not None and t.latency_until is None:
                    t.stage.left = max(0.0, t.stage.left - t.stage.rate * dt)
        self.now = max(self.now, to)
        finished = []
        for t in list(self._transfers.values()):
            for _ in range(len(t.stages) + 1):  # stages may end back to back
                if t.latency_until is not None:
                    if t.latency_until > self.now + 1e-12:
                        break
                    t.latency_until = None
                    t.current += 1
                    self._begin_stage(t)
                    self._dirty = True
                elif t.stage is not None and t.stage.left <= _DONE_EPS:
                    t.stage = None
                    t.latency_until = self.now + t.stages[t.current].latency_s
                    self._dirty = True
                else:
                    break
            if t.stage is None and t.latency_until is None and t.current >= len(t.stages):
                finished.append(t.gid)
                del self._transfers[t.gid]
        return sorted(finished)

    def _begin_stage(self, t: _Transfer) -> None:
        if t.current < len(t.stages):
            key = (self.now, t.gid, t.current)
            t.stage = _Stage(key, t.gid, t.rev, t.current, t.stages[t.current])
        else:
            t.stage = None

    def _allocate(self) -> None:
        """Strict priority in FCFS order (see the module docstring)."""
        if not self._dirty:
            return
        residual = self.cap.copy()
        running = sorted(
            (t.stage for t in self._transfers.values() if t.stage is not None),
            key=lambda s: s.key,
        )
        for s in running:
            room = residual[s.load.links]
            x = float(np.min(room / s.load.bytes)) if s.load.links.size else math.inf
            x = max(0.0, x) if math.isfinite(x) else 0.0
            s.rate = x
            if x > 0:
                residual[s.load.links] = np.maximum(0.0, room - x * s.load.bytes)
        usage = np.zeros_like(self.cap)  # summed from the rates, not from the residual: a check
        for s in running:
            if s.rate > 0:
                np.add.at(usage, s.load.links, s.rate * s.load.bytes)
        self.usage = usage
        live = self.cap > 0
        if live.any():
            over = float(np.max(self.usage[live] / self.cap[live])) - 1.0
            self.max_overload = max(self.max_overload, over)
        self._dirty = False
