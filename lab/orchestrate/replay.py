"""Replay and impersonation against a running run's listeners, with the run's own keys.

An eavesdropper on a lab link records bytes, it cannot make them. Holding the run's key (the
lab's ``secret`` file, or the secret a torchrun job was given) and the lab's admin key
(``admin-secret``; a launched job has none), this module makes the bytes an eavesdropper could
have recorded, by opening real sessions and recording what went out, and then tries them, each
on a fresh connection:

* ``replay``: a recorded HELLO and the frame that followed it. The HELLO verifies (it is a
  real one) and is answered with a fresh nonce, so the recorded frame must fail its tag and the
  target must close the connection (coordinator and every worker).
* ``replay-admin`` (coordinator, when the run has an admin key): the same with a recorded
  session of the lab itself, HELLO under the admin key and an ``Admin`` request (``set_p`` to
  the run's current p, so that even an accepted replay would change nothing). A launched job's
  coordinator holds the run's key alone: no session of the lab exists to record.
* ``impersonate``: a genuine session as peer k that then sends a frame naming sender m; the
  target must close the connection (coordinator and every worker).
* ``lab-hello`` (coordinator): a HELLO naming the lab's sender id under the run's key, as a
  worker that claims to be the lab would send; refused at the handshake.
* ``admin-from-worker`` (coordinator): a genuine session as worker k that sends ``Admin``
  (``set_p`` to another p). The coordinator keeps such a connection (its messages are only
  refused), so the check is in the run database: p must not change, and a ``security`` event
  must say the request was refused (:func:`admin_refused_in_db`).

The frames sent after a handshake are ones a target ignores when they are genuine: a CONTROL
frame with an unknown message type (coordinator), an opaque PAYLOAD frame (worker). Refused
means the target closed the connection within ``wait_s`` of the last byte; the write side stays
open, so the close is the target's decision, not an end of stream.
"""

from __future__ import annotations

import collections
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crew.config import RunConfig
from crew.runtime import rundb
from crew.wire import protocol as proto
from crew.wire.frames import COORDINATOR, Frame, FrameCodec, FrameKind, control_frame
from crew.wire.session import open_session
from crew.wire.transport import FrameStream
from lab.orchestrate.flood import CONNECT_TIMEOUT_S, Target, in_netns

HANDSHAKE_S = 5.0
IGNORED = {"type": "lab-hostile-probe"}  # no message type: the coordinator ignores it


class _Recorder:
    """A socket that records every byte sent through it (what an eavesdropper sees)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.sent = bytearray()

    def sendmsg(self, buffers: list[memoryview], *args: Any) -> int:
        n = self._sock.sendmsg(buffers, *args)
        self.sent += b"".join(bytes(b) for b in buffers)[:n]
        return n

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)
        self.sent += data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


@dataclass
class ReplayCounts:
    """Attempts and outcomes per kind of attack and target (``kind@target``)."""

    attempts: collections.Counter[str] = field(default_factory=collections.Counter)
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    kept: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: list[str] = field(default_factory=list)

    def note(self, key: str, refused: bool) -> None:
        self.attempts[key] += 1
        (self.refused if refused else self.kept)[key] += 1

    def to_dict(self) -> dict[str, object]:
        return {
            "attempts": dict(self.attempts),
            "refused": dict(self.refused),
            "kept": dict(self.kept),
            "errors": self.errors,
        }


@dataclass(frozen=True)
class Keys:
    """What the attacks need of a run: its number, its codec's settings and its keys; a run
    without ``admin_secret`` (a launched job) has no administrator's identity at all."""

    run_num: int
    n: int
    max_payload: int
    encrypt: bool
    secret: bytes
    admin_secret: bytes | None

    @classmethod
    def of_run(cls, run_dir: Path) -> Keys:
        """A lab's keys, from its run folder (``config.json``, ``secret``, ``admin-secret``)."""
        cfg = RunConfig.load(run_dir / "config.json")
        return cls.of_config(cfg, cfg.secret(), (run_dir / "admin-secret").read_bytes())

    @classmethod
    def of_config(cls, cfg: RunConfig, secret: bytes, admin_secret: bytes | None = None) -> Keys:
        return cls(cfg.run_num, cfg.n, cfg.max_payload, cfg.encrypt, secret, admin_secret)

    def codec(self, admin: bool = False) -> FrameCodec:
        key = self.admin_secret if admin else self.secret
        if key is None:
            raise ValueError("this run has no admin key")
        return FrameCodec(key, self.run_num, max_payload=self.max_payload, encrypt=self.encrypt)


def _session(target: Target, codec: FrameCodec, me: int) -> tuple[FrameStream, _Recorder]:
    sock = socket.create_connection((target.host, target.port), timeout=CONNECT_TIMEOUT_S)
    rec = _Recorder(sock)
    stream = FrameStream(rec, codec)  # type: ignore[arg-type]
    try:
        open_session(stream, me, HANDSHAKE_S)
    except BaseException:
        stream.close()
        raise
    return stream, rec


def _closed_by_peer(sock: socket.socket, wait_s: float) -> bool:
    """Whether the peer ends the connection within ``wait_s`` (whatever it sends first)."""
    deadline = time.monotonic() + wait_s
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            if not sock.recv(4096):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True  # reset
    return False


