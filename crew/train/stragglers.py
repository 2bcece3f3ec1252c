"""Straggler emulation: per-iteration compute-time distributions and the padding they imply.

Profiles come from ``crew/data/straggler-profiles.json`` (Li et al., PPoPP 2020, as used by the
CREW authors): each is a discrete distribution ``[values, probabilities]`` of *seconds per
iteration*. The file's note says the authors obtained slower workers by moving profile 2 to
``[0.2, 0.4]``, ``[0.4, 0.6]``, ... ``[1.0, 1.2]`` s.

One more profile, ``heavy``, is generated with a heavy tail (``crew.train.heavytail``).

Profile specs (:func:`get_profile`):

* ``"2"``: profile 2 as stored.
* ``"2@0.4"``: profile 2 shifted so its minimum is 0.4 s, spread kept (``v - min + 0.4``).
* ``"2@0.4:0.6"``: profile 2 mapped linearly onto ``[0.4, 0.6]`` (shape kept, spread
  rescaled). This reproduces the paper's variants exactly: the stored profile 2 spans
  0.05..0.2 s (spread 0.15), while the paper's slower variants are 0.2 s wide.

Semantics (:class:`ComputeDelay`): a sample is the *target* compute time of one iteration. Real
compute on the lab host is usually faster than the target, so the worker pads each iteration
with a sleep::

    padding = max(0, max(sample, floor, actual) * slowdown - actual)

i.e. the iteration takes the sampled time (or its real time, if that is longer), stretched by
the run-time ``slowdown`` factor the dashboard can set. With no profile the sample is 0, so the
iteration takes ``actual * slowdown``: a slowdown still slows an unprofiled worker.

``floor`` (``RunConfig.min_iteration_s``, 0 by default) is the least time an iteration takes.
Eight workers on a host of two cores share them: a worker that computes while others wait takes
CPU the others would have had, so the host, not each worker's own accelerator, sets how fast
they all train. With a floor well above an iteration's real CPU time, each worker's iteration
lasts its own fixed time whatever the others do, as on an accelerator of its own.

An iteration of H optimiser steps spreads its padding over its steps (:class:`IterationPace`):
step k of H ends no sooner than ``k / H`` of the iteration's time, as an accelerator's equal
steps would. Padded only at the end, the steps would run back to back and then sleep, and an
overlapped round's result arriving mid-iteration (``crew.Averager.start``) would always find
every step of the iteration already taken from the stale model.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from crew.train.heavytail import HEAVY, heavy_values

log = logging.getLogger(__name__)

_DATA_PACKAGE = "crew"
_DATA_FILE = "data/straggler-profiles.json"


class StragglerError(ValueError):
    """A straggler profile, spec or delay parameter is invalid; the message names it."""


@dataclass(frozen=True)
class StragglerProfile:
    """A discrete distribution of per-iteration compute time (seconds).

    ``probs`` are normalised on construction, so any non-negative weights with a positive sum
    are accepted (the stored profiles sum to 1 up to rounding).
    """

    name: str
    values: tuple[float, ...]
    probs: tuple[float, ...]

    def __post_init__(self) -> None:
        values = tuple(float(v) for v in self.values)
        probs = tuple(float(p) for p in self.probs)
        if not values:
            raise StragglerError(f"profile {self.name!r}: values is empty")
        if len(values) != len(probs):
            raise StragglerError(
                f"profile {self.name!r}: {len(values)} values but {len(probs)} probs"
            )
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise StragglerError(f"profile {self.name!r}: values must be finite and >= 0")
        if any(not math.isfinite(p) or p < 0 for p in probs):
            raise StragglerError(f"profile {self.name!r}: probs must be finite and >= 0")
        total = math.fsum(probs)
        if total <= 0:
            raise StragglerError(f"profile {self.name!r}: probs sum to {total}, need > 0")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "probs", tuple(p / total for p in probs))

    @property
    def mean(self) -> float:
        """Expected seconds per iteration."""
        return math.fsum(v * p for v, p in zip(self.values, self.probs, strict=True))

    @property
    def minimum(self) -> float:
        return min(self.values)

    @property
    def maximum(self) -> float:
        return max(self.values)

    def shifted(self, minimum: float) -> StragglerProfile:
        """This profile moved so its minimum is ``minimum`` seconds, spread unchanged."""
        _check_seconds("minimum", minimum, self.name)
        lo = self.minimum
        return StragglerProfile(
            name=f"{self.name}@{minimum:g}",
            values=tuple(v - lo + minimum for v in self.values),
            probs=self.probs,
        )

    def rescaled(self, low: float, high: float) -> StragglerProfile:
        """This profile mapped linearly onto ``[low, high]`` seconds (shape kept)."""
        _check_seconds("low", low, self.name)
        _check_seconds("high", high, self.name)
        if high < low:
            raise StragglerError(f"profile {self.name!r}: high={high} is below low={low}")
        lo, hi = self.minimum, self.maximum
        span = hi - lo
        # A one-point profile has no spread to rescale; put it at low.
        scale = (high - low) / span if span > 0 else 0.0
        return StragglerProfile(
            name=f"{self.name}@{low:g}:{high:g}",
            values=tuple(low + (v - lo) * scale for v in self.values),
            probs=self.probs,
        )


def _check_seconds(field: str, value: float, name: str | None = None) -> None:
    """StragglerError unless ``value`` is finite seconds >= 0; ``name``: the profile's."""
    if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        where = "" if name is None else f"profile {name!r}: "
        raise StragglerError(f"{where}{field} must be finite seconds >= 0, got {value!r}")


