"""The route LP's pricing: the cheapest new column under the LP's duals. Pure, no I/O.

With the duals y_k >= 0 of the resources and mu of ``sum x = 1``, a column's reduced cost is
``sum_{e in c} w_e - mu`` with link weight ``w_e = sum_{k contains e} y_k / rate_k``
(:meth:`~crew.plan.routelp.master.MasterLP.link_weights`). The cheapest single-shape column is,
for each root v, a min-cost Steiner in-tree from the members to v plus a min-cost Steiner
out-tree from v to the members, over the weighted links among active workers.

* :func:`price_exact` -- Dreyfus-Wagner dynamic programming for all roots at once, exact:
  O(3^p n + 2^p n^2) after an all-pairs shortest-path pass.
* :func:`price_spt` -- a heuristic for larger groups: per root, the union of shortest paths
  (two Dijkstra passes over all roots).

Both return the cheapest root's cost (a Lagrangian bound when exact) and the shapes of the
roots cheaper than a cut, cheapest first.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import shortest_path

from crew.plan.routelp.shapes import Edge, Shape


@functools.lru_cache(maxsize=16)
def _splits(q: int) -> tuple[list[tuple[np.ndarray, ...]], int]:
    """Per subset size k >= 2: (subsets S, reduceat starts, S1, S2, the row of S for each
    split, the splits' indices as a column) with S1 holding S's lowest bit, S1 and S2 = S
    minus S1 non-empty: every way to merge two sub-trees at a node."""
    by_size: dict[int, list[int]] = {}
    for s in range(1, 1 << q):
        by_size.setdefault(s.bit_count(), []).append(s)
    levels = []
    for k in range(2, q + 1):
        subsets, starts, s1s, s2s = [], [], [], []
        for s in by_size[k]:
            low = s & -s
            rest = s ^ low
            starts.append(len(s1s))
            subsets.append(s)
            sub = rest
            while True:  # subsets of rest, each with low added; S2 must be non-empty
                a = sub | low
                if a != s:
                    s1s.append(a)
                    s2s.append(s ^ a)
                if sub == 0:
                    break
                sub = (sub - 1) & rest
        seg = np.repeat(np.arange(len(subsets)), np.diff([*starts, len(s1s)]))
        idx = np.arange(len(s1s))[:, None]
        levels.append((np.array(subsets), np.array(starts), np.array(s1s), np.array(s2s), seg, idx))
    return levels, (1 << q) - 1


def _dreyfus_wagner(
    dist: np.ndarray, terms: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dp[S][v]: cheapest in-tree to v spanning terminals S (dist[u][v]: path u -> v), for all
    roots at once, and the choices that rebuild the trees: via[S][x] is the node u where the
    two sub-trees of S join on the way to x (dp[S][x] = merge[S][u] + dist[u][x]), and
    half[S][u] the sub-set S1 of the cheapest split S = S1 + S2 joined at u. Both are first
    minima (as numpy's argmin), so the trees are those an argmin search would rebuild.

    ``dist`` may be a stack of graphs (b x n x n; then every result gets the same leading
    axis): pricing solves the graph and its reverse in one pass, half the numpy calls, each
    element computed as alone."""
    if dist.ndim == 2:
        dp, via, half = _dreyfus_wagner(dist[None], terms)
        return dp[0], via[0], half[0]
    q = len(terms)
    b, n = dist.shape[0], dist.shape[-1]
    dp = np.full((b, 1 << q, n), np.inf)
    via = np.zeros((b, 1 << q, n), dtype=np.int64)
    half = np.zeros((b, 1 << q, n), dtype=np.int64)
    for i, t in enumerate(terms):
        dp[:, 1 << i] = dist[:, t]
    levels, _ = _splits(q)
    for subsets, starts, s1, s2, seg, idx in levels:
        vals = dp[:, s1] + dp[:, s2]
        m = np.minimum.reduceat(vals, starts, axis=1)
        first = np.where(vals == m[:, seg], idx, len(s1))  # the first split reaching the minimum
        half[:, subsets] = s1[np.minimum.reduceat(first, starts, axis=1)]
        joined = m[:, :, :, None] + dist[:, None, :, :]
        via[:, subsets] = joined.argmin(axis=2)
        dp[:, subsets] = joined.min(axis=2)
    return dp, via, half


def _dw_tree(
    v: int,
    via: list[list[int]],
    half: list[list[int]],
    pred: list[list[int]],
    terms: Sequence[int],
) -> set[Edge]:
    """Edges (towards v) of the Dreyfus-Wagner tree of all terminals rooted at v (``via`` and
    ``half`` from ``_dreyfus_wagner``, as lists: plain indexing is what this loop does; the
    shortest paths are walked inline, a call per path cost more than the walk at n = 8)."""
    q = len(terms)
    n = len(pred)
    edges: set[Edge] = set()
    stack = [((1 << q) - 1, v)]
    for _ in range(4 * (1 << q)):  # each entry splits a set: at most 2^(q+1) entries
        if not stack:
            break
        s, x = stack.pop()
        if s & (s - 1) == 0:
            u = terms[s.bit_length() - 1]
        else:
            u = via[s][x]
            a = half[s][u]
            stack.append((a, u))
            stack.append((s ^ a, u))
        row, y = pred[u], x  # the shortest path u -> x, backwards from x
        for _ in range(n):
            if y == u:
                break
            p = row[y]
            if p < 0:
                raise AssertionError(f"no path {u}->{x} in the pricing graph")
            edges.add((p, y))
            y = p
        else:
            if y != u:
                raise AssertionError("shortest-path predecessors loop")
    return edges


def _as_in_tree(root: int, edges: set[Edge], members: Collection[int]) -> tuple[Edge, ...]:
    """One parent per node: BFS from the root over reversed edges, then prune idle leaves."""
    into: dict[int, list[int]] = {}
    for a, b in edges:
        into.setdefault(b, []).append(a)
    parent: dict[int, int] = {}
    order = [root]
    for x in order:
        for a in sorted(into.get(x, ())):
            if a != root and a not in parent:
                parent[a] = x
                order.append(a)
    mset = set(members)
    for _ in range(len(parent) + 1):  # prune leaves that are not members
        has_child = set(parent.values())
        idle = [c for c in parent if c not in has_child and c not in mset]
        if not idle:
            break
        for c in idle:
            del parent[c]
    return tuple(sorted(parent.items()))


def _all_pairs(wt: np.ndarray, usable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shortest paths (dist[u][v] of u -> v) and predecessors (pred[u][x]: the node before x
    on the path from u; -9999 for none), by Floyd-Warshall in numpy for small n. ``wt`` and
    ``usable`` may be stacks of graphs (b x n x n), as in ``_dreyfus_wagner``."""
    n = wt.shape[-1]
    if wt.ndim == 3 and n > 48:
        pairs = [_all_pairs(w, u) for w, u in zip(wt, usable, strict=True)]
        return np.stack([d for d, _ in pairs]), np.stack([p for _, p in pairs])
    if n > 48:
        return shortest_path(
            _pricing_graph(wt, usable), method="D", directed=True, return_predecessors=True
        )
    dist = np.where(usable, wt, np.inf)
    diag = np.arange(n)
    dist[..., diag, diag] = 0.0
    pred = np.where(usable, np.arange(n)[:, None], -9999)
    for k in range(n):
        alt = dist[..., :, k, None] + dist[..., None, k, :]
        better = alt < dist
        dist = np.where(better, alt, dist)
        pred = np.where(better, pred[..., k, None, :], pred)
    return dist, pred


def _pricing_graph(wt: np.ndarray, usable: np.ndarray) -> csr_array:
    """Sparse weights for csgraph on the usable links (a dense matrix would drop weights
    below 1e-8: scipy masks values close to its null value)."""
    r, c = np.nonzero(usable)
    return csr_array((wt[r, c], (r, c)), shape=wt.shape)


def price_exact(
    wt: np.ndarray,
    usable: np.ndarray,
    members: Sequence[int],
    roots: np.ndarray,
    cut: float,
    limit: int,
) -> tuple[float, list[tuple[float, Shape]]]:
    """Cheapest (in-tree + out-tree) over all roots, exactly (Dreyfus-Wagner), and the trees
    of the roots whose cost is below ``cut`` (at most ``limit``, cheapest first)."""
    # in-trees on the graph, out-trees as in-trees of the reversed graph: both in one pass
    dist, pred = _all_pairs(np.stack([wt, wt.T]), np.stack([usable, usable.T]))
    dp, via, half = _dreyfus_wagner(dist, members)
    tables_in = via[0].tolist(), half[0].tolist(), pred[0].tolist()
    tables_out = via[1].tolist(), half[1].tolist(), pred[1].tolist()
    full = (1 << len(members)) - 1
    cost = dp[0, full] + dp[1, full]
    out = []
    order = roots[np.argsort(cost[roots], kind="stable")]
    for v in order[:limit]:
        v = int(v)
        if not cost[v] < cut:
            break
        up = _as_in_tree(v, _dw_tree(v, *tables_in, members), members)
        rev = _dw_tree(v, *tables_out, members)
        down_in = _as_in_tree(v, rev, members)  # in the reversed graph
        down = tuple(sorted((p, c) for c, p in down_in))
        out.append((float(cost[v]), Shape(v, up, down)))
    return float(cost[order[0]]), out


def price_spt(
    wt: np.ndarray,
    usable: np.ndarray,
    members: Sequence[int],
    roots: np.ndarray,
    cut: float,
    limit: int,
) -> tuple[float, list[tuple[float, Shape]]]:
    """Heuristic: shortest-path in-tree + out-tree per root (for groups too big for DW), with
    the same result form as :func:`price_exact`."""
    g = _pricing_graph(wt, usable)
    n = g.shape[0]
    dense = np.where(usable, wt, np.inf)
    _, pred_to = shortest_path(g.T, method="D", directed=True, return_predecessors=True)
    _, pred_from = shortest_path(g, method="D", directed=True, return_predecessors=True)
    mem = np.zeros(n, dtype=bool)
    mem[list(members)] = True
    # pred_to[v][u]: next hop from u towards v; pred_from[v][u]: parent of u from v
    cost = np.zeros(n)
    trees = {}
    for which, pred in (("up", pred_to), ("down", pred_from)):
        marked = np.zeros((n, n), dtype=bool)
        marked[:, mem] = True
        marked[np.arange(n), np.arange(n)] = False
        bad = (pred < 0) & marked
        dead = bad.any(axis=1)
        for _ in range(n):
            r, c = np.nonzero(marked & (pred >= 0))
            nxt = pred[r, c]
            newly = ~marked[r, nxt] & (nxt != r)
            if not newly.any():
                break
            marked[r[newly], nxt[newly]] = True
        r, c = np.nonzero(marked & (pred >= 0))
        p = pred[r, c]
        wts = dense[c, p] if which == "up" else dense[p, c]
        part = np.zeros(n)
        np.add.at(part, r, wts)
        part[dead] = np.inf
        cost += part
        trees[which] = (marked, pred)
    out = []
    order = roots[np.argsort(cost[roots], kind="stable")]
    for v in order[:limit]:
        v = int(v)
        if not cost[v] < cut:
            break
        m_up, p_up = trees["up"]
        m_dn, p_dn = trees["down"]
        up = tuple(sorted((int(u), int(p_up[v, u])) for u in np.flatnonzero(m_up[v])))
        down = tuple(sorted((int(p_dn[v, u]), int(u)) for u in np.flatnonzero(m_dn[v])))
        out.append((float(cost[v]), Shape(v, up, down)))
    return float(cost[order[0]]), out
