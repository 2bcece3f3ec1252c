"""Clipped aggregation: a group's result that no single member can drag far (``aggregate clip``).

Why. The linear mean of a group includes every member's vector at its weight: one member that
offers ``100 v`` moves the result by ``100 w v``, and no result check can tell, since the member
offered exactly that. CenteredClip (Karimireddy, He and Jaggi, "Learning from History for
Byzantine Robust Optimization", 2021; run per partition by BTARD, Gorbunov et al., 2022)
bounds that influence: each member's difference from the result counts only up to a radius.

What. Per part of a route (the root of a star holds every member's copy of it), starting from
the coordinate-wise median ``x``::

    x <- x + sum_m w_m clip(v_m - x, tau),   clip(d, tau) = d min(1, tau / ||d||)

in float64 until the step is below ``STEP_TOLERANCE`` of the clipped spread
``sum_m w_m c_m ||v_m - x||`` (or ``ITERATIONS`` passed), returned in float32. The weights are
the group's (normalised to sum to 1). The radius is relative, ``tau = rho ||x||`` of the
current iterate, so nobody needs to know the model's scale, and every member can recompute it
from the result part it receives and the group's ``rho`` (``Assign.clip_rho``). At the fixed
point ``sum_m w_m c_m (v_m - x) = 0`` with ``c_m = min(1, tau / ||v_m - x||)``: members
within ``tau`` of ``x`` count fully, and one further away pulls by ``w_m tau`` at most,
whatever it offered, so it moves ``x`` by ``w_m tau / (1 - w_m)`` from the others' weighted
mean while they stay within ``tau``. When every member is within the radius of the weighted
mean, that mean is the fixed point and is returned at once, without the median.

Faults. Crash faults cost nothing more here (a revision without the dead member re-plans as
before). A Byzantine member that poisons its own vector, however far, moves each part's result
by ``w_m tau / (1 - w_m)`` at most (bounded, not zero: in a group of three at the default
radius, ``w rho ||x|| / (1 - w) = 0.05 ||x||``); colluding members by about the sum of
theirs while their weight stays well below a half. The bound holds per group, not per run: a
member that pulls every group it joins the same way moves the models round after round. At a
fixed ``rho`` a pull along ``x`` itself (offering ``100 v``) grows the models' norm by up to
``w rho / (1 - w)`` a group, which compounds; so the coordinator learns each group's ``rho``
from how far apart the members' vectors are (``crew.control.clipradius``), which brings the
pull down to the order of the honest members' own spread. A root that tampers with the result
is caught by the secret check (``crew.control.clipcheck``).

Cost. Per part of ``L`` elements and ``p`` members: the weighted mean and the distances to
it (about four passes over the ``p L`` float64 copies), which ends an honest group's part;
otherwise, when someone is ``FAR`` radii away, the median (a sort of ``p`` values per element),
then per iteration about six passes (difference, norms, weighted sum), each clipped member
slowing the contraction (factor about ``1 - sum_m w_m c_m``). Measured on the lab's host for
``L = 64 Ki`` and three members: 4.3 ms when nobody is clipped, 12 ms with one honest member
just outside the radius, 17 ms with one offering ``100 v`` (31 ms for one of five). Memory:
the ``p`` copies of the part, in float64, at the root only.

Pure: numpy only, no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from crew.control.assignment import ReduceError
from crew.plan.routes import Route
from crew.wire.protocol import Assign

__all__ = [
    "Aggregate",
    "ClipRule",
    "DEFAULT_RHO",
    "FAR",
    "ITERATIONS",
    "STEP_TOLERANCE",
    "centered_clip",
    "clip_factors",
    "star_violation",
]

DEFAULT_RHO = 0.1
"""The largest radius relative to ``||x||`` of a part (``--clip-radius``), and the radius until
the coordinator has learned the members' spread (``crew.control.clipradius``). Honest members
training the lab's MLP (8 workers, groups of 3 every step) differ from their group's mean by
0.13% of its norm per part at the median and 1.6% at most (``lab.studies.trainsim``,
docs/results.md): 0.1, six times that, never clips them, so the first groups of a run are their
weighted means whatever the spread turns out to be."""

FAR = 4.0
"""Start from the coordinate-wise median only when a member is this many radii from the
weighted mean: members just outside the radius (honest ones, with a learned radius,
``crew.control.clipradius``) barely move the fixed point from the mean, which is then the
nearer start, and the median's sort is the costliest step."""

ITERATIONS = 100
"""At most this many CenteredClip steps per part (two when nobody is clipped)."""

STEP_TOLERANCE = 1e-5
"""Stop once the step is this small against the clipped spread: the check's tolerance
(``clipcheck.CLIP_TOLERANCE``) is 100 times larger, so an honest result always passes."""


