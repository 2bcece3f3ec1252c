"""The connection handshake (crew.wire.session): fresh nonces, keys of the connection's own and
sequence numbers under the tag refuse replays and reordering; the key that verified the HELLO
is the peer's identity. Real sockets on loopback."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import pytest

import crew.wire.frames as wf
from crew.wire.frames import Frame, FrameCodec, FrameKind
from crew.wire.session import (
    HELLO_BYTES,
    NONCE_BYTES,
    HandshakeError,
    Peer,
    accept_session,
    open_session,
)
from crew.wire.transport import FrameStream

RUN = 11
RUN_KEY = FrameCodec(b"r" * 32, RUN)
ADMIN_KEY = FrameCodec(b"a" * 32, RUN)
WAIT = 5.0


def data(sender: int, payload: bytes) -> Frame:
    return Frame(FrameKind.CONTROL, sender, RUN, payload=payload)


class Server:
    """accept_session on one end of a socket pair, in a thread; ``peer`` or ``error`` after."""

    def __init__(
        self,
        sock: socket.socket,
        keys: list[FrameCodec],
        known: Callable[[int, int], bool] = lambda *_: True,
    ) -> None:
        self.stream = FrameStream(sock, RUN_KEY)
        self.peer: Peer | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(keys, known), daemon=True)
        self.thread.start()

    def _run(self, keys: list[FrameCodec], known: Callable[[int, int], bool]) -> None:
        try:
            self.peer = accept_session(self.stream, 0xFFFF, WAIT, keys, known)
        except BaseException as exc:  # the test reads it
            self.error = exc
            self.stream.close()  # as a server does: the client sees the refusal at once

    def join(self) -> None:
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


class RecordingSocket(socket.socket):
    """A socket that keeps a copy of every byte it sends (a passive capture)."""

    sent: bytearray

    def sendmsg(self, buffers, *args):  # noqa: ANN001, ANN002, ANN201
        n = super().sendmsg(buffers, *args)
        self.sent += b"".join(bytes(b) for b in buffers)[:n]
        return n


def tapped_pair() -> tuple[RecordingSocket, socket.socket]:
    a, b = socket.socketpair()
    client = RecordingSocket(a.family, a.type, fileno=a.detach())
    client.sent = bytearray()
    return client, b


def test_a_session_carries_frames_both_ways_and_names_the_peer() -> None:
    a, b = socket.socketpair()
    server = Server(b, [RUN_KEY])
    client = FrameStream(a, RUN_KEY)
    open_session(client, 3, WAIT)
    server.join()
    assert server.peer == Peer(3, 0)
    client.send(data(3, b"up"))
    assert server.stream.recv(idle_timeout=WAIT).payload == b"up"
    server.stream.send(data(0xFFFF, b"down"))
    assert client.recv(idle_timeout=WAIT).payload == b"down"
    client.close()
    server.stream.close()


def test_a_recorded_session_replayed_on_a_new_connection_is_refused() -> None:
    client_sock, server_sock = tapped_pair()
    server = Server(server_sock, [RUN_KEY])
    client = FrameStream(client_sock, RUN_KEY)
    open_session(client, 3, WAIT)
    server.join()
    client.send(data(3, b'{"type": "register"}'))
    assert server.stream.recv(idle_timeout=WAIT).payload == b'{"type": "register"}'
    recorded = bytes(client_sock.sent)
    assert len(recorded) > HELLO_BYTES  # the HELLO and the frame after it

    # The attacker replays every recorded byte on a connection of its own.
    attacker, victim = socket.socketpair()
    replayed = Server(victim, [RUN_KEY])
    attacker.sendall(recorded)
    replayed.join()
    assert replayed.peer == Peer(3, 0)  # the HELLO alone proves nothing ...
    with pytest.raises(wf.BadMac):  # ... the frames after it fail under the new keys
        replayed.stream.recv(idle_timeout=WAIT)
    for s in (attacker, victim, client_sock, server_sock):
        s.close()


def test_a_frame_repeated_or_reordered_within_a_connection_is_refused() -> None:
    a, b = socket.socketpair()
    sender = RUN_KEY.session(b"k" * 32, b"q" * 32)
    receiver = RUN_KEY.session(b"q" * 32, b"k" * 32)
    first = sender.encode_bytes(data(1, b"one"))
    second = sender.encode_bytes(data(1, b"two"))
    with pytest.raises(wf.BadMac):
        receiver.decode(second)  # out of order
    assert receiver.decode(first).payload == b"one"
    with pytest.raises(wf.BadMac):
        receiver.decode(first)  # again
    assert receiver.decode(second).payload == b"two"
    a.close()
    b.close()


def test_a_challenge_for_another_hello_is_refused() -> None:
    a, b = socket.socketpair()
    client = FrameStream(a, RUN_KEY)
    server = FrameStream(b, RUN_KEY)

    def answer_with_a_recorded_challenge() -> None:
        server.recv_raw(HELLO_BYTES, idle_timeout=WAIT)
        stale = b"o" * NONCE_BYTES + b"s" * NONCE_BYTES  # answers another client's nonce
        server.send(Frame(FrameKind.CHALLENGE, 0xFFFF, RUN, payload=stale))

    thread = threading.Thread(target=answer_with_a_recorded_challenge, daemon=True)
    thread.start()
    with pytest.raises(HandshakeError, match="answers another HELLO"):
        open_session(client, 3, WAIT)
    thread.join(WAIT)
    client.close()
    server.close()


def test_the_key_that_verifies_the_hello_is_the_identity() -> None:
    lab_only = lambda sender, key: sender == 0xFFFF if key == 1 else sender < 8  # noqa: E731
    # The lab, under the admin key.
    a, b = socket.socketpair()
    server = Server(b, [RUN_KEY, ADMIN_KEY], lab_only)
    open_session(FrameStream(a, ADMIN_KEY), 0xFFFF, WAIT)
    server.join()
    assert server.peer == Peer(0xFFFF, 1)
    # A worker that holds the run's key and claims the lab's id is refused.
    c, d = socket.socketpair()
    server = Server(d, [RUN_KEY, ADMIN_KEY], lab_only)
    with pytest.raises((wf.FrameError, OSError)):
        open_session(FrameStream(c, RUN_KEY), 0xFFFF, WAIT)
    server.join()
    assert isinstance(server.error, HandshakeError) and "unknown peer" in str(server.error)
    # A key the server does not hold verifies nothing.
    e, f = socket.socketpair()
    server = Server(f, [RUN_KEY, ADMIN_KEY], lab_only)
    with pytest.raises((wf.FrameError, OSError)):
        open_session(FrameStream(e, FrameCodec(b"z" * 32, RUN)), 2, WAIT)
    server.join()
    assert isinstance(server.error, wf.BadMac)
    for s in (a, b, c, d, e, f):
        s.close()


def test_a_silent_client_is_cut_at_the_handshake_deadline() -> None:
    a, b = socket.socketpair()
    stream = FrameStream(b, RUN_KEY)
    with pytest.raises(HandshakeError):
        accept_session(stream, 0, 0.3, [RUN_KEY], lambda *_: True)
    a.close()
    stream.close()


# -- encryption --------------------------------------------------------------------------------

SEALED = FrameCodec(b"r" * 32, RUN, encrypt=True)


def test_an_encrypted_session_carries_frames_and_refuses_tampering() -> None:
    a, b = socket.socketpair()
    server_stream = FrameStream(b, SEALED)
    got: list[Frame] = []

    def serve() -> None:
        accept_session(server_stream, 0, WAIT, [SEALED], lambda *_: True)
        got.append(server_stream.recv(idle_timeout=WAIT))
        server_stream.send(data(0, b"sealed answer"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = FrameStream(a, SEALED)
    open_session(client, 2, WAIT)
    client.send(data(2, b"sealed question"))
    assert client.recv(idle_timeout=WAIT).payload == b"sealed answer"
    thread.join(WAIT)
    assert bytes(got[0].payload) == b"sealed question"
    client.close()
    server_stream.close()
    # A flipped ciphertext bit fails the tag.
    sender = SEALED.session(b"k" * 32, b"q" * 32)
    receiver = SEALED.session(b"q" * 32, b"k" * 32)
    wire = bytearray(sender.encode_bytes(data(1, b"x" * 100)))
    wire[60] ^= 1
    with pytest.raises(wf.BadMac):
        receiver.decode(bytes(wire))


def test_ends_that_disagree_on_encryption_are_told_so() -> None:
    a, b = socket.socketpair()
    server = Server(b, [RUN_KEY])  # this end does not encrypt
    with pytest.raises((wf.FrameError, OSError)):
        open_session(FrameStream(a, SEALED), 2, WAIT)
    server.join()
    assert isinstance(server.error, HandshakeError)
    assert "encryption on, this end has it off" in str(server.error)
    a.close()
    b.close()


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_capture_of_the_wire_holds_the_model_only_without_encryption(encrypt: bool) -> None:
    import numpy as np

    codec = FrameCodec(b"r" * 32, RUN, encrypt=encrypt)
    model = np.arange(50_000, dtype=np.float32) * np.float32(0.001)  # a recognisable vector
    client_sock, server_sock = tapped_pair()
    server = Server(server_sock, [codec])
    client = FrameStream(client_sock, codec)
    open_session(client, 1, WAIT)
    server.join()
    client.send(Frame(FrameKind.SCATTER, 1, RUN, payload=memoryview(model)))
    assert bytes(server.stream.recv(idle_timeout=WAIT).payload) == model.tobytes()
    captured = bytes(client_sock.sent)
    plain = model.tobytes()
    windows = [plain[k : k + 32] for k in range(0, len(plain) - 32, 4096)]
    found = sum(w in captured for w in windows)
    if encrypt:
        assert found == 0  # not one 32-byte stretch of the model is on the wire
    else:
        assert found == len(windows)  # the capture does see a model sent in the clear
    client.close()
    server.stream.close()


def test_launched_jobs_encrypt_unless_told_not_to() -> None:
    from crew.errors import LaunchError
    from crew.runtime.launch import encryption

    assert encryption({}) is True
    assert encryption({"CREW_ENCRYPT": "0"}) is False
    assert encryption({"CREW_ENCRYPT": "off"}) is False
    with pytest.raises(LaunchError, match="CREW_ENCRYPT"):
        encryption({"CREW_ENCRYPT": "maybe"})
