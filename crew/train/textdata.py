"""Text for the ``lm`` workload: the Python standard library's own source files, as bytes.

No torch, no download: every machine that runs the lab has a Python, and its standard library
is found with ``sysconfig.get_paths()["stdlib"]``. Files are the ``*.py`` files under it,
outside ``site-packages``/``dist-packages`` (third-party code) and the ``test``/``tests``/
``idlelib`` folders (the test suite is half of the library and mostly fixtures).

Split by file, deterministically: a file is held out when the first byte of the SHA-1 of its
path relative to the stdlib folder is below 26 (about 10%); paths, not contents, decide, so a
patched file stays on its side. Files are taken in SHA-1 order until ``train_bytes`` (held-out:
``test_bytes``) are reached, so the cap samples the whole library rather than its first
folders. The result depends only on the stdlib on the machine (its Python version): the
cache name carries the version.

Shards: ``Partition.IID`` deals the train files in a seeded random order, ``NON_IID`` in path
order (a worker then holds whole packages: email, asyncio, ...); either way the sequence is cut
at file boundaries into ``n`` runs of about equal bytes.

Cache: like :mod:`crew.train.datasets`, :func:`load_text_split` keeps the split in an ``.npz`` that
the lab writes once before the workers start; a missing or unreadable cache is made again.
Reading a few thousand files costs each process about a second, and the workers share 2 cores.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crew.train.datasets import DatasetError, Partition, atomic_savez

__all__ = [
    "TextShard",
    "load_text_split",
    "stdlib_files",
    "text_cache_path",
    "text_shard",
    "unigram_cross_entropy",
]

log = logging.getLogger(__name__)

TRAIN_BYTES = 6 << 20
TEST_BYTES = 512 << 10
_HELD_OUT_BELOW = 26  # first SHA-1 byte < 26 of 256: about 10% of files
_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}
)
_SEPARATOR = b"\n\n"


@dataclass(frozen=True)
class TextShard:
    """Bytes ``data`` (uint8, 1-D) made of whole files; ``starts``: each file's first byte."""

    data: np.ndarray
    starts: np.ndarray

    def __post_init__(self) -> None:
        if not isinstance(self.data, np.ndarray) or self.data.dtype != np.uint8:
            raise DatasetError("TextShard.data must be a uint8 ndarray")
        if self.data.ndim != 1:
            raise DatasetError(f"TextShard.data must be 1-D, got shape {self.data.shape}")
        if not isinstance(self.starts, np.ndarray) or self.starts.dtype != np.int64:
            raise DatasetError("TextShard.starts must be an int64 ndarray")
        s = self.starts
        if s.size and (s[0] != 0 or (np.diff(s) <= 0).any() or s[-1] >= self.data.size):
            raise DatasetError("TextShard.starts must rise strictly from 0 within data")
        self.data.flags.writeable = False
        self.starts.flags.writeable = False

    def __len__(self) -> int:
        return int(self.data.size)

    @property
    def files(self) -> int:
        return int(self.starts.size)

    def file_bytes(self) -> list[bytes]:
        ends = [*self.starts[1:].tolist(), self.data.size]
        return [self.data[a:b].tobytes() for a, b in zip(self.starts.tolist(), ends, strict=True)]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """``(relative path, path)`` of the stdlib's ``.py`` files, sorted by relative path."""
    root = stdlib_root() if root is None else root
    if not root.is_dir():
        raise DatasetError(f"no standard library folder at {root}")
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if _SKIP_DIRS.isdisjoint(rel.parts[:-1]) and p.is_file():
            out.append((rel.as_posix(), p))
    if not out:
        raise DatasetError(f"no .py files under {root}")
    return sorted(out)


def _digest(rel: str) -> bytes:
    return hashlib.sha1(rel.encode()).digest()


def text_cache_path(cache_dir: str | Path, train_bytes: int, test_bytes: int) -> Path:
    version = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    return Path(cache_dir) / f"pystdlib-{version}-train{train_bytes}-test{test_bytes}.npz"


