"""Shape and size of the ``lm`` workload's byte-level causal transformer, without torch.

Like :mod:`crew.plan.modelsize` for the MLP: the coordinator sizes vectors from this, and
:mod:`crew.train.transformer` builds the torch module from the same config (a test checks the
count).

Model (GPT-2 style, pre-LayerNorm): byte embedding ``256 x d`` tied with the output layer,
learned positions ``context x d``, ``layers`` blocks of causal self-attention (``heads`` heads,
fused qkv ``d -> 3d`` and output ``d -> d``, with biases) and an MLP ``d -> 4d -> d`` (GELU), a
LayerNorm before each and one at the end. Parameters:

    256 d + context d                                  embeddings (output tied)
    + layers (12 d^2 + 13 d)                           per block: qkv 3d^2+3d, proj d^2+d,
                                                        MLP 8d^2+5d, two LayerNorms 4d
    + 2 d                                              final LayerNorm

The default (d 96, 2 layers, 4 heads, context 128) has 260,736 parameters, 1.04 MB in
float32. Sized by measurement (one worker, one thread, a whole core, Adam lr 3e-3, 40 s): d 96
batch 16 ran 7.4 steps/s and reached held-out loss 2.49 (unigram 3.24); d 128 ran 4.9 steps/s
(batch 16, loss 2.54) or 9.4 (batch 8, loss 2.53). Eight workers on two cores get a quarter
core each, about 1.8 steps/s, so a few hundred steps each in five minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

VOCAB = 256  # bytes
BYTES_PER_PARAM = 4


class LMConfigError(ValueError):
    """A transformer configuration field is out of range."""


@dataclass(frozen=True)
class LMConfig:
    d_model: int = 96
    layers: int = 2
    heads: int = 4
    context: int = 128

    def __post_init__(self) -> None:
        for name in ("d_model", "layers", "heads", "context"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LMConfigError(f"LMConfig.{name} must be an int >= 1, got {value!r}")
        if self.d_model % self.heads:
            raise LMConfigError(
                f"LMConfig.d_model ({self.d_model}) must be a multiple of heads ({self.heads})"
            )

    @property
    def num_params(self) -> int:
        d = self.d_model
        return VOCAB * d + self.context * d + self.layers * (12 * d * d + 13 * d) + 2 * d

    @property
    def size_bytes(self) -> int:
        return self.num_params * BYTES_PER_PARAM
