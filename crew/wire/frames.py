"""Length-prefixed, MAC-authenticated frames for the CREW data and control planes.

Wire format (network byte order, no padding)::

    offset size field
         0    4 magic    b"CRW1"
         4    1 version  3
         5    1 kind     FrameKind
         6    2 sender   worker id, 0xFFFF for the coordinator / lab
         8    4 run      run number; frames of another run are refused
        12    4 group
        16    4 rev      plan revision
        20    4 block
        24    4 part
        28    8 offset   element offset of this part in the model vector
        36    4 length   payload bytes
        40    L payload
      40+L   32 tag      BLAKE3 keyed with K, over payload || header [|| seq]
                         (K = BLAKE3 derive_key(MAC_CONTEXT, secret))

Connections open with a handshake (:mod:`crew.wire.session`): a HELLO and a CHALLENGE, each
carrying fresh random nonces under K. From then on each direction of the connection has a key of
its own, derived from K and both nonces, and every frame's tag also covers its sequence number
on the connection (``seq``, 8 bytes, counted by both ends, never sent). So a frame recorded on
one connection fails its tag on any other, and a frame repeated, dropped or reordered within a
connection fails its tag too: replays are refused as ``BadMac``.

Design notes:

* The decoder validates magic, version, kind and the declared length *before* it reads or
  allocates the payload, so a hostile or desynchronised peer can make us allocate at most
  ``max_payload`` bytes per frame, never the 4 GiB a u32 length could claim.
* The tag covers the whole header, so no field (run, group, offset, ...) can be altered in
  transit. The run number is checked after the tag: a ``WrongRun`` therefore means "a peer that
  knows the secret but lives in another run", while forgeries surface as ``BadMac``.
* ``encode`` returns ``[header, payload, tag]`` without copying the payload, ready for
  ``socket.sendmsg``. The MAC costs one pass over the payload at each end: keyed BLAKE3 (a PRF,
  made for this use) takes 0.14 CPU s per GB of 64 KiB parts on an AVX-512 core, a quarter of
  HMAC-SHA256's cost (docs/decisions/2026-12-03-blake3-frame-tags.md; ``python -m
  lab.studies.datapath``). The payload goes first so that BLAKE3's 1 KiB chunks stay aligned
  with it (a 40-byte header first costs 0.26 s/GB more); the fixed-size header last keeps the
  input unambiguous. Frames of any other version are refused as ``BadVersion``.
* Every malformed input raises a ``FrameError`` subclass; nothing else escapes the decoder.
"""

from __future__ import annotations

import copy
import enum
import hmac
import json
import logging
import secrets
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import blake3
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

log = logging.getLogger(__name__)

MAGIC = b"CRW1"
VERSION = 3
MAC_CONTEXT = "crew-lab 2026-12 frame MAC v3"  # BLAKE3 key derivation: one key per use
COORDINATOR = 0xFFFF  # sender id of the coordinator and the lab
HEADER = struct.Struct("!4sBBHIIIIIQI")
HEADER_SIZE = HEADER.size  # 40
TAG_SIZE = 32  # BLAKE3's default output
GCM_TAG_SIZE = 16  # an encrypted session's tag; the rest of the tag field is zero
_TAG_PAD = bytes(TAG_SIZE - GCM_TAG_SIZE)
DEFAULT_MAX_PAYLOAD = 4 << 20
MIN_SECRET_BYTES = 16
SEND_BACKLOG_BYTES = 64 << 10
"""Unsent bytes a data connection may hold in the kernel (``TCP_NOTSENT_LOWAT``, set by
``crew.wire.transport``). A part written to a busy connection waits behind up to this many bytes
before its own go out, so the route LP counts them at every hop (``RunConfig.hop_backlog_bytes``).
"""

_U16 = 0xFFFF
_U32 = 0xFFFF_FFFF
_U64 = 0xFFFF_FFFF_FFFF_FFFF


class FrameKind(enum.IntEnum):
    """What a frame carries. New kinds take new values; old decoders refuse them (UnknownKind)."""

    CONTROL = 1  # JSON object, control plane
    SCATTER = 2  # a member's copy of a block part, to its aggregator
    RESULT = 3  # an aggregated block part, back to a member
    RELAY = 4  # a part forwarded on behalf of another worker (outage handling)
    HELLO = 5  # first frame on every connection: names the sender, carries its nonce
    PAYLOAD = 6  # opaque bulk data (baselines, benchmarks)
    PRESCATTER = 7  # non-blocking mode: an unweighted part sent before its group exists
    PROBE = 8  # a link probe (crew.wire.probes), UDP: names its receiver in ``block``
    CHALLENGE = 9  # the answer to a HELLO: both nonces (crew.wire.session)


