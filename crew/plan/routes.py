"""Routes: how one group's vector travels, for every scheme, in one vocabulary.

A **route** carries one element range ``[start, stop)`` of the model vector. Its **reduce
tree** (``up``: child → parent edges) gathers the members' copies of the range towards the
route's **root**: every node sums its own copy (if it is a member) and its children's partial
sums, and passes the sum to its parent. The root then holds the group's sum, and its
**broadcast tree** (``down``: parent → child edges) hands it to the members.

Every scheme in the lab is a set of routes:

* CREW and the original partial reduce: one star per block, rooted at the block's aggregator
  (a non-member in CREW), reduce and broadcast over the same star;
* PS: one star rooted at the server, covering the whole vector;
* Ring: per member c, a reduce path that ends at c and a broadcast path that starts at c;
* all-to-all: per member m, a star of the whole vector into m, with no broadcast;
* BLINK and TopoAdopt: a few spanning trees, each carrying a fraction of the vector.

Nodes that are not members (CREW's aggregators, relays in a tree) contribute nothing of their
own: they only add up and pass on. ``pipelined`` routes forward each part as soon as it is
complete at a node; otherwise a node waits for the whole range before passing anything on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class RouteError(ValueError):
    """A route plan is inconsistent; the message names the route and what is wrong."""


@dataclass(frozen=True)
class Route:
    start: int
    stop: int
    root: int
    up: tuple[tuple[int, int], ...]  # (child, parent)
    down: tuple[tuple[int, int], ...]  # (parent, child)

    @property
    def elems(self) -> int:
        return self.stop - self.start

    def parent(self, node: int) -> int | None:
        for child, parent in self.up:
            if child == node:
                return parent
        return None

    def children_up(self, node: int) -> tuple[int, ...]:
        return tuple(c for c, p in self.up if p == node)

    def children_down(self, node: int) -> tuple[int, ...]:
        return tuple(c for p, c in self.down if p == node)

    def nodes(self) -> set[int]:
        out = {self.root}
        for a, b in (*self.up, *self.down):
            out.add(a)
            out.add(b)
        return out

    def receivers(self) -> set[int]:
        """Nodes that end up holding the sum: the root and everyone the broadcast reaches."""
        return {self.root} | {c for _, c in self.down}

    def to_list(self) -> list[Any]:
        return [
            self.start,
            self.stop,
            self.root,
            [list(e) for e in self.up],
            [list(e) for e in self.down],
        ]

    @classmethod
    def from_list(cls, raw: Sequence[Any]) -> Route:
        try:
            start, stop, root, up, down = raw
            return cls(
                int(start),
                int(stop),
                int(root),
                tuple((int(a), int(b)) for a, b in up),
                tuple((int(a), int(b)) for a, b in down),
            )
        except (TypeError, ValueError) as exc:
            raise RouteError(f"route {raw!r}: malformed ({exc})") from None


def _leads_to(node: int, root: int, parent: dict[int, int]) -> bool:
    """Whether following ``parent`` from ``node`` reaches ``root`` (without a cycle)."""
    seen = set()
    while node != root:
        if node in seen or node not in parent:
            return False
        seen.add(node)
        node = parent[node]
    return True


def validate_routes(routes: Sequence[Route], members: Sequence[int], n: int, total: int) -> None:
    """Check that the routes compute, for every member, the sum over all members exactly once.

    * every node is a worker index;
    * each route's reduce tree is a tree towards its root that contains every member, and no
      node has two parents;
    * each route's broadcast tree is a tree from its root (each child has one parent, reachable
      from the root);
    * for every member, the ranges of the routes it receives cover ``[0, total)`` exactly once.
    """
    mset = set(members)
    coverage: dict[int, list[tuple[int, int]]] = {m: [] for m in members}
    for k, r in enumerate(routes):
        where = f"route {k} [{r.start}, {r.stop})"
        if not 0 <= r.start < r.stop <= total:
            raise RouteError(f"{where}: range outside [0, {total})")
        if any(not 0 <= x < n for x in r.nodes()):
            raise RouteError(f"{where}: node outside 0..{n - 1}")
        parents: dict[int, int] = {}
        for child, parent in r.up:
            if child == parent or child in parents or child == r.root:
                raise RouteError(f"{where}: reduce edge {child}->{parent} breaks the tree")
            parents[child] = parent
        for m in mset - {r.root}:
            if not _leads_to(m, r.root, parents):
                raise RouteError(f"{where}: member {m} does not reach root {r.root}")
        for node in parents:  # relays must lead somewhere too
            if not _leads_to(node, r.root, parents):
                raise RouteError(f"{where}: node {node} does not reach root {r.root}")
        dparent: dict[int, int] = {}
        for parent, child in r.down:
            if child == r.root or child in dparent or child == parent:
                raise RouteError(f"{where}: broadcast edge {parent}->{child} breaks the tree")
            dparent[child] = parent
        for child in dparent:
            if not _leads_to(child, r.root, dparent):
                raise RouteError(f"{where}: {child} is not reached from root {r.root}")
        for m in r.receivers() & mset:
            coverage[m].append((r.start, r.stop))
    for m, spans in coverage.items():
        pos = 0
        for start, stop in sorted(spans):
            if start != pos:
                raise RouteError(
                    f"member {m}: receives [{start}, {stop}) but needs {pos} next"
                    " (a gap or an overlap)"
                )
            pos = stop
        if pos != total:
            raise RouteError(f"member {m}: receives {pos} of {total} elements")


def star_routes(segments: Iterable[tuple[int, int, int]], members: Sequence[int]) -> list[Route]:
    """One star per ``(aggregator, start, stop)`` segment: scatter to it, broadcast from it."""
    out = []
    for agg, start, stop in segments:
        others = [m for m in members if m != agg]
        out.append(
            Route(
                start, stop, agg, tuple((m, agg) for m in others), tuple((agg, m) for m in others)
            )
        )
    return out


def relayed_star_routes(
    segments: Iterable[tuple[int, int, int]], members: Sequence[int], relay: np.ndarray
) -> list[Route]:
    """Stars as ``star_routes``, except that a member whose link to (from) the aggregator is
    slower than a one-relay path (``relay[a][b] >= 0``, from ``starcost.two_hop``) goes through
    that relay. One hop only: a member serves as a relay only if it reaches the aggregator
    directly itself, and a non-member relay hangs directly under the aggregator."""
    out = []
    for agg, start, stop in segments:
        up = _one_hop_tree(agg, members, lambda m, a=agg: int(relay[m][a]))
        down = _one_hop_tree(agg, members, lambda m, a=agg: int(relay[a][m]))
        out.append(
            Route(
                start,
                stop,
                agg,
                tuple(sorted(up.items())),
                tuple(sorted((p, c) for c, p in down.items())),
            )
        )
    return out


def _one_hop_tree(agg: int, members: Sequence[int], hop: Callable[[int], int]) -> dict[int, int]:
    """child -> parent: every member under ``agg``, or under its relay ``hop(m)`` if any."""
    others = [m for m in members if m != agg]
    via = {m: hop(m) for m in others}
    via = {m: r for m, r in via.items() if r >= 0 and r != agg}
    tree = {m: agg for m in others}
    for m, r in via.items():
        if r in via:
            continue  # that member is relayed itself: no chains
        tree[m] = r
        tree.setdefault(r, agg)
    return tree


def link_load(routes: Iterable[Route], n: int, elem_bytes: float = 4) -> np.ndarray:
    """Bytes each directed link carries: one copy of the range per tree edge."""
    load = np.zeros((n, n))
    for r in routes:
        size = r.elems * elem_bytes
        for a, b in (*r.up, *r.down):
            load[a, b] += size
    return load
