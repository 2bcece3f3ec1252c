"""The route LP's columns: a route's shape without its element range, bundles of shapes, and a
tree's latency. Pure, no I/O.

A :class:`Shape` is a reduce in-tree to its root (edges as (child, parent)) and a broadcast
out-tree from it (edges as (parent, child)). A :class:`Column` is the LP's variable: shapes
that together deliver one range to every member exactly once (one shape, or a bundle such as
all-to-all's). Every tree edge a -> b of a column puts x_c * M bytes on link a -> b.
"""

from __future__ import annotations

from dataclasses import dataclass

Edge = tuple[int, int]


@dataclass(frozen=True)
class Shape:
    """A route without its range: reduce in-tree to ``root``, broadcast out-tree from it."""

    root: int
    up: tuple[Edge, ...]
    down: tuple[Edge, ...]


@dataclass(frozen=True)
class Column:
    """Shapes that together deliver one range to every member exactly once."""

    shapes: tuple[Shape, ...]
    origin: str  # "star", "blink", "ring", "a2a", "priced": where the column came from

    def edge_uses(self) -> dict[Edge, int]:
        """How many times each link carries this column's range (both phases counted)."""
        out: dict[Edge, int] = {}
        for s in self.shapes:
            for e in (*s.up, *s.down):
                out[e] = out.get(e, 0) + 1
        return out


def tree_depth(root: int, edges: tuple[Edge, ...], hops: list[list[float]], down: bool) -> float:
    """Longest path of a shape's in-tree (``edges`` as (child, parent), ``down`` False) into
    ``root``, or of its out-tree ((parent, child), ``down`` True) from it, in seconds. Each
    node's depth is its parent's plus its hop, summed from the root outwards."""
    parent = {c: p for p, c in edges} if down else dict(edges)
    depth: dict[int, float] = {root: 0.0}
    worst = 0.0
    for x in parent:
        chain = []
        while x not in depth:  # bounded: a valid tree reaches the root
            chain.append(x)
            x = parent[x]
        d = depth[x]
        for y in reversed(chain):
            d += hops[parent[y]][y] if down else hops[y][parent[y]]
            depth[y] = d
        worst = max(worst, d)
    return worst
