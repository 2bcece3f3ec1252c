"""The reduce engine's codec: a part of a vector to frame payload bytes and back.

:mod:`crew.train.compress` encodes arrays; this module adds what the data plane needs on top:
the exact accounting of every encode's error, carried in the payload itself, so the
coordinator's existing result check (``crew.control.verify``) stays exact under fp16 and int8.

Payload of one part of ``n`` elements starting at element ``start`` of the vector:

* codec ``none``: ``n`` float32 values, as before (no header; :data:`PLAIN` is ``None`` in the
  engine and nothing changes on the fp32 path).
* ``fp16``/``int8``: an 8-byte little-endian float64 ``err``, then ``encode(codec, values)``.

``err`` is ``r . (decoded - exact)`` summed over every encode this part's values went through so
far, where ``r`` is the run's check vector (``crew.control.verify.check_vector``) sliced at
``[start, start + n)`` and ``exact`` is the float32 sum the engine would hold without a codec.
Each node that encodes knows its own error exactly: it encodes ``y``, decodes the bytes (as the
receiver will) and adds ``r . (decode(encode(y)) - y)`` to the ``err`` of the contributions it
summed into ``y`` (aggregators add the children's carried ``err`` as they add their values).
The root encodes the sum once for the broadcast and keeps the decoded values itself; broadcast
relays forward the payload bytes unchanged, so every member holds bit-identical results and the
same ``err`` for each part.

Verification (derived, not tuned): a member's result ``x`` satisfies, per part, ``r . x =
r . exact + err`` up to the float64 rounding of the dot products, so the member reports
``r . x - sum over parts of err`` in ``HaveAll`` (``Node._have_all``). That equals
``sum_m w_m r . v_m`` up to the same float32 summation rounding as an uncompressed reduce, so
``crew.control.verify``'s relative tolerance (``CHECK_TOLERANCE = 1e-3``, against float32 sums
whose relative rounding stays below 1e-5) applies unchanged: the tolerance formula is

    |r . x - sum_parts err - sum_m w_m r . v_m| <= 1e-3 * sum_m |w_m r . v_m|

with no codec term. A lost or doubly counted part still shifts ``r . x`` by the projection of a
whole part, and its (tiny) ``err`` cannot hide that. Without the accounting, an int8 encode of a
model adds about 4e-3 relative error to the projection (``lab.codecstudy``), above 1e-3; the
statistical bound :func:`crew.train.compress.reduce_tolerance` would have to be as wide as a
lost part. A bad header (size, non-finite ``err`` or block header) raises
:class:`~crew.train.compress.CompressError`; the engine drops the frame like any bad frame.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from crew.train.compress import Codec, CompressError, decode, encode, encoded_size

__all__ = ["ERR_HEADER", "PartCodec"]

ERR_HEADER = struct.Struct("<d")


class PartCodec:
    """Encodes parts for the wire and decodes them, with exact error accounting (see above).

    ``check``: the run's check vector (float32, the vector's length). The engine builds one
    per worker from the run's ``compress`` setting; for codec ``none`` it uses no codec."""

    def __init__(self, codec: Codec, check: np.ndarray) -> None:
        if codec is Codec.NONE:
            raise CompressError("PartCodec is for fp16 and int8; codec none sends float32 as is")
        self.codec = codec
        self._check = np.asarray(check, dtype=np.float64)

    def payload_size(self, n: int) -> int:
        return ERR_HEADER.size + encoded_size(self.codec, n)

    def encode(
        self, values: np.ndarray, start: int, carried: float
    ) -> tuple[bytes, np.ndarray, float]:
        """``(payload, decoded, err)``: the bytes to send, the float32 values a receiver will
        decode from them, and the error projection they carry (``carried`` plus this encode's).
        Raises CompressError on NaN, inf or fp16 overflow."""
        part = np.ascontiguousarray(values, dtype=np.float32)
        data = encode(self.codec, part)
        decoded = decode(self.codec, data, part.size)
        r = self._slice(start, part.size)
        err = carried + float(np.dot(r, decoded.astype(np.float64) - part.astype(np.float64)))
        return ERR_HEADER.pack(err) + data, decoded, err

    def decode(self, payload: bytes | memoryview, start: int, n: int) -> tuple[np.ndarray, float]:
        """``(values, err)`` of a payload for ``n`` elements at ``start``; CompressError if the
        payload does not fit or is not finite."""
        buf = memoryview(payload).cast("B")
        if buf.nbytes != self.payload_size(n):
            raise CompressError(
                f"{self.codec.value} part of {n} elements needs {self.payload_size(n)} bytes,"
                f" got {buf.nbytes}"
            )
        self._slice(start, n)
        (err,) = ERR_HEADER.unpack(buf[: ERR_HEADER.size])
        if not math.isfinite(err):
            raise CompressError(f"{self.codec.value} part at {start}: error header {err}")
        return decode(self.codec, buf[ERR_HEADER.size :], n), err

    def _slice(self, start: int, n: int) -> np.ndarray:
        if start < 0 or start + n > self._check.size:
            raise CompressError(
                f"part [{start}, {start + n}) is outside the vector of {self._check.size}"
            )
        return self._check[start : start + n]
