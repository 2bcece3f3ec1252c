"""From a scheme's name to the routes a group's data takes: the one place schemes are chosen.

Every scheme except Gloo plans a group as routes (``crew.plan.routes``) that the same engine
(``crew.runtime.reduce``) executes, so schemes differ only in where data goes, never in how it is
sent.

=============  ===========================================================================
scheme         plan
=============  ===========================================================================
crew           the route LP (``crew.plan.routelp``): a mix of routes (stars per aggregator, relays,
               reduce/broadcast trees, ring segments) chosen by column generation to empty
               the busiest link (or shared link) first, latency counted; parts stream through
crew-star      one star per active aggregator, block sizes from the per-link-load LP
               (``stars.solve_pipelined``); parts stream through
crew-relay     crew-star's split planned on capacities improved by one relay hop and routed
               through those relays (``starcost.two_hop``); its prediction is the honest cost
               of those routes (both hops' load counted), so it is usually worse than crew
crew-paper     the paper's form: p2a LP minimising X + Y; each block stored and forwarded
preduce        the original partial reduce: members only (p2p LP), stored and forwarded
ps, ring, a2a, blink, blink-pipe, topoadopt
               the baselines of ``crew.plan.baselines``
gloo           not planned here: torch.distributed all-reduce among all workers
=============  ===========================================================================

:class:`GroupPlanner` plans with caches that last as long as it does (the route LP's results
and warm columns, crew's plans up to renaming the workers, the star tie checks): a coordinator
or a simulator run holds one. :func:`plan_group` plans once, cold, with a fresh one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from crew.config import Scheme
from crew.plan import inputs, symmetry
from crew.plan.baselines import BASELINE_SCHEMES, plan_for
from crew.plan.inputs import BYTES_PER_S_PER_MBIT, ELEM_BYTES, PlanError, SharedLink
from crew.plan.memo import Memo, key_part
from crew.plan.plantypes import Plan
from crew.plan.routelp import (
    DEFAULT_SETTINGS,
    RouteLPCache,
    RouteLPSettings,
    hop_latency,
    plan_routes,
    route_time,
)
from crew.plan.routes import Route, link_load, relayed_star_routes, star_routes
from crew.plan.starcost import group_rates, two_hop
from crew.plan.stars import (
    solve_p2a,
    solve_p2a_nonblocking,
    solve_p2p,
    solve_pipelined,
)

STAR_SCHEMES = (Scheme.CREW, Scheme.CREW_PAPER, Scheme.PREDUCE, Scheme.CREW_RELAY, Scheme.CREW_STAR)
ROUTE_SCHEMES = BASELINE_SCHEMES
ALL_SCHEMES = tuple(Scheme)
GROUP_SCHEMES = STAR_SCHEMES + ROUTE_SCHEMES  # planned per group by the coordinator


@dataclass(frozen=True)
class GroupPlan:
    scheme: Scheme
    members: tuple[int, ...]
    routes: tuple[Route, ...]
    pipelined: bool
    predicted_s: float
    n: int
    total: int
    elem_bytes: float = float(ELEM_BYTES)
    """Wire bytes per element (``crew.plan.wiresize``): 4 for float32, about 2 for fp16 and 1
    for int8 payloads. The planners count 4; the coordinator plans compressed runs on rates
    scaled by 4 / elem_bytes and stamps the codec's figure here, so ``link_bytes`` (the
    bytes the coordinator records and reserves) are what the links carry."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "scheme", Scheme(self.scheme))

    @property
    def elems(self) -> list[int]:
        """Elements whose sum each worker computes (roots of routes): the 'block sizes'."""
        out = [0] * self.n
        for r in self.routes:
            out[r.root] += r.elems
        return out

    def participants(self) -> set[int]:
        nodes: set[int] = set(self.members)
        for r in self.routes:
            nodes |= r.nodes()
        return nodes

    def uses(self, src: int, dst: int) -> bool:
        return any((src, dst) in r.up or (src, dst) in r.down for r in self.routes)

    def phase_of(self, src: int, dst: int) -> str:
        """Which phase link src->dst serves in this plan: scatter, broadcast or both."""
        up = any((src, dst) in r.up for r in self.routes)
        down = any((src, dst) in r.down for r in self.routes)
        return "scatter and broadcast" if up and down else "scatter" if up else "broadcast"

    def link_bytes(self) -> np.ndarray:
        return link_load(self.routes, self.n, self.elem_bytes)

    def to_json(self) -> str:
        return json.dumps(
            {
                "scheme": self.scheme,
                "members": list(self.members),
                "elems": self.elems,
                "pipelined": self.pipelined,
                "predicted_s": self.predicted_s,
                "elem_bytes": self.elem_bytes,
                "routes": [r.to_list() for r in self.routes],
            }
        )


