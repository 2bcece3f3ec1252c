"""Rate traces: a link's rate over time, read from a CSV file or generated, for links that drift.

**File format.** UTF-8 text, one sample per line, ``t,mbit``: seconds from the start of the
run (finite, >= 0, strictly increasing) and the link's rate in Mbit/s from then on (finite,
> 0). A first line ``t,mbit`` (the column names) is optional; blank lines and lines starting
with ``#`` are skipped. The rate holds from one sample to the next and after the last one;
before the first sample the first rate holds. :func:`parse_trace` raises :class:`TraceError`
naming the file, the line and the problem (not a number, a missing column, time going
backwards, a negative or non-finite rate, no samples at all).

**Generated traces** (:func:`generate`): the log-rate follows an Ornstein-Uhlenbeck process,
mean-reverting to the link's mean rate, sampled exactly every ``dt_s``::

    x[k+1] = x[k] e^(-dt/τ) + σ sqrt(1 - e^(-2 dt/τ)) ε[k],   ε ~ N(0, 1),  x[0] ~ N(0, σ²)
    rate[k] = mean · exp(x[k] - σ²/2)

Stated statistics, which a test checks over a long seeded draw: the rate's expectation is
``mean`` (the ``-σ²/2`` makes the log-normal's mean exact); ``log(rate)`` has standard
deviation ``σ`` (``spread``); its autocorrelation at lag ``h`` is ``e^(-h/τ)`` (``tau_s``,
the time constant). About two thirds of the time the rate is within ``e^(±σ)`` of its
median.

Where the parameters come from. Measurements of VM-to-VM bandwidth between cloud regions
describe it as a stationary level per pair of regions plus rare, short excursions (mostly
downtimes), with paths rarely correlated with one another (Garcia-Dorado and Rao, "Bandwidth
measurements within the cloud", ACM Transactions on Internet Technology 17(4), 2017; 18
data centres of four providers), and find the per-VM-pair rate temporally stable at the scale
of hours while single TCP flows vary more (Lai, Chowdhury and Madhyastha, "To Relay or Not to
Relay for Inter-Cloud Transfers?", HotCloud 2018; 40 data centres of EC2, Azure and GCP). A
mean-reverting log-rate with independent links is that stationary component. The defaults
(:data:`DEFAULT_SPREAD` 0.3, :data:`DEFAULT_TAU_S` 30 s) are a stress setting rather than a
fit: rates moving by about ±30% over tens of seconds, the drift the lab's estimator-against-
oracle comparison is run under, faster than the cited studies report for whole VM pairs.
Every generated trace says so: :attr:`RateTrace.source` starts with ``generated:`` and
:func:`write_trace` writes its parameters in a ``# generated`` comment line.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_SPREAD = 0.3  # σ of log(rate)
DEFAULT_TAU_S = 30.0  # time constant of the mean reversion
DEFAULT_DT_S = 1.0  # one sample a second: the lab applies traces at >= 1 Hz
HEADER = ("t", "mbit")
GENERATED = "generated:"


class TraceError(ValueError):
    """A rate trace is unusable; the message names the file, the line and the problem."""


@dataclass(frozen=True)
class RateTrace:
    """A link's rate (Mbit/s) from each time (s) on. ``source``: the file it was read from,
    or ``generated: ...`` with the generator's parameters."""

    times: tuple[float, ...]
    mbit: tuple[float, ...]
    source: str

    def __post_init__(self) -> None:
        if not self.times or len(self.times) != len(self.mbit):
            raise TraceError(
                f"{self.source}: needs as many rates as times, at least one"
                f" ({len(self.times)} times, {len(self.mbit)} rates)"
            )
        for k, (t, r) in enumerate(zip(self.times, self.mbit, strict=True)):
            problem = _sample_problem(t, r, self.times[k - 1] if k else None)
            if problem:
                raise TraceError(f"{self.source}: sample {k}: {problem}")

    @property
    def generated(self) -> bool:
        return self.source.startswith(GENERATED)

    @property
    def duration_s(self) -> float:
        return self.times[-1]

    def rate_at(self, t: float) -> float:
        """The rate in force at time ``t`` (held from the last sample at or before it)."""
        k = int(np.searchsorted(self.times, t, side="right")) - 1
        return self.mbit[max(k, 0)]

    def scaled(self, factor: float) -> RateTrace:
        """The same trace with every rate times ``factor`` (> 0)."""
        if not (math.isfinite(factor) and factor > 0):
            raise TraceError(f"{self.source}: scale factor must be finite and > 0, got {factor}")
        return RateTrace(self.times, tuple(r * factor for r in self.mbit), self.source)


