"""Pre-authentication pressure on a listener: idle connections, slowloris and hostile frames.

A :class:`Target` is one listening port of a running lab (the coordinator's control port, or a
worker's data port) and the network namespace to reach it from: the coordinator listens in the
root namespace; a worker listens on its identity address inside its host's namespace, which the
root namespace has no route to, so its attackers run in threads that entered that namespace
(:func:`in_netns`). They connect over that namespace's loopback, from the worker's own identity
address: a source no honest peer uses, and no byte of it crosses the shaped links.

:func:`flood` runs three attackers against one target at once, each bounded in count and time:

* **idle**: ``connections`` connections opened at a steady pace over ``spread_s`` seconds, each
  held without sending a byte until the target ends it. One ended within ``REFUSED_S`` of its
  connect was *refused* (a connection cap closes it at once); later, *cut* (the handshake
  deadline); still open ``hold_s`` after its connect, *kept_open* (a failure: the target would
  hold it for ever).
* **slowloris**: ``slowloris`` slots, each a connection that sends one byte of a HELLO header
  every ``drip_s`` seconds until the target cuts it, then a new one, until ``duration_s``. The
  longest any was held must stay within the target's handshake deadline.
* **frames**: ``frames`` connections spread over ``duration_s``, one hostile message each
  (wrong MAC, garbage and oversized header in turn), made and delivered by
  ``lab.orchestrate.attacker`` as ``lab.fuzz attack`` does.

Every socket is closed before :func:`flood` returns.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from crew.wire.frames import DEFAULT_MAX_PAYLOAD, FrameKind
from crew.wire.session import HELLO_PAYLOAD
from lab.orchestrate.attacker import (
    AttackReport,
    attack,
    header_bytes,
)

T = TypeVar("T")

CLONE_NEWNET = 0x4000_0000
REFUSED_S = 1.0  # a connection ended this soon after its connect was refused, not cut
CONNECT_TIMEOUT_S = 3.0
DELIVER_WAIT_S = 5.0  # how long a hostile message's connection may stay open after it
SLOWLORIS_PAUSE_S = 0.5  # between two slowloris connections of one slot: bounds their count
POLL_S = 0.1
_DROPPED = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN, errno.ECONNABORTED})


@dataclass(frozen=True)
class Target:
    """A listening port of the lab: ``netns_pid`` names the namespace to reach it from (a
    process inside it; None: this one's), ``deadline_s`` its handshake deadline."""

    name: str
    host: str
    port: int
    netns_pid: int | None
    deadline_s: float


def enter_netns(pid: int) -> None:
    """Move the calling thread (only it) into the network namespace of process ``pid``."""
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        setns = getattr(os, "setns", None)
        if setns is not None:
            setns(fd, CLONE_NEWNET)
            return
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"setns into the namespace of pid {pid}: {os.strerror(code)}")
    finally:
        os.close(fd)


def in_thread(
    fn: Callable[[], T], name: str, wait: Callable[[threading.Thread], object], overrun: str
) -> T:
    """``fn()`` in a thread of its own, while ``wait(thread)`` waits for it here; its result,
    or its exception raised here. ``TimeoutError(overrun)`` if it is still running after."""
    box: dict[str, object] = {}

    def body() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    wait(thread)
    if thread.is_alive():
        raise TimeoutError(overrun)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def in_netns(pid: int | None, fn: Callable[[], T], timeout_s: float) -> T:
    """``fn()`` in a thread of its own inside ``pid``'s network namespace (None: here), waited
    for at most ``timeout_s``; its exception is raised here."""

    def inside() -> T:
        if pid is not None:
            enter_netns(pid)
        return fn()

    return in_thread(
        inside,
        f"netns-{pid}",
        lambda thread: thread.join(timeout_s),
        f"an attacker in the namespace of pid {pid} ran over {timeout_s:g} s",
    )


