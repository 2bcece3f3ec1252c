"""A worker's local training: an MLP on its digits shard, exposed as one flat float32 vector.

This is the only module in ``crew`` that imports torch. Everything the reduce schemes need
is the flat parameter vector (:meth:`Trainer.get_vector` / :meth:`Trainer.set_vector`); its
length and byte size are known without torch from :class:`crew.plan.modelsize.ModelConfig`.

Assumptions and choices:

* Same ``TrainConfig.seed`` => same initial weights on every worker (partial reduce averages
  models, which only makes sense from a common start). Initialisation draws from torch's
  global RNG inside ``fork_rng``, so building a Trainer does not disturb the caller's RNG.
* Minibatches are drawn without replacement from a per-epoch shuffle of the shard, by a numpy
  generator seeded from ``seed``; different shards give different batches anyway.
* Optimiser state (the SGD momentum buffer) stays local on ``set_vector``: averaging replaces
  the weights, not the velocity. It is not checkpointed either; a rejoining worker restarts
  its momentum from zero, which costs a few steps of warm-up and nothing else.
* The SGD step is written out here (:class:`_SGD`, PyTorch's update rule) rather than taken
  from ``torch.optim``: every ``torch.optim`` optimiser imports ``torch._dynamo`` (and sympy)
  on first use, about 1 s of CPU and tens of MB per process, which eight workers starting
  together on two cores pay for nothing. A test checks it against ``torch.optim.SGD``.
* ``torch.set_num_threads`` is process-wide: the lab runs one Trainer per worker process, and
  several workers share a couple of cores, so the default is one thread.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from crew.plan.modelsize import INPUT_DIM, NUM_CLASSES, ModelConfig
from crew.train.datasets import Shard, atomic_savez
from crew.vector import check_flat_float32

__all__ = [
    "CheckpointError",
    "DivergenceError",
    "FlatTrainer",
    "InnerOptimizer",
    "ModelConfig",
    "TrainConfig",
    "TrainConfigError",
    "Trainer",
    "VectorError",
    "build_model",
]

log = logging.getLogger(__name__)


class TrainConfigError(ValueError):
    """A training configuration field is out of range."""


class VectorError(ValueError):
    """A parameter vector handed to :meth:`Trainer.set_vector` is unusable."""


class CheckpointError(ValueError):
    """A checkpoint file is missing, malformed, or for a different model."""


class DivergenceError(RuntimeError):
    """Local training produced a non-finite loss (learning rate too high, or a bad vector)."""


class InnerOptimizer(enum.Enum):
    """The local (inner) optimiser: SGD for the MLP, Adam for the transformer."""

    SGD = "sgd"
    ADAM = "adam"


@dataclass(frozen=True)
class TrainConfig:
    """Local SGD settings. ``local_steps`` minibatch steps make one iteration (then *ready*)."""

    lr: float = 0.05
    momentum: float = 0.0
    batch_size: int = 32
    local_steps: int = 1
    seed: int = 0
    threads: int = 1
    optimizer: InnerOptimizer = InnerOptimizer.SGD

    def __post_init__(self) -> None:
        if not isinstance(self.optimizer, InnerOptimizer):
            raise TrainConfigError(
                f"TrainConfig.optimizer must be an InnerOptimizer, got {self.optimizer!r}"
            )
        if not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            raise TrainConfigError(f"TrainConfig.lr must be a finite float > 0, got {self.lr!r}")
        if not (isinstance(self.momentum, int | float) and 0.0 <= self.momentum < 1.0):
            raise TrainConfigError(f"TrainConfig.momentum must be in [0, 1), got {self.momentum!r}")
        for name in ("batch_size", "local_steps", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TrainConfigError(f"TrainConfig.{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise TrainConfigError(f"TrainConfig.seed must be an int >= 0, got {self.seed!r}")


def build_model(cfg: ModelConfig) -> nn.Sequential:
    """The MLP ``64 -> width (x depth, ReLU) -> 10`` described in :mod:`crew.plan.modelsize`."""
    layers: list[nn.Module] = []
    fan_in = INPUT_DIM
    for _ in range(cfg.depth):
        layers += [nn.Linear(fan_in, cfg.width), nn.ReLU()]
        fan_in = cfg.width
    layers.append(nn.Linear(fan_in, NUM_CLASSES))
    return nn.Sequential(*layers)


class _SGD:
    """Minibatch SGD with optional momentum, as ``torch.optim.SGD`` (no dampening, no weight
    decay, no Nesterov): ``buf = momentum * buf + grad`` (``buf = grad`` on the first step),
    ``param -= lr * buf``; without momentum, ``param -= lr * grad``."""

    def __init__(self, params: list[nn.Parameter], lr: float, momentum: float) -> None:
        self.params = params
        self.lr = lr
        self.momentum = momentum
        self._bufs: list[torch.Tensor | None] = [None] * len(params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for k, p in enumerate(self.params):
            if p.grad is None:
                continue
            d = p.grad
            if self.momentum:
                buf = self._bufs[k]
                if buf is None:
                    buf = self._bufs[k] = d.clone()
                else:
                    buf.mul_(self.momentum).add_(d)
                d = buf
            p.add_(d, alpha=-self.lr)


class _Adam:
    """Adam as ``torch.optim.Adam`` (no weight decay, no amsgrad), written out for the same
    reason as :class:`_SGD`: ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
    ``p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``. Like the SGD momentum, the
    moments stay local when the model is averaged."""

    def __init__(
        self,
        params: list[nn.Parameter],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.params = params
        self.lr = lr
        self.b1, self.b2 = betas
        self.eps = eps
        self._m = [torch.zeros_like(p) for p in params]
        self._v = [torch.zeros_like(p) for p in params]
        self._t = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self._t += 1
        c1 = 1 - self.b1**self._t
        c2 = math.sqrt(1 - self.b2**self._t)
        for p, m, v in zip(self.params, self._m, self._v, strict=True):
            if p.grad is None:
                continue
            g = p.grad
            m.mul_(self.b1).add_(g, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            denom = (v.sqrt() / c2).add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / c1)


def make_optimizer(params: list[nn.Parameter], cfg: TrainConfig) -> _SGD | _Adam:
    if cfg.optimizer is InnerOptimizer.ADAM:
        return _Adam(params, cfg.lr)
    return _SGD(params, cfg.lr, cfg.momentum)


class FlatTrainer:
    """A model, its optimiser and its data; steps locally and swaps flat float32 vectors.

    Subclasses give the model (built under ``fork_rng`` from the seed), ``_next_batch``,
    ``_loss``, ``evaluate`` and ``_shape`` (the checkpoint's identity). Not thread-safe: the
    worker calls it from one thread (its training loop).
    """

    def __init__(self, model: nn.Module, train_cfg: TrainConfig, expected_params: int) -> None:
        self.train_cfg = train_cfg
        self._model = model
        self._num_params = sum(p.numel() for p in self._model.parameters())
        if self._num_params != expected_params:  # guards the torch-free arithmetic
            raise AssertionError(
                f"torch model has {self._num_params} parameters, "
                f"the torch-free config says {expected_params}"
            )
        self._opt = make_optimizer(list(self._model.parameters()), train_cfg)
        self._iteration = 0

    @property
    def iteration(self) -> int:
        """Completed local iterations (each ``local_steps`` optimiser steps)."""
        return self._iteration

    @property
    def model(self) -> nn.Module:
        """The model itself (for ``crew.Averager``, which averages its parameters in place)."""
        return self._model

    @property
    def num_params(self) -> int:
        return self._num_params

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _loss(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _shape(self) -> dict[str, int]:
        raise NotImplementedError

    def evaluate(self) -> tuple[float, float]:
        raise NotImplementedError

    def step(self, after_step: Callable[[int], None] | None = None) -> float:
        """Run one local iteration (``local_steps`` optimiser steps); return the mean loss.

        ``after_step(k)`` is called after the k-th step (k = 1 .. local_steps), in this thread:
        the worker paces its steps there and applies an overlapped round's result as soon as
        it arrives. Raises DivergenceError (model left as it is) if a loss is not finite.
        """
        self._model.train()
        total = 0.0
        for done in range(1, self.train_cfg.local_steps + 1):
            xb, yb = self._next_batch()
            self._opt.zero_grad()
            loss = self._loss(xb, yb)
            value = float(loss.item())
            if not math.isfinite(value):
                raise DivergenceError(
                    f"non-finite training loss {value} at iteration {self._iteration}"
                )
            loss.backward()
            self._opt.step()
            total += value
            if after_step is not None:
                after_step(done)
        self._iteration += 1
        return total / self.train_cfg.local_steps

    def get_vector(self) -> np.ndarray:
        """A flat float32 copy of all parameters, in ``model.parameters()`` order."""
        with torch.no_grad():
            flat = nn.utils.parameters_to_vector(self._model.parameters())
        return flat.detach().numpy().astype(np.float32, copy=True)

    def set_vector(self, v: np.ndarray) -> None:
        """Load a flat float32 parameter vector. On any error the model is unchanged."""
        check_flat_float32(v, VectorError)
        if v.shape[0] != self._num_params:
            raise VectorError(f"vector length must be {self._num_params}, got {v.shape[0]}")
        if not np.isfinite(v).all():
            bad = int(np.count_nonzero(~np.isfinite(v)))
            raise VectorError(f"vector has {bad} non-finite entries (NaN or inf)")
        with torch.no_grad():
            # Copy so the caller may reuse its buffer (e.g. a receive buffer) afterwards.
            nn.utils.vector_to_parameters(torch.from_numpy(v.copy()), self._model.parameters())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Checkpoint the vector, iteration and model shape to ``path`` (an ``.npz`` file).

        Written to a temporary file and renamed, so a crash never leaves a torn checkpoint.
        """
        shape = {k: np.int64(v) for k, v in self._shape().items()}
        atomic_savez(
            Path(path), vector=self.get_vector(), iteration=np.int64(self._iteration), **shape
        )
        log.debug("saved checkpoint %s at iteration %d", path, self._iteration)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore vector and iteration from a :meth:`save` checkpoint of the same model shape.

        Raises CheckpointError (model unchanged) if the file is unreadable or for another shape.
        """
        expected = self._shape()
        try:
            with np.load(Path(path), allow_pickle=False) as data:
                vector = np.asarray(data["vector"])
                iteration = int(data["iteration"])
                shape = tuple(int(data[k]) for k in expected)
        except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as exc:
            raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
        if shape != tuple(expected.values()):
            names = ", ".join(expected)
            raise CheckpointError(
                f"checkpoint {path} is for ({names})={shape}, "
                f"this model is {tuple(expected.values())}"
            )
        if iteration < 0:
            raise CheckpointError(f"checkpoint {path} has negative iteration {iteration}")
        try:
            self.set_vector(vector)
        except VectorError as exc:
            raise CheckpointError(f"checkpoint {path}: {exc}") from exc
        self._iteration = iteration
        log.debug("loaded checkpoint %s at iteration %d", path, iteration)


class Trainer(FlatTrainer):
    """The MLP on a digits shard; ``evaluate`` gives held-out ``(loss, accuracy)``."""

    def __init__(
        self, model_cfg: ModelConfig, train_cfg: TrainConfig, shard: Shard, test: Shard
    ) -> None:
        if len(shard) == 0:
            raise ValueError("shard is empty: a worker needs at least one training sample")
        if len(test) == 0:
            raise ValueError("test is empty: evaluation needs at least one held-out sample")
        self.model_cfg = model_cfg
        torch.set_num_threads(train_cfg.threads)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(train_cfg.seed)
            model = build_model(model_cfg)
        super().__init__(model, train_cfg, model_cfg.num_params)
        self._loss_fn = nn.CrossEntropyLoss()
        # from_numpy needs writable arrays and Shard's are read-only: copy once, up front.
        self._x = torch.from_numpy(np.array(shard.x, dtype=np.float32))
        self._y = torch.from_numpy(np.array(shard.y, dtype=np.int64))
        self._x_test = torch.from_numpy(np.array(test.x, dtype=np.float32))
        self._y_test = torch.from_numpy(np.array(test.y, dtype=np.int64))
        self._rng = np.random.default_rng(train_cfg.seed)
        self._order = self._rng.permutation(len(shard))
        self._cursor = 0

    def _shape(self) -> dict[str, int]:
        return {"width": self.model_cfg.width, "depth": self.model_cfg.depth}

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        m = len(self._order)
        bs = min(self.train_cfg.batch_size, m)
        if self._cursor + bs > m:  # start a new epoch rather than return a short batch
            self._order = self._rng.permutation(m)
            self._cursor = 0
        idx = torch.from_numpy(self._order[self._cursor : self._cursor + bs])
        self._cursor += bs
        return self._x[idx], self._y[idx]

    def _loss(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return self._loss_fn(self._model(xb), yb)

    def evaluate(self) -> tuple[float, float]:
        """Held-out ``(mean cross-entropy loss, accuracy)`` on the test shard."""
        self._model.eval()
        with torch.no_grad():
            logits = self._model(self._x_test)
            loss = float(self._loss_fn(logits, self._y_test).item())
            acc = float((logits.argmax(dim=1) == self._y_test).float().mean().item())
        return loss, acc