class Aggregate(enum.StrEnum):
    """How a group's root combines its members' copies (``RunConfig.aggregate``)."""

    MEAN = "mean"  # the weighted sum of weighted copies: the linear mean
    CLIP = "clip"  # CenteredClip of the unweighted copies (this module)


def clip_factors(dist: np.ndarray, tau: float) -> np.ndarray:
    """``c = min(1, tau / dist)``, 1 where ``dist`` is 0 (nothing to clip)."""
    dist = np.asarray(dist, dtype=np.float64)
    c = np.ones_like(dist)
    far = dist > tau
    c[far] = tau / dist[far]
    return c


def centered_clip(
    copies: np.ndarray,
    weights: Sequence[float] | np.ndarray,
    rho: float,
    iters: int = ITERATIONS,
    tol: float = STEP_TOLERANCE,
) -> tuple[np.ndarray, np.ndarray]:
    """``(x, c)``: CenteredClip of ``copies`` (``(p, L)``) under ``weights`` with radius ``rho
    ||x||`` (module doc); ``x`` in float32, ``c`` the members' clip factors at ``x``."""
    v = np.asarray(copies, dtype=np.float64)
    if v.ndim != 2 or v.shape[0] < 1:
        raise ValueError(f"copies: want (members, elements), got {v.shape}")
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (v.shape[0],) or not np.all(w >= 0) or not w.sum() > 0:
        raise ValueError(f"weights: want {v.shape[0]} non-negative ones, got {w}")
    w = w / w.sum()
    x = w @ v
    dist = np.linalg.norm(v - x, axis=1)
    tau = rho * float(np.linalg.norm(x))
    if np.all(dist <= tau):
        # Everyone within the radius of the weighted mean: it is the fixed point (every c_m
        # is 1 and sum_m w_m (v_m - x) = 0), so an honest group skips the median's sort.
        return _rounded(v, x, rho)
    if np.any(dist > FAR * tau):
        # Someone far away drags the mean with it: start where no minority can drag it.
        x = np.median(v, axis=0)
    for _ in range(iters):
        d = v - x
        dist = np.linalg.norm(d, axis=1)
        wc = w * clip_factors(dist, rho * float(np.linalg.norm(x)))
        step = wc @ d
        x += step
        # Below float32's resolution of x nothing more can be gained either.
        if float(np.linalg.norm(step)) <= max(
            tol * float(wc @ dist), 2**-26 * float(np.linalg.norm(x))
        ):
            break
    return _rounded(v, x, rho)


def _rounded(v: np.ndarray, x: np.ndarray, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """``x`` in float32 and the clip factors members compute from it."""
    out = x.astype(np.float32)
    tau = rho * float(np.linalg.norm(out.astype(np.float64)))
    return out, clip_factors(np.linalg.norm(v - out, axis=1), tau)


def star_violation(routes: Sequence[Route], members: Sequence[int]) -> str | None:
    """Why ``routes`` cannot be clipped, or None: every route's reduce tree must be a star of
    member leaves under its root, so the root holds each member's own copy, and no two routes
    may cover the same elements (a2a's), so that each part has one clipped result."""
    kept = set(members)
    ranges = sorted((r.start, r.stop) for r in routes)
    if any(a[1] > b[0] for a, b in zip(ranges, ranges[1:], strict=False)):
        return "routes cover the same elements more than once"
    for k, r in enumerate(routes):
        for child, parent in r.up:
            if parent != r.root or child not in kept:
                return f"route {k}: {child} -> {parent} is not a member's copy to the root"
    return None


@dataclass(frozen=True)
class ClipRule:
    """The reduce engine's side of clipped aggregation: which assignments it can run, and a
    complete part's result from its members' unweighted copies."""

    rho: float = DEFAULT_RHO  # the radius of an Assign that names none (``clip_rho`` 0)

    def validate(self, assign: Assign, routes: Sequence[Route]) -> None:
        """ReduceError unless every route is a star of member leaves (:func:`star_violation`)."""
        why = star_violation(routes, assign.members)
        if assign.prescatter:  # pre-scattered parts are weighted where they land
            why = "pre-scattered parts (non-blocking mode)"
        if why is not None:
            raise ReduceError(
                f"group {assign.group}: clipped aggregation needs stars of members: {why}"
            )

    def combine(self, assign: Assign, copies: Mapping[int, np.ndarray]) -> np.ndarray:
        """The part's result from ``copies`` (member -> its unweighted copy), at the group's
        radius (``Assign.clip_rho``; this rule's ``rho`` when the Assign names none)."""
        members = sorted(copies)
        weights = [assign.weights[assign.members.index(m)] for m in members]
        rho = self.radius(assign)
        return centered_clip(np.stack([copies[m] for m in members]), weights, rho)[0]

    def radius(self, assign: Assign) -> float:
        """The radius ``assign``'s group is clipped and proved at."""
        return assign.clip_rho or self.rho
