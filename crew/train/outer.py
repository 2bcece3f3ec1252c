"""When a worker reduces and what it sends: every step, LocalSGD, or DiLoCo outer steps.

Pure NumPy, no torch, no sockets: the worker hands it flat float32 vectors and gets back what
to send and what to load. The worker's loop with an :class:`OuterLoop` ``loop``::

    after each local SGD step s (1, 2, ...):
        if loop.ready_to_reduce(s):                 # every H-th step
            vector = loop.before_reduce(model)      # what this member offers the group
            ... partial reduce of vector (weights w_m, sum 1) ...
            committed: model = loop.after_reduce(result)
            abandoned: loop.on_abandon()            # model stays as it is

(With ``TrainConfig.local_steps = H`` the Trainer's ``step()`` already runs H steps per
iteration, and the worker is ready after every iteration, as today.)

Modes (``H`` = ``local_steps``):

* ``every-step``: H = 1, send the model, load the average (today's behaviour).
* ``local-sgd``: the same every H steps (model averaging, Stich 2019 / Lin et al. 2020).
* ``diloco``: each member keeps ``theta``, its parameters at its last synchronisation, and an
  outer momentum buffer ``b`` (zero at the start). At a reduce, with the local model ``x``:
  pseudo-gradient ``g = theta - x``; ``b' = mu b + g``; Nesterov step
  ``y = theta - lr_out (g + mu b')``. The member sends ``y``; the group's weighted average
  ``sum_m w_m y_m`` becomes the new model and the new ``theta``, and ``b'`` becomes ``b``.

Why the member sends ``y`` (its outer step) rather than ``g``: ``y`` is linear in ``theta``,
``g`` and ``b``, so when the members share ``theta`` and ``b`` (full participation, as in
DiLoCo), ``sum w_m y_m = theta - lr_out (g_avg + mu (mu b + g_avg))``: exactly the outer
Nesterov step on the averaged pseudo-gradient, with the averaged momentum, in one model-sized
vector. Under partial reduce the members of a group come from different earlier groups, so
their ``theta`` differ; averaging only ``g`` would leave every member on its own ``theta`` with
nothing pulling them together (the bases drift apart like independent runs), while averaging
``theta`` and ``g`` separately costs two vectors. Averaging ``y`` averages the bases too, which
is what keeps partial-reduce members in consensus, at the cost of one vector.

Outer momentum under partial reduce: each member's ``b`` accumulates its own pseudo-gradients
(``b' = mu b + g_m``), not the group's. A group's update then carries the weighted average of
its members' buffers, ``sum w_m b'_m``, which equals DiLoCo's buffer under full participation.
A member whose group is *abandoned* (not in a group this time) drops ``b'`` and ``y``: ``theta``
and ``b`` stay, and it trains on from its local ``x``, so its next pseudo-gradient covers the
steps of both rounds and no work is lost. It does not apply an outer step on its own: with
``lr_out`` near 1 and Nesterov, a step on one shard's pseudo-gradient amplifies that shard's
direction (non-IID shards), and its momentum would count the same steps again next round.

Staleness weights (``crew.control.grouping``) multiply ``y_m``, so a stale member's base and its
step both count less; the weights sum to 1, so the result is a convex combination of the members'
proposed models. LocalSGD is DiLoCo with ``lr_out = 1, mu = 0`` (then ``y = x``).

Wire format and compression: ``y`` is a model, not a small delta, so an int8 encode adds about
4e-3 relative error to it (``crew.train.compress``; ``lab.studies.codecstudy`` measures it), and one
local step moves most weights by less than half an int8 step; the engine's codec therefore keeps
each node's rounding residual and sends it with the node's next encode (error feedback,
``crew.train.partcodec``).
"""

from __future__ import annotations

import enum
import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crew.train.datasets import atomic_savez

__all__ = ["OuterConfig", "OuterConfigError", "OuterLoop", "OuterStateError", "SyncMode"]


class SyncMode(enum.Enum):
    EVERY_STEP = "every-step"
    LOCAL_SGD = "local-sgd"
    DILOCO = "diloco"


class OuterConfigError(ValueError):
    """An outer-loop setting is out of range; the message names it."""


class OuterStateError(ValueError):
    """A vector or saved state does not fit this outer loop."""


