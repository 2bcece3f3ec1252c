"""Training data for the lab's workers: scikit-learn's bundled digits set, split and sharded.

No torch here: the coordinator and tests can shard data without paying for ``import torch``.

Data: ``sklearn.datasets.load_digits`` (1797 8x8 images, 10 classes, ships with scikit-learn,
no download). Pixels (0..16) are scaled to [0, 1] as float32; labels are int64.

Split cache: importing scikit-learn costs each process about 1.4 s of CPU, as much as importing
torch. Eight workers starting at once on two cores would spend 11 s of CPU on it, so
:func:`load_split` can keep the split in an ``.npz`` file: the lab writes it once before it
starts the workers, which then read it with NumPy alone. A cache that is missing or unreadable
is (re)made from scikit-learn, so a worker never depends on it being there.

Sharding (every worker calls :func:`shard` with the same ``n``, ``partition`` and ``seed``
and its own ``index``, so shards are disjoint and together cover the train set):

* ``Partition.IID``: a seeded permutation of the train set, dealt into ``n`` contiguous
  chunks of near-equal size. Each shard has roughly the global label mix.
* ``Partition.NON_IID``: label-skewed by *sort and deal*: samples are sorted by label (ties
  broken by a seeded permutation), and the sorted sequence is dealt into ``n`` contiguous
  chunks. With ``n <= 10`` each shard holds about ``10 / n`` labels; with ``n = 10`` each shard
  is dominated by a single label. This is the pathological non-IID split of McMahan et al.
  with one chunk per worker; it is deterministic and needs no concentration parameter.
"""

from __future__ import annotations

import enum
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crew.plan.modelsize import INPUT_DIM, NUM_CLASSES

log = logging.getLogger(__name__)

_PIXEL_MAX = 16.0  # digits pixels are integers in 0..16


class Partition(enum.Enum):
    """How the train set is divided among workers."""

    IID = "iid"
    NON_IID = "non-iid"


class DatasetError(ValueError):
    """A data set or sharding argument is invalid; the message names the field."""


@dataclass(frozen=True)
class Shard:
    """Features ``x`` (float32, shape (m, 64), values in [0, 1]) and labels ``y`` (int64, (m,)).

    The arrays are made read-only so the frozen dataclass is frozen in fact too.
    """

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if not isinstance(self.x, np.ndarray) or self.x.dtype != np.float32:
            raise DatasetError(f"Shard.x must be a float32 ndarray, got {_describe(self.x)}")
        if not isinstance(self.y, np.ndarray) or self.y.dtype != np.int64:
            raise DatasetError(f"Shard.y must be an int64 ndarray, got {_describe(self.y)}")
        if self.x.ndim != 2 or self.x.shape[1] != INPUT_DIM:
            raise DatasetError(f"Shard.x must have shape (m, {INPUT_DIM}), got {self.x.shape}")
        if self.y.shape != (self.x.shape[0],):
            raise DatasetError(
                f"Shard.y must have shape ({self.x.shape[0]},) to match x, got {self.y.shape}"
            )
        if self.y.size and (self.y.min() < 0 or self.y.max() >= NUM_CLASSES):
            raise DatasetError(f"Shard.y labels must be in [0, {NUM_CLASSES}), got out-of-range")
        self.x.flags.writeable = False
        self.y.flags.writeable = False

    def __len__(self) -> int:
        return int(self.y.shape[0])


def _describe(a: object) -> str:
    return f"{type(a).__name__} of dtype {a.dtype}" if isinstance(a, np.ndarray) else repr(type(a))


def load_split(
    seed: int = 0, test_fraction: float = 0.2, cache_dir: str | Path | None = None
) -> tuple[Shard, Shard]:
    """Return ``(train, test)``: a stratified, seeded split of the digits set.

    Deterministic for a given ``seed`` and ``test_fraction``. Stratified so the held-out
    accuracy is not skewed by an unlucky label mix. With ``cache_dir``, the split is read from
    (or, the first time, written to) ``split_cache_path(cache_dir, seed, test_fraction)``.
    """
    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    if cache_dir is None:
        return _split_from_sklearn(seed, test_fraction)
    path = split_cache_path(cache_dir, seed, test_fraction)
    if path.is_file():
        try:
            return _read_split(path)
        except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as e:
            log.warning("split cache %s is unreadable (%s); making it again", path, e)
    train, test = _split_from_sklearn(seed, test_fraction)
    _write_split(path, train, test)
    return train, test


