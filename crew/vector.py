"""What every entry point that takes a model vector asks of it: a 1-D float32 numpy array."""

from __future__ import annotations

from typing import Any

import numpy as np


def check_flat_float32(vector: Any, error: type[Exception]) -> None:
    """Raise ``error``, naming what is wrong, unless ``vector`` is a 1-D float32 numpy array."""
    if not isinstance(vector, np.ndarray):
        raise error(f"vector must be a numpy array, got {type(vector).__name__}")
    if vector.dtype != np.float32:
        raise error(f"vector must be float32, got {vector.dtype}")
    if vector.ndim != 1:
        raise error(f"vector must be 1-D, got shape {vector.shape}")
