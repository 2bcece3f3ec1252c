"""The ``lm`` workload: a small byte-level causal transformer on a shard of stdlib source.

Shape in :mod:`crew.train.lm`, text in :mod:`crew.train.textdata`. :class:`LMTrainer` has the MLP
Trainer's interface (``step``, ``get_vector``/``set_vector``, ``save``/``load``), so the
worker and the outer loop treat both workloads alike; ``evaluate`` gives the held-out
``(loss in nats per byte, next-byte accuracy)``, and perplexity is ``exp(loss)``.

Training windows: ``batch_size`` windows of ``context + 1`` bytes at uniform random offsets in
the shard (a seeded NumPy generator), predicting each next byte. Held-out: ``eval_windows``
fixed windows spread evenly over the held-out files, the same on every worker, so all
workers' losses are comparable and an evaluation costs about ``eval_windows / batch_size``
training steps of forward passes.
Inner optimiser: Adam (``TrainConfig(optimizer=InnerOptimizer.ADAM)``; plain SGD trains
transformers slowly), with moments local to each worker, as DiLoCo's inner AdamW.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from crew.train.lm import VOCAB, LMConfig
from crew.train.textdata import TextShard
from crew.train.training import FlatTrainer, TrainConfig

__all__ = ["CausalLM", "LMTrainer"]


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class CausalLM(nn.Module):
    """Bytes in, next-byte logits out (see :mod:`crew.train.lm` for the shape)."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(VOCAB, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg.d_model, cfg.heads) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        for m in self.modules():  # GPT-2's small init: the default fan-in init trains slower
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tok.weight.T


class LMTrainer(FlatTrainer):
    def __init__(
        self,
        lm_cfg: LMConfig,
        train_cfg: TrainConfig,
        shard: TextShard,
        test: TextShard,
        eval_windows: int = 64,
    ) -> None:
        t = lm_cfg.context
        if len(shard) < t + 2:
            raise ValueError(f"shard has {len(shard)} bytes; a window needs {t + 2}")
        if len(test) < t + 2:
            raise ValueError(f"held-out text has {len(test)} bytes; a window needs {t + 2}")
        if eval_windows < 1:
            raise ValueError(f"eval_windows must be >= 1, got {eval_windows}")
        self.lm_cfg = lm_cfg
        torch.set_num_threads(train_cfg.threads)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(train_cfg.seed)
            model = CausalLM(lm_cfg)
        super().__init__(model, train_cfg, lm_cfg.num_params)
        self._data = torch.from_numpy(np.array(shard.data, dtype=np.int64))
        test_data = torch.from_numpy(np.array(test.data, dtype=np.int64))
        starts = np.linspace(0, len(test) - t - 1, eval_windows).astype(np.int64)
        windows = torch.stack([test_data[s : s + t + 1] for s in starts.tolist()])
        self._x_test, self._y_test = windows[:, :-1], windows[:, 1:]
        self._rng = np.random.default_rng(train_cfg.seed)

    def _shape(self) -> dict[str, int]:
        c = self.lm_cfg
        return {"d_model": c.d_model, "layers": c.layers, "heads": c.heads, "context": c.context}

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.lm_cfg.context
        offsets = self._rng.integers(0, len(self._data) - t - 1, self.train_cfg.batch_size)
        idx = torch.from_numpy(offsets)[:, None] + torch.arange(t + 1)
        windows = self._data[idx]
        return windows[:, :-1], windows[:, 1:]

    def _loss(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self._model(xb).reshape(-1, VOCAB), yb.reshape(-1))

    def evaluate(self) -> tuple[float, float]:
        """Held-out ``(cross-entropy in nats per byte, next-byte accuracy)``."""
        self._model.eval()
        with torch.no_grad():
            logits = self._model(self._x_test)
            loss = float(F.cross_entropy(logits.reshape(-1, VOCAB), self._y_test.reshape(-1)))
            acc = float((logits.argmax(dim=2) == self._y_test).float().mean())
        return loss, acc