def _star(
    scheme: Scheme,
    plan: Plan,
    members: tuple[int, ...],
    pipelined: bool,
    n: int,
    total: int,
) -> GroupPlan:
    segments = [(s.worker, s.start, s.stop) for s in plan.segments]
    return GroupPlan(
        scheme,
        members,
        tuple(star_routes(segments, members)),
        pipelined,
        plan.predicted_s,
        n,
        total,
    )


def plan_group_nonblocking(
    scheme: Scheme,
    bw: np.ndarray,
    members: Sequence[int],
    size: int,
    sent: np.ndarray,
    a2a: Plan,
    active: Sequence[int] | None = None,
) -> GroupPlan:
    """CREW's non-blocking re-solve (``stars.solve_p2a_nonblocking``) as star routes."""
    members = tuple(members)
    plan = solve_p2a_nonblocking(bw, members, size, sent, active=active, a2a=a2a)
    return _star(scheme, plan, members, scheme == Scheme.CREW, bw.shape[0], size // ELEM_BYTES)


STAR_TIE = 1e-6
"""Relative margin within which ``crew`` takes the one-star-per-aggregator plan over an
equally fast mix of routes (see ``star_on_tie``)."""


def star_bound(
    bw: np.ndarray,
    members: Sequence[int],
    size: int,
    active: Sequence[int] | None = None,
    shared: Sequence[SharedLink] | None = None,
    delay_s: np.ndarray | None = None,
    part_bytes: int = 0,
) -> float:
    """A lower bound on the time of any star plan (one star per aggregator, any split) under
    the route LP's cost model (``routelp.route_time``), from the members' link rates alone.

    Cost model: a star at aggregator v carries v's block S_v over every link m -> v and v -> m
    of the other members m (plus, at a member aggregator, the other members' blocks), so
    T_bw >= S_v / min(a_v, b_v), with a_v, b_v the slowest link into v from the group and out
    of v to it. Summing S_v <= T_bw * min(a_v, b_v) over the usable aggregators (active,
    reaching every member both ways: the only ones a star split gives elements) with
    sum S_v = M gives T_bw >= M / sum_v min(a_v, b_v); shared capacities only add load. The
    latency term is the slowest used star's, at least the least of the usable stars'. Costs
    two (n x p) minima, against the star split's LP it lets ``star_on_tie`` skip. The small
    margin keeps float error on the bound's side."""
    w = inputs.check_bw(bw)
    n = w.shape[0]
    ms = list(members)
    if len(ms) < 2:
        return 0.0
    act = inputs.check_active(active, n, tuple(ms))
    into, out_of = group_rates(w, ms)  # inf where v is the only member (diagonal)
    usable = act & (into > 0) & (out_of > 0)
    if not usable.any():
        return math.inf  # no star reaches every member
    rate = np.minimum(into, out_of)[usable]
    moved = (size // ELEM_BYTES) * ELEM_BYTES
    t_bw = moved / (float(rate.sum()) * BYTES_PER_S_PER_MBIT)
    sh = inputs.check_shared(shared, n)
    hop = hop_latency(w, inputs.check_delays(delay_s, n, sh), part_bytes)
    lat = 0.0
    if hop is not None:
        mask = np.zeros(n, dtype=bool)
        mask[ms] = True
        up = np.where(mask[:, None], hop, -np.inf)  # up[m, v]: member m -> aggregator v
        down = np.where(mask[None, :], hop, -np.inf)  # down[v, m]: aggregator v -> member m
        np.fill_diagonal(up, -np.inf)  # a member aggregator has no link to itself
        np.fill_diagonal(down, -np.inf)
        lat = float((up.max(axis=0) + down.max(axis=1))[usable].min())
    return (t_bw + lat) * (1.0 - 1e-9)


def star_on_tie(
    bw: np.ndarray,
    members: tuple[int, ...],
    size: int,
    active: Sequence[int] | None,
    shared: Sequence[SharedLink] | None,
    delay_s: np.ndarray | None,
    part_bytes: int,
    route_lp_s: float,
) -> tuple[tuple[Route, ...], float] | None:
    """The star plan (crew-star's split) when the route LP cannot beat it, else None.

    Why: the fluid model charges a route only for its bytes, so when links are uniform many
    mixes of stars, relays and trees tie (on 4 uniform clouds with p = n every route crosses at
    least half the links). The executor is not indifferent: a relay or tree node forwards a
    part only once it has all of it, so every extra hop adds a part's time and more parts in
    flight (docs/decisions/2026-12-01-ties-go-to-stars.md). A star has the fewest hops a
    partial reduce can have, so ties go to it. The star is priced by the same cost model
    (``routelp.route_time``), so ``crew`` stays no worse than the route LP by more than
    ``STAR_TIE``."""
    if route_lp_s * (1 + STAR_TIE) < star_bound(
        bw, members, size, active, shared, delay_s, part_bytes
    ):
        return None  # no star can tie: skip the star split (an LP over every aggregator)
    try:
        plan = solve_pipelined(bw, members, size, active=active)
    except PlanError:
        return None  # no star reaches every member: only relays or trees do
    routes = tuple(star_routes([(g.worker, g.start, g.stop) for g in plan.segments], members))
    star_s = route_time(routes, bw, shared, delay_s, part_bytes)
    if star_s <= route_lp_s * (1 + STAR_TIE):
        return routes, star_s
    return None


CREW_PLANS_BUDGET_BYTES = 4 << 20
"""Bytes of ``crew`` plans (with their canonical keys) a planner keeps at most."""
STAR_TIES_BUDGET_BYTES = 2 << 20
"""Bytes of star tie checks (exact keys: rates and delays included) a planner keeps at most."""


class GroupPlanner:
    """:func:`plan_group` with caches that last as long as this object. Thread-safe: the
    coordinator may plan ahead on a second thread (``crew.runtime.planahead``).

    What it keeps: the route LP's results and warm columns (``route_cache``), ``crew``'s plans
    by their inputs up to renaming the workers (``crew_plans``, ``crew.plan.symmetry``: a group
    isomorphic to one planned before gets that plan, renamed, without a route LP), and the star
    tie checks by exact inputs (``star_ties``). Warm columns make later plans faster and can
    change a plan where the route LP's result depends on where its search starts (a latency
    term, a capped search: :mod:`crew.plan.routelp.cache`). ``settings`` bound every route LP
    it solves. Every cache is bounded by count and by bytes (``CREW_PLANS_BUDGET_BYTES``,
    ``STAR_TIES_BUDGET_BYTES`` and the route LP's own), about 18 MiB in all."""

    def __init__(self, settings: RouteLPSettings = DEFAULT_SETTINGS) -> None:
        if not isinstance(settings, RouteLPSettings):
            raise PlanError("settings", f"must be RouteLPSettings, got {settings!r}")
        self._settings = settings
        self.route_cache = RouteLPCache()
        self.crew_plans = Memo(512, CREW_PLANS_BUDGET_BYTES)
        self.star_ties = Memo(256, STAR_TIES_BUDGET_BYTES)

    @property
    def settings(self) -> RouteLPSettings:
        return self._settings

    def clear(self) -> None:
        """Forget every cached plan and warm column."""
        self.route_cache.clear()
        self.crew_plans.clear()
        self.star_ties.clear()

    def _crew_routes(
        self,
        bw: np.ndarray,
        members: tuple[int, ...],
        size: int,
        active: Sequence[int] | None,
        shared: Sequence[SharedLink] | None,
        delay_s: np.ndarray | None,
        part_bytes: int,
    ) -> tuple[tuple[Route, ...], float]:
        """``crew``'s routes and predicted time: the route LP's, or the star plan on a tie."""
        rp = plan_routes(
            bw, members, size, active, shared=shared, delay_s=delay_s, part_bytes=part_bytes,
            settings=self._settings, cache=self.route_cache,
        )  # fmt: skip
        args = (bw, members, size, active, shared, delay_s, part_bytes, rp.predicted_s)
        star = self.star_ties.get(key_part(args), lambda: star_on_tie(*args))
        if star is not None:
            return star
        return rp.routes, rp.predicted_s

    def __call__(
        self,
        scheme: Scheme,
        bw: np.ndarray,
        members: Sequence[int],
        size: int,
        active: Sequence[int] | None = None,
        *,
        seed: int = 0,
        shared: Sequence[SharedLink] | None = None,
        delay_s: np.ndarray | None = None,
        part_bytes: int = 0,
    ) -> GroupPlan:
        """Plan one group of ``members`` moving ``size`` bytes on capacity matrix ``bw``.

        ``shared`` (capacities shared by several pairs), ``delay_s`` (one-way delays, seconds)
        and ``part_bytes`` (per-hop serialisation of a part) reach ``crew``'s route LP and the
        cost of ``crew-relay``'s routes; the other schemes keep their own cost models, which
        ignore them."""
        members = tuple(members)
        n = bw.shape[0]
        total = size // ELEM_BYTES
        if scheme == Scheme.CREW:
            order = symmetry.canonical_order(bw, members, active, delay_s)
            key = (
                symmetry.canonical_key(
                    order, bw, members, active, shared, delay_s, size, part_bytes
                ),
                self._settings,  # a plan made under tighter bounds is not the unbounded one
            )

            def canonical() -> tuple[tuple[Route, ...], float]:
                routes, predicted = self._crew_routes(
                    bw, members, size, active, shared, delay_s, part_bytes
                )
                return symmetry.rename_routes(routes, symmetry.to_canonical(order)), predicted

            routes, predicted = self.crew_plans.get(key, canonical)
            return GroupPlan(
                scheme, members, symmetry.rename_routes(routes, order), True, predicted, n, total
            )
        return _plan_other(
            scheme, bw, members, size, active, seed, shared, delay_s, part_bytes, n, total
        )


def _plan_other(
    scheme: Scheme,
    bw: np.ndarray,
    members: tuple[int, ...],
    size: int,
    active: Sequence[int] | None,
    seed: int,
    shared: Sequence[SharedLink] | None,
    delay_s: np.ndarray | None,
    part_bytes: int,
    n: int,
    total: int,
) -> GroupPlan:
    """Every scheme but ``crew``: none of them keeps anything between calls."""
    if scheme in STAR_SCHEMES:
        if scheme == Scheme.CREW_STAR:
            plan = solve_pipelined(bw, members, size, active=active)
            pipelined = True
        elif scheme == Scheme.CREW_RELAY:
            live = np.array(bw, dtype=float)  # relays only through active workers
            if active is not None:
                off = np.setdiff1d(np.arange(n), np.asarray(list(active), dtype=int))
                live[off, :] = 0.0
                live[:, off] = 0.0
            better, relay = two_hop(live)
            plan = solve_pipelined(better, members, size, active=active)
            segments = [(s.worker, s.start, s.stop) for s in plan.segments]
            routes = tuple(relayed_star_routes(segments, members, relay))
            return GroupPlan(
                scheme,
                members,
                routes,
                True,
                route_time(routes, bw, shared, delay_s, part_bytes),
                n,
                total,
            )
        elif scheme == Scheme.CREW_PAPER:
            plan = solve_p2a(bw, members, size, active=active)
            pipelined = False
        else:
            plan = solve_p2p(bw, members, size)
            pipelined = False
        return _star(scheme, plan, members, pipelined, n, total)
    if scheme in ROUTE_SCHEMES:
        rp = plan_for(scheme, bw, members, size, active=active, seed=seed)
        return GroupPlan(scheme, members, tuple(rp.routes), rp.pipelined, rp.predicted_s, n, total)
    raise PlanError(
        "scheme", f"{scheme!r} is not planned per group; known: {', '.join(GROUP_SCHEMES)}"
    )


def plan_group(
    scheme: Scheme,
    bw: np.ndarray,
    members: Sequence[int],
    size: int,
    active: Sequence[int] | None = None,
    *,
    seed: int = 0,
    shared: Sequence[SharedLink] | None = None,
    delay_s: np.ndarray | None = None,
    part_bytes: int = 0,
) -> GroupPlan:
    """One group's plan, cold: :class:`GroupPlanner`'s, with a fresh planner and the default
    settings. A caller that plans many groups holds a :class:`GroupPlanner` instead, so that
    repeated and similar groups reuse earlier work."""
    return GroupPlanner()(
        scheme, bw, members, size, active,
        seed=seed, shared=shared, delay_s=delay_s, part_bytes=part_bytes,
    )  # fmt: skip
