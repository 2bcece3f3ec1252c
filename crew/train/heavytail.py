"""A generated straggler profile with a heavy tail, for groups that size themselves.

The bundled profiles (Li et al., PPoPP 2020) are narrow: the slowest iteration is at most 4x
the median. Waiting for the p-th ready worker costs little there. Shared and preemptible
accelerators also show rare iterations many times the usual one; to study them the lab ships
one **generated** profile, not a measurement:

``heavy``: a Pareto distribution of shape ``ALPHA`` = 1.5 (finite mean, infinite variance)
above ``MINIMUM_S`` = 0.05 s, as ``POINTS`` = 64 equally likely values at the quantiles
(k + 0.5) / 64. Its median is 0.079 s, its mean 0.13 s, and its slowest value 1.27 s, 16x the
median.

Standard library only.
"""

from __future__ import annotations

HEAVY = "heavy"
ALPHA = 1.5
MINIMUM_S = 0.05
POINTS = 64


def heavy_values() -> tuple[float, ...]:
    """The profile's equally likely seconds per iteration, ascending."""
    return tuple(
        round(MINIMUM_S * (1.0 - (k + 0.5) / POINTS) ** (-1.0 / ALPHA), 4) for k in range(POINTS)
    )


GENERATED_PROFILE_IDS = frozenset({HEAVY})
