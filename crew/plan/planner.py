"""The CREW paper's planner, as one import: capacity matrix + group -> plan. Pure, no I/O.

Each name lives in the module of its concept; this module gathers the public ones for callers
that want the whole planner:

* :mod:`crew.plan.inputs` -- the conventions (units, element size) and the input checks;
* :mod:`crew.plan.plantypes` -- :class:`Plan`, :class:`Segment`, :class:`PlanKind`;
* :mod:`crew.plan.stars` -- the star LPs (``solve_p2a``, ``solve_p2p``, ``solve_a2a``,
  ``solve_p2a_nonblocking``, ``solve_pipelined``);
* :mod:`crew.plan.starcost` -- what a star split costs, the capacity left by groups in flight,
  and relayed capacities;
* :mod:`crew.plan.rounding` -- whole elements from real shares;
* :mod:`crew.plan.bound` -- the fluid lower bound no scheme can beat.
"""

from __future__ import annotations

from crew.plan.bound import BOUNDS, CUT_ENUMERATION_MAX_NODES, lower_bound
from crew.plan.inputs import (
    BYTES_PER_S_PER_MBIT,
    ELEM_BYTES,
    PlanError,
    SharedLink,
    check_active,
    check_bw,
    check_delays,
    check_group,
    check_shared,
    check_size,
    is_int,
    plan_json_object,
)
from crew.plan.plantypes import Plan, PlanKind, Segment
from crew.plan.rounding import largest_remainder
from crew.plan.starcost import (
    DEFAULT_FLOOR_MBIT,
    group_rates,
    link_load,
    phased_cost,
    pipelined_cost,
    residual_capacity,
    two_hop,
)
from crew.plan.stars import (
    solve_a2a,
    solve_p2a,
    solve_p2a_nonblocking,
    solve_p2p,
    solve_pipelined,
)

__all__ = [
    "BOUNDS",
    "BYTES_PER_S_PER_MBIT",
    "CUT_ENUMERATION_MAX_NODES",
    "DEFAULT_FLOOR_MBIT",
    "ELEM_BYTES",
    "Plan",
    "PlanError",
    "PlanKind",
    "Segment",
    "SharedLink",
    "check_active",
    "check_bw",
    "check_delays",
    "check_group",
    "check_shared",
    "check_size",
    "group_rates",
    "is_int",
    "largest_remainder",
    "link_load",
    "lower_bound",
    "phased_cost",
    "pipelined_cost",
    "plan_json_object",
    "residual_capacity",
    "solve_a2a",
    "solve_p2a",
    "solve_p2a_nonblocking",
    "solve_p2p",
    "solve_pipelined",
    "two_hop",
]
