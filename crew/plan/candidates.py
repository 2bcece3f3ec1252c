"""Planning a group over a candidate set of workers: its members and the k best-connected others.

A relay pays off only where its links to *and* from the members are fast, so most workers cannot
help a given group much, yet every one the planner may route through costs something: the route
LP grows with every worker a tree may pass through (at n = 256 one plan over the whole network
takes seconds), and in a running lab every helper a plan uses gets the group's control messages
and relays its parts (at 32 clouds on two cores, that work saturates the host). So the planner
(``crew.plan.schemes.plan_group``, unchanged) may be given a smaller network: the group's
members plus the ``k`` active non-members best connected to them, scored by

    score(x) = sum over members m of min(bw[m, x], bw[x, m])

(the rate a two-way relay through x could give each member; ties go to the lower index), with
rates, delays and the member and active sets restricted to those workers. Its plan is mapped
back to the workers' own indices. A plan made this way is a valid plan on the full network (it
only uses links among candidates, at their full capacity), but it may be slower than the one
the planner would find with every worker. By default (``--helpers`` left out, in the lab and
the simulator) groups are planned this way above ``CANDIDATES_FROM_N`` workers, over
``DEFAULT_HELPERS`` others; ``RunConfig.helpers`` (``--helpers K``) sets it.

Cost: O(n x p) for the scores, then the planner on p + k workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from crew.plan.routes import Route
from crew.plan.schemes import GroupPlan

__all__ = [
    "CANDIDATES_FROM_N",
    "DEFAULT_HELPERS",
    "CandidateError",
    "candidates",
    "default_helpers",
    "helpers_for",
    "plan_on_candidates",
    "planner_over",
]

CANDIDATES_FROM_N = 64
"""Above this many workers groups are planned over candidates by default (``--helpers``)."""
DEFAULT_HELPERS = 16
"""Non-member candidates per group by default: p + 16 workers keeps a plan near n = 20's time."""


class CandidateError(ValueError):
    """The candidate set cannot be formed; the message says why."""


def default_helpers(n: int) -> int | None:
    """The helper count for n workers when none is given (None: plan over every worker)."""
    return DEFAULT_HELPERS if n > CANDIDATES_FROM_N else None


def helpers_for(given: int | None, n: int) -> int | None:
    """``--helpers`` as the planner takes it: None (left out) is :func:`default_helpers`, a
    negative count is every worker (None), K >= 0 is K."""
    if given is None:
        return default_helpers(n)
    return None if given < 0 else int(given)


def candidates(
    bw: np.ndarray, members: Sequence[int], active: Sequence[int] | None, k: int
) -> tuple[int, ...]:
    """The members and the ``k`` best-connected active non-members, sorted by index."""
    if k < 0:
        raise CandidateError(f"helpers must be >= 0, got {k}")
    w = np.asarray(bw, dtype=float)
    n = w.shape[0]
    ms = sorted(set(int(m) for m in members))
    pool = set(range(n) if active is None else (int(a) for a in active)) - set(ms)
    if not pool or k == 0:
        return tuple(ms)
    others = np.array(sorted(pool), dtype=int)
    finite = np.where(np.isfinite(w), w, 0.0)
    score = np.minimum(finite[ms][:, others], finite[others][:, ms].T).sum(axis=0)
    best = others[np.lexsort((others, -score))[:k]]  # highest score, then lowest index
    return tuple(sorted(ms + best.tolist()))


def _map_route(r: Route, idx: Sequence[int]) -> Route:
    return Route(
        r.start,
        r.stop,
        idx[r.root],
        tuple((idx[a], idx[b]) for a, b in r.up),
        tuple((idx[a], idx[b]) for a, b in r.down),
    )


def plan_on_candidates(
    plan_fn: Callable[..., GroupPlan],
    k: int,
    scheme: str,
    bw: np.ndarray,
    members: Sequence[int],
    size: int,
    *,
    active: Sequence[int] | None = None,
    **kw: Any,
) -> GroupPlan:
    """``plan_fn`` (``plan_group``'s signature) on the candidate sub-network, mapped back."""
    if kw.get("shared"):
        raise CandidateError("shared capacities (cloud uplinks) span workers: plan over all")
    w = np.asarray(bw, dtype=float)
    n = w.shape[0]
    cand = candidates(w, members, active, k)
    if len(cand) == n:
        return plan_fn(scheme, w, members, size, active=active, **kw)
    pos = {x: i for i, x in enumerate(cand)}
    sub = w[np.ix_(cand, cand)]
    if kw.get("delay_s") is not None:
        kw = kw | {"delay_s": np.asarray(kw["delay_s"], dtype=float)[np.ix_(cand, cand)]}
    act = None if active is None else [pos[a] for a in active if a in pos]
    plan = plan_fn(scheme, sub, [pos[m] for m in members], size, active=act, **kw)
    return GroupPlan(
        scheme=plan.scheme,
        members=tuple(cand[m] for m in plan.members),
        routes=tuple(_map_route(r, cand) for r in plan.routes),
        pipelined=plan.pipelined,
        predicted_s=plan.predicted_s,
        n=n,
        total=plan.total,
    )


def planner_over(plan_fn: Callable[..., GroupPlan], helpers: int) -> Callable[..., GroupPlan]:
    """``plan_fn`` itself for ``helpers`` -1 (every worker), else ``plan_fn`` on each group's
    members and its ``helpers`` best-connected others (:func:`plan_on_candidates`)."""
    if helpers < 0:
        return plan_fn
    return partial(plan_on_candidates, plan_fn, helpers)
