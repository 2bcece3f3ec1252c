"""CPU cost of the data path, per GB moved.

    python -m lab.studies.datapath [--workers 4] [--mb 16]

Runs the real thing: ``--workers`` ReduceEngines, each with its own Transport (framed,
MAC-authenticated TCP) on loopback and, as in the lab, in its own process (``--one-process``:
all in this one), all members of one group planned as CREW's direct stars (one equal segment
per worker). ``--ops`` groups run back to back; the processes' user and system CPU seconds
over them are divided by the bytes the plan moves across links (``crew.plan.routes.link_load``),
the figure ``lab.bench`` prints as CPU s/GB.

Then every per-byte stage the engine and codec run is timed alone at the same part size, in
CPU seconds per GB of link bytes (how many times it touches each link byte is in the table):
the frame MAC (keyed BLAKE3, ``FrameCodec.tag``; sender and receiver: x2), the finiteness
check (x1, every received part), adding (up phase: x1/2), copies into the result (down phase:
x1/2), the receive buffer's allocation (x1). What the stages do not explain is the kernel
(TCP, loopback, softirq: mostly ``sys``) and Python's per-frame work (thread hand-offs, queues,
frame objects).

``--lab-mtu`` (root) re-runs itself in a fresh network namespace whose loopback has the lab's
veth settings: MTU 1500 and TSO/GSO/GRO off (``lab.net.shaping.disable_offloads``), so every
1448-byte segment costs the kernel a full trip, as on the lab's links. ``--json`` prints the
figures as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from crew.cli_options import add_json_flag, command_parser, write_json
from crew.plan.routes import Route, link_load, star_routes
from crew.runtime.reduce import DTYPE, ReduceEngine
from crew.wire.frames import HEADER_SIZE, BadMac, Frame, FrameCodec, FrameKind
from crew.wire.protocol import Assign
from crew.wire.transport import Transport

RUN = 1
WAIT_S = 120.0  # one op on loopback takes well under a second; this only bounds a hang
PART_ELEMS = 64 << 10  # crew.control.assignment.MAX_ROUTE_PART_ELEMS: the lab's part size


@dataclass(frozen=True)
class EndToEnd:
    workers: int
    ops: int
    link_gb: float  # 10^9 bytes the plans moved across links, all ops
    wall_s: float
    user_s: float
    sys_s: float

    @property
    def cpu_s_per_gb(self) -> float:
        return (self.user_s + self.sys_s) / self.link_gb

    @property
    def gbit_s(self) -> float:
        return self.link_gb * 8 / self.wall_s


def _star_assign(group: int, n: int, total: int) -> Assign:
    members = list(range(n))
    bounds = [total * w // n for w in range(n + 1)]
    routes = star_routes([(w, bounds[w], bounds[w + 1]) for w in members], members)
    return Assign(
        group=group,
        rev=0,
        scheme="crew",
        members=members,
        weights=[1.0 / n] * n,
        routes=[r.to_list() for r in routes],
        pipelined=True,
        total=total,
        part_elems=PART_ELEMS,
        prescatter=[],
        iterations=[0] * n,
        split_epoch=-1,
    )


class ThreadProfiles:
    """cProfile in every thread started while it is installed (cProfile alone sees one)."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def _start(self, *_: object) -> None:
        prof = cProfile.Profile()
        with self._lock:
            self.profiles.append(prof)
        prof.enable()  # replaces this hook in the calling thread

    def install(self) -> None:
        threading.setprofile(self._start)

    def uninstall(self) -> None:
        threading.setprofile(None)  # type: ignore[arg-type]
        for prof in self.profiles:
            prof.disable()

    def top(self, count: int) -> str:
        out = io.StringIO()
        with self._lock:
            profiles = list(self.profiles)
        if profiles:
            pstats.Stats(*profiles, stream=out).sort_stats("tottime").print_stats(count)
        return out.getvalue()


