"""The simulator's candidate sets by default: above ``CANDIDATES_FROM_N`` workers every group is
planned over its members and ``DEFAULT_HELPERS`` best-connected others (``crew.plan.candidates``,
which the lab's coordinator uses too when its run sets ``helpers``)."""

from __future__ import annotations

__all__ = ["CANDIDATES_FROM_N", "DEFAULT_HELPERS", "default_helpers"]

CANDIDATES_FROM_N = 64
"""Above this many workers the simulator plans over candidates by default (``--helpers``)."""
DEFAULT_HELPERS = 16
"""Non-member candidates per group by default: p + 16 workers keeps a plan near n = 20's time."""


def default_helpers(n: int) -> int | None:
    """The simulator's default helper count for n workers (None: plan over every worker)."""
    return DEFAULT_HELPERS if n > CANDIDATES_FROM_N else None