def _sample_problem(t: float, rate: float, previous: float | None) -> str:
    if not math.isfinite(t) or t < 0:
        return f"time {t!r} must be finite and >= 0"
    if previous is not None and not t > previous:
        return f"time {t!r} is not after the previous sample's {previous!r}"
    if not math.isfinite(rate):
        return f"rate {rate!r} is not finite"
    if rate <= 0:
        return f"rate {rate!r} Mbit/s must be > 0"
    return ""


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{what} {text.strip()!r} is not a number") from None


def parse_trace(text: str, source: str = "<trace>") -> RateTrace:
    """The trace in ``text`` (the CSV format of the module docstring); ``source`` names it in
    errors. Raises TraceError ``"<source>, line <k>: <problem>"``."""
    times: list[float] = []
    rates: list[float] = []
    generated = ""
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [c.strip() for c in row]
        if not cells or not any(cells):
            continue
        if cells[0].startswith("#"):
            if cells[0].lstrip("# ").startswith(GENERATED) and not times:
                generated = ",".join(row).lstrip("# ").strip()
            continue
        if not times and tuple(c.lower() for c in cells) == HEADER:
            continue
        where = f"{source}, line {lineno}"
        if len(cells) != 2:
            raise TraceError(
                f"{where}: expected 2 columns (t, mbit), got {len(cells)}: {','.join(row)!r}"
            )
        try:
            t = _number(cells[0], "time")
            rate = _number(cells[1], "rate")
        except ValueError as exc:
            raise TraceError(f"{where}: {exc}") from None
        problem = _sample_problem(t, rate, times[-1] if times else None)
        if problem:
            raise TraceError(f"{where}: {problem}")
        times.append(t)
        rates.append(rate)
    if not times:
        raise TraceError(f"{source}: no samples (expected lines of t,mbit)")
    label = f"{generated} (read from {source})" if generated else source
    return RateTrace(tuple(times), tuple(rates), label)


def load_trace(path: str | Path) -> RateTrace:
    """The trace in the CSV file ``path``; TraceError names the file (and line) when it is
    missing, unreadable or malformed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read the rate trace: {exc}") from exc
    return parse_trace(text, str(path))


def format_trace(trace: RateTrace) -> str:
    """The trace as CSV text (:func:`parse_trace` reads it back); a generated one carries its
    ``# generated: ...`` label on the first line."""
    lines = [f"# {trace.source}"] if trace.generated else []
    lines.append(",".join(HEADER))
    lines += [f"{t:.6g},{r:.6g}" for t, r in zip(trace.times, trace.mbit, strict=True)]
    return "\n".join(lines) + "\n"


def write_trace(trace: RateTrace, path: str | Path) -> None:
    Path(path).write_text(format_trace(trace), encoding="utf-8")


@dataclass(frozen=True)
class DriftParams:
    """A generated trace's parameters: ``mean_mbit`` (the rate's expectation), ``spread``
    (σ of log rate), ``tau_s`` (time constant), ``dt_s`` (sample interval), ``duration_s``
    (last sample's time at most) and ``seed``."""

    mean_mbit: float
    spread: float = DEFAULT_SPREAD
    tau_s: float = DEFAULT_TAU_S
    dt_s: float = DEFAULT_DT_S
    duration_s: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("mean_mbit", 0.0), ("tau_s", 0.0), ("dt_s", 0.0), ("duration_s", 0.0)):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > low):
                raise TraceError(f"drift {name}: must be finite and > {low:g}, got {value!r}")
        if not (isinstance(self.spread, int | float) and 0 <= self.spread <= 2):
            raise TraceError(f"drift spread: σ of log rate in [0, 2], got {self.spread!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise TraceError(f"drift seed: an int >= 0, got {self.seed!r}")

    def label(self) -> str:
        return (
            f"{GENERATED} log-rate Ornstein-Uhlenbeck, mean {self.mean_mbit:g} Mbit/s,"
            f" spread {self.spread:g}, tau {self.tau_s:g} s, dt {self.dt_s:g} s,"
            f" seed {self.seed}"
        )


def generate(params: DriftParams, stream: Sequence[int] = ()) -> RateTrace:
    """A trace drawn from ``params`` (see the module docstring); ``stream`` (e.g. a link's
    ``(src, dst)``) selects an independent draw under the same seed."""
    steps = int(params.duration_s / params.dt_s) + 1
    rng = np.random.default_rng([params.seed, *stream])
    decay = math.exp(-params.dt_s / params.tau_s)
    kick = params.spread * math.sqrt(1.0 - decay * decay)
    noise = rng.standard_normal(steps)
    x = np.empty(steps)
    x[0] = params.spread * noise[0]
    for k in range(1, steps):
        x[k] = x[k - 1] * decay + kick * noise[k]
    rates = params.mean_mbit * np.exp(x - params.spread**2 / 2)
    times = np.arange(steps) * params.dt_s
    where = f" stream {tuple(stream)}" if stream else ""
    return RateTrace(
        tuple(float(t) for t in times), tuple(float(r) for r in rates), params.label() + where
    )
