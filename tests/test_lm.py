"""The lm workload: stdlib text split and shards, the transformer's size, and its training."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from crew.train.datasets import DatasetError, Partition
from crew.train.lm import LMConfig, LMConfigError
from crew.train.textdata import (
    TextShard,
    load_text_split,
    stdlib_files,
    text_cache_path,
    text_shard,
    unigram_cross_entropy,
)

torch = pytest.importorskip("torch")

from crew.train.training import InnerOptimizer, TrainConfig, _Adam  # noqa: E402
from crew.train.transformer import CausalLM, LMTrainer  # noqa: E402

SMALL = LMConfig(d_model=32, layers=1, heads=2, context=32)
CAPS = {"train_bytes": 300_000, "test_bytes": 60_000}


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> tuple[TextShard, TextShard]:
    return load_text_split(cache_dir=tmp_path_factory.mktemp("text"), **CAPS)


def test_split_is_by_file_deterministic_and_cached(
    split: tuple[TextShard, TextShard], tmp_path: Path
) -> None:
    train, test = split
    assert len(train) >= CAPS["train_bytes"] and len(test) >= CAPS["test_bytes"]
    assert set(train.file_bytes()).isdisjoint(test.file_bytes())  # no file on both sides
    again = load_text_split(**CAPS)  # from the files, not the cache
    assert np.array_equal(again[0].data, train.data) and np.array_equal(again[1].data, test.data)
    load_text_split(cache_dir=tmp_path, **CAPS)
    path = text_cache_path(tmp_path, **CAPS)
    assert path.is_file()
    path.write_bytes(b"torn")  # an unreadable cache is made again
    assert np.array_equal(load_text_split(cache_dir=tmp_path, **CAPS)[0].data, train.data)
    assert b"def " in train.data.tobytes()


def test_stdlib_files_skip_tests_and_third_party() -> None:
    rels = [rel for rel, _ in stdlib_files()]
    assert "os.py" in rels
    assert not any(part in ("test", "site-packages") for r in rels for part in r.split("/"))


@pytest.mark.parametrize("partition", list(Partition))
def test_text_shards_disjoint_covering_balanced(
    split: tuple[TextShard, TextShard], partition: Partition
) -> None:
    train, _ = split
    shards = [text_shard(train, 5, i, partition, seed=2) for i in range(5)]
    sizes = [len(s) for s in shards]
    assert sum(sizes) == len(train) and max(sizes) - min(sizes) <= 1
    joined = np.concatenate([s.data for s in shards])
    assert np.array_equal(
        np.bincount(joined, minlength=256), np.bincount(train.data, minlength=256)
    )
    again = text_shard(train, 5, 3, partition, seed=2)
    assert np.array_equal(again.data, shards[3].data)
    with pytest.raises(DatasetError, match="index"):
        text_shard(train, 5, 5, partition, seed=2)


def test_textshard_validation() -> None:
    with pytest.raises(DatasetError, match="uint8"):
        TextShard(np.zeros(4, np.int64), np.zeros(1, np.int64))
    with pytest.raises(DatasetError, match="starts"):
        TextShard(np.zeros(4, np.uint8), np.array([1], np.int64))


def test_unigram_baseline_is_the_byte_entropy(split: tuple[TextShard, TextShard]) -> None:
    train, test = split
    h = unigram_cross_entropy(train, test)
    assert 2.5 < h < 4.0  # Python source: about 4.5 to 5 bits per byte
    uniform = TextShard(np.arange(256, dtype=np.uint8).repeat(4), np.zeros(1, np.int64))
    assert unigram_cross_entropy(uniform, uniform) == pytest.approx(math.log(256))


@pytest.mark.parametrize(
    "cfg", [LMConfig(), SMALL, LMConfig(d_model=48, layers=3, heads=4, context=16)]
)
def test_param_count_matches_torch(cfg: LMConfig) -> None:
    assert sum(p.numel() for p in CausalLM(cfg).parameters()) == cfg.num_params


def test_lm_config_validation() -> None:
    with pytest.raises(LMConfigError, match="multiple of heads"):
        LMConfig(d_model=30, heads=4)
    with pytest.raises(LMConfigError, match="LMConfig.layers"):
        LMConfig(layers=0)


def test_model_is_causal() -> None:
    torch.manual_seed(0)
    model = CausalLM(SMALL).eval()
    a = torch.randint(0, 256, (1, 20))
    b = a.clone()
    b[0, 12:] = (b[0, 12:] + 1) % 256  # change only the future of position 11
    with torch.no_grad():
        assert torch.allclose(model(a)[0, :12], model(b)[0, :12], atol=1e-6)
        assert not torch.allclose(model(a)[0, 12:], model(b)[0, 12:])


@pytest.mark.parametrize("lr", [1e-3, 3e-2])
def test_adam_step_matches_torch_optim(lr: float) -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    mine, ref = _Adam(list(a.parameters()), lr), torch.optim.Adam(b.parameters(), lr=lr)
    for _ in range(5):
        x = torch.randn(8, 5)
        for model, opt in ((a, mine), (b, ref)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_lm_trains_below_the_unigram_baseline(split: tuple[TextShard, TextShard]) -> None:
    train, test = split
    cfg = TrainConfig(lr=3e-3, batch_size=16, optimizer=InnerOptimizer.ADAM)
    t = LMTrainer(SMALL, cfg, text_shard(train, 2, 0, Partition.IID, 0), test, eval_windows=32)
    start, _ = t.evaluate()
    assert start == pytest.approx(math.log(256), abs=0.3)  # the small init predicts ~uniform
    for _ in range(150):
        t.step()
    loss, acc = t.evaluate()
    assert loss < unigram_cross_entropy(train, test) - 0.2 and acc > 0.2


def test_lm_vector_and_checkpoint_round_trip(
    split: tuple[TextShard, TextShard], tmp_path: Path
) -> None:
    train, test = split
    cfg = TrainConfig(lr=3e-3, batch_size=4, optimizer=InnerOptimizer.ADAM)
    t = LMTrainer(SMALL, cfg, train, test, eval_windows=4)
    t.step()
    t.save(tmp_path / "lm.npz")
    other = LMTrainer(SMALL, cfg, train, test, eval_windows=4)
    other.load(tmp_path / "lm.npz")
    assert np.array_equal(other.get_vector(), t.get_vector()) and other.iteration == 1
    assert other.evaluate() == t.evaluate()
    wider = LMTrainer(LMConfig(d_model=64, layers=1, heads=2, context=32), cfg, train, test)
    from crew.train.training import CheckpointError

    with pytest.raises(CheckpointError, match="d_model, layers, heads, context"):
        wider.load(tmp_path / "lm.npz")


@pytest.mark.parametrize("workload", ["mlp", "lm"])
def test_make_trainer_builds_each_workload_at_its_size(workload: str, tmp_path: Path) -> None:
    from crew.train.workloads import DEFAULTS, Workload, make_trainer, num_params, prepare_cache

    w = Workload(workload)
    prepare_cache(w, tmp_path)
    assert any(tmp_path.glob("*.npz"))
    t = make_trainer(
        w,
        n=4,
        index=1,
        partition=Partition.IID,
        seed=0,
        lr=DEFAULTS[w].lr,
        batch_size=DEFAULTS[w].batch_size,
        local_steps=1,
        cache_dir=tmp_path,
    )
    assert t.num_params == num_params(w) == t.get_vector().size
    assert math.isfinite(t.step())
