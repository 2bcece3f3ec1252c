"""How hard the route LP works: the bounds and tuning of its column generation and latency-level
search, as one frozen value a caller passes in. Pure, no I/O.

Every field carries a one-line reason (``dataclasses.fields(RouteLPSettings)[k].metadata
["why"]``). The defaults are what the coordinator plans with; a simulator that plans thousands
of groups trades a proved gap for time with ``max_rounds`` and ``level_tolerance`` (rounds, not
seconds, so that a run does not depend on the machine). The tuning behind the defaults is in
docs/decisions/2026-12-04-route-lp-settings.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from crew.plan.inputs import PlanError, is_int


def _setting(default: Any, why: str) -> Any:
    return field(default=default, metadata={"why": why})


@dataclass(frozen=True)
class RouteLPSettings:
    """Bounds and tuning of one route LP planner (see the module docstring)."""

    max_rounds: int = _setting(
        60, "bounds the search in work, not time: a round is one LP solve and one pricing"
    )
    time_budget_s: float = _setting(
        2.0, "bounds planning time; a plan cut short stays as good as every seeded baseline"
    )
    level_tolerance: float = _setting(
        0.0,
        "skip latency levels that could improve the plan by at most this share (0: exact)",
    )
    exact: bool | None = _setting(
        None, "force (True) or forbid (False) exact Dreyfus-Wagner pricing; None: by size"
    )
    exact_pricing_work: int = _setting(
        3_000_000, "exact pricing costs 3^p n + 2^p n^2: used while both stay below this"
    )
    columns_per_round: int = _setting(
        4, "new columns per round at most (the best roots by reduced cost): keeps each LP small"
    )
    gap: float = _setting(
        1e-7, "relative Lagrangian gap at which column generation stops, proved optimal within it"
    )
    smoothing: float = _setting(
        0.7, "weight of the best-bound duals in pricing (Wentges): the plain duals are degenerate"
    )
    tree_seeds: int = _setting(
        16, "roots whose least-link-time trees seed the pool: all roots cost more than they save"
    )
    relay_seeds: bool = _setting(
        True, "seed one-relay stars from cut_check_min_n workers on: large groups need relays"
    )
    cross_pairs: bool = _setting(
        True, "add crossed reduce/broadcast tree pairs after each pricing: fewer rounds"
    )
    cross_limit: int = _setting(
        2, "most-used routes at a root that each new shape is crossed with; bounds columns added"
    )
    cross_max_n: int = _setting(
        16, "crossed pairs only up to this many workers: above, they cost more than they save"
    )
    max_latency_levels: int = _setting(
        48, "caps the level search's LP solves (a handful usually) on pathological pools"
    )
    dual_for_levels: bool = _setting(
        True, "solve latency levels with the dual simplex: fixing columns keeps duals feasible"
    )
    level_rows_min_n: int = _setting(
        32, "solve levels on the binding rows from here; below, the master is small enough"
    )
    level_rows_slack: float = _setting(
        1e-9, "an omitted row returns once its load exceeds t by this share (HiGHS tolerance: 1e-7)"
    )
    cut_check_min_n: int = _setting(
        12, "stop at the max-flow bound from here; below, the few rounds left do not pay for it"
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "exact":
                ok = value is None or isinstance(value, bool)
            elif isinstance(f.default, bool):
                ok = isinstance(value, bool)
            elif isinstance(f.default, int):
                low = 1 if f.name in _AT_LEAST_ONE else 0
                if not (is_int(value) and value >= low):
                    raise PlanError(f.name, f"must be an int >= {low}, got {value!r}")
                ok = True
            else:
                ok = isinstance(value, int | float) and not isinstance(value, bool)
                ok = ok and math.isfinite(value) and value >= 0
            if not ok:
                raise PlanError(f.name, f"invalid route LP setting {value!r}")
        if not self.time_budget_s > 0:
            raise PlanError(
                "time_budget_s", f"must be a positive number, got {self.time_budget_s!r}"
            )
        for name in ("level_tolerance", "smoothing"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise PlanError(name, f"must be in [0, 1), got {getattr(self, name)!r}")


_AT_LEAST_ONE = frozenset(
    {"max_rounds", "exact_pricing_work", "columns_per_round", "max_latency_levels"}
)
"""The int settings that stop the planner from doing anything at 0."""


DEFAULT_SETTINGS = RouteLPSettings()
"""The coordinator's settings: every default."""
