"""Error of int8 layouts on real model deltas: why ``crew.train.compress`` uses min/max blocks
of 256.

``python -m lab.studies.codecstudy [--steps 8]``: trains the default MLP on one digits shard for
a few local steps (what a worker sends after H = 8 local steps), and prints for the pseudo-gradient
(model - start) and for the model itself the relative L2 error ``||decode(encode(x)) - x|| /
||x||`` and the bytes per element of each candidate layout. The candidates other than the
shipped codec are written out here only to be measured.
"""

from __future__ import annotations

import numpy as np

from crew.cli_options import command_parser
from crew.train.compress import Codec, decode, encode, encoded_size


def _minmax(x: np.ndarray, block: int) -> np.ndarray:
    out = np.empty_like(x, dtype=np.float64)
    for s in range(0, x.size, block):
        b = x[s : s + block].astype(np.float64)
        lo, step = b.min(), (b.max() - b.min()) / 255
        out[s : s + block] = lo + np.rint((b - lo) / step) * step if step > 0 else b
    return out


def _absmax(x: np.ndarray, block: int) -> np.ndarray:
    out = np.empty_like(x, dtype=np.float64)
    for s in range(0, x.size, block):
        b = x[s : s + block].astype(np.float64)
        step = np.abs(b).max() / 127
        out[s : s + block] = np.rint(b / step) * step if step > 0 else b
    return out


def _clipped(x: np.ndarray, block: int, k: float) -> np.ndarray:
    out = np.empty_like(x, dtype=np.float64)
    for s in range(0, x.size, block):
        b = x[s : s + block].astype(np.float64)
        lo = max(b.min(), b.mean() - k * b.std())
        hi = min(b.max(), b.mean() + k * b.std())
        step = (hi - lo) / 255
        if step <= 0:
            out[s : s + block] = b
            continue
        out[s : s + block] = lo + np.clip(np.rint((b - lo) / step), 0, 255) * step
    return out


def _rel(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.linalg.norm(y - x.astype(np.float64)) / np.linalg.norm(x))


def vectors(steps: int) -> dict[str, np.ndarray]:
    from crew.train.datasets import Partition, load_split, shard
    from crew.train.training import ModelConfig, TrainConfig, Trainer

    train, test = load_split(seed=0)
    t = Trainer(
        ModelConfig(), TrainConfig(local_steps=steps), shard(train, 8, 0, Partition.IID, 0), test
    )
    for _ in range(20):  # past the first, atypically large, updates
        t.step()
    start = t.get_vector()
    t.step()
    return {f"pseudo-gradient ({steps} steps)": start - t.get_vector(), "model": t.get_vector()}


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("python -m lab.studies.codecstudy", __doc__)
    parser.add_argument("--steps", type=int, default=8, help="local steps per update")
    args = parser.parse_args(argv)
    for name, x in vectors(args.steps).items():
        n = x.size
        print(f"\n{name}: {n} elements, rms {np.sqrt(np.mean(x.astype(np.float64) ** 2)):.3g}")
        print(f"{'layout':34s} {'rel L2 error':>12s} {'bytes/elem':>10s}")
        rows = [
            ("fp16 (shipped)", decode(Codec.FP16, encode(Codec.FP16, x), n), 2.0),
            (
                "int8 min/max, 256 (shipped)",
                decode(Codec.INT8, encode(Codec.INT8, x), n),
                encoded_size(Codec.INT8, n) / n,
            ),
            ("int8 min/max, 64", _minmax(x, 64), 1 + 8 / 64),
            ("int8 min/max, 1024", _minmax(x, 1024), 1 + 8 / 1024),
            ("int8 absmax/127, 256", _absmax(x, 256), 1 + 4 / 256),
            ("int8 clip mu+-3 sigma, 256", _clipped(x, 256, 3.0), 1 + 8 / 256),
            ("int8 clip mu+-4 sigma, 256", _clipped(x, 256, 4.0), 1 + 8 / 256),
        ]
        for label, y, bpe in rows:
            print(f"{label:34s} {_rel(x, y):12.3e} {bpe:10.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
