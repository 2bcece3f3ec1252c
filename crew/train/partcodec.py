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
model adds about 4e-3 relative error to the projection (``lab.studies.codecstudy``), above 1e-3; the
statistical bound :func:`crew.train.compress.reduce_tolerance` would have to be as wide as a
lost part. A bad header (size, non-finite ``err`` or block header) raises
:class:`~crew.train.compress.CompressError`; the engine drops the frame like any bad frame.

Error feedback (on; ``PartCodec(..., error_feedback=False)`` turns it off). Each node keeps one
float32 residual ``e`` per element of the vector, zero at the start. To encode values ``y`` of
``[start, start + n)`` it encodes ``s = y + e[start:start + n]`` and keeps ``e = s - Q(s)``
there (``Q``: encode then decode). Why: the lab sends models (every step, LocalSGD) or outer
steps of models (DiLoCo), not small deltas. After a reduce every member holds the decoded
result, on its block's int8 grid; one SGD step moves most weights by less than half a grid
step, so rounding to nearest takes much of it back at the next encode, round after round: a
bias against small updates, not zero-mean noise. With the residual, what one encode rounds away
is sent by the node's next encode of those elements, so over any number of encodes the values
a node sent add up to the values it was asked to send, less one residual (at most half a step
per element): no update is lost for good (docs/decisions/2026-12-01-error-feedback.md).

Which encode takes the residual: the node's next one of the same elements, whatever its role
(leaf, aggregator, or root encoding the broadcast). Each encode's error enters the group's
result one for one (a leaf's weighted part and an aggregator's partial sum are summands of it,
the broadcast is the result), and every member loads the result; so an error left in one group
moves each of its p members by ``-e`` and its correction in a later group moves each of that
group's p members by ``+e``. With groups of equal size the sum of all n workers' models loses
nothing. A worker that is in no group encodes nothing and keeps its residual until it is.

Partial reduce and aborts: the residual changes when a part is encoded, not when the group
commits. If the group is then abandoned or revised (members send again), one encode's rounding
is dropped or counted twice, once; a residual is never larger than half a step of the block it
came from, so nothing accumulates.

Verification: ``err`` is ``r . (Q(s) - y)``, against the values the engine asked to send, so
it includes the residual that was added: what the coordinator checks is what was actually sent,
accounted exactly, and ``r . x - sum err = sum_m w_m r . v_m`` still holds with no new term. A
NaN or inf in ``y`` is refused before it can reach the residual. Cost: one model-sized float32
vector per worker and an add and a subtract per encode.
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

    def __init__(self, codec: Codec, check: np.ndarray, *, error_feedback: bool = True) -> None:
        if codec is Codec.NONE:
            raise CompressError("PartCodec is for fp16 and int8; codec none sends float32 as is")
        self.codec = codec
        self._check = np.asarray(check, dtype=np.float64)
        # What this node's encodes rounded away, per element, added to its next encode of the
        # same elements (error feedback, see the module docstring). None: plain rounding.
        self._residual = np.zeros(self._check.size, np.float32) if error_feedback else None

    @property
    def error_feedback(self) -> bool:
        return self._residual is not None

    def residual(self) -> np.ndarray | None:
        """A copy of the error-feedback residual (None without error feedback)."""
        return None if self._residual is None else self._residual.copy()

    def payload_size(self, n: int) -> int:
        return ERR_HEADER.size + encoded_size(self.codec, n)

    def encode(
        self, values: np.ndarray, start: int, carried: float
    ) -> tuple[bytes, np.ndarray, float]:
        """``(payload, decoded, err)``: the bytes to send, the float32 values a receiver will
        decode from them, and the error projection they carry (``carried`` plus this encode's).
        Raises CompressError on NaN, inf or fp16 overflow."""
        part = np.ascontiguousarray(values, dtype=np.float32)
        r = self._slice(start, part.size)
        sent = part
        if self._residual is not None:
            _check_finite(part, start)  # a NaN must be refused, not hidden in the residual
            sent = part + self._residual[start : start + part.size]
        data = encode(self.codec, sent)
        decoded = decode(self.codec, data, part.size)
        if self._residual is not None:
            self._residual[start : start + part.size] = sent - decoded
        # Against the values the engine asked for: the residual added is part of the error.
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


def _check_finite(part: np.ndarray, start: int) -> None:
    if not np.isfinite(part).all():
        i = int(np.flatnonzero(~np.isfinite(part))[0])
        raise CompressError(
            f"part at {start} has non-finite values (element {i}: {part[i]}); refusing to encode"
        )
