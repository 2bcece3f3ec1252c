"""crew.plan.wiresize restates the payload format of crew.train.partcodec: it must match it."""

from __future__ import annotations

import numpy as np
import pytest

from crew.plan.wiresize import WireSizeError, elem_bytes, payload_bytes
from crew.train.compress import Codec
from crew.train.partcodec import PartCodec


@pytest.mark.parametrize("codec", [Codec.FP16, Codec.INT8])
@pytest.mark.parametrize("n", [1, 2, 255, 256, 257, 1000, 16384, 65537])
def test_payload_matches_the_part_codec(codec: Codec, n: int) -> None:
    pc = PartCodec(codec, np.ones(70_000, dtype=np.float32))
    assert payload_bytes(codec.value, n) == pc.payload_size(n)
    payload, _, _ = pc.encode(np.linspace(-1, 1, n, dtype=np.float32), 0, 0.0)
    assert payload_bytes(codec.value, n) == len(payload)


def test_float32_and_per_element_figures() -> None:
    assert payload_bytes("none", 10) == 40
    assert elem_bytes("none", 16384) == 4.0
    assert elem_bytes("fp16", 16384) == pytest.approx(2.0005, abs=1e-4)
    assert elem_bytes("int8", 16384) == pytest.approx(1.0317, abs=1e-4)


@pytest.mark.parametrize(("codec", "n"), [("bf16", 10), ("fp16", 0), ("int8", -3), ("none", 1.5)])
def test_bad_input_is_named(codec: str, n: int) -> None:
    with pytest.raises(WireSizeError):
        payload_bytes(codec, n)
