"""One call of a group planner, as a value: its inputs, an exact key, and how to make it. Pure.

Why: the coordinator may plan a group *before* it forms (a ``lab.bench`` trace names its next
group; :mod:`crew.runtime.planahead` plans it while the current one runs). A plan made ahead is
used only for a call whose key is identical, bit for bit (rates, members, active set, delays,
part size), so it is the plan the group would have got at once: nothing is approximated, only
when it is computed moves. The same key serves the call made ahead and the call made when the
group forms, because both are built here from the planner's own signature
(``crew.plan.schemes.plan_group(scheme, bw, members, size, active=, seed=, part_bytes=,
shared=, delay_s=)``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crew.config import Scheme
from crew.plan.memo import key_part
from crew.plan.schemes import GroupPlan


@dataclass(frozen=True, eq=False)
class PlanCall:
    """``plan(scheme, bw, members, size, **keywords)``. Keywords absent from ``keywords`` are
    not passed at all (planners and test doubles without them keep working). Compare calls by
    :meth:`key` (arrays have no ``==`` that gives one answer)."""

    scheme: Scheme
    bw: np.ndarray
    members: tuple[int, ...]
    size: int
    keywords: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls, scheme: Scheme, bw: np.ndarray, members: Sequence[int], size: int, **keywords: Any
    ) -> PlanCall:
        return cls(Scheme(scheme), np.asarray(bw, dtype=float), tuple(members), size, keywords)

    def key(self) -> Hashable:
        """Exact: equal keys mean equal inputs (arrays by dtype, shape and bytes)."""
        kw = tuple(sorted((k, key_part(v)) for k, v in self.keywords.items()))
        return (self.scheme, key_part(self.bw), self.members, self.size, kw)

    def run(self, plan: Callable[..., GroupPlan]) -> GroupPlan:
        return plan(self.scheme, self.bw, self.members, self.size, **self.keywords)