def load_text_split(
    cache_dir: str | Path | None = None,
    train_bytes: int = TRAIN_BYTES,
    test_bytes: int = TEST_BYTES,
    root: Path | None = None,
) -> tuple[TextShard, TextShard]:
    """``(train, held_out)`` files of the stdlib, split and capped as the docstring says."""
    if train_bytes < 1 or test_bytes < 1:
        raise DatasetError(f"byte caps must be >= 1, got {train_bytes}, {test_bytes}")
    path = None if cache_dir is None else text_cache_path(cache_dir, train_bytes, test_bytes)
    if path is not None and path.is_file():
        try:
            with np.load(path, allow_pickle=False) as f:
                return (
                    TextShard(f["train"], f["train_starts"]),
                    TextShard(f["test"], f["test_starts"]),
                )
        except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as e:
            log.warning("text cache %s is unreadable (%s); making it again", path, e)
    files = sorted(stdlib_files(root), key=lambda f: _digest(f[0]))
    train: list[tuple[str, bytes]] = []
    test: list[tuple[str, bytes]] = []
    sizes = {"train": 0, "test": 0}
    for rel, p in files:
        side, cap, bucket = (
            ("test", test_bytes, test)
            if _digest(rel)[0] < _HELD_OUT_BELOW
            else ("train", train_bytes, train)
        )
        if sizes[side] >= cap:
            continue
        try:
            body = p.read_bytes() + _SEPARATOR
        except OSError as e:  # an unreadable file is skipped, the split stays deterministic
            log.warning("skipping %s: %s", p, e)
            continue
        bucket.append((rel, body))
        sizes[side] += len(body)
    if not train or not test:
        raise DatasetError(f"stdlib at {root or stdlib_root()} gave an empty train or test set")
    tr, te = _join(sorted(train)), _join(sorted(test))  # stored in path order
    if path is not None:
        atomic_savez(
            path, train=tr.data, train_starts=tr.starts, test=te.data, test_starts=te.starts
        )
    return tr, te


def _join(files: list[tuple[str, bytes]]) -> TextShard:
    bodies = [b for _, b in files]
    starts = np.cumsum([0] + [len(b) for b in bodies[:-1]], dtype=np.int64)
    return TextShard(np.frombuffer(b"".join(bodies), dtype=np.uint8).copy(), starts)


def text_shard(train: TextShard, n: int, index: int, partition: Partition, seed: int) -> TextShard:
    """Shard ``index`` of ``n``: bytes ``[index L / n, (index + 1) L / n)`` of the train files
    in the partition's order (a file may be cut between two shards; windows of the LM cross
    file ends anyway). Disjoint, covering, sizes within one byte, deterministic."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DatasetError(f"n must be an int >= 1, got {n!r}")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
        raise DatasetError(f"index must be an int in [0, n={n}), got {index!r}")
    if n > len(train):
        raise DatasetError(f"n={n} exceeds the {len(train)} train bytes; a shard would be empty")
    bodies = train.file_bytes()
    if partition is Partition.IID:
        bodies = [bodies[i] for i in np.random.default_rng(seed).permutation(len(bodies))]
    elif partition is not Partition.NON_IID:
        raise DatasetError(f"partition must be a Partition, got {partition!r}")
    joined = _join([("", b) for b in bodies])
    lo, hi = index * len(train) // n, (index + 1) * len(train) // n
    inside = joined.starts[(joined.starts > lo) & (joined.starts < hi)] - lo
    return TextShard(joined.data[lo:hi].copy(), np.concatenate([[0], inside]).astype(np.int64))


def unigram_cross_entropy(train: TextShard, test: TextShard) -> float:
    """Held-out loss (nats per byte) of the best context-free model: train byte frequencies,
    add-one smoothed. The LM must beat this to have learnt anything beyond byte counts."""
    counts = np.bincount(train.data, minlength=256).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[test.data].mean())


def perplexity(loss: float) -> float:
    return math.exp(loss)


def main(argv: list[str] | None = None) -> int:
    """``python -m crew.train.textdata --cache-dir DIR``: write the text split cache ahead of the
    workers, as ``python -m crew.train.datasets`` does for digits."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m crew.train.textdata", description=main.__doc__)
    parser.add_argument("--cache-dir", type=Path, required=True, help="folder of the cache")
    parser.add_argument("--train-bytes", type=int, default=TRAIN_BYTES)
    parser.add_argument("--test-bytes", type=int, default=TEST_BYTES)
    args = parser.parse_args(argv)
    try:
        train, test = load_text_split(args.cache_dir, args.train_bytes, args.test_bytes)
    except DatasetError as exc:
        parser.error(str(exc))
    print(text_cache_path(args.cache_dir, args.train_bytes, args.test_bytes))
    print(
        f"train {len(train)} bytes in {train.files} files, held-out {len(test)} bytes in "
        f"{test.files} files, unigram loss {unigram_cross_entropy(train, test):.4f} nats/byte"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
