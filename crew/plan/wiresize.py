"""Bytes on the wire per element of a group's vector, per payload codec. Pure.

Planners count a range of E elements as ``E * 4`` bytes (float32). With ``--compress fp16|int8``
the engine sends fewer: the payload of one part of ``n`` elements (``crew.train.partcodec``) is

* ``none``: ``4 n`` (float32, no header);
* ``fp16``: an 8-byte float64 ``err`` header, then ``2 n``;
* ``int8``: the 8-byte ``err`` header, then ``n`` bytes and, per block of 256 elements (the last
  may be short), a float32 offset and a float32 step (8 bytes).

So a part of ``n`` elements costs ``payload(n) / n`` bytes per element, e.g. 2.0005 (fp16) and
1.0317 (int8) for 16 Ki-element parts. ``crew.plan`` may not import ``crew.train`` (the layers of
``tests/test_layers.py``), so the format is restated here; ``tests/test_wiresize.py`` checks it
against ``PartCodec.payload_size`` for every codec and many part sizes.
"""

from __future__ import annotations

import enum

ERR_HEADER_BYTES = 8
INT8_BLOCK = 256
INT8_BLOCK_HEADER_BYTES = 8


class WireCodec(enum.Enum):
    NONE = "none"
    FP16 = "fp16"
    INT8 = "int8"


class WireSizeError(ValueError):
    """Unknown codec or a part size below 1."""


def payload_bytes(codec: str, n: int) -> int:
    """Exact payload bytes of one part of ``n`` elements under ``codec`` (none, fp16, int8)."""
    try:
        c = WireCodec(codec)
    except ValueError:
        raise WireSizeError(f"codec: one of none, fp16, int8, got {codec!r}") from None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise WireSizeError(f"part elements: an int >= 1, got {n!r}")
    if c is WireCodec.NONE:
        return 4 * n
    if c is WireCodec.FP16:
        return ERR_HEADER_BYTES + 2 * n
    blocks = -(-n // INT8_BLOCK)
    return ERR_HEADER_BYTES + n + INT8_BLOCK_HEADER_BYTES * blocks


def elem_bytes(codec: str, part_elems: int) -> float:
    """Wire bytes per element when the vector travels in parts of ``part_elems`` elements."""
    return payload_bytes(codec, part_elems) / part_elems