class FrameError(Exception):
    """A frame is malformed, unauthenticated or not for us. The message says what is wrong."""


class BadMagic(FrameError):
    pass


class BadVersion(FrameError):
    pass


class UnknownKind(FrameError):
    pass


class Oversized(FrameError):
    pass


class BadMac(FrameError):
    pass


class WrongRun(FrameError):
    pass


class Truncated(FrameError):
    pass


class TrailingData(FrameError):
    """``decode`` got bytes after the end of the frame."""


class BadPayload(FrameError):
    """A CONTROL payload is not a UTF-8 JSON object."""


class BadField(FrameError, ValueError):
    """A frame field is out of range when building or encoding a frame."""


def _check_uint(name: str, value: int, limit: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadField(f"frame field {name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= limit:
        raise BadField(f"frame field {name}={value} is outside 0..{limit}")


@dataclass(frozen=True)
class Frame:
    """One message. ``payload`` is bytes, or a read-only byte view of a received buffer.

    A memoryview payload (e.g. ``memoryview(np_array)``) is sent without copying, so the caller
    must not modify the underlying buffer until the frame has been sent.
    """

    kind: FrameKind
    sender: int
    run: int
    group: int = 0
    rev: int = 0
    block: int = 0
    part: int = 0
    offset: int = 0
    payload: bytes | memoryview = b""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", FrameKind(self.kind))
        except ValueError:
            raise BadField(f"frame field kind={self.kind!r} is not a FrameKind") from None
        _check_uint("sender", self.sender, _U16)
        for name in ("run", "group", "rev", "block", "part"):
            _check_uint(name, getattr(self, name), _U32)
        _check_uint("offset", self.offset, _U64)
        if not isinstance(self.payload, bytes):
            object.__setattr__(self, "payload", _byte_view(self.payload))

    @property
    def nbytes(self) -> int:
        return len(self.payload) if isinstance(self.payload, bytes) else self.payload.nbytes

    def __repr__(self) -> str:
        return (
            f"Frame({self.kind.name}, sender={self.sender}, run={self.run}, group={self.group}, "
            f"rev={self.rev}, block={self.block}, part={self.part}, offset={self.offset}, "
            f"payload=<{self.nbytes} bytes>)"
        )


def _byte_view(obj: Any) -> memoryview:
    """A flat unsigned-byte view of any C-contiguous buffer (bytearray, numpy array, ...)."""
    try:
        view = memoryview(obj)
    except TypeError:
        raise BadField(
            f"frame field payload must be a bytes-like object, got {type(obj).__name__}"
        ) from None
    if not view.c_contiguous:
        raise BadField("frame field payload must be C-contiguous")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def wire_size(frame: Frame) -> int:
    """Bytes this frame occupies on the wire."""
    return HEADER_SIZE + frame.nbytes + TAG_SIZE


def new_secret() -> bytes:
    """A fresh per-run secret."""
    return secrets.token_bytes(32)


class FrameCodec:
    """Encodes and authenticates frames for one run; decodes and verifies them.

    Thread-safe: it keeps no per-frame state (each MAC is a fresh keyed hasher).
    """

    def __init__(
        self,
        secret: bytes,
        run: int,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        *,
        encrypt: bool = False,
    ) -> None:
        if not isinstance(secret, bytes | bytearray) or len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"secret must be at least {MIN_SECRET_BYTES} bytes")
        _check_uint("run", run, _U32)
        if isinstance(max_payload, bool) or not isinstance(max_payload, int):
            raise ValueError("max_payload must be an int")
        if not 0 < max_payload <= _U32:
            raise ValueError(f"max_payload={max_payload} is outside 1..{_U32}")
        self.run = run
        self.max_payload = max_payload
        self.encrypt = bool(encrypt)  # sessions of this codec encrypt (see SessionCodec)
        self._key = blake3.blake3(bytes(secret), derive_key_context=MAC_CONTEXT).digest()

    def limited(self, max_payload: int) -> FrameCodec:
        """The same key and run with a smaller ``max_payload``: what a handshake reads, so that
        a peer that has not authenticated yet cannot make the reader allocate more."""
        out = copy.copy(self)
        out.max_payload = max(1, min(int(max_payload), self.max_payload))
        return out

    def tag(
        self, header: bytes | bytearray | memoryview, payload: bytes | bytearray | memoryview
    ) -> bytes:
        """The frame's MAC (see the module doc); a fresh keyed hasher per frame, so any thread
        may call it."""
        mac = blake3.blake3(payload, key=self._key)
        mac.update(header)
        return mac.digest()

    def _seal(self, header: bytes, payload: bytes | memoryview) -> tuple[bytes | memoryview, bytes]:
        """What goes on the wire after ``header``: the payload and the tag."""
        return payload, self.tag(header, payload)

    def _open(
        self,
        header: bytes | bytearray | memoryview,
        payload: bytes | bytearray | memoryview,
        tag: bytes | bytearray | memoryview,
    ) -> bytes | bytearray | memoryview:
        """The payload that ``header``, the wire payload and ``tag`` carry; BadMac if the tag
        does not check out."""
        if not hmac.compare_digest(self.tag(header, payload), bytes(tag)):
            raise BadMac("frame tag does not match")
        return payload

    def derive(self, label: bytes, *parts: bytes) -> bytes:
        """A 32-byte key for one use, from this codec's key and ``parts`` (a session's
        nonces): BLAKE3 keyed with K over the label and the parts."""
        mac = blake3.blake3(label, key=self._key)
        for part in parts:
            mac.update(part)
        return mac.digest()

    def session(self, send_key: bytes, recv_key: bytes) -> SessionCodec:
        """This run's codec for one connection after its handshake (``crew.wire.session``)."""
        return SessionCodec(self, send_key, recv_key)

    def encode(self, frame: Frame) -> list[bytes | memoryview]:
        """``[header, payload, tag]``; the payload is not copied. Raises Oversized, BadField.
        A session's encode counts the frame: call it in the order the frames are sent."""
        n = frame.nbytes
        if n > self.max_payload:
            raise Oversized(f"frame length {n} exceeds the maximum {self.max_payload}")
        header = HEADER.pack(
            MAGIC,
            VERSION,
            frame.kind,
            frame.sender,
            frame.run,
            frame.group,
            frame.rev,
            frame.block,
            frame.part,
            frame.offset,
            n,
        )
        return [header, *self._seal(header, frame.payload)]

    def encode_bytes(self, frame: Frame) -> bytes:
        """The whole frame as one bytes object (copies; for tests and small frames)."""
        return b"".join(bytes(p) for p in self.encode(frame))

    def decode(self, data: bytes | bytearray | memoryview) -> Frame:
        """Decode exactly one whole frame; the result's payload is bytes."""
        buf = bytes(data)
        pos = 0

        def take(n: int) -> bytes:
            nonlocal pos
            chunk = buf[pos : pos + n]
            pos += len(chunk)
            return chunk

        frame = self.read_frame(take)
        if pos != len(buf):
            raise TrailingData(f"{len(buf) - pos} bytes after the end of the frame")
        return frame

    def read_frame(self, recv_exact: Callable[[int], bytes | bytearray | memoryview]) -> Frame:
        """Read one frame through ``recv_exact(n)``.

        ``recv_exact`` must return exactly n bytes, or fewer if the stream ended (-> Truncated);
        its own exceptions propagate. The payload is requested only after the header passed
        every check, so an Oversized frame costs a 40-byte read and no allocation.
        """
        header = recv_exact(HEADER_SIZE)
        if len(header) != HEADER_SIZE:
            raise Truncated(f"frame header: got {len(header)} of {HEADER_SIZE} bytes")
        magic, version, kind, sender, run, group, rev, block, part, offset, length = HEADER.unpack(
            header
        )
        if magic != MAGIC:
            raise BadMagic(f"frame magic {bytes(magic)!r} is not {MAGIC!r}")
        if version != VERSION:
            raise BadVersion(f"frame version {version} is not {VERSION}")
        try:
            kind = FrameKind(kind)
        except ValueError:
            raise UnknownKind(f"frame kind {kind} is unknown") from None
        if length > self.max_payload:
            raise Oversized(f"frame length {length} exceeds the maximum {self.max_payload}")
        payload: bytes | bytearray | memoryview = recv_exact(length) if length else b""
        if len(payload) != length:
            raise Truncated(f"frame payload: got {len(payload)} of {length} bytes")
        tag = recv_exact(TAG_SIZE)
        if len(tag) != TAG_SIZE:
            raise Truncated(f"frame tag: got {len(tag)} of {TAG_SIZE} bytes")
        try:
            payload = self._open(header, payload, tag)
        except BadMac as exc:
            raise BadMac(f"{exc} (kind {kind.name}, sender {sender})") from None
        if run != self.run:
            raise WrongRun(f"frame run {run} is not this run {self.run}")
        if not isinstance(payload, bytes):
            # Received buffers are handed out read-only: several consumers may look at them.
            payload = memoryview(payload).toreadonly()
        return Frame(kind, sender, run, group, rev, block, part, offset, payload)


class SessionCodec(FrameCodec):
    """One connection's codec after its handshake: a key per direction, and each frame's
    sequence number in that direction under its tag (see the module doc).

    With ``encrypt`` (the base codec's), every payload is also encrypted: AES-256-GCM under
    the direction's key, with the sequence number as the 96-bit nonce (never repeated under
    one key) and the header as associated data. The wire format stays the same: the payload
    field holds the ciphertext (as long as the plaintext) and the tag field the GCM tag
    followed by 16 zero bytes. AES-GCM runs on the CPU's AES and carry-less multiply
    instructions through OpenSSL (the ``cryptography`` package).

    Not thread-safe: a connection's sends must be encoded one at a time, in the order they go
    out (``FrameStream.send`` encodes under its send lock), and its reads come from one thread.
    """

    def __init__(self, base: FrameCodec, send_key: bytes, recv_key: bytes) -> None:
        self.run = base.run
        self.max_payload = base.max_payload
        self.encrypt = base.encrypt
        self._key = base._key  # the run's key, for derive()
        self._send_key = send_key
        self._recv_key = recv_key
        self._send_seq = 0
        self._recv_seq = 0
        if self.encrypt:
            self._sealer = AESGCM(send_key)
            self._opener = AESGCM(recv_key)

    @staticmethod
    def _mac(key: bytes, seq: int, header: Any, payload: Any) -> bytes:
        mac = blake3.blake3(payload, key=key)
        mac.update(header)
        mac.update(seq.to_bytes(8, "big"))
        return mac.digest()

    def _seal(self, header: bytes, payload: bytes | memoryview) -> tuple[bytes | memoryview, bytes]:
        seq, self._send_seq = self._send_seq, self._send_seq + 1
        if not self.encrypt:
            return payload, self._mac(self._send_key, seq, header, payload)
        sealed = self._sealer.encrypt(seq.to_bytes(12, "big"), payload, header)
        cut = len(sealed) - GCM_TAG_SIZE
        return memoryview(sealed)[:cut], sealed[cut:] + _TAG_PAD

    def _open(
        self,
        header: bytes | bytearray | memoryview,
        payload: bytes | bytearray | memoryview,
        tag: bytes | bytearray | memoryview,
    ) -> bytes | bytearray | memoryview:
        seq = self._recv_seq
        if not self.encrypt:
            if not hmac.compare_digest(self._mac(self._recv_key, seq, header, payload), bytes(tag)):
                raise BadMac("frame tag does not match")
            self._recv_seq += 1
            return payload
        tag = bytes(tag)
        if tag[GCM_TAG_SIZE:] != _TAG_PAD:
            raise BadMac("frame tag is not a GCM tag")
        try:
            plain = self._opener.decrypt(
                seq.to_bytes(12, "big"), bytes(payload) + tag[:GCM_TAG_SIZE], bytes(header)
            )
        except InvalidTag:
            raise BadMac("frame does not decrypt under this connection's key") from None
        self._recv_seq += 1
        return plain

    def limited(self, max_payload: int) -> FrameCodec:
        raise TypeError("a session's codec is not limited: its counters belong to one stream")


# -- control-plane payloads ----------------------------------------------------------------


def encode_control(obj: Mapping[str, Any]) -> bytes:
    """A JSON object as compact UTF-8. Raises BadPayload for a non-dict or non-JSON value."""
    if not isinstance(obj, Mapping):
        raise BadPayload(f"control payload must be a JSON object, got {type(obj).__name__}")
    try:
        text = json.dumps(dict(obj), separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise BadPayload(f"control payload is not JSON-serialisable: {e}") from None
    return text.encode("utf-8")


def decode_control(payload: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The JSON object in a CONTROL payload. Raises BadPayload for anything else."""
    try:
        text = bytes(payload).decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadPayload(f"control payload is not UTF-8: {e.reason} at byte {e.start}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadPayload(f"control payload is not JSON: {e.msg} at char {e.pos}") from None
    except RecursionError:
        raise BadPayload("control payload is nested too deeply") from None
    if not isinstance(obj, dict):
        raise BadPayload(f"control payload must be a JSON object, got {type(obj).__name__}")
    return obj


def control_frame(
    sender: int, run: int, obj: Mapping[str, Any], *, group: int = 0, rev: int = 0
) -> Frame:
    """A CONTROL frame carrying ``obj`` as JSON."""
    return Frame(FrameKind.CONTROL, sender, run, group=group, rev=rev, payload=encode_control(obj))


def control_body(frame: Frame) -> dict[str, Any]:
    """The JSON object of a CONTROL frame. Raises BadPayload for another kind or bad JSON."""
    if frame.kind is not FrameKind.CONTROL:
        raise BadPayload(f"expected a CONTROL frame, got {frame.kind.name}")
    return decode_control(frame.payload)
