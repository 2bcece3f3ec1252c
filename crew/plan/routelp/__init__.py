"""CREW's route planner: one LP over every route a group's vector can take. Pure, no I/O.

Conventions are :mod:`crew.plan.inputs`': ``bw`` is n x n Mbit/s (``bw[i][j]`` the rate of
i -> j, 0 = dead link, diagonal ignored), ``members`` the group, ``active`` who may relay or
aggregate, ``size`` the bytes of the vector (4-byte elements), times in seconds.

**Routes.** A route (:mod:`crew.plan.routes`) carries one element range up a reduce in-tree to
its root and back down a broadcast out-tree. A *column* of the LP is a route shape without its
range, or a bundle of shapes that together deliver a range to every member once
(:mod:`.shapes`); the LP gives each column a fraction x_c of the vector.

**Cost model** (:mod:`.cost`). Each directed pair is a resource of capacity ``bw[a][b]``; a
:class:`~crew.plan.inputs.SharedLink` is one more resource whose pairs' *sum* is capped. Every
resource drains its load at its rate, all at once, so the bandwidth time is
``T_bw = max over resources of load / rate``. With a one-way delay matrix and ``part_bytes``,
a route also needs its longest reduce path plus its longest broadcast path, each hop one delay
plus the part's serialisation, before its last part lands. The coordinator passes a part's own
bytes plus the unsent bytes a busy connection holds ahead of it
(``crew.control.assignment.hop_bytes``), so the LP weighs a relay's extra hops at what they
cost the engine. The plan's time is ``T = T_bw + max over used columns of L_c``.

**Solving.** :func:`plan_routes` runs column generation (:mod:`.colgen`): a master LP kept warm
in HiGHS (:mod:`.master`), seeded with every route baseline (:mod:`.seeds`), priced exactly by
Dreyfus-Wagner for small groups and by shortest-path trees for large ones (:mod:`.pricing`).
Since T is not linear in x, the latency term is minimised by a search over latency levels
(:mod:`.levels`); the fractions are then rounded to whole elements (:mod:`.result`).

This is the path (column) form of the tree-packing LPs of ForestColl (Zhao et al., 2024:
aggregation and broadcast trees, throughput-optimal via spanning-tree packing) and of TE-CCL's
flow formulation, restricted to what the lab's engine runs: per range one reduce tree and one
broadcast tree through the same root, cut-through, with shared capacities and latency added.

**State.** Nothing here is kept between calls unless the caller passes a
:class:`RouteLPCache` (results and warm columns); :class:`RouteLPSettings` bound the search.
"""

from __future__ import annotations

from crew.plan.routelp.cache import RouteLPCache
from crew.plan.routelp.colgen import plan_routes
from crew.plan.routelp.cost import bandwidth_time, hop_latency, route_latency, route_time
from crew.plan.routelp.result import RoutePlanResult
from crew.plan.routelp.settings import DEFAULT_SETTINGS, RouteLPSettings
from crew.plan.routelp.shapes import Column, Shape

__all__ = [
    "DEFAULT_SETTINGS",
    "Column",
    "RouteLPCache",
    "RouteLPSettings",
    "RoutePlanResult",
    "Shape",
    "bandwidth_time",
    "hop_latency",
    "plan_routes",
    "route_latency",
    "route_time",
]
