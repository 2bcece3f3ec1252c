"""Model shape and size arithmetic, without torch.

The coordinator and planner need the model vector's size M (bytes) to cut it into blocks and
to size transfers, but must not pay for ``import torch``. So the model's shape lives here as a
plain dataclass; :mod:`crew.train.training` builds the torch module from the same config and the
tests check that the arithmetic here equals torch's parameter count.

Model: an MLP ``INPUT_DIM -> width (x depth, ReLU) -> NUM_CLASSES`` with biases. Parameters:

    INPUT_DIM*width + width                       first hidden layer
    + (depth - 1) * (width*width + width)         further hidden layers
    + width*NUM_CLASSES + NUM_CLASSES             output layer

Stored as one flat float32 vector, so ``size_bytes = 4 * num_params``. The default
(width 640, depth 3) has 868,490 parameters, about 3.5 MB.
"""

from __future__ import annotations

from dataclasses import dataclass

# The digits data set: 8x8 images, 10 classes. crew.train.datasets checks it against these.
INPUT_DIM = 64
NUM_CLASSES = 10
BYTES_PER_PARAM = 4  # float32 on the wire and in checkpoints


class ModelConfigError(ValueError):
    """A model configuration field is out of range."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the MLP every worker trains (all workers must use the same config)."""

    width: int = 640
    depth: int = 3

    def __post_init__(self) -> None:
        for name in ("width", "depth"):
            value = getattr(self, name)
            # bool is an int subclass; reject it so ModelConfig(width=True) is not 1.
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ModelConfigError(f"ModelConfig.{name} must be an int >= 1, got {value!r}")

    @property
    def num_params(self) -> int:
        """Number of scalar parameters (weights and biases)."""
        return num_params(self)

    @property
    def size_bytes(self) -> int:
        """Size of the flat float32 parameter vector, in bytes."""
        return self.num_params * BYTES_PER_PARAM


def num_params(cfg: ModelConfig) -> int:
    """Parameter count of the MLP described by ``cfg`` (see the module docstring)."""
    w, d = cfg.width, cfg.depth
    first = INPUT_DIM * w + w
    hidden = (d - 1) * (w * w + w)
    out = w * NUM_CLASSES + NUM_CLASSES
    return first + hidden + out