def split_cache_path(cache_dir: str | Path, seed: int, test_fraction: float) -> Path:
    return Path(cache_dir) / f"digits-seed{seed}-test{test_fraction:g}.npz"


def _split_from_sklearn(seed: int, test_fraction: float) -> tuple[Shard, Shard]:
    # Imported here: only the process that makes the split pays for scikit-learn.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (np.asarray(digits.data, dtype=np.float64) / _PIXEL_MAX).astype(np.float32)
    y = np.asarray(digits.target, dtype=np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    # train_test_split may return views of one buffer; copy so each Shard owns its arrays.
    return (
        Shard(np.ascontiguousarray(x_tr).copy(), np.ascontiguousarray(y_tr).copy()),
        Shard(np.ascontiguousarray(x_te).copy(), np.ascontiguousarray(y_te).copy()),
    )


def _read_split(path: Path) -> tuple[Shard, Shard]:
    """The cached split; Shard validation rejects a file with the wrong shapes or types."""
    with np.load(path, allow_pickle=False) as f:
        return Shard(f["x_train"], f["y_train"]), Shard(f["x_test"], f["y_test"])


def _write_split(path: Path, train: Shard, test: Shard) -> None:
    """Written atomically: workers that make the cache at once each replace it whole."""
    atomic_savez(path, x_train=train.x, y_train=train.y, x_test=test.x, y_test=test.y)


def atomic_savez(path: Path, **arrays: np.ndarray) -> None:
    """``np.savez`` to a temporary file in the same folder, then rename: a reader or a crash
    never sees a torn file. Shared by split caches and checkpoints."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def shard_indices(
    num_samples: int, labels: np.ndarray, n: int, partition: Partition, seed: int
) -> list[np.ndarray]:
    """Index arrays of all ``n`` shards (disjoint, covering ``range(num_samples)``)."""
    if not isinstance(partition, Partition):
        raise DatasetError(f"partition must be a Partition, got {partition!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DatasetError(f"n must be an int >= 1, got {n!r}")
    if n > num_samples:
        raise DatasetError(
            f"n={n} exceeds the train set size {num_samples}; a shard would be empty"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(num_samples)
    if partition is Partition.NON_IID:
        # Stable sort keeps the random order within each label, so ties are seeded too.
        order = order[np.argsort(labels[order], kind="stable")]
    return list(np.array_split(order, n))


def shard(train: Shard, n: int, index: int, partition: Partition, seed: int) -> Shard:
    """Shard ``index`` of ``n`` of ``train`` (see the module docstring for the partitions).

    Shards for ``index in range(n)`` are disjoint, cover ``train``, are all non-empty (sizes
    differ by at most one) and are deterministic in ``(n, partition, seed)``.
    """
    parts = shard_indices(len(train), train.y, n, partition, seed)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
        raise DatasetError(f"index must be an int in [0, n={n}), got {index!r}")
    idx = np.sort(parts[index])
    return Shard(train.x[idx].copy(), train.y[idx].copy())


def main(argv: list[str] | None = None) -> int:
    """``python -m crew.train.datasets --cache-dir DIR [--seed S]``: write the split cache ahead of
    the workers (the lab runs it beside its network build, in a process of its own so the
    import of scikit-learn does not hold up the build's own Python)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m crew.train.datasets", description=main.__doc__)
    parser.add_argument("--cache-dir", type=Path, required=True, help="folder of the cache")
    parser.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    parser.add_argument(
        "--test-fraction", type=float, default=0.2, help="held-out share (default 0.2)"
    )
    args = parser.parse_args(argv)
    try:
        load_split(args.seed, args.test_fraction, cache_dir=args.cache_dir)
    except DatasetError as exc:
        parser.error(str(exc))
    print(split_cache_path(args.cache_dir, args.seed, args.test_fraction))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
