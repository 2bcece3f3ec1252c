"""The CREW planner: capacity matrix + group -> plan. Pure functions, no I/O.

Inputs shared by every function:

``bw``
    n x n array of directed capacities in Mbit/s; ``bw[i][j]`` is the rate of i -> j, 0 for a
    dead link. The diagonal is ignored and treated as ``inf``: a worker's own copy moves for free.
``group``
    the members G, distinct 0-based worker indices; p = |G|.
``active``
    the workers that may aggregate or relay (default: all n); every member must be active.
``size``
    M, the bytes of the model vector, a positive multiple of ``elem_bytes``.

Units: a rate r in Mbit/s moves ``r * 1e6 / 8`` bytes/s; every time is in seconds.

The model vector is split into contiguous element ranges (:class:`Segment`); worker i aggregates
``elems[i]`` elements. Every member sends its copy of i's elements to i (scatter); i sums the p
copies and sends the sum back to every member (broadcast). Worker i's share of bytes is S_i.

Plans (all split the vector by linear programs solved with HiGHS through ``scipy.optimize``):

* :func:`solve_p2a` -- CREW's LP over all usable active workers, phases run back to back.
* :func:`solve_p2p` -- the same LP over the members only (P-Reduce, load-balanced).
* :func:`solve_a2a` -- every active worker as if all were members (split used before a group).
* :func:`solve_p2a_nonblocking` -- re-solve p2a crediting bytes already sent under a2a.
* :func:`solve_pipelined` -- parts stream, so the objective is per-link load, not X + Y.
* :func:`lower_bound` -- a fluid bound no scheme can beat on this matrix.

The LP solution is a real split; :func:`largest_remainder` turns it into whole elements, and the
predicted times are recomputed from those elements, so a plan's prediction is exactly the cost
model applied to what the workers will actually move.
"""

from __future__ import annotations

import enum
import json
import logging
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from highspy._core import HighsModelStatus, _Highs, kHighsInf
from scipy.sparse import coo_array, csr_array
from scipy.sparse.csgraph import maximum_flow

from crew.plan.memo import Memo, key_part

log = logging.getLogger(__name__)

BYTES_PER_S_PER_MBIT = 1e6 / 8
"""Bytes per second carried by a link of 1 Mbit/s."""

DEFAULT_FLOOR_MBIT = 1e-3
"""Residual capacity left on a live link that is fully committed (see residual_capacity)."""

# scipy's maximum_flow wants int32 capacities and silently wraps larger values, so capacities
# are scaled so that the sum over all links stays below this.
_FLOW_UNITS = 2**30


class PlanError(ValueError):
    """A planner input is invalid, or no plan exists. ``field`` names the offending argument."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


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
            if not _is_int(getattr(self, name)):
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
        if not _is_int(self.n) or self.n < 1:
            raise PlanError("n", f"must be a positive int, got {self.n!r}")
        if not _is_int(self.elem_bytes) or self.elem_bytes < 1:
            raise PlanError("elem_bytes", f"must be a positive int, got {self.elem_bytes!r}")
        # Normalise numpy ints so that to_json works whoever built the plan.
        object.__setattr__(self, "group", _check_group(self.group, self.n))
        if not isinstance(self.elems, Iterable):
            raise PlanError("elems", f"must be a sequence, got {self.elems!r}")
        object.__setattr__(self, "elems", tuple(self.elems))
        object.__setattr__(self, "segments", tuple(self.segments))
        if len(self.elems) != self.n or not all(_is_int(e) and e >= 0 for e in self.elems):
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
        if not _is_int(worker) or not 0 <= worker < self.n:
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


# --------------------------------------------------------------------------- input checks


def plan_json_object(text: str) -> dict[str, Any]:
    """The JSON object a serialised plan must be; PlanError("plan") otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError("plan", f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise PlanError("plan", "JSON is not an object")
    return data


def _is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_)


def _check_bw(bw: object) -> np.ndarray:
    """A float copy of ``bw`` with an ``inf`` diagonal."""
    try:
        w = np.array(bw, dtype=float)
    except (TypeError, ValueError) as exc:
        raise PlanError("bw", f"not a numeric matrix: {exc}") from exc
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
        raise PlanError("bw", f"must be a non-empty square matrix, got shape {w.shape}")
    off = ~np.eye(w.shape[0], dtype=bool)
    if not np.all(np.isfinite(w[off])):
        raise PlanError("bw", "off-diagonal rates must be finite")
    if np.any(w[off] < 0):
        raise PlanError("bw", "rates must be non-negative")
    np.fill_diagonal(w, np.inf)
    return w


def _check_group(group: object, n: int) -> tuple[int, ...]:
    if isinstance(group, str | bytes) or not isinstance(group, Iterable):
        raise PlanError("group", f"must be a sequence of worker indices, got {group!r}")
    members = tuple(group)
    if not members:
        raise PlanError("group", "is empty")
    for g in members:
        if not _is_int(g) or not 0 <= g < n:
            raise PlanError("group", f"index {g!r} is not a worker in [0, {n})")
    if len(set(members)) != len(members):
        raise PlanError("group", f"has repeated members: {members}")
    return tuple(int(g) for g in members)


def _check_active(active: Collection[int] | None, n: int, members: Sequence[int]) -> np.ndarray:
    """Boolean mask of active workers; every member must be among them."""
    mask = np.zeros(n, dtype=bool)
    if active is None:
        mask[:] = True
    else:
        if isinstance(active, str | bytes) or not isinstance(active, Iterable):
            raise PlanError("active", f"must be a collection of worker indices, got {active!r}")
        for i in active:
            if not _is_int(i) or not 0 <= i < n:
                raise PlanError("active", f"index {i!r} is not a worker in [0, {n})")
            mask[int(i)] = True
    missing = [g for g in members if not mask[g]]
    if missing:
        raise PlanError("group", f"members {missing} are not active")
    return mask


