"""The two workloads behind one door: ``mlp`` (digits, the quick default) and ``lm``.

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
    MLP = "mlp"
    LM = "lm"


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
}


def num_params(workload: Workload, width: int = 640, depth: int = 3) -> int:
    """Elements of the flat vector (``width``/``depth`` shape the MLP only)."""
    if workload is Workload.LM:
        from crew.train.lm import LMConfig

        return LMConfig().num_params
    from crew.plan.modelsize import ModelConfig

    return ModelConfig(width=width, depth=depth).num_params


def prepare_cache(workload: Workload, cache_dir: str | Path, seed: int = 0) -> None:
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
):  # noqa: ANN201 - torch types stay out of this module's imports
    """The trainer of worker ``index`` of ``n``: its shard, the shared held-out set."""
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