def _vectors(workers: int, total: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Every worker's vector (the same seed in every process) and their average."""
    rng = np.random.default_rng(1)
    vectors = [rng.standard_normal(total).astype(DTYPE) for _ in range(workers)]
    return vectors, np.mean(vectors, axis=0)


class _Member:
    """One worker's reduce engine on its own transport, as a worker process holds them."""

    def __init__(self, me: int, workers: int, codec: FrameCodec) -> None:
        self._done: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self.engine = ReduceEngine(me, workers, RUN, self._send, self._have_all)
        self.transport = Transport(me, ("127.0.0.1", 0), {}, codec, on_frame=self.engine.on_frame)

    def _event(self, group: int) -> threading.Event:
        with self._lock:
            return self._done.setdefault(group, threading.Event())

    def _send(self, dst: int, frame: Any, priority: int) -> None:
        self.transport.send(dst, frame, priority)

    def _have_all(self, group: int, rev: int, nbytes: int) -> None:
        self._event(group).set()

    def start(self, peers: dict[int, Any]) -> None:
        for j, addr in peers.items():
            self.transport.set_peer(j, addr)
        self.transport.start()

    def wait(self, group: int) -> np.ndarray | None:
        """This member's result of ``group`` once it has all of it."""
        if not self._event(group).wait(WAIT_S):
            raise TimeoutError(f"worker {self.engine.me} never completed group {group}")
        with self._lock:
            del self._done[group]
        return self.engine.finish(group)

    def close(self) -> None:
        self.transport.close()


def _link_bytes(assign: Assign, workers: int) -> float:
    """The bytes ``assign``'s routes move across links."""
    return float(link_load([Route.from_list(r) for r in assign.routes], workers).sum())


def _is_average(result: np.ndarray | None, expected: np.ndarray) -> bool:
    return result is not None and bool(np.allclose(result, expected, atol=1e-5))


def _member_process(
    me: int, workers: int, total: int, secret: bytes, encrypt: bool, conn: Any
) -> None:
    """A worker process: its engine and transport, driven group by group through ``conn``.

    Per group: an ``Assign`` -> clock starts, ``"done"`` when its result is whole;
    ``"stop"`` (sent once every member is done, so nothing of the group is still being sent)
    -> clock stops, the result is checked off the clock, and ``(user_s, sys_s, exact)``
    goes back. ``None`` ends it."""
    member = _Member(me, workers, FrameCodec(secret, RUN, encrypt=encrypt))
    try:
        conn.send(member.transport.address)
        member.start(conn.recv())
        vectors, expected = _vectors(workers, total)
        while (msg := conn.recv()) is not None:
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            member.engine.assign(msg, vectors[me])
            result = member.wait(msg.group)
            conn.send("done")
            conn.recv()  # "stop"
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            used = (r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime)
            conn.send((*used, _is_average(result, expected)))
            del result
    finally:
        member.close()
        conn.close()


def _run_in_processes(workers: int, total: int, ops: int, encrypt: bool) -> list[tuple]:
    """Per group: (link bytes, wall s, user s, sys s) summed over ``workers`` processes."""
    ctx = mp.get_context("fork")  # nothing runs threads yet in this process
    secret = os.urandom(32)
    pipes = [ctx.Pipe() for _ in range(workers)]
    procs = [
        ctx.Process(target=_member_process, args=(w, workers, total, secret, encrypt, pipes[w][1]))
        for w in range(workers)
    ]
    for proc in procs:
        proc.start()
    conns = [parent for parent, _ in pipes]
    rows = []
    try:
        addrs = {w: _recv(c, w) for w, c in enumerate(conns)}
        for w, c in enumerate(conns):
            c.send({j: a for j, a in addrs.items() if j != w})
        for group in range(ops + 1):
            assign = _star_assign(group, workers, total)
            w0 = time.perf_counter()
            for c in conns:
                c.send(assign)
            for w, c in enumerate(conns):
                _recv(c, w)  # "done"
            wall = time.perf_counter() - w0
            for c in conns:
                c.send("stop")
            used = [_recv(c, w) for w, c in enumerate(conns)]
            for w, (_, _, exact) in enumerate(used):
                if not exact:
                    raise AssertionError(f"worker {w}: group {group} is not the average")
            nbytes = _link_bytes(assign, workers)
            rows.append((nbytes, wall, sum(u[0] for u in used), sum(u[1] for u in used)))
    finally:
        for c in conns:
            with contextlib.suppress(OSError):
                c.send(None)
        for proc in procs:
            proc.join(10.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
    return rows


def _recv(conn: Any, who: int) -> Any:
    if not conn.poll(WAIT_S):
        raise TimeoutError(f"worker process {who} did not answer within {WAIT_S:.0f} s")
    return conn.recv()


def _run_in_one_process(
    workers: int, total: int, ops: int, encrypt: bool, profiles: ThreadProfiles | None
) -> list[tuple]:
    """Per group: (link bytes, wall s, user s, sys s), every member a thread group here."""
    codec = FrameCodec(os.urandom(32), RUN, encrypt=encrypt)
    if profiles is not None:
        profiles.install()  # before the transports start their threads
    members: list[_Member] = []
    rows = []
    try:
        members.extend(_Member(i, workers, codec) for i in range(workers))
        for i, m in enumerate(members):
            m.start({j: o.transport.address for j, o in enumerate(members) if j != i})
        vectors, expected = _vectors(workers, total)
        for group in range(ops + 1):
            assign = _star_assign(group, workers, total)
            r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for w, m in enumerate(members):
                m.engine.assign(assign, vectors[w])
            results = [m.wait(group) for m in members]
            w1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            for w, result in enumerate(results):
                if not _is_average(result, expected):
                    raise AssertionError(f"worker {w}: group {group} is not the average")
            del results
            nbytes = _link_bytes(assign, workers)
            rows.append((nbytes, w1 - w0, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime))
    finally:
        for m in members:
            m.close()
        if profiles is not None:
            profiles.uninstall()
    return rows


def end_to_end(
    workers: int,
    mb: float,
    ops: int,
    profiles: ThreadProfiles | None = None,
    *,
    encrypt: bool = False,
    processes: bool = True,
) -> EndToEnd:
    """``ops`` groups of all ``workers`` over real transports on loopback, and their CPU.

    ``processes``: each worker in its own process, as in the lab, the CPU summed over them;
    otherwise all in this one (their threads then contend for one GIL: a cost no worker
    pays). ``encrypt``: every connection encrypted (AES-256-GCM), as a launched job's are.
    Group 0 warms up connections and allocators and is not counted. Each group is checked,
    and its results dropped, off the clock: keeping every result would put each group's
    receive into freshly faulted pages, a cost that a worker (which consumes its result)
    never pays."""
    total = int(mb * 1e6) // DTYPE.itemsize
    if processes:
        if profiles is not None:
            raise ValueError("profiles cover threads of this process: use processes=False")
        rows = _run_in_processes(workers, total, ops, encrypt)
    else:
        rows = _run_in_one_process(workers, total, ops, encrypt, profiles)
    counted = rows[1:]
    return EndToEnd(
        workers=workers,
        ops=ops,
        link_gb=sum(r[0] for r in counted) / 1e9,
        wall_s=sum(r[1] for r in counted),
        user_s=sum(r[2] for r in counted),
        sys_s=sum(r[3] for r in counted),
    )


@dataclass(frozen=True)
class Stage:
    name: str
    per_link_byte: float  # how many times the stage touches each link byte
    s_per_gb: float  # CPU s per GB the stage processes
    note: str

    @property
    def s_per_link_gb(self) -> float:
        return self.s_per_gb * self.per_link_byte


def _cpu_per_gb(fn: Any, nbytes: int, min_s: float = 0.3) -> float:
    """CPU seconds per 10^9 bytes of ``fn()`` processing ``nbytes`` per call (thread CPU)."""
    fn()
    calls = 0
    start = time.thread_time()
    while True:
        fn()
        calls += 1
        used = time.thread_time() - start
        if used >= min_s or calls >= 100_000:
            return used / (calls * nbytes / 1e9)


def stages(
    part_elems: int = PART_ELEMS, min_s: float = 0.3, *, encrypt: bool = False
) -> list[Stage]:
    """Each per-byte stage of the engine's data path, alone, at ``part_elems`` per part;
    ``encrypt``: an encrypted session's seal and open in place of the frame MAC."""
    nbytes = part_elems * DTYPE.itemsize
    rng = np.random.default_rng(2)
    part = rng.standard_normal(part_elems).astype(DTYPE)
    payload = part.tobytes()
    header = bytes(HEADER_SIZE)
    acc = np.zeros(part_elems, dtype=DTYPE)
    result = np.empty(part_elems * 4, dtype=DTYPE)
    codec = FrameCodec(os.urandom(32), 1)

    def tag() -> None:
        codec.tag(header, payload)

    def finite() -> None:
        np.all(np.isfinite(np.frombuffer(payload, dtype=DTYPE)))

    def add() -> None:
        np.add(acc, part, out=acc)

    def place() -> None:
        result[part_elems : 2 * part_elems] = part

    def alloc() -> None:
        bytearray(nbytes)

    sealed = FrameCodec(os.urandom(32), 1, encrypt=True).session(os.urandom(32), os.urandom(32))
    wire = bytes(sealed.encode_bytes(Frame(FrameKind.SCATTER, 0, 1, payload=payload)))
    opener = FrameCodec(os.urandom(32), 1, encrypt=True).session(os.urandom(32), os.urandom(32))

    def seal() -> None:
        sealed._send_seq = 0  # the same nonce each time: timing only, nothing is sent
        sealed.encode(Frame(FrameKind.SCATTER, 0, 1, payload=payload))

    def open_() -> None:
        try:
            opener.decode(wire)
        except BadMac:
            pass  # another key: the whole decryption and tag check ran all the same

    protect = (
        [
            Stage("seal (AES-256-GCM)", 1, _cpu_per_gb(seal, nbytes, min_s), "SessionCodec, send"),
            Stage("open (AES-256-GCM)", 1, _cpu_per_gb(open_, nbytes, min_s), "SessionCodec, recv"),
        ]
        if encrypt
        else [Stage("frame MAC", 2, _cpu_per_gb(tag, nbytes, min_s), "FrameCodec.tag, both ends")]
    )
    return [
        *protect,
        Stage("finite check", 1, _cpu_per_gb(finite, nbytes, min_s), "reduce._values, every part"),
        Stage("add", 0.5, _cpu_per_gb(add, nbytes, min_s), "reduce._add, up phase"),
        Stage("copy to result", 0.5, _cpu_per_gb(place, nbytes, min_s), "reduce._deliver, down"),
        Stage("recv buffer", 1, _cpu_per_gb(alloc, nbytes, min_s), "transport.FrameStream._read"),
    ]


def _lab_mtu_reexec(argv: Sequence[str]) -> int:
    """Run this command again inside ``unshare -n`` with lo at MTU 1500 and offloads off."""
    inner = [a for a in argv if a != "--lab-mtu"]
    script = (
        "set -e; ip link set lo mtu 1500; ip link set lo up; "
        "ethtool -K lo tso off gso off gro off >/dev/null 2>&1 || true; "
        'exec "$@"'
    )
    cmd = ["unshare", "-n", "sh", "-c", script, "sh", sys.executable, "-m", "lab.studies.datapath"]
    return subprocess.call([*cmd, "--in-lab-mtu", *inner])


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser(
        "python -m lab.studies.datapath", __doc__.split("\n\n")[0] if __doc__ else None
    )
    ap.add_argument("--workers", type=int, default=4, help="engines (all members), default 4")
    ap.add_argument("--mb", type=float, default=16.0, help="vector size in MB, default 16")
    ap.add_argument("--ops", type=int, default=4, help="timed groups (after one warm-up)")
    ap.add_argument(
        "--lab-mtu",
        action="store_true",
        help="(root) loopback with the lab's veth settings: MTU 1500, no TSO/GSO/GRO",
    )
    ap.add_argument("--in-lab-mtu", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-stages", action="store_true", help="skip the per-stage timings")
    ap.add_argument(
        "--encrypt",
        action="store_true",
        help="encrypt every connection (AES-256-GCM, as launched jobs do); default: MAC only",
    )
    ap.add_argument(
        "--one-process",
        action="store_true",
        help="every worker's engine and transport in this one process (default: a process"
        " each, as in the lab; in one, their threads contend for one interpreter lock)",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="cProfile every thread; print the N functions with the most own time"
        " (implies --one-process)",
    )
    add_json_flag(ap, "the figures")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.workers < 2:
        raise SystemExit("--workers must be at least 2")
    if args.lab_mtu:
        if os.geteuid() != 0:
            raise SystemExit("--lab-mtu needs root (a new network namespace)")
        return _lab_mtu_reexec(argv)
    profiles = ThreadProfiles() if args.profile else None
    processes = not (args.one_process or args.profile)
    e2e = end_to_end(
        args.workers, args.mb, args.ops, profiles, encrypt=args.encrypt, processes=processes
    )
    st = [] if args.no_stages else stages(encrypt=args.encrypt)
    explained = sum(s.s_per_link_gb for s in st)
    out = {
        "network": "lab-mtu loopback (1500, no offloads)" if args.in_lab_mtu else "loopback",
        "encrypted": args.encrypt,
        "process_per_worker": processes,
        "end_to_end": {
            **asdict(e2e),
            "cpu_s_per_gb": e2e.cpu_s_per_gb,
            "user_s_per_gb": e2e.user_s / e2e.link_gb,
            "sys_s_per_gb": e2e.sys_s / e2e.link_gb,
            "gbit_s": e2e.gbit_s,
        },
        "stages": [{**asdict(s), "s_per_link_gb": s.s_per_link_gb} for s in st],
        "unexplained_s_per_gb": e2e.cpu_s_per_gb - explained if st else None,
    }
    write_json(args.json, out)
    if args.json == "-":
        return 0
    print(
        f"{out['network']}{', encrypted' if args.encrypt else ''}: {e2e.workers} workers,"
        f" {'a process each' if processes else 'one process'},"
        f" {e2e.ops} ops, {e2e.link_gb:.3f} GB over links"
        f" in {e2e.wall_s:.2f} s ({e2e.gbit_s:.2f} Gbit/s)"
    )
    print(
        f"CPU s/GB moved: {e2e.cpu_s_per_gb:.2f} (user {e2e.user_s / e2e.link_gb:.2f},"
        f" sys {e2e.sys_s / e2e.link_gb:.2f})"
    )
    for s in st:
        print(
            f"  {s.name:<15} {s.s_per_link_gb:6.3f} s per link GB"
            f"  ({s.s_per_gb:.3f} s/GB x{s.per_link_byte:g}; {s.note})"
        )
    if profiles is not None:
        print(profiles.top(args.profile))
    if st:
        print(f"  {'rest':<15} {out['unexplained_s_per_gb']:6.3f} s per link GB (kernel, Python)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
