"""Spanning trees over a group's members: BLINK-style greedy packing, and routes along a tree.
Pure, no I/O.

Used by the BLINK and TopoAdopt baselines (:mod:`crew.plan.baselines`) and to seed the route LP
(:mod:`crew.plan.routelp`). Inputs follow :mod:`crew.plan.inputs`.

Cost: :func:`pack_trees` runs Kruskal over the p(p - 1)/2 member pairs once per tree;
:func:`tree_routes` and :func:`eccentric_root` are breadth-first walks, O(p) per tree and root.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from crew.plan.inputs import PlanError, check_bw, check_group, is_int
from crew.plan.routes import Route

_EPS = 1e-9  # relative: residual capacity below this fraction of the largest rate counts as 0


@dataclass(frozen=True)
class PackedTree:
    """A spanning tree over the members (undirected edges ``(i, j)``, i < j) and its rate."""

    rate: float
    edges: tuple[tuple[int, int], ...]


def pack_trees(bw: np.ndarray, group: Sequence[int], max_trees: int = 4) -> tuple[PackedTree, ...]:
    """Greedy packing of spanning trees over the members' links (BLINK-style).

    A tree carries its range up (child -> parent) and back down (parent -> child), so an edge
    {i, j} is worth c_ij = min(bw[i][j], bw[j][i]). Repeatedly: take a maximum spanning tree of
    the residual c (Kruskal, equal edges by lowest degree then index; it is also a
    maximum-bottleneck spanning tree), give
    it the rate of its slowest edge, subtract that rate from its edges. Stop after ``max_trees``
    trees or when the residual links no longer connect the members (residual below 1e-9 of the
    fastest link counts as none). Rates therefore never oversubscribe a link in either
    direction. Only member-member links are used (no relays). BLINK proper packs directed
    arborescences near-optimally; this greedy packing is simpler and may pack less rate.
    Returns () when the members are not connected by links live in both directions (or p = 1).
    """
    w = check_bw(bw)
    members = check_group(group, w.shape[0])
    if not is_int(max_trees) or max_trees < 1:
        raise PlanError("max_trees", f"must be a positive int, got {max_trees!r}")
    ms = sorted(members)
    if len(ms) == 1:
        return ()
    cap = {(a, b): float(min(w[a, b], w[b, a])) for a, b in itertools.combinations(ms, 2)}
    eps = _EPS * max(cap.values())
    out: list[PackedTree] = []
    for _ in range(max_trees):
        tree = _max_spanning_tree(ms, {e: c for e, c in cap.items() if c > eps})
        if tree is None:
            break
        rate = min(cap[e] for e in tree)
        for e in tree:
            cap[e] -= rate
        out.append(PackedTree(rate, tree))
    return tuple(out)


def _max_spanning_tree(
    nodes: Sequence[int], cap: dict[tuple[int, int], float]
) -> tuple[tuple[int, int], ...] | None:
    """Kruskal, fastest edges first. Among equally fast edges (uniform topologies) the one
    joining the lowest-degree nodes goes first, so that the first tree is path-like rather than
    a star and leaves a spanning tree behind (on uniform K4 a star would leave a triangle)."""
    root = {x: x for x in nodes}
    deg = dict.fromkeys(nodes, 0)

    def find(x: int) -> int:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    ranked = sorted(cap.items(), key=lambda kv: (-kv[1], kv[0]))
    edges: list[tuple[int, int]] = []
    i = 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][1] >= ranked[i][1] * (1 - 1e-12):
            j += 1
        batch = [e for e, _ in ranked[i:j]]
        for _ in batch:  # each round adds one edge or stops
            joinable = [e for e in batch if find(e[0]) != find(e[1])]
            if not joinable:
                break
            a, b = min(joinable, key=lambda e: (deg[e[0]] + deg[e[1]], e))
            root[find(a)] = find(b)
            deg[a] += 1
            deg[b] += 1
            edges.append((a, b))
        i = j
    return tuple(sorted(edges)) if len(edges) == len(nodes) - 1 else None


def tree_routes(
    trees: Sequence[tuple[tuple[int, int], ...]],
    roots: Sequence[int],
    elems: Sequence[int],
) -> list[Route]:
    """Ranges laid out in tree order; reduce towards the root, broadcast back down."""
    out = []
    pos = 0
    for edges, root, e in zip(trees, roots, elems, strict=True):
        if e == 0:
            continue
        adj: dict[int, list[int]] = {}
        for a, b in edges:
            adj.setdefault(a, []).append(b)
            adj.setdefault(b, []).append(a)
        parent = {root: root}
        order = [root]
        for x in order:  # BFS: grows by at most one entry per node
            for y in sorted(adj.get(x, ())):
                if y not in parent:
                    parent[y] = x
                    order.append(y)
        up = tuple((x, parent[x]) for x in reversed(order[1:]))
        down = tuple((parent[x], x) for x in order[1:])
        out.append(Route(pos, pos + int(e), root, up, down))
        pos += int(e)
    return out


def eccentric_root(edges: Sequence[tuple[int, int]], members: Sequence[int]) -> int:
    """The member whose farthest member is fewest hops away (ties: lowest index)."""
    adj: dict[int, list[int]] = {m: [] for m in members}
    for a, b in edges:
        adj[a].append(b)
        adj[b].append(a)

    def ecc(s: int) -> int:
        dist = {s: 0}
        frontier = [s]
        for x in frontier:
            for y in adj[x]:
                if y not in dist:
                    dist[y] = dist[x] + 1
                    frontier.append(y)
        return max(dist.values())

    return min(sorted(members), key=ecc)
