"""The secret check of a clipped result (``aggregate clip``): the fixed point, on a vector
nobody knew while data moved.

Why. A clipped result is not the linear mean, so ``r . result = sum_m w_m r . v_m`` (the
public and the mean-mode secret check, ``crew.control.secretcheck``) does not hold. What holds
instead is CenteredClip's fixed point (``crew.control.clipping``): per part ``p`` of the plan,
``sum_m w_m c_mp (v_mp - x_p) = 0`` with ``c_mp = min(1, tau_p / ||v_mp - x_p||)`` and
``tau_p = rho ||x_p||``, all of which member ``m`` can compute from its own offered vector and
the result it received.

How. On ``Reveal`` each member draws ``r_g`` exactly as the mean-mode check does
(``crew.control.verify.check_chunks``) and answers, besides ``r_g . v_m`` and ``r_g . x``
(:func:`clip_proof`, one pass over both vectors):

* ``s_m = sum_p c_mp r_g[p] . (v_mp - x_p)``, its clipped residual on ``r_g``;
* ``a_m = sqrt(sum_p (c_mp ||v_mp - x_p||)^2)``, the residual's scale: ``s_m`` is normal with
  standard deviation ``a_m``, and ``a_m <= rho ||x||`` since no part counts beyond its radius;
* ``b = ||x||``, the same for every member holding the same result.

The coordinator (:func:`judge_clip`) passes the group when the members agree on ``b`` and on
``r_g . x`` (one result), no member claims more than a clipped vector can (``a_m <= rho b``,
``|s_m| <= Z a_m``), and ``|sum_m w_m s_m| <= T = CLIP_TOLERANCE sum_m w_m a_m + ROUNDING b``.
``sum_m w_m s_m = r_g . R`` with ``R`` the fixed point's residual over all parts, normal with
standard deviation ``||R||``; the iteration stops each part at ``||R_p|| <= STEP_TOLERANCE
sum_m w_m c_mp ||v_mp - x_p||``, so ``||R|| <= STEP_TOLERANCE sum_m w_m a_m``, 100 times below
``T``, and the float32 rounding of ``x`` adds at most ``2^-24 ||x||`` (``ROUNDING``).

How large a tamper can hide. A root that broadcasts ``x + delta`` instead of ``x`` leaves a
residual of about ``-(sum_m w_m c_m) delta`` (just ``-delta`` when nobody is clipped), and
``r_g`` is independent of it, so as in the mean-mode check ``P(pass) <= 0.8 T / ||delta||``.
``T`` scales with the members' spread, not the model: with honest members 1% of ``||x||``
apart ``T`` is about ``1e-5 ||x||``, and a tamper must stay under about ``1.5e-5 ||x||`` for
even odds, a hundred times below the mean-mode check's reach; a member clipped in every part
adds ``w_m rho ||x||`` to ``sum_m w_m a_m`` (``T`` 2.5e-5 ``||x||`` more for one of four at
``rho = 0.1``). A root that is also a member can lie in its own proof, but ``|s_a| <= Z
a_a <= Z rho b`` caps what it can cancel: its tamper stays within about ``Z w_a tau`` in
projection, the same order as what it could do by poisoning its own vector.

Cost. Per member: one pass over the offered vector and the result for the norms, and one for
the projections with ``r_g`` drawn in chunks (about twice the mean-mode proof); nothing
model-sized is allocated. At the coordinator: ``O(members)`` per group.

Pure: numpy only, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from crew.control.assignment import part_starts, route_part_sizes, validate_assign
from crew.control.clipping import clip_factors
from crew.control.verify import check_chunks
from crew.wire.protocol import Assign, Proof

__all__ = [
    "AGREE",
    "CLIP_TOLERANCE",
    "ClipProof",
    "ROUNDING",
    "Z",
    "clip_parts",
    "clip_proof",
    "judge_clip",
]

CLIP_TOLERANCE = 1e-3
"""Relative to the clipped spread ``sum_m w_m a_m``: 100 times the iteration's stop rule."""

Z = 6.0
"""Standard deviations of a normal projection an honest member may reach (2e-9 two-sided)."""

ROUNDING = Z * 8 * 2.0**-24
"""Relative to ``b = ||x||``: ``x``'s float32 rounding (at most ``2^-24 |x_i|`` per element)
moves the residual's projection by a normal of standard deviation at most ``2^-24 ||x||``, with
margin for the clip factors recomputed from the rounded ``x``."""

