"""Clipped aggregation's radius, learned from the honest members' spread (``--clip-factor``).

Why. CenteredClip (``crew.control.clipping``) lets a member that poisons its own vector move
each part of a group's result by ``w tau / (1 - w)`` at most. With a radius fixed relative to
the result, ``tau = rho ||x||``, that bound is per group, and it compounds: a member offering
``100 v`` pulls every group it joins along the model itself, so the models' norm grows by up to
``w rho / (1 - w)`` (5% in a group of three at ``rho = 0.1``) a group, and training diverges
(docs/results.md, "Clipped aggregation"). Honest members training together differ from their
group's result by a small fraction of its norm (a few tenths of a percent for the lab's MLP).
A radius a few times that spread still leaves them unclipped, while a poisoner's pull per group
falls to the order of one honest step's noise, which training corrects like any other noise.
This is the radius CenteredClip's analysis asks for: of the order of the honest members' spread.

What. Every member's proof carries ``r_g . v_m``, its offered vector on the group's secret
check vector (``crew.control.clipcheck``; ``r_g`` standard normal, drawn after the data moved),
so ``r_g . (v_a - v_b)`` is normal with standard deviation ``||v_a - v_b||``. For each group
that passed its check the coordinator keeps the *lower median absolute deviation* of those
projections, ``lower_median_m |r_g . v_m - median_k r_g . v_k|``, divided by ``b = ||x||``: a
one-number estimate of how far apart the members' vectors are. A group's radius is ``factor``
times the median of the last ``WINDOW`` groups' estimates, clamped to ``[FLOOR, ceiling]``
(``ceiling`` is ``--clip-radius``, also the radius until ``MIN_GROUPS`` groups are known). It is
fixed when a group is first assigned and carried in its ``Assign`` (``clip_rho``), so the roots
that clip, the members that prove and the coordinator that judges all use one number, and later
revisions of the group (which keep parts already clipped) use it too.

The estimate reads the offered vectors, not their distances from the clipped result: a
poisoner's pull moves the result by up to ``w tau / (1 - w)`` and would make the honest members
look further apart the larger the radius, a feedback that, at any useful ``factor``, drives the
radius up to the ceiling in groups that hold a poisoner.

Faults. Nothing checks ``r_g . v_m`` in clip mode, so a member may report any number. In a
group with an honest majority the median projection lies between two honest ones, and the lower
median of the deviations is at most the largest honest member's deviation from it: a liar can
make the group look tighter (lowering the radius, which clips honest members too, never below
``FLOOR``) but not looser. A group of two has no honest majority: the lower median is the
smaller of two equal deviations, half the claimed gap, which a liar sets. The window's median
ignores any minority of such groups.

Cost. ``O(members log members)`` per judged group, and a median of ``WINDOW`` numbers per
assigned group.

Pure: no I/O, no time.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence

__all__ = [
    "DEFAULT_FACTOR",
    "FLOOR",
    "MIN_GROUPS",
    "WINDOW",
    "ClipRadius",
    "lower_median",
    "projection_spread",
]

DEFAULT_FACTOR = 4.0
"""Times the honest spread. The lab's MLP (``lab.studies.trainsim``, 8 workers in groups of
three) spreads 0.15-0.22% of a part's norm at the median and about 0.9% at the 99th
percentile, so four times the median clips an honest part now and then, and a ``x100``
poisoner's pull per group is about two honest spreads."""

WINDOW = 32
"""Groups whose spread the radius follows: training's spread shrinks as it converges, and a
window this short follows it within a few rounds of the workers."""

MIN_GROUPS = 4
"""Groups to know before the radius leaves the ceiling."""

FLOOR = 1e-6
"""The smallest radius, relative to the result's norm: far below any training's spread, and
far above float32's resolution (``2^-24``), which the check allows for."""


def lower_median(values: Sequence[float]) -> float:
    """The ``(k - 1) // 2``-th smallest of ``k`` values: the median for odd ``k``, the lower of
    the middle two for even ``k`` (module doc: a minority cannot raise it)."""
    if not values:
        raise ValueError("lower_median of no values")
    return sorted(values)[(len(values) - 1) // 2]


def projection_spread(projs: Sequence[float]) -> float:
    """The lower median absolute deviation of ``projs`` from their median (module doc)."""
    centre = statistics.median(projs)
    return lower_median([abs(x - centre) for x in projs])


class ClipRadius:
    """The radius of each clipped group, learned from the proofs of the groups before it."""

    def __init__(
        self,
        ceiling: float,
        factor: float = DEFAULT_FACTOR,
        *,
        window: int = WINDOW,
        min_groups: int = MIN_GROUPS,
    ):
        if not (math.isfinite(ceiling) and ceiling > 0):
            raise ValueError(f"ceiling: a finite number > 0, got {ceiling!r}")
        if not (math.isfinite(factor) and factor >= 0):
            raise ValueError(f"factor: a finite number >= 0, got {factor!r}")
        if window < 1 or not 1 <= min_groups <= window:
            raise ValueError(
                f"window {window} and min_groups {min_groups}: want 1 <= min <= window"
            )
        self.ceiling = ceiling
        self.factor = factor  # 0: the radius stays at the ceiling
        self.min_groups = min_groups
        self._spreads: deque[float] = deque(maxlen=window)
        self._groups: dict[int, float] = {}  # group -> its radius, while it is open

    def current(self) -> float:
        """The radius a group assigned now gets."""
        if self.factor == 0 or len(self._spreads) < self.min_groups:
            return self.ceiling
        learned = self.factor * statistics.median(self._spreads)
        return min(self.ceiling, max(FLOOR, learned))

    def for_group(self, group: int) -> float:
        """``group``'s radius: :meth:`current` when first asked, the same until :meth:`end`."""
        rho = self._groups.get(group)
        if rho is None:
            rho = self._groups[group] = self.current()
        return rho

    def end(self, group: int) -> None:
        """The group closed: forget its radius."""
        self._groups.pop(group, None)

    def observe(self, offered_projs: Sequence[float], norm: float) -> None:
        """A group passed its check: its members' ``r_g . v_m`` and the result's norm ``b``
        (module doc). Groups of one member, or with a zero or non-finite norm, teach nothing."""
        if len(offered_projs) < 2 or not (math.isfinite(norm) and norm > 0):
            return
        spread = projection_spread(offered_projs) / norm
        if math.isfinite(spread):
            self._spreads.append(spread)

    def open_groups(self) -> int:
        """Groups whose radius is held (bounded by the groups open at once)."""
        return len(self._groups)
