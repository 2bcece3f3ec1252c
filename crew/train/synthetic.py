"""The ``synthetic`` workload: a float32 vector of a chosen size in place of a model, no torch.

For runs at scale the lab needs workers whose processes are small and start at once, while
everything else (coordinator, planner, transport, probes, database) stays the real runtime.
A synthetic worker imports numpy only. Its compute time per step is drawn from its straggler
profile exactly as the MLP worker's padding is (:class:`crew.train.stragglers.ComputeDelay`,
the same draw the simulator makes); its "model" is a vector of ``--model-mb`` megabytes
(10^6 bytes, 250 000 float32 values each) that a seeded rule rewrites every step.

The rule: worker ``w`` at step ``s`` (``s >= 0``: the local iterations it has completed)
offers ``x[k] = T[(k + o) mod N] + c`` for ``k >= 2n`` and the *header* below for ``k < 2n``,
where

* ``T`` is one table of ``N`` integers in ``[-1024, 1024)`` drawn from the run seed (the same
  on every worker),
* ``o`` in ``[0, N)`` and ``c`` in ``[-1024, 1024)`` are drawn from ``(seed, w, s)``,
* the header holds ``x[w] = s + 1`` and ``x[n + w] = 1``, all other header slots 0.

So the vector changes every step, and the average of any member set is known without the
members' data: a result ``Σ w_m x_m`` carries in its header each member's float32 weight
(``result[n + m]``, exact: only that member adds to the slot) and its step
(``result[m] / result[n + m] - 1``, rounded), from which
:meth:`SyntheticRule.expected_average` rebuilds the exact average in float64 (products of a
float32 weight and an integer below 2^12 have at most
36 significant bits, sums of up to 2^10 of them at most 46: all exact in float64).

How exact the check is (:meth:`SyntheticRule.verify`): the reduce engine forms ``fl(w_m x_m)`` and
sums those in float32 in whatever order its routes give, so each element of a correct result
lies within ``γ(p + 1) · Σ |w_m x_m|`` of the exact average (``γ(k) = k u / (1 - k u)``,
``u = 2^-24``: the standard bound for p products and p - 1 additions). With weights that are
powers of two (equal weights in groups of 2, 4, 8, ...) every product and partial sum is
exact and a correct result equals the exact average bit for bit. A part delivered to the wrong
place, counted twice or left out, a wrong member or a stale step moves elements by whole units
(table values are independent integers), orders of magnitude beyond the bound.

Cost: the table is ``2N`` float32 values held once (a wrapped copy, so every step's vector is
one slice plus one add: about a millisecond for 4 MB); a verification costs one float64 pass
per member (about 1 ms per member per 4 MB on this project's machine).
"""

from __future__ import annotations

import logging
import math
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crew.train.datasets import atomic_savez
from crew.vector import check_flat_float32

log = logging.getLogger(__name__)

BYTES_PER_MB = 1_000_000
VALUE_BOUND = 1024  # table values and per-step shifts lie in [-VALUE_BOUND, VALUE_BOUND)
UNIT_ROUNDOFF = 2.0**-24  # float32's
MAX_STEP = 2**22  # the header's step stays exactly recoverable below this (float32: 24 bits)
_TABLE_TAG = 0x7AB1E  # keeps the table's seed sequence apart from the per-step draws


class SyntheticError(ValueError):
    """A synthetic workload parameter, vector or checkpoint is unusable; the message says which."""


def elements_for(model_mb: float, n: int) -> int:
    """float32 elements of a ``model_mb`` MB (10^6 bytes) vector for ``n`` workers.

    Raises SyntheticError when the size is not finite and positive, or too small to hold the
    ``2n``-element header and at least one body element."""
    if (
        isinstance(model_mb, bool)
        or not isinstance(model_mb, int | float)
        or not math.isfinite(model_mb)
        or model_mb <= 0
    ):
        raise SyntheticError(f"model_mb: must be a finite number of MB > 0, got {model_mb!r}")
    size = round(model_mb * BYTES_PER_MB / 4)
    if size < 2 * n + 1:
        raise SyntheticError(
            f"model_mb: {model_mb} MB is {size} values; {n} workers need at least {2 * n + 1}"
            f" (a {2 * n}-value header and a body)"
        )
    return size


@dataclass(frozen=True)
class Contribution:
    """One member's share of an average: its worker index, its step and its float32 weight."""

    worker: int
    step: int
    weight: float


@dataclass(frozen=True)
class Verdict:
    """What :meth:`SyntheticRule.verify` found. ``error``: the largest absolute deviation from the
    exact average; ``tolerance``: the float32 bound it must stay within; ``reason`` is empty
    when ``ok``."""

    ok: bool
    members: tuple[Contribution, ...]
    error: float
    tolerance: float
    reason: str = ""

    @property
    def ratio(self) -> float:
        """``error / tolerance``: at most 1 for a correct result, 0 when bit-exact."""
        if self.tolerance > 0:
            return self.error / self.tolerance
        return 0.0 if self.error == 0 else math.inf


