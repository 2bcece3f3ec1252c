"""What every planner takes, checked: capacity matrices, groups, active sets, sizes, delays and
shared capacities, with their units. Pure, no I/O.

Conventions shared by every planner of :mod:`crew.plan`:

``bw``
    n x n array of directed capacities in Mbit/s; ``bw[i][j]`` is the rate of i -> j, 0 for a
    dead link. The diagonal is ignored and treated as ``inf``: a worker's own copy moves for free.
``group`` / ``members``
    distinct 0-based worker indices; p = |G|.
``active``
    the workers that may aggregate or relay (default: all n); every member must be active.
``size``
    M, the bytes of the model vector, a positive multiple of the element size.
``delay_s``
    n x n one-way delays in seconds (optional).
``shared``
    :class:`SharedLink` capacities over sets of directed pairs (optional).

Units: a rate r in Mbit/s moves ``r * 1e6 / 8`` bytes/s; every time is in seconds.

Every check raises :class:`PlanError` naming the offending argument, and returns the input in
the form the planners compute with (a float matrix, a tuple of ints, a boolean mask).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

BYTES_PER_S_PER_MBIT = 1e6 / 8
"""Bytes per second carried by a link of 1 Mbit/s."""

ELEM_BYTES = 4
"""Bytes per vector element (float32), as every planner counts them."""


class PlanError(ValueError):
    """A planner input is invalid, or no plan exists. ``field`` names the offending argument."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


def is_int(x: object) -> bool:
    """An int or numpy integer, but not a bool."""
    return isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_)


def check_bw(bw: object) -> np.ndarray:
    """A float copy of ``bw`` with an ``inf`` diagonal."""
    try:
        w = np.array(bw, dtype=float)
    except (TypeError, ValueError) as exc:
        raise PlanError("bw", f"not a numeric matrix: {exc}") from exc
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
        raise PlanError("bw", f"must be a non-empty square matrix, got shape {w.shape}")
    off = ~np.eye(w.shape[0], dtype=bool)
    if not np.all(np.isfinite(w[off])):
        raise PlanError("bw", "off-diagonal rates must be finite")
    if np.any(w[off] < 0):
        raise PlanError("bw", "rates must be non-negative")
    np.fill_diagonal(w, np.inf)
    return w


def check_group(group: object, n: int) -> tuple[int, ...]:
    """The members as plain ints: a non-empty sequence of distinct workers in [0, n)."""
    if isinstance(group, str | bytes) or not isinstance(group, Iterable):
        raise PlanError("group", f"must be a sequence of worker indices, got {group!r}")
    members = tuple(group)
    if not members:
        raise PlanError("group", "is empty")
    for g in members:
        if not is_int(g) or not 0 <= g < n:
            raise PlanError("group", f"index {g!r} is not a worker in [0, {n})")
    if len(set(members)) != len(members):
        raise PlanError("group", f"has repeated members: {members}")
    return tuple(int(g) for g in members)


def check_active(active: Collection[int] | None, n: int, members: Sequence[int]) -> np.ndarray:
    """Boolean mask of active workers; every member must be among them."""
    mask = np.zeros(n, dtype=bool)
    if active is None:
        mask[:] = True
    else:
        if isinstance(active, str | bytes) or not isinstance(active, Iterable):
            raise PlanError("active", f"must be a collection of worker indices, got {active!r}")
        for i in active:
            if not is_int(i) or not 0 <= i < n:
                raise PlanError("active", f"index {i!r} is not a worker in [0, {n})")
            mask[int(i)] = True
    missing = [g for g in members if not mask[g]]
    if missing:
        raise PlanError("group", f"members {missing} are not active")
    return mask


def check_size(size: int, elem_bytes: int) -> int:
    """Number of elements in a vector of ``size`` bytes."""
    if not is_int(elem_bytes) or elem_bytes <= 0:
        raise PlanError("elem_bytes", f"must be a positive int, got {elem_bytes!r}")
    if not is_int(size) or size <= 0:
        raise PlanError("size", f"must be a positive int of bytes, got {size!r}")
    if size % elem_bytes:
        raise PlanError("size", f"{size} bytes is not a multiple of elem_bytes={elem_bytes}")
    return int(size) // int(elem_bytes)


@dataclass(frozen=True)
class SharedLink:
    """A capacity shared by several directed pairs: their bytes together drain at ``mbit``.

    E.g. a cloud's WAN uplink: every pair (a, b) with a in the cloud and b outside crosses it,
    so the cloud's workers share its rate instead of each having a private link. ``delay_s``
    is its one-way delay: a pair crossing it is at least that far. Used by the lower bound
    (:mod:`crew.plan.bound`) and by the route planner (:mod:`crew.plan.routelp`).
    """

    pairs: tuple[tuple[int, int], ...]
    mbit: float
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        try:
            pairs = tuple((int(a), int(b)) for a, b in self.pairs)
        except (TypeError, ValueError):
            raise PlanError(
                "shared", f"pairs must be (src, dst) ints, got {self.pairs!r}"
            ) from None
        if (
            not pairs
            or len(set(pairs)) != len(pairs)
            or any(a == b or a < 0 or b < 0 for a, b in pairs)
        ):
            raise PlanError(
                "shared", f"pairs must be distinct (src, dst), 0 <= src != dst: {pairs}"
            )
        object.__setattr__(self, "pairs", pairs)
        for name in ("mbit", "delay_s"):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not math.isfinite(v)
                or v < 0
            ):
                raise PlanError("shared", f"{name} must be a finite number >= 0, got {v!r}")
        if not self.mbit > 0:
            raise PlanError("shared", "mbit must be positive (drop the pairs' links instead)")


def check_shared(shared: Sequence[SharedLink] | None, n: int) -> tuple[SharedLink, ...]:
    """The shared capacities as a tuple, each a :class:`SharedLink` over pairs of [0, n)."""
    out = tuple(shared or ())
    for s in out:
        if not isinstance(s, SharedLink):
            raise PlanError("shared", f"must be SharedLink, got {s!r}")
        if any(not (0 <= a < n and 0 <= b < n) for a, b in s.pairs):
            raise PlanError("shared", f"a pair is outside 0..{n - 1}: {s.pairs}")
    return out


def check_delays(
    delay_s: np.ndarray | None, n: int, shared: Sequence[SharedLink]
) -> np.ndarray | None:
    """One-way delay per directed pair (seconds), raised to every shared link it crosses;
    None when there are no delays at all."""
    if delay_s is None and not any(s.delay_s > 0 for s in shared):
        return None
    try:
        d = np.zeros((n, n)) if delay_s is None else np.array(delay_s, dtype=float)
    except (TypeError, ValueError) as exc:
        raise PlanError("delay_s", f"not a numeric matrix: {exc}") from None
    if d.shape != (n, n):
        raise PlanError("delay_s", f"must have shape {(n, n)}, got {d.shape}")
    off = ~np.eye(n, dtype=bool)
    if not np.all(np.isfinite(d[off])) or np.any(d[off] < 0):
        raise PlanError("delay_s", "off-diagonal delays must be finite and >= 0")
    for s in shared:
        for a, b in s.pairs:
            d[a, b] = max(d[a, b], s.delay_s)
    np.fill_diagonal(d, 0.0)
    return d


def plan_json_object(text: str) -> dict[str, Any]:
    """The JSON object a serialised plan must be; PlanError("plan") otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError("plan", f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise PlanError("plan", "JSON is not an object")
    return data
