"""Data split and sharding, model size arithmetic, and the torch Trainer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crew.plan.modelsize import ModelConfig, ModelConfigError
from crew.train.datasets import (
    DatasetError,
    Partition,
    Shard,
    load_split,
    shard,
    shard_indices,
    split_cache_path,
)

torch = pytest.importorskip("torch")

from crew.train.training import (  # noqa: E402  (after the importorskip guard)
    CheckpointError,
    TrainConfig,
    TrainConfigError,
    Trainer,
    VectorError,
    build_model,
)

SMALL = ModelConfig(width=32, depth=1)


@pytest.fixture(scope="module")
def split() -> tuple[Shard, Shard]:
    return load_split(seed=0)


# --- data ---------------------------------------------------------------------------------


def test_load_split_is_deterministic_scaled_and_typed(split: tuple[Shard, Shard]) -> None:
    train, test = split
    again_train, again_test = load_split(seed=0)
    assert np.array_equal(train.x, again_train.x) and np.array_equal(train.y, again_train.y)
    assert np.array_equal(test.x, again_test.x)
    assert len(train) + len(test) == 1797
    assert len(test) == pytest.approx(0.2 * 1797, abs=1)
    assert train.x.dtype == np.float32 and train.y.dtype == np.int64
    assert train.x.min() >= 0.0 and train.x.max() <= 1.0 and train.x.max() > 0.9
    assert set(np.unique(test.y)) == set(range(10))
    other_train, _ = load_split(seed=1)
    assert not np.array_equal(train.y, other_train.y)


def test_load_split_rejects_bad_fraction() -> None:
    with pytest.raises(DatasetError, match="test_fraction"):
        load_split(test_fraction=1.0)


def _row_keys(s: Shard) -> list[bytes]:
    return [row.tobytes() + bytes([int(lbl)]) for row, lbl in zip(s.x, s.y, strict=True)]


@pytest.mark.parametrize("partition", list(Partition))
@pytest.mark.parametrize("n", [1, 3, 8])
def test_shards_disjoint_covering_nonempty(
    split: tuple[Shard, Shard], partition: Partition, n: int
) -> None:
    train, _ = split
    parts = shard_indices(len(train), train.y, n, partition, seed=5)
    joined = np.concatenate(parts)
    assert sorted(joined.tolist()) == list(range(len(train)))  # disjoint and covering
    assert all(len(p) > 0 for p in parts)
    shards = [shard(train, n, i, partition, seed=5) for i in range(n)]
    assert sum(len(s) for s in shards) == len(train)
    # The same content as the train set, row for row (as a multiset).
    assert sorted(k for s in shards for k in _row_keys(s)) == sorted(_row_keys(train))


@pytest.mark.parametrize("partition", list(Partition))
def test_shards_deterministic_for_seed(split: tuple[Shard, Shard], partition: Partition) -> None:
    train, _ = split
    a = shard(train, 4, 2, partition, seed=11)
    b = shard(train, 4, 2, partition, seed=11)
    c = shard(train, 4, 2, partition, seed=12)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x, c.x)


def _majority_share(s: Shard) -> float:
    return float(np.bincount(s.y, minlength=10).max() / len(s))


def test_non_iid_shards_are_label_skewed(split: tuple[Shard, Shard]) -> None:
    train, _ = split
    n = 10
    iid = [shard(train, n, i, Partition.IID, seed=0) for i in range(n)]
    skew = [shard(train, n, i, Partition.NON_IID, seed=0) for i in range(n)]
    iid_share = np.mean([_majority_share(s) for s in iid])
    skew_share = np.mean([_majority_share(s) for s in skew])
    assert iid_share < 0.25  # about 1/10 plus noise
    assert skew_share > 0.8  # sort-and-deal: each shard is nearly one label
    assert np.mean([len(np.unique(s.y)) for s in skew]) <= 2.5
    assert np.mean([len(np.unique(s.y)) for s in iid]) == 10


@pytest.mark.parametrize(
    ("n", "index", "fragment"),
    [(0, 0, "n must be"), (3, 3, "index must be"), (3, -1, "index must be"), (10**6, 0, "exceeds")],
)
def test_shard_rejects_bad_arguments(
    split: tuple[Shard, Shard], n: int, index: int, fragment: str
) -> None:
    with pytest.raises(DatasetError, match=fragment):
        shard(split[0], n, index, Partition.IID, seed=0)


def test_shard_arrays_are_read_only(split: tuple[Shard, Shard]) -> None:
    with pytest.raises(ValueError):
        split[0].x[0, 0] = 1.0


def test_shard_validates_fields() -> None:
    with pytest.raises(DatasetError, match="Shard.x"):
        Shard(np.zeros((3, 64), dtype=np.float64), np.zeros(3, dtype=np.int64))
    with pytest.raises(DatasetError, match="Shard.y"):
        Shard(np.zeros((3, 64), dtype=np.float32), np.zeros(2, dtype=np.int64))


# --- model size ---------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [ModelConfig(), ModelConfig(1, 1), ModelConfig(17, 4), SMALL])
def test_size_arithmetic_equals_torch_count(cfg: ModelConfig) -> None:
    count = sum(p.numel() for p in build_model(cfg).parameters())
    assert cfg.num_params == count
    assert cfg.size_bytes == 4 * count


def test_default_model_size() -> None:
    assert ModelConfig().num_params == 868_490


@pytest.mark.parametrize(("field", "value"), [("width", 0), ("depth", -1), ("width", 2.5)])
def test_model_config_rejects_bad_fields(field: str, value: object) -> None:
    with pytest.raises(ModelConfigError, match=f"ModelConfig.{field}"):
        ModelConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [("lr", 0.0), ("lr", float("nan")), ("momentum", 1.0), ("batch_size", 0), ("local_steps", 0)],
)
def test_train_config_rejects_bad_fields(field: str, value: object) -> None:
    with pytest.raises(TrainConfigError, match=f"TrainConfig.{field}"):
        TrainConfig(**{field: value})  # type: ignore[arg-type]


# --- trainer ------------------------------------------------------------------------------


def _trainer(split: tuple[Shard, Shard], part: Shard | None = None, **kw: object) -> Trainer:
    train, test = split
    return Trainer(SMALL, TrainConfig(**kw), part if part is not None else train, test)  # type: ignore[arg-type]


def test_same_seed_same_initial_weights(split: tuple[Shard, Shard]) -> None:
    train, _ = split
    a = _trainer(split, shard(train, 2, 0, Partition.IID, 0), seed=3)
    b = _trainer(split, shard(train, 2, 1, Partition.IID, 0), seed=3)
    c = _trainer(split, seed=4)
    assert np.array_equal(a.get_vector(), b.get_vector())
    assert not np.array_equal(a.get_vector(), c.get_vector())


def test_vector_round_trip(split: tuple[Shard, Shard]) -> None:
    t = _trainer(split)
    v = t.get_vector()
    assert v.dtype == np.float32 and v.shape == (SMALL.num_params,)
    new = np.linspace(-0.1, 0.1, v.size, dtype=np.float32)
    t.set_vector(new)
    assert np.array_equal(t.get_vector(), new)
    new[:] = 0  # the trainer copied the caller's buffer
    assert not np.array_equal(t.get_vector(), new)
    got = t.get_vector()
    got[:] = 7  # and get_vector hands out a copy
    assert not np.array_equal(t.get_vector(), got)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda n: np.zeros(n - 1, dtype=np.float32), "length"),
        (lambda n: np.zeros(n, dtype=np.float64), "float32, got float64"),
        (lambda n: np.zeros((1, n), dtype=np.float32), "1-D"),
        (lambda n: np.full(n, np.nan, dtype=np.float32), "non-finite"),
        (lambda n: np.where(np.arange(n) == 5, np.inf, 0).astype(np.float32), "non-finite"),
        (lambda n: [0.0] * n, "numpy array, got list"),
    ],
)
def test_set_vector_rejects_bad_input_without_change(
    split: tuple[Shard, Shard], make, fragment: str
) -> None:
    t = _trainer(split)
    before = t.get_vector()
    with pytest.raises(VectorError, match=fragment):
        t.set_vector(make(SMALL.num_params))
    assert np.array_equal(t.get_vector(), before)


def test_training_reaches_high_accuracy(split: tuple[Shard, Shard]) -> None:
    t = _trainer(split, seed=0)
    _, acc0 = t.evaluate()
    losses = [t.step() for _ in range(400)]
    loss, acc = t.evaluate()
    assert t.iteration == 400
    assert acc0 < 0.3
    assert acc > 0.8
    assert np.mean(losses[-50:]) < np.mean(losses[:50])
    assert np.isfinite(loss)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_step_matches_torch_optim(split: tuple[Shard, Shard], momentum: float) -> None:
    """Trainer's own SGD must follow torch.optim.SGD's update rule step for step."""
    cfg = TrainConfig(lr=0.05, batch_size=16, local_steps=3, seed=4, momentum=momentum)
    ours = Trainer(SMALL, cfg, shard(split[0], 4, 0, Partition.IID, 0), split[1])
    ref = Trainer(SMALL, cfg, shard(split[0], 4, 0, Partition.IID, 0), split[1])
    ref._opt = torch.optim.SGD(ref._model.parameters(), lr=cfg.lr, momentum=momentum)
    for _ in range(5):
        assert ours.step() == pytest.approx(ref.step(), rel=1e-6)
    assert np.allclose(ours.get_vector(), ref.get_vector(), rtol=1e-5, atol=1e-6)
    assert not np.array_equal(ours.get_vector(), _trainer(split, seed=4).get_vector())


def test_local_steps_count_as_one_iteration(split: tuple[Shard, Shard]) -> None:
    t = _trainer(split, local_steps=3)
    before = t.get_vector()
    t.step()
    assert t.iteration == 1
    assert not np.array_equal(t.get_vector(), before)


def test_after_step_runs_between_the_local_steps(split: tuple[Shard, Shard]) -> None:
    t = _trainer(split, local_steps=3)
    seen: list[tuple[int, np.ndarray]] = []
    t.step(lambda done: seen.append((done, t.get_vector())))
    assert [done for done, _ in seen] == [1, 2, 3]
    vectors = [v for _, v in seen]
    assert all(not np.array_equal(a, b) for a, b in zip(vectors, vectors[1:], strict=False))
    assert np.array_equal(vectors[-1], t.get_vector())  # the last call comes after the last step
    # What the hook loads is where the next step starts from: the overlapped result's place.
    start = np.zeros_like(t.get_vector())
    t.step(lambda done: t.set_vector(start) if done == 1 else None)
    assert np.linalg.norm(t.get_vector()) < np.linalg.norm(vectors[-1])


def test_model_averaging_keeps_training(split: tuple[Shard, Shard]) -> None:
    train, _ = split
    trainers = [_trainer(split, shard(train, 2, i, Partition.IID, 0), seed=0) for i in range(2)]
    for _ in range(8):
        for t in trainers:
            for _ in range(25):
                t.step()
        avg = (trainers[0].get_vector() + trainers[1].get_vector()) / np.float32(2)
        for t in trainers:
            t.set_vector(avg.astype(np.float32))
    assert np.array_equal(trainers[0].get_vector(), trainers[1].get_vector())
    assert trainers[0].evaluate()[1] > 0.8


def test_checkpoint_round_trip(split: tuple[Shard, Shard], tmp_path: Path) -> None:
    t = _trainer(split, seed=1)
    for _ in range(5):
        t.step()
    path = tmp_path / "ckpt" / "w0.pt"  # the worker names checkpoints *.pt
    t.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["w0.pt"]  # no temp file, no added suffix
    fresh = _trainer(split, seed=2)
    fresh.load(path)
    assert fresh.iteration == 5
    assert np.array_equal(fresh.get_vector(), t.get_vector())
    assert fresh.evaluate() == t.evaluate()


def test_checkpoint_for_other_shape_rejected(split: tuple[Shard, Shard], tmp_path: Path) -> None:
    train, test = split
    other = Trainer(ModelConfig(width=16, depth=1), TrainConfig(), train, test)
    path = tmp_path / "other.npz"
    other.save(path)
    t = _trainer(split)
    before = t.get_vector()
    with pytest.raises(CheckpointError, match="width, depth"):
        t.load(path)
    with pytest.raises(CheckpointError, match="cannot read"):
        t.load(tmp_path / "missing.npz")
    assert np.array_equal(t.get_vector(), before) and t.iteration == 0


def test_split_cache_gives_the_same_split_without_sklearn(
    split: tuple[Shard, Shard], tmp_path: Path
) -> None:
    made = load_split(seed=0, cache_dir=tmp_path)
    path = split_cache_path(tmp_path, 0, 0.2)
    assert path.is_file()
    code = (
        "import sys; from crew.train.datasets import load_split;"
        f" tr, te = load_split(seed=0, cache_dir={str(tmp_path)!r});"
        " print(len(tr), len(te), 'sklearn' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [str(len(split[0])), str(len(split[1])), "False"]
    for a, b in zip(made, split, strict=True):
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)


@pytest.mark.parametrize("damage", [b"", b"not a zip file", b"PK\x03\x04 truncated"])
def test_unreadable_split_cache_is_made_again(
    split: tuple[Shard, Shard], tmp_path: Path, damage: bytes
) -> None:
    path = split_cache_path(tmp_path, 0, 0.2)
    path.write_bytes(damage)
    train, test = load_split(seed=0, cache_dir=tmp_path)
    assert np.array_equal(train.x, split[0].x) and np.array_equal(test.y, split[1].y)
    again, _ = load_split(seed=0, cache_dir=tmp_path)  # the remade file reads back
    assert np.array_equal(again.y, split[0].y)


def test_split_cache_with_wrong_arrays_is_made_again(
    split: tuple[Shard, Shard], tmp_path: Path
) -> None:
    path = split_cache_path(tmp_path, 0, 0.2)
    bad = np.zeros((3, 5), dtype=np.float32)
    np.savez(path, x_train=bad, y_train=bad, x_test=bad, y_test=bad)
    train, _ = load_split(seed=0, cache_dir=tmp_path)
    assert np.array_equal(train.x, split[0].x)