AGREE = 1e-9
"""Relative to ``b``: members holding one result compute ``b`` and ``r_g . x`` in the same
order from the same float32 values, so they agree to the last bit; this allows for nothing
more than a different numpy build."""


def clip_parts(assign: Assign, n: int) -> list[tuple[int, int]]:
    """The parts the roots clipped, ``(start, stop)`` in order: every route cut as the engine
    cuts it (``crew.control.assignment.route_part_sizes``)."""
    routes = validate_assign(assign, n)
    parts = [
        (s, min(s + step, r.stop))
        for r, step in zip(routes, route_part_sizes(assign, routes), strict=True)
        for s in part_starts(r, step)
    ]
    return sorted(parts)


@dataclass(frozen=True)
class ClipProof:
    """One member's answer to a Reveal in clip mode (the module docstring's numbers)."""

    offered_proj: float  # r_g . v_m
    result_proj: float  # r_g . x
    residual: float  # s_m
    scale: float  # a_m
    norm: float  # b


def clip_proof(
    run_num: int,
    nonce: int,
    offered: np.ndarray,
    result: np.ndarray,
    parts: Sequence[tuple[int, int]],
    rho: float,
) -> ClipProof:
    """This member's :class:`ClipProof` of ``result`` under ``parts`` (:func:`clip_parts`)."""
    if offered.shape != result.shape or offered.ndim != 1:
        raise ValueError(f"offered {offered.shape} and result {result.shape} differ")
    factors = []
    scale = norm = 0.0  # squared until the end
    for start, stop in parts:
        x = result[start:stop].astype(np.float64)
        dist = float(np.linalg.norm(offered[start:stop] - x))
        x_norm = float(np.linalg.norm(x))
        c = float(clip_factors(np.array([dist]), rho * x_norm)[0])
        factors.append(c)
        scale += (c * dist) ** 2
        norm += x_norm**2
    pa = pb = residual = 0.0
    k = 0
    for start, r in check_chunks(run_num, nonce, offered.size):
        stop = start + r.size
        v = offered[start:stop].astype(np.float64)
        x = result[start:stop].astype(np.float64)
        pa += float(np.dot(r, v))
        pb += float(np.dot(r, x))
        v -= x
        while k < len(parts) and parts[k][1] <= start:
            k += 1
        j = k
        while j < len(parts) and parts[j][0] < stop:  # the parts this chunk overlaps
            lo, hi = max(parts[j][0], start) - start, min(parts[j][1], stop) - start
            residual += factors[j] * float(np.dot(r[lo:hi], v[lo:hi]))
            j += 1
    return ClipProof(pa, pb, residual, math.sqrt(scale), math.sqrt(norm))


def judge_clip(weights: Sequence[float], proofs: Sequence[Proof], rho: float) -> tuple[float, str]:
    """``(ratio, reason)`` of a group's clip-mode proofs (in the order of ``weights``): the
    group passes when ``ratio <= 1`` (NaN and infinity fail); ``reason`` says why not."""
    total = math.fsum(weights)
    w = [x / total for x in weights]
    b = proofs[0].clip_norm
    agree = AGREE * b + 1e-30
    x_proj = proofs[0].result_proj
    for p in proofs:
        if not (abs(p.clip_norm - b) <= agree and abs(p.result_proj - x_proj) <= agree):
            return math.inf, (
                f"secret check failed: members {proofs[0].worker} and {p.worker} hold"
                " different results (a root sent members different data)"
            )
        bound = Z * p.clip_scale + ROUNDING * b
        if not (p.clip_scale <= rho * b * (1 + AGREE) + 1e-30 and abs(p.clip_residual) <= bound):
            return math.inf, (
                f"secret check failed: member {p.worker}'s proof claims more than a clipped"
                f" vector can (scale {p.clip_scale:.3g}, residual {p.clip_residual:.3g})"
            )
    residual = math.fsum(x * p.clip_residual for x, p in zip(w, proofs, strict=True))
    tol = CLIP_TOLERANCE * math.fsum(x * p.clip_scale for x, p in zip(w, proofs, strict=True))
    tol += ROUNDING * b + 1e-30
    ratio = abs(residual) / tol
    if ratio <= 1.0:
        return ratio, ""
    return ratio, (
        f"secret check failed: clipped residual {residual:.3g} is {ratio:.3g}x the tolerance"
        f" {tol:.3g} (a root changed the clipped result)"
    )