def _check_size(size: int, elem_bytes: int) -> int:
    """Number of elements in the vector."""
    if not _is_int(elem_bytes) or elem_bytes <= 0:
        raise PlanError("elem_bytes", f"must be a positive int, got {elem_bytes!r}")
    if not _is_int(size) or size <= 0:
        raise PlanError("size", f"must be a positive int of bytes, got {size!r}")
    if size % elem_bytes:
        raise PlanError("size", f"{size} bytes is not a multiple of elem_bytes={elem_bytes}")
    return int(size) // int(elem_bytes)


def _member_mask(n: int, members: Sequence[int]) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    mask[list(members)] = True
    return mask


def _group_rates(w: np.ndarray, members: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """a_i = min_g bw[g][i] (slowest link in from the group), b_i = min_g bw[i][g] (out)."""
    rows = w[list(members), :]
    cols = w[:, list(members)]
    return rows.min(axis=0), cols.min(axis=1)


def _usable(w: np.ndarray, members: Sequence[int], active: np.ndarray) -> np.ndarray:
    """Workers that can aggregate: active, reachable from every member and reaching every one."""
    a, b = _group_rates(w, members)
    return active & (a > 0) & (b > 0)


# --------------------------------------------------------------------------- rounding


def largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
    """Round non-negative ``shares`` (any scale) to ints summing exactly to ``total``.

    Each worker gets the floor of its proportional quota; the elements left over go one each to
    the largest fractional parts (ties to the lower index). So no element is lost or duplicated,
    and a zero share stays zero.
    """
    q = np.asarray(shares, dtype=float)
    if q.ndim != 1 or not np.all(np.isfinite(q)) or np.any(q < 0):
        raise PlanError("shares", "must be a 1-D array of finite non-negative numbers")
    if not _is_int(total) or total < 0:
        raise PlanError("total", f"must be a non-negative int, got {total!r}")
    out = np.zeros(q.shape, dtype=np.int64)
    if total == 0:
        return out
    positive = q > 0
    if not positive.any():
        raise PlanError("shares", "are all zero but total > 0")
    quota = q / q.sum() * total
    out[:] = np.floor(quota)
    frac = quota - out
    short = int(total - out.sum())
    order = np.argsort(-frac, kind="stable")
    order = order[positive[order]]
    if short > 0:
        # Float error can leave more elements than positive shares; spread them round-robin.
        for k in range(short):
            out[order[k % len(order)]] += 1
    elif short < 0:
        for k in order[::-1][:-short]:
            out[k] -= 1  # quota sums were a hair above total
    if out.sum() != total or np.any(out < 0):
        raise AssertionError(f"largest_remainder lost elements: {out} vs {total}")
    return out


# --------------------------------------------------------------------------- LP plumbing


def _linprog(
    c: np.ndarray,
    rows: list[int],
    cols: list[int],
    vals: list[float],
    b_ub: list[float],
    n_vars: int,
    eq_vars: int,
    what: str,
    upper: dict[int, float] | None = None,
) -> np.ndarray:
    """min c.x s.t. A_ub x <= b_ub, sum(x[:eq_vars]) == 1, 0 <= x (<= upper), by HiGHS."""
    # HiGHS's own interface, not scipy.optimize.linprog: the same solver and options, without
    # scipy's per-call model checks and conversions (measured: 5 ms of a 6 ms solve_pipelined
    # call per group on bench-hetero; the coordinator plans every group with it).
    a_ub = coo_array((vals, (rows, cols)), shape=(len(b_ub), n_vars)).tocsr()
    h = _Highs()
    h.setOptionValue("output_flag", False)
    # One thread, as the route LP's: HiGHS keeps one global scheduler per process, and a solve
    # asking for another thread count than the first one fails ("Not Set").
    h.setOptionValue("threads", 1)
    up = np.full(n_vars, kHighsInf)
    for v, bound in (upper or {}).items():
        if bound is not None:
            up[v] = bound
    h.addVars(n_vars, np.zeros(n_vars), up)
    h.changeColsCost(n_vars, np.arange(n_vars, dtype=np.int32), np.asarray(c, dtype=float))
    m = len(b_ub)
    h.addRows(
        m,
        np.full(m, -kHighsInf),
        np.asarray(b_ub, dtype=float),
        a_ub.nnz,
        a_ub.indptr[:-1].astype(np.int32),
        a_ub.indices.astype(np.int32),
        a_ub.data.astype(float),
    )
    h.addRow(1.0, 1.0, eq_vars, np.arange(eq_vars, dtype=np.int32), np.ones(eq_vars))
    h.run()
    status = h.getModelStatus()
    if status != HighsModelStatus.kOptimal:
        raise PlanError("bw", f"{what} LP has no solution: {h.modelStatusToString(status)}")
    return np.asarray(h.getSolution().col_value)


def _phased_shares(
    w: np.ndarray,
    members: Sequence[int],
    usable: np.ndarray,
    sent_frac: np.ndarray | None,
    what: str,
) -> np.ndarray:
    """Fractions of the vector per worker minimising X + Y (the p2a LP).

    Without ``sent_frac``: s_i <= a_i X and s_i <= b_i Y. With it (non-blocking):
    s_i - sent_frac[g][i] <= bw[g][i] X for every member g != i. Rates are divided by the largest
    one so every coefficient is in (0, 1]; times come out in units of M / r_max and are not used
    (the caller recomputes them from whole elements).
    """
    n = w.shape[0]
    idx = np.flatnonzero(usable)
    if idx.size == 0:
        raise PlanError("bw", f"{what}: no active worker has live links to and from every member")
    a, b = _group_rates(w, members)
    finite = w[np.isfinite(w)]
    r = float(finite.max()) if finite.size else 1.0
    k = idx.size
    x_col, y_col = k, k + 1
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    b_ub: list[float] = []

    def add(var: int, rate: float, time_col: int, rhs: float) -> None:
        row = len(b_ub)
        rows.extend((row, row))
        cols.extend((var, time_col))
        vals.extend((1.0, -rate / r))
        b_ub.append(rhs)

    for v, i in enumerate(idx):
        if sent_frac is None:
            if math.isfinite(a[i]):
                add(v, float(a[i]), x_col, 0.0)
        else:
            for g in members:
                if g != i:
                    add(v, float(w[g, i]), x_col, float(sent_frac[g, i]))
        if math.isfinite(b[i]):
            add(v, float(b[i]), y_col, 0.0)
    c = np.zeros(k + 2)
    c[x_col] = c[y_col] = 1.0
    x = _linprog(c, rows, cols, vals, b_ub, k + 2, k, what)
    shares = np.zeros(n)
    shares[idx] = np.clip(x[:k], 0.0, None)
    return shares


def _to_elems(shares: np.ndarray, total: int) -> np.ndarray:
    return largest_remainder(shares, total)


def _contiguous(elems: Sequence[int]) -> tuple[Segment, ...]:
    """One segment per aggregator, laid out in worker order."""
    segs: list[Segment] = []
    pos = 0
    for i, e in enumerate(elems):
        if e > 0:
            segs.append(Segment(i, pos, pos + int(e)))
            pos += int(e)
    return tuple(segs)


def _single_member(kind: PlanKind, members: tuple[int, ...], n: int, eb: int, total: int) -> Plan:
    """p = 1: the member already holds the 'sum'; nothing moves."""
    elems = [0] * n
    elems[members[0]] = total
    return Plan(kind, members, n, eb, tuple(elems), _contiguous(elems), 0.0, 0.0, 0.0)


# --------------------------------------------------------------------------- cost models


def phased_cost(
    bw: np.ndarray, group: Sequence[int], elems: Sequence[int], elem_bytes: int = 4
) -> tuple[float, float]:
    """(X, Y) in seconds for a phased scatter-then-broadcast with this split on ``group``.

    Cost model: every member sends its copy of worker i's S_i bytes to i over its own link, all
    links in parallel and independent (one shaped point-to-point link per pair, no shared NIC),
    so i's scatter ends after ``S_i / a_i``; X is the slowest over aggregators. Broadcast
    likewise ends after ``Y = max_i S_i / b_i``. The phases are back to back: T = X + Y. Latency
    and aggregation time are ignored. An aggregator with a dead link to or from a member gives
    ``inf``. Useful to price a fixed split (e.g. the a2a one) on a group.
    """
    w = _check_bw(bw)
    members = _check_group(group, w.shape[0])
    e = np.asarray(elems, dtype=float)
    if e.shape != (w.shape[0],) or np.any(e < 0):
        raise PlanError("elems", f"need {w.shape[0]} non-negative counts")
    a, b = _group_rates(w, members)
    return _phase_times(e * elem_bytes, a, b)


def _phase_times(nbytes: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    used = nbytes > 0
    if not used.any():
        return 0.0, 0.0
    with np.errstate(divide="ignore"):
        x = nbytes[used] / (a[used] * BYTES_PER_S_PER_MBIT)
        y = nbytes[used] / (b[used] * BYTES_PER_S_PER_MBIT)
    return float(x.max()), float(y.max())


def _load_matrices(members_mask: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scatter, broadcast) bytes per directed link j -> k."""
    scatter = np.outer(members_mask, nbytes).astype(float)  # member j sends S_k to k
    broadcast = np.outer(nbytes, members_mask).astype(float)  # aggregator j sends S_j to member k
    np.fill_diagonal(scatter, 0.0)
    np.fill_diagonal(broadcast, 0.0)
    return scatter, broadcast


def _link_time(load: np.ndarray, w: np.ndarray) -> float:
    used = load > 0
    if not used.any():
        return 0.0
    with np.errstate(divide="ignore"):
        return float((load[used] / (w[used] * BYTES_PER_S_PER_MBIT)).max())


def pipelined_cost(
    bw: np.ndarray, group: Sequence[int], elems: Sequence[int], elem_bytes: int = 4
) -> tuple[float, float, float]:
    """(scatter-only, broadcast-only, T) link times in seconds for a streamed split.

    See :func:`solve_pipelined` for the model: T = max over links of load / rate.
    """
    w = _check_bw(bw)
    members = _check_group(group, w.shape[0])
    e = np.asarray(elems, dtype=float)
    if e.shape != (w.shape[0],) or np.any(e < 0):
        raise PlanError("elems", f"need {w.shape[0]} non-negative counts")
    scatter, broadcast = _load_matrices(_member_mask(w.shape[0], members), e * elem_bytes)
    return _link_time(scatter, w), _link_time(broadcast, w), _link_time(scatter + broadcast, w)


def link_load(plan: Plan, group: Sequence[int] | None = None) -> np.ndarray:
    """n x n bytes each directed link carries under ``plan`` (scatter + broadcast).

    Link j -> k carries S_k if j is a member (scatter) plus S_j if k is a member (broadcast),
    j != k. ``group`` defaults to ``plan.group``. For a non-blocking plan this is the whole
    transfer, including the bytes already sent under a2a.
    """
    members = plan.group if group is None else _check_group(group, plan.n)
    nbytes = np.asarray(plan.elems, dtype=float) * plan.elem_bytes
    scatter, broadcast = _load_matrices(_member_mask(plan.n, members), nbytes)
    return scatter + broadcast


def residual_capacity(
    bw: np.ndarray,
    committed: np.ndarray,
    horizon_s: float,
    floor_mbit: float = DEFAULT_FLOOR_MBIT,
) -> np.ndarray:
    """Capacity (Mbit/s) left for a new group after the groups already in flight.

    ``committed[j][k]`` is the bytes link j -> k still has to carry for groups in flight (e.g. the
    sum of :func:`link_load` minus what has been delivered). Spreading them evenly over the next
    ``horizon_s`` seconds uses ``committed * 8 / 1e6 / horizon_s`` Mbit/s, which is subtracted.
    A live link is never planned as dead: with FCFS sending, a saturated link still serves the
    new group after the backlog, so it keeps ``min(bw, floor_mbit)`` and the LP steers load away
    from it instead of failing. Dead links stay 0; the diagonal stays ``inf``. This is a planning
    heuristic, not a bound.
    """
    w = _check_bw(bw)
    used = np.array(committed, dtype=float)
    if used.shape != w.shape:
        raise PlanError("committed", f"must have shape {w.shape}, got {used.shape}")
    if not np.all(np.isfinite(used)) or np.any(used < 0):
        raise PlanError("committed", "must be finite and non-negative")
    if not isinstance(horizon_s, int | float) or not math.isfinite(horizon_s) or horizon_s <= 0:
        raise PlanError("horizon_s", f"must be a positive number of seconds, got {horizon_s!r}")
    if not isinstance(floor_mbit, int | float) or not floor_mbit > 0:
        raise PlanError("floor_mbit", f"must be positive, got {floor_mbit!r}")
    off = ~np.eye(w.shape[0], dtype=bool)
    live = off & (w > 0)
    out = np.zeros_like(w)
    rest = w - used / BYTES_PER_S_PER_MBIT / horizon_s
    out[live] = np.maximum(rest[live], np.minimum(w[live], floor_mbit))
    np.fill_diagonal(out, np.inf)
    return out


# --------------------------------------------------------------------------- solvers


def _solve_phased(
    kind: PlanKind,
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    active: Collection[int] | None,
    elem_bytes: int,
) -> Plan:
    w = _check_bw(bw)
    n = w.shape[0]
    members = _check_group(group, n)
    act = _check_active(active, n, members)
    total = _check_size(size, elem_bytes)
    if len(members) == 1:
        return _single_member(kind, members, n, elem_bytes, total)
    usable = _usable(w, members, act)
    shares = _phased_shares(w, members, usable, None, kind.value)
    elems = _to_elems(shares, total)
    a, b = _group_rates(w, members)
    x, y = _phase_times(elems.astype(float) * elem_bytes, a, b)
    log.debug("%s plan for %s: X=%.4g s Y=%.4g s", kind.value, members, x, y)
    return Plan(
        kind,
        members,
        n,
        elem_bytes,
        tuple(int(e) for e in elems),
        _contiguous(elems),
        x,
        y,
        x + y,
    )


def solve_p2a(
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    active: Collection[int] | None = None,
    elem_bytes: int = 4,
) -> Plan:
    """CREW's p2a plan: every usable active worker aggregates a share of the vector.

    Cost model (see :func:`phased_cost`): with a_i = min_g bw[g][i] and b_i = min_g bw[i][g] over
    members g (a member's own copy is free, hence the ``inf`` diagonal), scatter takes
    X = max_i S_i / a_i and broadcast Y = max_i S_i / b_i, one after the other. The LP

        minimise X + Y  s.t.  sum_i S_i = M,  S_i >= 0,  S_i <= a_i X,  S_i <= b_i Y

    picks the split. Workers that are inactive or have a dead link from or to some member
    (a_i = 0 or b_i = 0) get S_i = 0. A one-member group needs no traffic: everything stays on
    the member and every time is 0. Raises PlanError when no worker is usable (p >= 2).
    """
    return _solve_phased(PlanKind.P2A, bw, group, size, active, elem_bytes)


def solve_p2p(bw: np.ndarray, group: Sequence[int], size: int, elem_bytes: int = 4) -> Plan:
    """The p2a LP restricted to the members: P-Reduce's all-reduce among members, load-balanced.

    Same cost model as :func:`solve_p2a`; non-members never aggregate or carry anything.
    """
    w = _check_bw(bw)
    members = _check_group(group, w.shape[0])
    return _solve_phased(PlanKind.P2P, w, members, size, members, elem_bytes)


def solve_a2a(
    bw: np.ndarray,
    size: int,
    active: Collection[int] | None = None,
    elem_bytes: int = 4,
) -> Plan:
    """The p2a LP with every active worker as a member: a split usable before any group exists.

    ``plan.group`` is the sorted active set. Non-blocking mode scatters with this split as soon as
    a worker is ready (see :func:`solve_p2a_nonblocking`).
    """
    w = _check_bw(bw)
    n = w.shape[0]
    act = _check_active(active, n, ())
    members = tuple(int(i) for i in np.flatnonzero(act))
    if not members:
        raise PlanError("active", "is empty")
    return _solve_phased(PlanKind.A2A, w, members, size, members, elem_bytes)


def _check_a2a(a2a: Plan, n: int, elem_bytes: int, total: int) -> np.ndarray:
    """Start element of each worker's (single) a2a segment; -1 for none."""
    if not isinstance(a2a, Plan):
        raise PlanError("a2a", f"must be a Plan, got {type(a2a).__name__}")
    if a2a.n != n or a2a.elem_bytes != elem_bytes or a2a.total_elems != total:
        raise PlanError("a2a", "n, elem_bytes or size differ from this call's")
    start = np.full(n, -1, dtype=np.int64)
    for seg in a2a.segments:
        if start[seg.worker] >= 0:
            raise PlanError("a2a", f"worker {seg.worker} has several segments")
        start[seg.worker] = seg.start
    return start


def _nonblocking_layout(
    elems: np.ndarray, a2a_elems: np.ndarray, a2a_start: np.ndarray
) -> tuple[Segment, ...]:
    """Complete or truncate: i keeps the first min(S_i, A_i) elements of its a2a segment; the
    freed suffixes, in vector order, fill the workers with S_i > A_i in index order."""
    n = elems.size
    segs: list[Segment] = []
    freed: list[tuple[int, int]] = []
    for i in range(n):
        if a2a_elems[i] == 0:
            continue
        keep = int(min(elems[i], a2a_elems[i]))
        lo, hi = int(a2a_start[i]), int(a2a_start[i] + a2a_elems[i])
        if keep:
            segs.append(Segment(i, lo, lo + keep))
        if lo + keep < hi:
            freed.append((lo + keep, hi))
    freed.sort()
    need = [(i, int(elems[i] - a2a_elems[i])) for i in range(n) if elems[i] > a2a_elems[i]]
    hole = 0
    for i, want in need:
        while want > 0:
            lo, hi = freed[hole]
            take = min(want, hi - lo)
            segs.append(Segment(i, lo, lo + take))
            want -= take
            if lo + take == hi:
                hole += 1
            else:
                freed[hole] = (lo + take, hi)
    if hole != len(freed):
        raise AssertionError("non-blocking layout left elements unassigned")
    segs.sort(key=lambda s: s.start)
    merged: list[Segment] = []
    for s in segs:
        if merged and merged[-1].worker == s.worker and merged[-1].stop == s.start:
            merged[-1] = Segment(s.worker, merged[-1].start, s.stop)
        else:
            merged.append(s)
    return tuple(merged)


def solve_p2a_nonblocking(
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    sent: np.ndarray,
    active: Collection[int] | None = None,
    elem_bytes: int = 4,
    a2a: Plan | None = None,
) -> Plan:
    """Re-solve p2a for a group whose members already scattered part of the a2a split.

    ``sent[g][i]`` is the bytes member g has already sent to worker i under ``a2a`` (default:
    :func:`solve_a2a` on the same inputs); they are a prefix of i's a2a segment, of A_i elements.
    Rows of non-members and the diagonal are ignored.

    Layout, "complete or truncate": worker i keeps the first min(S_i, A_i) elements of its a2a
    segment. Suffixes freed by workers whose share shrank (S_i < A_i) are handed, in vector
    order, to the workers whose share grew (S_i > A_i, in index order) as extra segments. So an
    element already sent stays with the aggregator it was sent to whenever that aggregator's
    share did not shrink below it, and the bytes of it still useful from g are
    min(sent[g][i], min(S_i, A_i)).

    Cost model: as :func:`solve_p2a`, but member g only has S_i - sent[g][i] bytes left for i:

        minimise X + Y  s.t.  sum S_i = M,  S_i >= 0,
                              S_i - sent[g][i] <= bw[g][i] X   for every member g != i,
                              S_i <= b_i Y.

    (When S_i < sent[g][i] the row is slack, matching the max(0, .) of the truncation.) With
    ``sent = 0`` this is exactly the p2a LP. Workers with a dead link from or to a member still
    get 0, even if some bytes already reached them. Predicted times are recomputed from the
    rounded split and the layout; bytes already sent are not counted in X.
    """
    w = _check_bw(bw)
    n = w.shape[0]
    members = _check_group(group, n)
    act = _check_active(active, n, members)
    total = _check_size(size, elem_bytes)
    if a2a is None:
        a2a = solve_a2a(w, size, active, elem_bytes)
    a2a_start = _check_a2a(a2a, n, elem_bytes, total)
    a2a_elems = np.asarray(a2a.elems, dtype=np.int64)
    done = np.array(sent, dtype=float)
    if done.shape != (n, n):
        raise PlanError("sent", f"must have shape {(n, n)}, got {done.shape}")
    np.fill_diagonal(done, 0.0)
    rows = list(members)
    if not np.all(np.isfinite(done[rows])) or np.any(done[rows] < 0):
        raise PlanError("sent", "member rows must be finite and non-negative")
    cap = a2a_elems * elem_bytes
    over = done[rows] > cap[None, :]
    if over.any():
        g, i = np.argwhere(over)[0]
        raise PlanError(
            "sent", f"member {rows[g]} sent {done[rows[g], i]} B to {i}, beyond its a2a share"
        )
    done_members = np.zeros_like(done)
    done_members[rows] = done[rows]

    if len(members) == 1:
        elems = np.zeros(n, dtype=np.int64)
        elems[members[0]] = total
        x = y = 0.0
    else:
        usable = _usable(w, members, act)
        shares = _phased_shares(
            w, members, usable, done_members / (total * elem_bytes), PlanKind.P2A_NONBLOCKING.value
        )
        elems = _to_elems(shares, total)
        x, y = _nonblocking_times(w, members, elems, a2a_elems, done_members, elem_bytes)
    segs = _nonblocking_layout(elems, a2a_elems, a2a_start)
    log.debug("non-blocking plan for %s: X=%.4g s Y=%.4g s", members, x, y)
    return Plan(
        PlanKind.P2A_NONBLOCKING,
        members,
        n,
        elem_bytes,
        tuple(int(e) for e in elems),
        segs,
        x,
        y,
        x + y,
    )


def _nonblocking_times(
    w: np.ndarray,
    members: Sequence[int],
    elems: np.ndarray,
    a2a_elems: np.ndarray,
    sent: np.ndarray,
    elem_bytes: int,
) -> tuple[float, float]:
    nbytes = elems.astype(float) * elem_bytes
    kept = np.minimum(elems, a2a_elems).astype(float) * elem_bytes
    useful = np.minimum(sent, kept[None, :])
    left = np.maximum(nbytes[None, :] - useful, 0.0)  # left[g][i]: bytes g still owes i
    mask = np.zeros_like(left, dtype=bool)
    mask[list(members), :] = True
    np.fill_diagonal(mask, False)
    x = _link_time(np.where(mask, left, 0.0), w)
    _, b = _group_rates(w, members)
    _, y = _phase_times(nbytes, np.full_like(b, np.inf), b)
    return x, y


def solve_pipelined(
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    active: Collection[int] | None = None,
    elem_bytes: int = 4,
) -> Plan:
    """Beyond the paper: parts stream, so scatter and broadcast overlap on different links.

    Cost model. Each block is cut into small parts; an aggregator sums a part as soon as all p
    copies of it arrived and streams the sum back at once. In the fluid limit (parts -> 0, no
    latency, free aggregation) no phase waits for another, and each directed link j -> k simply
    has to carry its load:

        load(j -> k) = S_k [j in G]  +  S_j [k in G]       (j != k)
                       (scatter of k's block)  (broadcast of j's block)

    and, links being independent shaped pipes, the group ends when the busiest link has carried
    its load: T = max_{j,k} load(j -> k) / bw[j][k]. Scatter and broadcast of the same worker use
    opposite link directions, so they do not compete; only a member-member link carries both.
    The LP

        minimise T  s.t.  sum S_i = M,  S_i >= 0,  load(j -> k) <= bw[j][k] T  for used links

    picks the split; workers with a dead link from or to a member, or inactive, get 0. The p2a
    split is feasible here with T <= X + Y (each link's scatter part takes <= X and broadcast
    part <= Y), so this plan is never slower than p2a under its own model. Pipeline fill (one
    part's time) is ignored. ``scatter_s``/``broadcast_s`` report the slowest link's time for
    scatter load alone and broadcast load alone. Among splits reaching the optimal T, a second LP
    prefers the one with the smallest phased X + Y (see ``_pipelined_shares``).
    """
    w = _check_bw(bw)
    n = w.shape[0]
    members = _check_group(group, n)
    act = _check_active(active, n, members)
    total = _check_size(size, elem_bytes)
    if len(members) == 1:
        return _single_member(PlanKind.PIPELINED, members, n, elem_bytes, total)
    usable = _usable(w, members, act)
    shares = _pipelined_shares(w, members, usable)
    elems = _to_elems(shares, total)
    scatter, broadcast = _load_matrices(_member_mask(n, members), elems.astype(float) * elem_bytes)
    xs, ys = _link_time(scatter, w), _link_time(broadcast, w)
    t = _link_time(scatter + broadcast, w)
    log.debug("pipelined plan for %s: T=%.4g s", members, t)
    return Plan(
        PlanKind.PIPELINED,
        members,
        n,
        elem_bytes,
        tuple(int(e) for e in elems),
        _contiguous(elems),
        xs,
        ys,
        t,
    )


def _pipelined_shares(w: np.ndarray, members: Sequence[int], usable: np.ndarray) -> np.ndarray:
    """Fractions per worker minimising the busiest link's time (see solve_pipelined).

    The optimum is often degenerate (e.g. two members sharing a fast link may split their load
    any way), so a second LP picks, among splits within 1e-7 of the optimal T, the one with the
    smallest phased X + Y: it balances the aggregators and degrades gracefully if the parts do
    not overlap as well as the fluid model assumes.
    """
    n = w.shape[0]
    idx = np.flatnonzero(usable)
    if idx.size == 0:
        raise PlanError("bw", "pipelined: no active worker has live links to and from every member")
    var = {int(i): v for v, i in enumerate(idx)}
    k = idx.size
    t_col, x_col, y_col = k, k + 1, k + 2
    r = float(w[np.isfinite(w)].max())
    links: dict[tuple[int, int], list[int]] = {}
    for g in members:
        for i in var:
            if i != g:
                links.setdefault((g, i), []).append(var[i])  # scatter g -> i
                links.setdefault((i, g), []).append(var[i])  # broadcast i -> g
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    b_ub: list[float] = []

    def add(terms: Sequence[int], rate: float, time_col: int) -> None:
        if rate <= 0:
            raise AssertionError("a usable worker sits on a dead link")
        row = len(b_ub)
        rows.extend([row] * (len(terms) + 1))
        cols.extend([*terms, time_col])
        vals.extend([1.0] * len(terms) + [-rate / r])
        b_ub.append(0.0)

    for (j, i), terms in links.items():
        add(terms, float(w[j, i]), t_col)
    c = np.zeros(k + 3)
    c[t_col] = 1.0
    first = _linprog(c, rows, cols, vals, b_ub, k + 3, k, "pipelined")
    a, b = _group_rates(w, members)
    for v, i in enumerate(idx):
        if math.isfinite(a[i]):
            add([v], float(a[i]), x_col)
        if math.isfinite(b[i]):
            add([v], float(b[i]), y_col)
    c = np.zeros(k + 3)
    c[x_col] = c[y_col] = 1.0
    t_max = float(first[t_col]) * (1 + 1e-7) + 1e-12
    x = _linprog(c, rows, cols, vals, b_ub, k + 3, k, "pipelined", upper={t_col: t_max})
    shares = np.zeros(n)
    shares[idx] = np.clip(x[:k], 0.0, None)
    return shares


@dataclass(frozen=True)
class SharedLink:
    """A capacity shared by several directed pairs: their bytes together drain at ``mbit``.

    E.g. a cloud's WAN uplink: every pair (a, b) with a in the cloud and b outside crosses it,
    so the cloud's workers share its rate instead of each having a private link. ``delay_s``
    is its one-way delay: a pair crossing it is at least that far. Used by
    :func:`lower_bound` and by the route planner (``crew.plan.routelp``).
    """

    pairs: tuple[tuple[int, int], ...]
    mbit: float
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        try:
            pairs = tuple((int(a), int(b)) for a, b in self.pairs)
        except (TypeError, ValueError):
            raise PlanError(
                "shared", f"pairs must be (src, dst) ints, got {self.pairs!r}"
            ) from None
        if (
            not pairs
            or len(set(pairs)) != len(pairs)
            or any(a == b or a < 0 or b < 0 for a, b in pairs)
        ):
            raise PlanError(
                "shared", f"pairs must be distinct (src, dst), 0 <= src != dst: {pairs}"
            )
        object.__setattr__(self, "pairs", pairs)
        for name in ("mbit", "delay_s"):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not math.isfinite(v)
                or v < 0
            ):
                raise PlanError("shared", f"{name} must be a finite number >= 0, got {v!r}")
        if not self.mbit > 0:
            raise PlanError("shared", "mbit must be positive (drop the pairs' links instead)")


# --------------------------------------------------------------------------- lower bound


BOUNDS = Memo(512)
"""Bounds already computed, by exact inputs (the coordinator bounds every group it plans)."""


def lower_bound(
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    active: Collection[int] | None = None,
    *,
    shared: Sequence[SharedLink] | None = None,
    delay_s: np.ndarray | None = None,
) -> float:
    """:func:`_lower_bound`, computed once per exact inputs (``BOUNDS``)."""
    key = key_part((np.asarray(bw, dtype=float), group, size, active, shared, delay_s))
    return float(
        BOUNDS.get(
            key, lambda: _lower_bound(bw, group, size, active, shared=shared, delay_s=delay_s)
        )
    )


def _lower_bound(
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    active: Collection[int] | None = None,
    *,
    shared: Sequence[SharedLink] | None = None,
    delay_s: np.ndarray | None = None,
) -> float:
    """Seconds no partial-reduce scheme can beat for this group on this capacity matrix.

    Assumptions: fluid traffic (bits, not packets), no latency, free aggregation, links are
    independent pipes of rate bw[j][k]; only active workers send, receive or relay; the scheme
    is exact (no lossy compression) and must be correct for every input; no information is
    carried by timing. With these, the bound holds for ANY scheme: relays through non-members,
    trees, pipelining, network coding.

    Claim. For p >= 2 let F = min over ordered member pairs (s, t), s != t, of the max-flow from
    s to t in the graph of active workers with capacities bw. Then T >= 8 M / (1e6 F).

    Proof. Take any set C of active workers containing a member t but not a member s, and fix all
    inputs except s's vector x_s. Every worker in C is deterministic given its own (fixed) inputs
    and the bits it receives, so t's final state is a function of the bits entering C from
    outside. t must end with sum_g x_g, which takes all 2^(8M) values as x_s varies; hence at
    least 8M bits enter C. By time T at most T * 1e6 * cap(into C) bits can enter, so
    T >= 8M / (1e6 cap(into C)). Maximising over C: by max-flow/min-cut, the smallest cut
    separating s from t is maxflow(s, t); the best such C over all pairs gives the claim. For p = 1
    nothing moves and the bound is 0.

    This is at least the per-member bound max_g max(M / sum_j bw[j][g], M / sum_j bw[g][j])
    (take C = {g}, resp. all active workers but g), and strictly tighter when members share a
    fast local network but a slow way out. Only 2(p - 1) flows are needed: fix a member g0; a cut
    separating two members either excludes g0 (and holds some t: maxflow(g0, t) bounds it) or
    includes g0 (and misses some s: maxflow(s, g0)). Capacities are rounded *up* to integers for
    the max-flow (scipy's, or on up to ``CUT_ENUMERATION_MAX_NODES`` nodes the least cut over
    every node set, the same integer), which can only lower the bound, so it stays valid.
    Returns ``inf`` when some member cannot reach another at all.

    **Shared capacities** (``shared``, see :class:`SharedLink`): the max-flow runs on the graph
    where each shared link's pairs go through two extra nodes, u -> in (capacity: u's pairs in
    the set), in -> out (the shared rate), out -> v (v's pairs). Every flow of the real network
    is a flow there (a relaxation: it may also allow flows the real one does not), and each cut
    of this graph costs at least what the shared-rate-aware cut of its workers can carry, so
    the bound stays valid and sees the shared rate. A pair in two shared sets keeps only the
    first (dropping a constraint only relaxes).

    **Latency** (``delay_s``: one-way delays, raised by shared links' ``delay_s``): a bit of x_s
    that crosses link u -> v into C and reaches t by T left u no earlier than d(s, u) and
    entered C no later than T - delay(u, v) - d(v, t), a window of at most T - d(s, t) (d: the
    shortest delay path among active workers). So 8M <= 1e6 cap(into C) (T - d(s, t)), i.e.
    T >= d(s, t) + 8M / (1e6 maxflow(s, t)) for each computed pair (on the per-link graph: the
    windows of a shared link's pairs differ, so their sum is not capped the same way), and
    trivially T >= max d(s, t) over member pairs. The bound is the largest of these.
    """
    w = _check_bw(bw)
    n = w.shape[0]
    members = _check_group(group, n)
    act = _check_active(active, n, members)
    if not _is_int(size) or size <= 0:
        raise PlanError("size", f"must be a positive int of bytes, got {size!r}")
    if len(members) == 1:
        return 0.0
    nodes = np.flatnonzero(act)
    pos = {int(v): k for k, v in enumerate(nodes)}
    sub = w[np.ix_(nodes, nodes)].copy()
    np.fill_diagonal(sub, 0.0)
    pairs = [(pos[members[0]], pos[m]) for m in members[1:]]
    pairs += [(b, a) for a, b in pairs]
    flows = _max_flows(sub, pairs)
    if min(flows) <= 0:
        return math.inf
    bits = size * 8 / 1e6
    bound = bits / min(flows)
    shared = tuple(shared or ())
    if shared:
        flows_shared = _max_flows(*_shared_graph(sub, shared, pos), pairs)
        bound = max(bound, bits / min(flows_shared))
    delays = _check_delays(delay_s, n, shared)
    if delays is not None:
        d = delays[np.ix_(nodes, nodes)]
        d = np.where(sub > 0, d, np.inf)
        np.fill_diagonal(d, 0.0)
        dist = _delay_paths(d)
        ms = [pos[m] for m in members]
        bound = max(bound, float(dist[np.ix_(ms, ms)].max()))
        for (a, b), f in zip(pairs, flows, strict=True):
            bound = max(bound, float(dist[a, b]) + bits / f)
    return bound


def _max_flows(cap: np.ndarray, pairs: Sequence[tuple[int, int]]) -> list[float]:
    """Max-flow value (Mbit/s) for each (source, sink) on the capacity matrix ``cap``.

    Capacities are scaled to int32 and rounded *up* (scipy's max-flow wants int32 and wraps
    larger values), which can only raise a flow, so a bound from it stays valid."""
    cap_sum = float(cap.sum())
    if cap_sum <= 0:
        return [0.0] * len(pairs)
    scale = (_FLOW_UNITS - cap.size) / cap_sum
    units = np.ceil(cap * scale)
    if cap.shape[0] <= CUT_ENUMERATION_MAX_NODES:
        return [f / scale for f in _min_cuts(units, pairs)]
    graph = csr_array(units.astype(np.int32))
    return [maximum_flow(graph, a, b).flow_value / scale for a, b in pairs]


CUT_ENUMERATION_MAX_NODES = 10
"""Up to this many nodes ``_max_flows`` takes the least cut over every node set instead of
scipy's max-flow: the same integer (max-flow min-cut), and at n = 8 one small matrix product
instead of 2(p - 1) calls of about 0.3 ms each (scipy's checks and conversions)."""


def _min_cuts(units: np.ndarray, pairs: Sequence[tuple[int, int]]) -> list[int]:
    """Per (s, t): the least capacity out of a node set holding s but not t, over all 2^k sets
    (``units``: whole-number capacities, as ``_max_flows`` makes them). Every cut is below 2^31,
    so float64 sums are exact."""
    k = units.shape[0]
    inside = ((np.arange(1 << k)[:, None] >> np.arange(k)) & 1).astype(float)
    cut = ((inside @ units) * (1.0 - inside)).sum(axis=1)
    out = []
    for a, b in pairs:
        ok = (inside[:, a] > 0) & (inside[:, b] == 0)
        out.append(int(cut[ok].min()))
    return out


def _shared_graph(
    sub: np.ndarray, shared: Sequence[SharedLink], pos: dict[int, int]
) -> tuple[np.ndarray]:
    """The per-link capacity graph with each shared link as in -> out gadget nodes."""
    k = sub.shape[0]
    taken: set[tuple[int, int]] = set()
    gadgets = []
    for s in shared:
        if not isinstance(s, SharedLink):
            raise PlanError("shared", f"must be SharedLink, got {s!r}")
        pairs = [(pos[a], pos[b]) for a, b in s.pairs if a in pos and b in pos]
        pairs = [e for e in pairs if e not in taken and sub[e] > 0]
        if pairs:
            taken.update(pairs)
            gadgets.append((pairs, s.mbit))
    cap = np.zeros((k + 2 * len(gadgets),) * 2)
    cap[:k, :k] = sub
    for g, (pairs, mbit) in enumerate(gadgets):
        gin, gout = k + 2 * g, k + 2 * g + 1
        cap[gin, gout] = mbit
        for a, b in pairs:
            cap[a, gin] += sub[a, b]
            cap[gout, b] += sub[a, b]
            cap[a, b] = 0.0
    return (cap,)


def _check_delays(
    delay_s: np.ndarray | None, n: int, shared: Sequence[SharedLink]
) -> np.ndarray | None:
    """One-way delay per directed pair (seconds), raised to every shared link it crosses."""
    if delay_s is None and not any(s.delay_s > 0 for s in shared):
        return None
    try:
        d = np.zeros((n, n)) if delay_s is None else np.array(delay_s, dtype=float)
    except (TypeError, ValueError) as exc:
        raise PlanError("delay_s", f"not a numeric matrix: {exc}") from None
    if d.shape != (n, n):
        raise PlanError("delay_s", f"must have shape {(n, n)}, got {d.shape}")
    off = ~np.eye(n, dtype=bool)
    if not np.all(np.isfinite(d[off])) or np.any(d[off] < 0):
        raise PlanError("delay_s", "off-diagonal delays must be finite and >= 0")
    for s in shared:
        for a, b in s.pairs:
            d[a, b] = max(d[a, b], s.delay_s)
    np.fill_diagonal(d, 0.0)
    return d


def _delay_paths(d: np.ndarray) -> np.ndarray:
    """All-pairs shortest delay (Floyd-Warshall; ``inf`` marks no link)."""
    dist = d.copy()
    for k in range(dist.shape[0]):
        dist = np.minimum(dist, dist[:, k, None] + dist[None, k, :])
    return dist


def two_hop(bw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Capacities improved by one relay hop, and which relay achieves each.

    ``out[i][j] = max(bw[i][j], max_r min(bw[i][r], bw[r][j]))``; ``relay[i][j]`` is that r, or
    -1 where the direct link is at least as fast. Dead links (0) are never relays.

    Cost model and its limit: a relayed transfer i -> r -> j streams, so it runs at the slower
    of its two hops. The LP that plans on ``out`` does not know the hops are shared with r's own
    traffic, so it is optimistic wherever it relays; that is why ``crew-relay`` is a scheme to
    measure against ``crew``, not the default.
    """
    w = _check_bw(bw)
    n = w.shape[0]
    out = w.copy()
    relay = np.full((n, n), -1, dtype=np.int64)
    for r in range(n):
        via = np.minimum(w[:, r][:, None], w[r, :][None, :])  # i -> r -> j
        via[r, :] = 0.0
        via[:, r] = 0.0
        better = via > out
        np.fill_diagonal(better, False)
        out = np.where(better, via, out)
        relay = np.where(better, r, relay)
    return out, relay