class SyntheticRule:
    """The seeded rule of the module docstring for a run: ``seed``, ``n`` workers, ``size``
    float32 elements. Builds the shared table once (``2 * size`` float32 values)."""

    def __init__(self, seed: int, n: int, size: int) -> None:
        for name, value, low in (("seed", seed, 0), ("n", n, 1), ("size", size, 2 * n + 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise SyntheticError(f"{name}: must be an int >= {low}, got {value!r}")
        self.seed = seed
        self.n = n
        self.size = size
        table = (
            np.random.default_rng([seed, _TABLE_TAG])
            .integers(-VALUE_BOUND, VALUE_BOUND, size=size, dtype=np.int32)
            .astype(np.float32)
        )
        # Wrapped once, so the rotation by o is a slice (a view), not a copy.
        self._table = np.concatenate([table, table])

    def shift(self, worker: int, step: int) -> tuple[int, int]:
        """``(o, c)`` of worker ``worker`` at step ``step``: the table's rotation and the
        constant added."""
        self._check_member(worker, step)
        rng = np.random.default_rng([self.seed, worker, step])
        return int(rng.integers(0, self.size)), int(rng.integers(-VALUE_BOUND, VALUE_BOUND))

    def vector(self, worker: int, step: int) -> np.ndarray:
        """The float32 vector worker ``worker`` offers after ``step`` local iterations."""
        o, c = self.shift(worker, step)
        out = self._table[o : o + self.size] + np.float32(c)
        out[: 2 * self.n] = 0.0
        out[worker] = step + 1
        out[self.n + worker] = 1.0
        return out

    def expected_average(self, members: Sequence[Contribution]) -> np.ndarray:
        """The exact weighted average (float64) of the members' vectors, from the rule alone."""
        if not members:
            raise SyntheticError("expected_average: no members")
        acc = np.zeros(self.size, dtype=np.float64)
        for m in members:
            o, c = self.shift(m.worker, m.step)
            acc += m.weight * (self._table[o : o + self.size].astype(np.float64) + c)
        acc[: 2 * self.n] = 0.0
        for m in members:
            acc[m.worker] = m.weight * (m.step + 1)
            acc[self.n + m.worker] = m.weight
        return acc

    def decode(self, result: np.ndarray) -> tuple[Contribution, ...]:
        """The members, steps and float32 weights a result's header names.

        Raises SyntheticError when the header cannot be the average of this rule's vectors
        (wrong shape, a negative or non-finite weight, a step that is not a whole number)."""
        self.check_vector(result)
        members = []
        for w in range(self.n):
            weight = float(result[self.n + w])
            scaled = float(result[w])
            if weight == 0.0 and scaled == 0.0:
                continue
            if not (math.isfinite(weight) and weight > 0 and math.isfinite(scaled)):
                raise SyntheticError(
                    f"header: worker {w} has weight {weight!r} and step slot {scaled!r}"
                )
            step_plus_one = round(scaled / weight)
            # fl(weight * (step + 1)) is within one rounding of the product.
            if step_plus_one < 1 or abs(scaled - weight * step_plus_one) > (
                2 * UNIT_ROUNDOFF * abs(weight * step_plus_one)
            ):
                raise SyntheticError(
                    f"header: worker {w}'s step slot {scaled!r} is not a whole step times its"
                    f" weight {weight!r}"
                )
            members.append(Contribution(w, step_plus_one - 1, weight))
        if not members:
            raise SyntheticError("header: no member contributed")
        return tuple(members)

    def tolerance(self, members: Sequence[Contribution]) -> float:
        """The float32 bound ``γ(p + 1) · Σ |w_m| · max |x|`` on any element's error."""
        k = len(members) + 1
        gamma = k * UNIT_ROUNDOFF / (1 - k * UNIT_ROUNDOFF)
        largest = max(2 * VALUE_BOUND, max(m.step + 1 for m in members))
        return gamma * math.fsum(abs(m.weight) for m in members) * largest

    def verify(self, result: np.ndarray, members: Sequence[int] | None = None) -> Verdict:
        """Check a group's result against the exact average of the contributions its header
        names; ``members``, when given, must be exactly those workers."""
        try:
            found = self.decode(result)
        except SyntheticError as exc:
            return Verdict(False, (), math.inf, 0.0, str(exc))
        named = tuple(m.worker for m in found)
        if members is not None and tuple(sorted(members)) != named:
            return Verdict(
                False, found, math.inf, 0.0, f"header names {named}, the group was {members}"
            )
        total = math.fsum(m.weight for m in found)
        if abs(total - 1.0) > 2 * len(found) * UNIT_ROUNDOFF:
            return Verdict(False, found, math.inf, 0.0, f"weights sum to {total!r}, not 1")
        tol = self.tolerance(found)
        deviation = np.abs(result - self.expected_average(found))
        worst = int(np.argmax(deviation))
        error = float(deviation[worst])
        if not error <= tol:  # also catches NaN
            return Verdict(
                False, found, error, tol, f"element {worst} is off by {error:g} (bound {tol:g})"
            )
        return Verdict(True, found, error, tol)

    def _check_member(self, worker: int, step: int) -> None:
        if not 0 <= worker < self.n:
            raise SyntheticError(f"worker: must be in [0, {self.n}), got {worker}")
        if not 0 <= step < MAX_STEP:
            raise SyntheticError(f"step: must be in [0, {MAX_STEP}), got {step}")

    def check_vector(self, v: np.ndarray) -> None:
        """SyntheticError unless ``v`` is a 1-D float32 vector of this rule's size."""
        check_flat_float32(v, SyntheticError)
        if v.shape != (self.size,):
            raise SyntheticError(f"vector must have {self.size} values, got {v.shape[0]}")


class SyntheticTrainer:
    """Worker ``index``'s stand-in for a trainer (:class:`crew.train.training.FlatTrainer`'s
    calls, numpy only): :meth:`step` moves to the next step's vector, :meth:`set_vector`
    verifies a group's average and counts the outcome.

    What it reports as training metrics: :meth:`step`'s "loss" is the worst ``error /
    tolerance`` of the averages verified since the previous step (0 when exact, above 1 when
    a result was wrong); :meth:`evaluate` gives that and the share of averages that verified
    (1.0 when all did), in the place of held-out loss and accuracy.
    """

    def __init__(self, rule: SyntheticRule, index: int, *, verify: bool = True) -> None:
        rule.shift(index, 0)  # validates the index
        self.rule = rule
        self.index = index
        self.verify = verify
        self._iteration = 0
        self._vector = rule.vector(index, 0)
        self.verified = 0
        self.mismatched = 0
        self.last_verdict: Verdict | None = None
        self._worst_ratio = 0.0

    @property
    def iteration(self) -> int:
        return self._iteration

    @property
    def num_params(self) -> int:
        return self.rule.size

    def step(self) -> float:
        """One local iteration: the next step's vector. Returns the worst verification ratio
        since the previous call."""
        self._iteration += 1
        self._vector = self.rule.vector(self.index, self._iteration)
        worst, self._worst_ratio = self._worst_ratio, 0.0
        return worst

    def get_vector(self) -> np.ndarray:
        return self._vector

    def set_vector(self, v: np.ndarray, members: Sequence[int] | None = None) -> Verdict | None:
        """Take a group's average: verify it (against ``members`` when given) and count it;
        without ``verify`` (a lossy wire codec: the result is not exact) only take it.
        The next :meth:`step` replaces the vector whatever the verdict; a wrong result is
        logged as an error and counted in ``mismatched``."""
        self.rule.check_vector(v)
        if not self.verify:
            self._vector = v.copy()
            return None
        verdict = self.rule.verify(v, members)
        self.last_verdict = verdict
        if verdict.ok:
            self.verified += 1
        else:
            self.mismatched += 1
            log.error("worker %d: the group's average is wrong: %s", self.index, verdict.reason)
        ratio = verdict.ratio if verdict.ok else math.inf
        self._worst_ratio = max(self._worst_ratio, min(ratio, 1e30))
        self._vector = v.copy()
        return verdict

    def evaluate(self) -> tuple[float, float]:
        """``(worst ratio so far in this step, share of averages that verified)``."""
        checked = self.verified + self.mismatched
        return self._worst_ratio, (self.verified / checked if checked else 1.0)

    def save(self, path: str | Path) -> None:
        """Checkpoint the step count (the vector follows from it)."""
        atomic_savez(
            Path(path),
            iteration=np.array(self._iteration, dtype=np.int64),
            size=np.array(self.rule.size, dtype=np.int64),
            worker=np.array(self.index, dtype=np.int64),
        )

    def load(self, path: str | Path) -> None:
        """Resume at a :meth:`save` checkpoint's step; SyntheticError (state unchanged) if the
        file is unreadable or for another size or worker."""
        try:
            with np.load(Path(path), allow_pickle=False) as data:
                iteration, size, worker = (int(data[k]) for k in ("iteration", "size", "worker"))
        except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as exc:
            raise SyntheticError(f"cannot read checkpoint {path}: {exc}") from exc
        if (size, worker) != (self.rule.size, self.index):
            raise SyntheticError(
                f"checkpoint {path} is for worker {worker} with {size} values, this is worker"
                f" {self.index} with {self.rule.size}"
            )
        if not 0 <= iteration < MAX_STEP:
            raise SyntheticError(f"checkpoint {path}: iteration {iteration} out of range")
        self._iteration = iteration
        self._vector = self.rule.vector(self.index, iteration)