def _try(target: Target, data: bytes, wait_s: float) -> bool:
    """Send ``data`` on a fresh connection; True if the target then closed it."""
    with socket.create_connection((target.host, target.port), timeout=CONNECT_TIMEOUT_S) as s:
        try:
            s.sendall(data)
        except OSError:
            return True
        return _closed_by_peer(s, wait_s)


def _probe_frame(keys: Keys, sender: int, worker_target: bool) -> Frame:
    if worker_target:
        return Frame(FrameKind.PAYLOAD, sender, keys.run_num, payload=secrets.token_bytes(64))
    return control_frame(sender, keys.run_num, IGNORED)


def _recorded(target: Target, codec: FrameCodec, me: int, frame: Frame) -> bytes:
    """The bytes of a genuine session as ``me``: its HELLO and ``frame``."""
    stream, rec = _session(target, codec, me)
    try:
        stream.send(frame)
    finally:
        stream.close()
    return bytes(rec.sent)


def _impersonate(target: Target, codec: FrameCodec, me: int, frame: Frame, wait_s: float) -> bool:
    """A genuine session as ``me`` that sends ``frame`` (another sender); True if closed."""
    stream, _ = _session(target, codec, me)
    try:
        stream.send(frame)
        return _closed_by_peer(stream.sock, wait_s)
    except OSError:
        return True
    finally:
        stream.close()


def attack_target(
    target: Target, worker: int | None, keys: Keys, tries: int, p: int, wait_s: float
) -> ReplayCounts:
    """Every attack of the module docstring that applies to ``target`` (``worker``: the worker
    listening there; None: the coordinator), ``tries`` times each, from this thread."""
    counts = ReplayCounts()
    run = keys.codec()
    wt = worker is not None
    me = 0 if worker is None else (worker + 1) % keys.n  # a genuine peer of the target
    other = 1 if worker is None else (worker + 2) % keys.n  # the sender it claims to be
    attacks: list[tuple[str, Callable[[], bool]]] = [
        (
            "replay",
            lambda: _try(target, _recorded(target, run, me, _probe_frame(keys, me, wt)), wait_s),
        ),
        (
            "impersonate",
            lambda: _impersonate(target, run, me, _probe_frame(keys, other, wt), wait_s),
        ),
    ]
    if worker is None and keys.admin_secret is not None:
        admin = keys.codec(admin=True)
        same_p = control_frame(
            COORDINATOR, keys.run_num, proto.Admin(op="set_p", args={"p": p}).to_dict()
        )
        attacks.append(
            (
                "replay-admin",
                lambda: _try(target, _recorded(target, admin, COORDINATOR, same_p), wait_s),
            )
        )
    if worker is None:
        hello = run.encode_bytes(
            Frame(FrameKind.HELLO, COORDINATOR, keys.run_num, payload=bytes(17))
        )
        attacks.append(("lab-hello", lambda: _try(target, hello, wait_s)))
    for kind, attempt in attacks:
        for _ in range(tries):
            try:
                counts.note(f"{kind}@{target.name}", attempt())
            except Exception as exc:  # a genuine session that failed: counted, reported
                counts.errors.append(f"{kind}@{target.name}: {type(exc).__name__}: {exc}")
    return counts


def admin_from_worker(target: Target, keys: Keys, tries: int, new_p: int) -> int:
    """``tries`` genuine worker sessions (worker 0) sending ``Admin(set_p=new_p)``; returns
    how many were sent. Whether they were refused is in the database."""
    sent = 0
    run = keys.codec()
    for _ in range(tries):
        frame = control_frame(0, keys.run_num, proto.Admin(op="set_p", args={"p": new_p}).to_dict())
        stream, _ = _session(target, run, 0)
        try:
            stream.send(frame)
            sent += 1
            time.sleep(0.2)  # read by the coordinator before the connection closes
        finally:
            stream.close()
    return sent


def admin_refused_in_db(db_path: Path, since: float) -> tuple[str | None, int]:
    """(the run's p now, the security events since ``since`` saying an Admin was refused)."""
    with rundb.reading(db_path) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key='p'").fetchone()
        refused = conn.execute(
            "SELECT COUNT(*) FROM events WHERE kind='security' AND t >= ?"
            " AND message LIKE 'Admin %refused%'",
            (since,),
        ).fetchone()[0]
    return (None if row is None else str(row[0])), int(refused)


def replay_all(
    targets: list[tuple[Target, int | None]], keys: Keys, tries: int, p: int, wait_s: float
) -> ReplayCounts:
    """:func:`attack_target` on every target, each from its own namespace, one after another."""
    total = ReplayCounts()
    for target, worker in targets:
        bound = tries * 4 * (2 * CONNECT_TIMEOUT_S + HANDSHAKE_S + wait_s) + 10
        try:
            got = in_netns(
                target.netns_pid,
                lambda t=target, w=worker: attack_target(t, w, keys, tries, p, wait_s),
                bound,
            )
        except Exception as exc:
            total.errors.append(f"{target.name}: {type(exc).__name__}: {exc}")
            continue
        total.attempts.update(got.attempts)
        total.refused.update(got.refused)
        total.kept.update(got.kept)
        total.errors += got.errors
    return total
