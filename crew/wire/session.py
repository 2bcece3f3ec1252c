"""The handshake that opens every connection: fresh nonces from both ends, then keys of the
connection's own.

::

    client                                          server
      HELLO     sender = me, payload = Nc || m ->   verified under one of the server's keys K
                                               <-   CHALLENGE  sender = server, payload = Nc || Ns
    both ends:  client -> server key = derive(K, "c2s", Nc, Ns)
                server -> client key = derive(K, "s2c", Nc, Ns)

Nc and Ns are 16 random bytes each; m is one byte, 1 if the client's codec encrypts, and the
server refuses a HELLO whose m differs from its own key's (a clear error, not garbage later).
After the handshake every frame's tag is keyed with its direction's key and covers its
sequence number (``crew.wire.frames.SessionCodec``). What that refuses:

* **a replayed HELLO** gets a fresh Ns, so the frames recorded after it fail their tags;
* **a replayed or reordered frame**, on its own connection or another, fails its tag;
* **a replayed CHALLENGE** names another Nc, so the client refuses it.

The server may hold several keys: the run's, and an identity's (the lab's admin key, which the
workers never hold). The key that verifies the HELLO is the peer's identity for the whole
connection (:class:`Peer`); ``known(sender, key index)`` says whether that sender may speak with
that key. Before the HELLO checks out the server reads exactly one HELLO's bytes
(``HELLO_BYTES``), and the whole handshake has a deadline, so a peer without the key costs a
thread for at most ``timeout`` seconds and 89 bytes.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from crew.wire.frames import (
    HEADER_SIZE,
    TAG_SIZE,
    BadMac,
    Frame,
    FrameCodec,
    FrameError,
    FrameKind,
    TrailingData,
    Truncated,
)

NONCE_BYTES = 16
HELLO_PAYLOAD = NONCE_BYTES + 1  # the nonce and the encryption mode
HELLO_BYTES = HEADER_SIZE + HELLO_PAYLOAD + TAG_SIZE  # 89: what a server reads before any key
CHALLENGE_PAYLOAD = 2 * NONCE_BYTES
_CLIENT_TO_SERVER = b"crew session c2s"
_SERVER_TO_CLIENT = b"crew session s2c"


class HandshakeError(FrameError):
    """A connection did not open with a valid HELLO from a known peer, or a valid answer."""


class Stream(Protocol):
    """What the handshake needs of a connection (``crew.wire.transport.FrameStream``)."""

    codec: FrameCodec

    def send(self, frame: Frame) -> int: ...

    def recv(self, idle_timeout: float | None = None) -> Frame: ...

    def recv_raw(self, n: int, idle_timeout: float | None = None) -> bytes: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class Peer:
    """Who opened a connection: the sender id its HELLO named, and the index of the server's
    key that verified it."""

    id: int
    key: int


@contextmanager
def _deadline(stream: Stream, timeout: float) -> Iterator[None]:
    """Shut the stream down if the block takes longer than ``timeout``: a peer that dribbles
    bytes cannot hold the handshake open."""
    timer = threading.Timer(timeout, stream.shutdown)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _keys(codec: FrameCodec, nonce_c: bytes, nonce_s: bytes) -> tuple[bytes, bytes]:
    """(client -> server, server -> client) keys of one connection."""
    return (
        codec.derive(_CLIENT_TO_SERVER, nonce_c, nonce_s),
        codec.derive(_SERVER_TO_CLIENT, nonce_c, nonce_s),
    )


def open_session(stream: Stream, me: int, timeout: float) -> int:
    """The client's side: say HELLO as ``me`` under the stream's codec, check the answer, and
    switch the stream to the connection's keys. Returns the bytes sent. Raises
    HandshakeError, FrameError or OSError (the caller closes the stream)."""
    base = stream.codec
    nonce_c = secrets.token_bytes(NONCE_BYTES)
    with _deadline(stream, timeout):
        mode = bytes([int(base.encrypt)])
        sent = stream.send(Frame(FrameKind.HELLO, me, base.run, payload=nonce_c + mode))
        stream.codec = base.limited(CHALLENGE_PAYLOAD)
        try:
            answer = stream.recv(idle_timeout=timeout)
        except TimeoutError:
            raise HandshakeError(f"no answer to HELLO within {timeout:g} s") from None
        finally:
            stream.codec = base
    payload = bytes(answer.payload)
    if answer.kind is not FrameKind.CHALLENGE or len(payload) != CHALLENGE_PAYLOAD:
        raise HandshakeError(f"HELLO answered by {answer.kind.name}, not a CHALLENGE")
    if payload[:NONCE_BYTES] != nonce_c:
        raise HandshakeError("the CHALLENGE answers another HELLO (a replay)")
    to_server, to_client = _keys(base, nonce_c, payload[NONCE_BYTES:])
    stream.codec = base.session(to_server, to_client)
    return sent


def _verify(raw: bytes, keys: Sequence[FrameCodec]) -> tuple[int, Frame]:
    """The index of the key that verifies the first frame ``raw``, and the frame."""
    for index, codec in enumerate(keys):
        try:
            return index, codec.decode(raw)
        except BadMac:
            continue
        except (Truncated, TrailingData):
            raise HandshakeError(
                f"first frame is not a HELLO: a HELLO is {HELLO_BYTES} bytes on the wire"
            ) from None
    raise BadMac("the first frame's tag matches none of this server's keys")


def accept_session(
    stream: Stream,
    me: int,
    timeout: float,
    keys: Sequence[FrameCodec],
    known: Callable[[int, int], bool],
) -> Peer:
    """The server's side: read one HELLO's bytes, find the key among ``keys`` that verifies
    it, check ``known(sender, key index)``, answer with a CHALLENGE as ``me`` and switch the
    stream to the connection's keys. Raises HandshakeError, FrameError or OSError."""
    with _deadline(stream, timeout):
        try:
            raw = stream.recv_raw(HELLO_BYTES, idle_timeout=timeout)
        except TimeoutError:
            raise HandshakeError(f"no HELLO within {timeout:g} s") from None
        except ConnectionError:  # closed by the peer, or by the deadline
            raise HandshakeError(f"no HELLO: closed, or not within {timeout:g} s") from None
        if len(raw) != HELLO_BYTES:
            raise HandshakeError(f"connection closed {len(raw)} bytes into its HELLO")
        index, hello = _verify(raw, keys)
        if hello.kind is not FrameKind.HELLO or len(hello.payload) != HELLO_PAYLOAD:
            raise HandshakeError(f"first frame is {hello.kind.name}, expected HELLO")
        if not known(hello.sender, index):
            raise HandshakeError(f"HELLO from unknown peer id {hello.sender}")
        codec = keys[index]
        hello_payload = bytes(hello.payload)
        if hello_payload[NONCE_BYTES] != int(codec.encrypt):
            wants, has = ("on", "off") if hello_payload[NONCE_BYTES] else ("off", "on")
            raise HandshakeError(
                f"peer {hello.sender} has encryption {wants}, this end has it {has}:"
                " both ends of a run must agree"
            )
        nonce_c, nonce_s = hello_payload[:NONCE_BYTES], secrets.token_bytes(NONCE_BYTES)
        stream.codec = codec
        stream.send(Frame(FrameKind.CHALLENGE, me, codec.run, payload=nonce_c + nonce_s))
    to_server, to_client = _keys(codec, nonce_c, nonce_s)
    stream.codec = codec.session(to_client, to_server)
    return Peer(hello.sender, index)
