"""Topologies for the simulator: generated like the CREW paper's, or taken from the lab's.

A :class:`SimTopology` is what the simulator needs and no more: worker names and clouds, the
directed rate matrix (Mbit/s) and one-way delays (ms), and each worker's straggler spec
(``crew.train.stragglers.get_profile``). The lab's YAML becomes one through ``lab.simrun`` (``crew``
never imports ``lab``); :func:`generate` builds the paper's.

Generated topologies (:func:`generate`): ``n`` clouds of one worker each, every ordered pair
with its own rate, drawn with the given seed at one of the paper's bandwidth-diversity
settings:

* ``bwd=1``: ``25 x clip(round(N(5, 1)), 1, 10)`` Mbit/s per pair: mostly 100-150 Mbit/s,
  little spread;
* ``bwd=2``: drawn with replacement from the 110 measured inter-cloud rates in
  ``crew/data/inter-cloud-bandwidth-samples.json`` (HotCloud 2018; 20-398 Mbit/s, median
  ~57): the measured diversity;
* ``bwd=3``: 125 Mbit/s everywhere.

The paper gives these three definitions and nothing else about the topology, so these are our
choices: each direction is drawn independently (measured inter-cloud paths are asymmetric;
``symmetric=True`` draws one rate per unordered pair instead, both directions alike), no
delays (the paper's simulator is flow-level and its metric is throughput-bound), one worker
per cloud. Stragglers: ``"mixed"`` gives worker i the i-th (mod 6) of profile 2 and its five
slower variants the profile file describes (``2``, ``2@0.2:0.4``, ... ``2@1.0:1.2``), i.e. a
spread from 0.05 s to 1.2 s per iteration; ``"none"`` gives every worker profile 2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

BWD_SETTINGS = (1, 2, 3)
MIXED_STRAGGLERS = ("2", "2@0.2:0.4", "2@0.4:0.6", "2@0.6:0.8", "2@0.8:1.0", "2@1.0:1.2")


class TopologyGenError(ValueError):
    """A generator argument is invalid; the message names it."""


@dataclass(frozen=True)
class SimTopology:
    name: str
    names: tuple[str, ...]
    clouds: tuple[str, ...]
    rate_mbit: np.ndarray  # n x n, diagonal ignored
    delay_ms: np.ndarray  # n x n one-way
    stragglers: tuple[str | None, ...]
    description: str = ""

    def __post_init__(self) -> None:
        n = len(self.names)
        if n < 1 or len(self.clouds) != n or len(self.stragglers) != n:
            raise TopologyGenError("names, clouds and stragglers must have one entry per worker")
        for field in ("rate_mbit", "delay_ms"):
            m = np.asarray(getattr(self, field), dtype=float)
            if m.shape != (n, n):
                raise TopologyGenError(f"{field} must be {n}x{n}, got {m.shape}")
            off = ~np.eye(n, dtype=bool)
            if not np.all(np.isfinite(m[off])) or np.any(m[off] < 0):
                raise TopologyGenError(f"{field}: off-diagonal values must be finite and >= 0")
            object.__setattr__(self, field, m)

    @property
    def n(self) -> int:
        return len(self.names)

    def to_dict(self) -> dict:
        """A JSON form for the run database's ``meta.topology`` (the dashboard reads ``name``)."""
        return {
            "name": self.name,
            "description": self.description,
            "simulated": True,
            "workers": [
                {"name": w, "cloud": c, "straggler": s}
                for w, c, s in zip(self.names, self.clouds, self.stragglers, strict=True)
            ],
        }


@cache
def inter_cloud_samples() -> tuple[float, ...]:
    text = resources.files("crew").joinpath("data/inter-cloud-bandwidth-samples.json").read_text()
    return tuple(float(v) for v in json.loads(text)["values"])


def rates(n: int, bwd: int, rng: np.random.Generator, symmetric: bool = False) -> np.ndarray:
    """An n x n directed rate matrix (Mbit/s) at bandwidth diversity ``bwd``; diagonal 0.

    ``symmetric``: one rate per unordered pair, both directions alike (the draws above the
    diagonal, mirrored; the same draws as the directed matrix's upper triangle)."""
    if bwd == 1:
        r = 25.0 * np.clip(np.round(rng.normal(5.0, 1.0, (n, n))), 1, 10)
    elif bwd == 2:
        r = rng.choice(np.asarray(inter_cloud_samples()), size=(n, n), replace=True)
    elif bwd == 3:
        r = np.full((n, n), 125.0)
    else:
        raise TopologyGenError(f"bwd must be one of {BWD_SETTINGS}, got {bwd!r}")
    np.fill_diagonal(r, 0.0)
    if symmetric:
        up = np.triu(r, 1)
        r = up + up.T
    return r


def generate(
    n: int, bwd: int, seed: int, stragglers: str = "mixed", symmetric: bool = False
) -> SimTopology:
    """The paper-like topology of :mod:`this module <crew.sim.topogen>`'s docstring."""
    if not isinstance(n, int) or n < 2:
        raise TopologyGenError(f"n must be an int >= 2, got {n!r}")
    if stragglers not in ("mixed", "none"):
        raise TopologyGenError(f"stragglers must be 'mixed' or 'none', got {stragglers!r}")
    rng = np.random.default_rng([seed, n, bwd])
    specs = tuple(
        MIXED_STRAGGLERS[i % len(MIXED_STRAGGLERS)] if stragglers == "mixed" else "2"
        for i in range(n)
    )
    pairs = ", symmetric pairs" if symmetric else ""
    return SimTopology(
        name=f"gen-n{n}-bwd{bwd}-s{seed}" + ("-sym" if symmetric else ""),
        names=tuple(f"w{i}" for i in range(n)),
        clouds=tuple(f"cloud-{i}" for i in range(n)),
        rate_mbit=rates(n, bwd, rng, symmetric),
        delay_ms=np.zeros((n, n)),
        stragglers=specs,
        description=f"generated: {n} clouds, bwd={bwd}{pairs}, seed {seed},"
        f" stragglers {stragglers}",
    )