@dataclass(frozen=True)
class OuterConfig:
    """``local_steps`` is H (must be 1 for ``every-step``); ``outer_lr`` and
    ``outer_momentum`` (Nesterov) are used by ``diloco`` only."""

    mode: SyncMode = SyncMode.EVERY_STEP
    local_steps: int = 1
    outer_lr: float = 0.7
    outer_momentum: float = 0.9

    def __post_init__(self) -> None:
        if not isinstance(self.mode, SyncMode):
            raise OuterConfigError(f"OuterConfig.mode must be a SyncMode, got {self.mode!r}")
        h = self.local_steps
        if not isinstance(h, int) or isinstance(h, bool) or h < 1:
            raise OuterConfigError(f"OuterConfig.local_steps must be an int >= 1, got {h!r}")
        if self.mode is SyncMode.EVERY_STEP and h != 1:
            raise OuterConfigError(f"every-step mode reduces after each step; local_steps={h}")
        lr, mu = self.outer_lr, self.outer_momentum
        if not (isinstance(lr, int | float) and math.isfinite(lr) and 0 < lr <= 2):
            raise OuterConfigError(f"OuterConfig.outer_lr must be in (0, 2], got {lr!r}")
        if not (isinstance(mu, int | float) and 0 <= mu < 1):
            raise OuterConfigError(f"OuterConfig.outer_momentum must be in [0, 1), got {mu!r}")


class OuterLoop:
    """One member's outer state. ``start``: the common initial parameters (every member builds
    the same model from the same seed, so every ``theta`` starts equal)."""

    def __init__(self, cfg: OuterConfig, start: np.ndarray) -> None:
        self.cfg = cfg
        self._n = _check(start, None, "start").size
        diloco = cfg.mode is SyncMode.DILOCO
        self._theta = start.astype(np.float32, copy=True) if diloco else None
        self._momentum = np.zeros(self._n, np.float32) if diloco else None
        self._pending: np.ndarray | None = None  # b' of the offer in flight
        self.reduces = 0  # committed reduces

    def ready_to_reduce(self, local_step: int) -> bool:
        """True after every ``local_steps``-th local step (steps count from 1)."""
        return local_step > 0 and local_step % self.cfg.local_steps == 0

    def before_reduce(self, model: np.ndarray) -> np.ndarray:
        """The vector to offer the group (a new array; ``model`` is not changed)."""
        x = _check(model, self._n, "model")
        if self._theta is None:
            return x.copy()
        lr = np.float32(self.cfg.outer_lr)
        mu = np.float32(self.cfg.outer_momentum)
        g = self._theta - x
        b = mu * self._momentum + g
        self._pending = b
        return self._theta - lr * (g + mu * b)

    def after_reduce(self, averaged: np.ndarray) -> np.ndarray:
        """Commit a group's result; returns the vector to load into the model."""
        result = _check(averaged, self._n, "averaged").copy()
        if self._theta is not None:
            if self._pending is None:
                raise OuterStateError("after_reduce without a before_reduce in flight")
            self._momentum = self._pending
            self._theta = result.copy()
            self._pending = None
        self.reduces += 1
        return result

    def on_abandon(self) -> None:
        """The group did not commit: keep ``theta`` and the momentum; the model trains on."""
        self._pending = None

    @property
    def theta(self) -> np.ndarray | None:
        return None if self._theta is None else self._theta.copy()

    @property
    def momentum(self) -> np.ndarray | None:
        return None if self._momentum is None else self._momentum.copy()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Checkpoint ``theta``, the momentum and the reduce count (atomic ``.npz``)."""
        arrays: dict[str, np.ndarray] = {"reduces": np.int64(self.reduces)}
        if self._theta is not None:
            arrays |= {"theta": self._theta, "momentum": self._momentum}
        atomic_savez(Path(path), **arrays)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore a :meth:`save` of the same mode and size; OuterStateError otherwise."""
        try:
            with np.load(Path(path), allow_pickle=False) as f:
                reduces = int(f["reduces"])
                theta = np.asarray(f["theta"]) if "theta" in f else None
                momentum = np.asarray(f["momentum"]) if "momentum" in f else None
        except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as exc:
            raise OuterStateError(f"cannot read outer state {path}: {exc}") from exc
        if (theta is None) != (self._theta is None):
            raise OuterStateError(f"outer state {path} is not for mode {self.cfg.mode.value}")
        if theta is not None:
            self._theta = _check(theta, self._n, "theta").copy()
            self._momentum = _check(momentum, self._n, "momentum").copy()
        self._pending = None
        self.reduces = reduces


def _check(v: object, n: int | None, name: str) -> np.ndarray:
    if not isinstance(v, np.ndarray) or v.dtype != np.float32 or v.ndim != 1:
        raise OuterStateError(f"{name} must be a 1-D float32 ndarray")
    if n is not None and v.size != n:
        raise OuterStateError(f"{name} has {v.size} elements, expected {n}")
    if not np.isfinite(v).all():
        raise OuterStateError(f"{name} has non-finite entries")
    return v
