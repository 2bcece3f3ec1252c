"""The fluid lower bound: seconds no partial-reduce scheme can beat for a group on a capacity
matrix. Pure, no I/O.

:func:`lower_bound` takes the conventions of :mod:`crew.plan.inputs` and returns the largest of
a max-flow/min-cut bound on the bandwidth, the same bound with shared capacities as extra
nodes, and with one-way delays the shortest delay between members plus the bandwidth time of
each computed pair. The proof is in ``fluid_bound``'s docstring.

Cost: 2(p - 1) max-flows on the active workers' graph (on up to ``CUT_ENUMERATION_MAX_NODES``
nodes, one dense product over all 2^k node sets instead), plus a Floyd-Warshall pass with
delays; results are memoised by exact inputs (``BOUNDS``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_flow

from crew.plan import inputs
from crew.plan.inputs import PlanError, SharedLink
from crew.plan.memo import Memo, key_part

# scipy's maximum_flow wants int32 capacities and silently wraps larger values, so capacities
# are scaled so that the sum over all links stays below this.
_FLOW_UNITS = 2**30

BOUNDS = Memo(512, 2 << 20)
"""Bounds already computed, by exact inputs (the coordinator bounds every group it plans), in
2 MiB at most: at n = 60 a key holds 29 KB of rates."""


def lower_bound(
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    active: Collection[int] | None = None,
    *,
    shared: Sequence[SharedLink] | None = None,
    delay_s: np.ndarray | None = None,
) -> float:
    """:func:`fluid_bound`, computed once per exact inputs (``BOUNDS``)."""
    args = (bw, group, size, active, shared, delay_s)
    key = key_part((np.asarray(bw, dtype=float), *args[1:]))
    return float(BOUNDS.get(key, lambda: fluid_bound(*args)))


def fluid_bound(
    bw: np.ndarray,
    group: Sequence[int],
    size: int,
    active: Collection[int] | None,
    shared: Sequence[SharedLink] | None,
    delay_s: np.ndarray | None,
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
    w = inputs.check_bw(bw)
    n = w.shape[0]
    members = inputs.check_group(group, n)
    act = inputs.check_active(active, n, members)
    if not inputs.is_int(size) or size <= 0:
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
    delays = inputs.check_delays(delay_s, n, shared)
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


def _delay_paths(d: np.ndarray) -> np.ndarray:
    """All-pairs shortest delay (Floyd-Warshall; ``inf`` marks no link)."""
    dist = d.copy()
    for k in range(dist.shape[0]):
        dist = np.minimum(dist, dist[:, k, None] + dist[None, k, :])
    return dist
