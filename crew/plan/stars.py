"""The star planners: one linear program splits the vector among aggregators, each a star over
the members. Pure, no I/O.

Inputs follow :mod:`crew.plan.inputs`. The model vector is split into contiguous element ranges
(:class:`~crew.plan.plantypes.Segment`); worker i aggregates ``elems[i]`` elements. Every member
sends its copy of i's elements to i (scatter); i sums the p copies and sends the sum back to
every member (broadcast). Worker i's share of bytes is S_i.

Plans (every split by a linear program solved with HiGHS, :mod:`crew.plan.highs`):

* :func:`solve_p2a` -- CREW's LP over all usable active workers, phases run back to back.
* :func:`solve_p2p` -- the same LP over the members only (P-Reduce, load-balanced).
* :func:`solve_a2a` -- every active worker as if all were members (split used before a group).
* :func:`solve_p2a_nonblocking` -- re-solve p2a crediting bytes already sent under a2a.
* :func:`solve_pipelined` -- parts stream, so the objective is per-link load, not X + Y.

The LP solution is a real split; :func:`~crew.plan.rounding.largest_remainder` turns it into
whole elements, and the predicted times are recomputed from those elements
(:mod:`crew.plan.starcost`), so a plan's prediction is exactly the cost model applied to what
the workers will actually move.

Cost: one LP of at most n + 2 variables and 2n rows (p2a, p2p, a2a); the non-blocking LP has a
row per member-worker pair; :func:`solve_pipelined` solves two LPs of at most n + 3 variables
with a row per member-worker link.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Sequence

import numpy as np
from scipy.sparse import coo_array

from crew.plan import inputs
from crew.plan.highs import INF, OPTIMAL, new_solver, status_text
from crew.plan.inputs import ELEM_BYTES, PlanError
from crew.plan.plantypes import Plan, PlanKind, Segment
from crew.plan.rounding import largest_remainder
from crew.plan.starcost import group_rates, link_time, load_matrices, member_mask, phase_times

log = logging.getLogger(__name__)


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
    a_ub = coo_array((vals, (rows, cols)), shape=(len(b_ub), n_vars)).tocsr()
    h = new_solver()
    up = np.full(n_vars, INF)
    for v, bound in (upper or {}).items():
        if bound is not None:
            up[v] = bound
    h.addVars(n_vars, np.zeros(n_vars), up)
    h.changeColsCost(n_vars, np.arange(n_vars, dtype=np.int32), np.asarray(c, dtype=float))
    m = len(b_ub)
    h.addRows(
        m,
        np.full(m, -INF),
        np.asarray(b_ub, dtype=float),
        a_ub.nnz,
        a_ub.indptr[:-1].astype(np.int32),
        a_ub.indices.astype(np.int32),
        a_ub.data.astype(float),
    )
    h.addRow(1.0, 1.0, eq_vars, np.arange(eq_vars, dtype=np.int32), np.ones(eq_vars))
    h.run()
    if h.getModelStatus() != OPTIMAL:
        raise PlanError("bw", f"{what} LP has no solution: {status_text(h)}")
    return np.asarray(h.getSolution().col_value)


def _usable(w: np.ndarray, members: Sequence[int], active: np.ndarray) -> np.ndarray:
    """Workers that can aggregate: active, reachable from every member and reaching every one."""
    a, b = group_rates(w, members)
    return active & (a > 0) & (b > 0)


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
    a, b = group_rates(w, members)
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


def _solve_phased(
    kind: PlanKind,
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    active: Collection[int] | None,
    elem_bytes: int,
) -> Plan:
    w = inputs.check_bw(bw)
    n = w.shape[0]
    members = inputs.check_group(group, n)
    act = inputs.check_active(active, n, members)
    total = inputs.check_size(size, elem_bytes)
    if len(members) == 1:
        return _single_member(kind, members, n, elem_bytes, total)
    usable = _usable(w, members, act)
    shares = _phased_shares(w, members, usable, None, kind.value)
    elems = _to_elems(shares, total)
    a, b = group_rates(w, members)
    x, y = phase_times(elems.astype(float) * elem_bytes, a, b)
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
    elem_bytes: int = ELEM_BYTES,
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


def solve_p2p(
    bw: np.ndarray, group: Sequence[int], size: int, elem_bytes: int = ELEM_BYTES
) -> Plan:
    """The p2a LP restricted to the members: P-Reduce's all-reduce among members, load-balanced.

    Same cost model as :func:`solve_p2a`; non-members never aggregate or carry anything.
    """
    w = inputs.check_bw(bw)
    members = inputs.check_group(group, w.shape[0])
    return _solve_phased(PlanKind.P2P, w, members, size, members, elem_bytes)


def solve_a2a(
    bw: np.ndarray,
    size: int,
    active: Collection[int] | None = None,
    elem_bytes: int = ELEM_BYTES,
) -> Plan:
    """The p2a LP with every active worker as a member: a split usable before any group exists.

    ``plan.group`` is the sorted active set. Non-blocking mode scatters with this split as soon as
    a worker is ready (see :func:`solve_p2a_nonblocking`).
    """
    w = inputs.check_bw(bw)
    n = w.shape[0]
    act = inputs.check_active(active, n, ())
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
    elem_bytes: int = ELEM_BYTES,
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
    w = inputs.check_bw(bw)
    n = w.shape[0]
    members = inputs.check_group(group, n)
    act = inputs.check_active(active, n, members)
    total = inputs.check_size(size, elem_bytes)
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
    x = link_time(np.where(mask, left, 0.0), w)
    _, b = group_rates(w, members)
    _, y = phase_times(nbytes, np.full_like(b, np.inf), b)
    return x, y


def solve_pipelined(
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    active: Collection[int] | None = None,
    elem_bytes: int = ELEM_BYTES,
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
    w = inputs.check_bw(bw)
    n = w.shape[0]
    members = inputs.check_group(group, n)
    act = inputs.check_active(active, n, members)
    total = inputs.check_size(size, elem_bytes)
    if len(members) == 1:
        return _single_member(PlanKind.PIPELINED, members, n, elem_bytes, total)
    usable = _usable(w, members, act)
    shares = _pipelined_shares(w, members, usable)
    elems = _to_elems(shares, total)
    scatter, broadcast = load_matrices(member_mask(n, members), elems.astype(float) * elem_bytes)
    xs, ys = link_time(scatter, w), link_time(broadcast, w)
    t = link_time(scatter + broadcast, w)
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
    a, b = group_rates(w, members)
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
