"""The workloads behind one door: ``mlp`` (digits, the quick default), ``lm`` and ``synthetic``
(a vector of ``model_mb`` MB and no model, for runs at scale: :mod:`crew.train.synthetic`).

The worker builds its trainer with :func:`make_trainer`; the coordinator and planner size the
vector with :func:`num_params` without importing torch; the lab writes the data cache once
with :func:`prepare_cache` before the workers start. Defaults per workload
(:data:`DEFAULTS`): the MLP trains with SGD, lr 0.05, batch 32; the transformer with Adam,
lr 3e-3, batch 16 (measured in :mod:`crew.train.lm`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from crew.train.datasets import Partition


class Workload(enum.Enum):
    """What each worker computes between reduces (``--workload``)."""

    MLP = "mlp"  # digits classification: the quick default
    LM = "lm"  # a small transformer language model (crew.train.lm)
    SYNTHETIC = "synthetic"  # no torch: a verifiable vector (crew.train.synthetic), for scale


@dataclass(frozen=True)
class WorkloadDefaults:
    lr: float
    batch_size: int
    optimizer: str  # crew.train.training.InnerOptimizer value
    quality: str  # what evaluate()'s second number is


DEFAULTS = {
    Workload.MLP: WorkloadDefaults(lr=0.05, batch_size=32, optimizer="sgd", quality="accuracy"),
    Workload.LM: WorkloadDefaults(
        lr=3e-3, batch_size=16, optimizer="adam", quality="next-byte accuracy"
    ),
    # No optimiser runs; lr and batch size are unused.
    Workload.SYNTHETIC: WorkloadDefaults(
        lr=0.05, batch_size=32, optimizer="sgd", quality="share of averages verified"
    ),
}


def num_params(
    workload: Workload, width: int = 640, depth: int = 3, *, model_mb: float = 4.0, n: int = 1
) -> int:
    """Elements of the flat vector (``width``/``depth`` shape the MLP only; ``model_mb`` and
    the ``n`` workers its header names size the synthetic vector)."""
    if workload is Workload.SYNTHETIC:
        from crew.train.synthetic import elements_for

        return elements_for(model_mb, n)
    if workload is Workload.LM:
        from crew.train.lm import LMConfig

        return LMConfig().num_params
    from crew.plan.modelsize import ModelConfig

    return ModelConfig(width=width, depth=depth).num_params


def prepare_cache(workload: Workload, cache_dir: str | Path, seed: int = 0) -> None:
    if workload is Workload.SYNTHETIC:
        return  # no data: the vector follows from the seed
    if workload is Workload.LM:
        from crew.train.textdata import load_text_split

        load_text_split(cache_dir=cache_dir)
    else:
        from crew.train.datasets import load_split

        load_split(seed=seed, cache_dir=cache_dir)


def make_trainer(
    workload: Workload,
    *,
    n: int,
    index: int,
    partition: Partition,
    seed: int,
    lr: float,
    batch_size: int,
    local_steps: int,
    cache_dir: str | Path | None,
    width: int = 640,
    depth: int = 3,
    model_mb: float = 4.0,
    verify: bool = True,
):  # noqa: ANN201 - torch types stay out of this module's imports
    """The trainer of worker ``index`` of ``n``: its shard, the shared held-out set. The
    synthetic workload has neither; it imports no torch, and ``verify`` says whether it
    checks each average exactly (not with a lossy wire codec)."""
    if workload is Workload.SYNTHETIC:
        from crew.train.synthetic import SyntheticRule, SyntheticTrainer, elements_for

        rule = SyntheticRule(seed, n, elements_for(model_mb, n))
        return SyntheticTrainer(rule, index, verify=verify)
    from crew.train.training import InnerOptimizer, TrainConfig

    cfg = TrainConfig(
        lr=lr,
        batch_size=batch_size,
        local_steps=local_steps,
        seed=seed,
        optimizer=InnerOptimizer(DEFAULTS[workload].optimizer),
    )
    if workload is Workload.LM:
        from crew.train.lm import LMConfig
        from crew.train.textdata import load_text_split, text_shard
        from crew.train.transformer import LMTrainer

        train, test = load_text_split(cache_dir=cache_dir)
        return LMTrainer(LMConfig(), cfg, text_shard(train, n, index, partition, seed), test)
    from crew.train.datasets import load_split, shard
    from crew.train.training import ModelConfig, Trainer

    train, test = load_split(seed=seed, cache_dir=cache_dir)
    return Trainer(
        ModelConfig(width=width, depth=depth), cfg, shard(train, n, index, partition, seed), test
    )