@cache
def _load_profiles() -> dict[str, StragglerProfile]:
    text = resources.files(_DATA_PACKAGE).joinpath(_DATA_FILE).read_text(encoding="utf-8")
    raw: Any = json.loads(text)
    entries = raw.get("profiles") if isinstance(raw, dict) else None
    if not isinstance(entries, dict):
        raise StragglerError(f"{_DATA_FILE}: missing 'profiles' object")
    out: dict[str, StragglerProfile] = {}
    for name, pair in entries.items():
        if not (isinstance(pair, list) and len(pair) == 2):
            raise StragglerError(f"{_DATA_FILE}: profile {name!r} is not [values, probabilities]")
        out[str(name)] = StragglerProfile(str(name), tuple(pair[0]), tuple(pair[1]))
    values = heavy_values()  # generated, not measured (crew.train.heavytail)
    out[HEAVY] = StragglerProfile(HEAVY, values, (1.0,) * len(values))
    return out


def available_profiles() -> list[str]:
    """Names of the bundled base profiles and the generated ``heavy`` one (shifted variants
    are built from these by spec)."""
    return sorted(_load_profiles())


def _parse_seconds(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise StragglerError(
            f"straggler spec {spec!r}: {text!r} is not a number of seconds"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise StragglerError(f"straggler spec {spec!r}: seconds must be finite and >= 0")
    return value


def get_profile(spec: str) -> StragglerProfile:
    """Profile for ``spec``: ``"NAME"``, ``"NAME@MIN"`` or ``"NAME@LOW:HIGH"``.

    See the module docstring for what the suffixes mean. Raises StragglerError naming the spec.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise StragglerError(f"straggler spec must be a non-empty string, got {spec!r}")
    name, sep, shift = spec.strip().partition("@")
    profiles = _load_profiles()
    base = profiles.get(name.strip())
    if base is None:
        raise StragglerError(
            f"straggler spec {spec!r}: unknown profile {name.strip()!r};"
            f" available: {', '.join(available_profiles())}"
        )
    if not sep:
        return base
    low_text, colon, high_text = shift.partition(":")
    low = _parse_seconds(low_text.strip(), spec)
    if not colon:
        return base.shifted(low)
    high = _parse_seconds(high_text.strip(), spec)
    if high < low:
        raise StragglerError(f"straggler spec {spec!r}: high {high} is below low {low}")
    return base.rescaled(low, high)


@dataclass(frozen=True)
class IterationPace:
    """One iteration's time, spread evenly over its ``steps`` optimiser steps.

    ``budget_s`` is ``max(sample, floor) * slowdown``. Both methods are pure: elapsed and
    compute time in, seconds to sleep out.
    """

    budget_s: float
    steps: int
    slowdown: float = 1.0

    def __post_init__(self) -> None:
        _check_seconds("budget_s", self.budget_s)
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1:
            raise StragglerError(f"steps must be an int >= 1, got {self.steps!r}")

    def after_step(self, done: int, elapsed_s: float) -> float:
        """Seconds to sleep after ``done`` of the steps, ``elapsed_s`` into the iteration:
        until ``done / steps`` of the budget has passed. The last step's sleep is
        :meth:`at_end`'s."""
        if done >= self.steps:
            return 0.0
        return max(0.0, self.budget_s * done / self.steps - elapsed_s)

    def at_end(self, compute_s: float, elapsed_s: float) -> float:
        """Seconds to sleep after the last step: the iteration lasts the budget, or its real
        compute ``compute_s`` stretched by the slowdown if that is longer."""
        _check_seconds("compute_s", compute_s)
        return max(0.0, max(self.budget_s, compute_s * self.slowdown) - elapsed_s)


class ComputeDelay:
    """Draws per-iteration target compute times and turns them into sleep padding.

    Give each worker a distinct ``seed`` (e.g. derived from run seed and worker index), or
    all workers straggle in lockstep. ``slowdown`` may be changed at any time from another
    thread (the dashboard's "slow this worker" command); it takes effect on the next padding.
    """

    def __init__(
        self,
        profile: StragglerProfile | None,
        seed: int,
        slowdown: float = 1.0,
        floor_s: float = 0.0,
    ) -> None:
        _check_seconds("floor_s", floor_s)
        self.profile = profile
        self.floor_s = float(floor_s)
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()  # the generator is not thread-safe
        if profile is not None:
            self._values = np.asarray(profile.values, dtype=np.float64)
            self._probs = np.asarray(profile.probs, dtype=np.float64)
        self._slowdown = 1.0
        self.slowdown = slowdown
        self.last_sample: float | None = None

    @classmethod
    def for_worker(
        cls, spec: str | None, run_seed: int, worker: int, floor_s: float = 0.0
    ) -> ComputeDelay:
        """A run's worker's draws: its profile spec (None: no profile), seeded
        ``run_seed * 1000 + worker``, so that the lab's worker, the simulator and the studies
        that redraw its samples all draw the same ones."""
        profile = get_profile(spec) if spec else None
        return cls(profile, seed=run_seed * 1000 + worker, floor_s=floor_s)

    @property
    def slowdown(self) -> float:
        """Factor applied to each iteration's target time (1 = as sampled, 2 = twice as long)."""
        return self._slowdown

    @slowdown.setter
    def slowdown(self, factor: float) -> None:
        if not isinstance(factor, int | float) or not math.isfinite(factor) or factor <= 0:
            raise StragglerError(f"slowdown must be a finite number > 0, got {factor!r}")
        self._slowdown = float(factor)

    def sample(self) -> float:
        """One target compute time for an iteration, in seconds (0.0 without a profile)."""
        if self.profile is None:
            return 0.0
        with self._lock:
            return float(self._rng.choice(self._values, p=self._probs))

    def samples(self, count: int) -> np.ndarray:
        """``count`` target times at once (for simulators and statistics)."""
        if count < 0:
            raise StragglerError(f"count must be >= 0, got {count}")
        if self.profile is None:
            return np.zeros(count)
        with self._lock:
            return self._rng.choice(self._values, size=count, p=self._probs)

    def pace(self, steps: int = 1) -> IterationPace:
        """The next iteration's pace over its ``steps`` steps. Draws a fresh sample (call
        once per iteration; it is kept in ``last_sample``)."""
        target = self.sample()
        self.last_sample = target
        budget = max(target, self.floor_s) * self._slowdown
        return IterationPace(budget, steps, self._slowdown)

    def padding(self, actual_s: float) -> float:
        """Seconds to sleep after an iteration whose real compute took ``actual_s``, padded
        only at its end: ``max(0, max(sample, floor_s, actual_s) * slowdown - actual_s)``.
        Draws a fresh sample, as :meth:`pace` does."""
        _check_seconds("actual_s", actual_s)
        return self.pace().at_end(actual_s, actual_s)