@dataclass
class FloodCounts:
    """What the attackers of one target did and how the target ended each connection."""

    target: str
    deadline_s: float
    idle: collections.Counter[str] = field(default_factory=collections.Counter)
    idle_longest_s: float = 0.0  # the longest an idle connection stayed open
    slowloris: collections.Counter[str] = field(default_factory=collections.Counter)
    slowloris_longest_s: float = 0.0
    slowloris_most_bytes: int = 0  # the most bytes one slowloris connection got to send
    frames: AttackReport | None = None
    error: str | None = None

    @property
    def attempted(self) -> int:
        sent = sum(self.frames.sent.values()) if self.frames else 0
        failed = self.frames.ended["connect_failed"] if self.frames else 0
        return sum(self.idle.values()) + sum(self.slowloris.values()) + sent + failed

    def to_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "deadline_s": self.deadline_s,
            "attempted": self.attempted,
            "idle": dict(self.idle),
            "idle_longest_s": round(self.idle_longest_s, 2),
            "slowloris": dict(self.slowloris),
            "slowloris_longest_s": round(self.slowloris_longest_s, 2),
            "slowloris_most_bytes": self.slowloris_most_bytes,
            "frames": None if self.frames is None else self.frames.to_dict(),
            "error": self.error,
        }


def _ended(sock: socket.socket) -> str | None:
    """How the peer ended a readable connection: "closed", "reset", or "answered" (it sent
    bytes, which no listener does before a HELLO); None if it is still open."""
    try:
        data = sock.recv(4096, socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as exc:
        return "reset" if exc.errno in _DROPPED else "recv_failed"
    return "closed" if not data else "answered"


def idle_flood(
    target: Target, connections: int, spread_s: float, hold_s: float, counts: FloodCounts
) -> None:
    """Open ``connections`` connections over ``spread_s`` and hold each until the target ends
    it (see the module docstring). Returns by ``spread_s + hold_s + CONNECT_TIMEOUT_S``."""
    sel = selectors.DefaultSelector()
    opened_at: dict[socket.socket, float] = {}
    start = time.monotonic()
    stop = start + spread_s + hold_s + CONNECT_TIMEOUT_S
    gap = spread_s / connections if connections else 0.0

    def finish(sock: socket.socket, how: str) -> None:
        held = time.monotonic() - opened_at.pop(sock)
        counts.idle_longest_s = max(counts.idle_longest_s, held)
        if how in ("closed", "reset"):
            how = "refused" if held < REFUSED_S else "cut"
        counts.idle[how] += 1
        sel.unregister(sock)
        sock.close()

    try:
        opened = 0
        while (opened < connections or opened_at) and time.monotonic() < stop:
            now = time.monotonic()
            while opened < connections and now >= start + opened * gap:
                opened += 1
                try:
                    sock = socket.create_connection(
                        (target.host, target.port), timeout=CONNECT_TIMEOUT_S
                    )
                except OSError:
                    counts.idle["connect_failed"] += 1
                    continue
                sock.setblocking(False)
                opened_at[sock] = time.monotonic()
                sel.register(sock, selectors.EVENT_READ)
                now = time.monotonic()
            for key, _ in sel.select(POLL_S if opened_at else min(POLL_S, gap)):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                how = _ended(sock)
                if how is not None:
                    finish(sock, how)
            now = time.monotonic()
            for sock in [s for s, t in opened_at.items() if now - t > hold_s]:
                finish(sock, "kept_open")
        if opened < connections:
            counts.idle["not_opened"] += connections - opened
    finally:
        for sock in list(opened_at):
            finish(sock, "kept_open")
        sel.close()


def slowloris(
    target: Target, slots: int, drip_s: float, duration_s: float, counts: FloodCounts
) -> None:
    """``slots`` dribbling connections, renewed when cut, until ``duration_s`` (see the module
    docstring). Returns by ``duration_s + target.deadline_s + 2 drip_s``."""
    hello = header_bytes(FrameKind.HELLO, HELLO_PAYLOAD)
    lock = threading.Lock()
    end = time.monotonic() + duration_s

    def one_slot() -> None:
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                sock = socket.create_connection(
                    (target.host, target.port), timeout=CONNECT_TIMEOUT_S
                )
            except OSError:
                with lock:
                    counts.slowloris["connect_failed"] += 1
                time.sleep(SLOWLORIS_PAUSE_S)
                continue
            with sock:
                how, sent = _dribble(sock, hello, drip_s, end + target.deadline_s + drip_s)
            held = time.monotonic() - t0
            with lock:
                counts.slowloris[how] += 1
                counts.slowloris_longest_s = max(counts.slowloris_longest_s, held)
                counts.slowloris_most_bytes = max(counts.slowloris_most_bytes, sent)
            time.sleep(SLOWLORIS_PAUSE_S)

    threads = [threading.Thread(target=one_slot, daemon=True) for _ in range(slots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration_s + target.deadline_s + 2 * drip_s + CONNECT_TIMEOUT_S + 5)


def _dribble(sock: socket.socket, data: bytes, drip_s: float, give_up: float) -> tuple[str, int]:
    """Send ``data`` one byte per ``drip_s`` until the peer ends the connection ("cut"), the
    bytes run out or ``give_up`` passes ("kept_open"). Returns how it ended and bytes sent."""
    sent = 0
    while time.monotonic() < give_up:
        if sent < len(data):
            try:
                sock.sendall(data[sent : sent + 1])
                sent += 1
            except OSError:
                return "cut", sent
        sock.settimeout(max(0.01, min(drip_s, give_up - time.monotonic())))
        try:
            got = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return "cut", sent
        return ("cut" if not got else "answered"), sent
    return "kept_open", sent


def hostile_frames(
    target: Target, frames: int, duration_s: float, seed: int, max_payload: int
) -> AttackReport:
    """``frames`` connections spread over ``duration_s``, one hostile message each, in turn
    wrong-MAC, garbage and oversized (``attacker.attack``). Bounded by ``duration_s`` plus
    ``frames * (CONNECT_TIMEOUT_S + DELIVER_WAIT_S)``."""
    return attack(
        target.host,
        target.port,
        frames,
        seed=seed,
        max_payload=max_payload,
        connect_timeout=CONNECT_TIMEOUT_S,
        wait_s=DELIVER_WAIT_S,
        spread_s=duration_s,
    )


@dataclass(frozen=True)
class FloodPlan:
    """How hard to press one target (see the module docstring)."""

    connections: int
    slowloris: int
    frames: int
    duration_s: float
    drip_s: float = 2.0
    seed: int = 0
    max_payload: int = DEFAULT_MAX_PAYLOAD

    def time_bound_s(self, target: Target) -> float:
        """The longest :func:`flood` may take against ``target``."""
        hold = self.hold_s(target)
        return (
            self.duration_s
            + max(hold, target.deadline_s + 2 * self.drip_s)
            + self.frames * (CONNECT_TIMEOUT_S + DELIVER_WAIT_S)
            + 2 * CONNECT_TIMEOUT_S
            + 10.0
        )

    def hold_s(self, target: Target) -> float:
        """How long an idle connection may stay open before it counts as kept open."""
        return 2 * target.deadline_s + 5.0


def flood(target: Target, plan: FloodPlan) -> FloodCounts:
    """The three attackers against ``target`` at once, from its namespace."""
    counts = FloodCounts(target.name, target.deadline_s)
    box: list[AttackReport] = []
    parts = [
        lambda: idle_flood(
            target, plan.connections, plan.duration_s / 2, plan.hold_s(target), counts
        ),
        lambda: slowloris(target, plan.slowloris, plan.drip_s, plan.duration_s, counts),
        lambda: box.append(
            hostile_frames(target, plan.frames, plan.duration_s, plan.seed, plan.max_payload)
        ),
    ]
    bound = plan.time_bound_s(target)
    threads = [
        threading.Thread(target=_guarded, args=(target.netns_pid, part, bound, counts), daemon=True)
        for part in parts
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(bound + 5)
    counts.frames = box[0] if box else None
    return counts


def _guarded(
    pid: int | None, part: Callable[[], object], bound: float, counts: FloodCounts
) -> None:
    try:
        in_netns(pid, part, bound)
    except Exception as exc:  # reported with the counts; the other attackers go on
        counts.error = f"{type(exc).__name__}: {exc}"
