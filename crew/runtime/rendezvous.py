"""Start-up of a launched job: peers find each other, measure their links, get the config.

A job started by ``torchrun`` (or any launcher) has no ``config.json``: the workers know only
their rank, the world size, the coordinator's address and the run's secret. Before the coordinator
exists, the rendezvous host (on rank 0, or ``python -m crew.runtime.coordinator --world``) runs this
exchange with every rank, over authenticated control frames::

    worker -> host   Join(rank, world, data-plane host:port, tensor shapes)
    host -> all      Roster(the data-plane address of every rank)        once all joined
    worker -> host   RosterTaken               its transport now accepts every peer's HELLO
    host -> each     Probe(send_to, time_from)     once all took it; then once per round
    (each rank sends its burst of the round, if any, and times the one it receives, if any)
    worker -> host   LinkRates([src, bytes, seconds])           its burst of the round arrived
    host -> all      Start(RunConfig)                                    register and train

or ``Refused(reason)`` to everyone as soon as the job cannot start. Every wait is bounded:

* a rank that has not joined by ``join_timeout`` fails the job, naming the missing ranks;
* a rank whose tensor shapes differ from the first rank's is refused, naming both shapes, and
  so is the job (a model that cannot be averaged is a bug in the script, not a straggler);
* a rank that leaves during start-up fails the job, naming it;
* a client with another secret cannot send a frame the host accepts: the host drops the
  connection, and the client, hearing nothing valid back, raises :class:`SecretError`.

The probe's rounds, their cost and how a burst is timed are in
:mod:`crew.runtime.capacity_probe`. The host runs the rounds one after the other and turns the
reports into the initial capacity matrix (Mbit/s, ``bw[src][dst]``, measured at ``dst``); a
link without a sample gets the median of the others, with a warning. The coordinator's online
estimator (``LinkRates`` in heartbeats) keeps it current afterwards.
"""

from __future__ import annotations

import itertools
import logging
import queue
import socket
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from crew.config import RunConfig
from crew.control.capacity import TCP_GOODPUT
from crew.errors import CoordinatorUnreachable, JoinRefused, SecretError
from crew.runtime.capacity_probe import (
    DEFAULT_PROBE_BYTES,
    DEFAULT_PROBE_SECONDS,
    REPORT_SLACK_S,
    ProbePlan,
    ProbeReceiver,
    plan_probe,
    send_burst,
)
from crew.wire import protocol as proto
from crew.wire.frames import FrameCodec, FrameError, control_body, control_frame
from crew.wire.listener import accept_loop
from crew.wire.session import accept_session, open_session
from crew.wire.transport import Address, FrameStream, StreamClosed, Transport

log = logging.getLogger("crew.runtime.rendezvous")

HANDSHAKE_S = 10.0  # a connection's HELLO and CHALLENGE, whole (crew.wire.session)
HOST_ID = 0xFFFF  # sender id of the host's frames (as crew.wire.frames.COORDINATOR)
COLLECT_TIMEOUT_S = 10.0  # beyond a round's own bound, before the host gives up on a rank
HOST_SLACK_S = 5.0  # a worker waits this much longer than the host's own timeouts
REFUSAL_WAIT_S = 2.0  # close() waits at most this for the refusal to reach every rank
FALLBACK_MBIT = 1000.0  # a world of one: no link to measure


@dataclass(frozen=True)
class ProbeFigures:
    """What the start-up probe did and cost: wall time at the host, bytes each worker sent
    (at most), rounds run, directed links with a sample."""

    seconds: float
    bytes_per_worker: int
    rounds: int = 0
    links_measured: int = 0


MakeConfig = Callable[[list[Address], list[list[float]], ProbeFigures], RunConfig]


class RendezvousHost:
    """Runs the start-up exchange for ``world`` ranks (see the module doc), then stops.

    ``make_config(addresses, bw_mbit, figures)`` builds the job's RunConfig once the links are
    measured. With ``measure=False`` there is no probe: ``bw_mbit`` is all zeros, for a
    ``make_config`` that uses configured capacities."""

    def __init__(
        self,
        codec: FrameCodec,
        world: int,
        bind: Address,
        make_config: MakeConfig,
        *,
        join_timeout: float = 60.0,
        probe_seconds: float = DEFAULT_PROBE_SECONDS,
        probe_bytes: int = DEFAULT_PROBE_BYTES,
        measure: bool = True,
    ) -> None:
        if world < 1:
            raise ValueError(f"world: must be at least 1, got {world}")
        self.codec = codec
        self.world = world
        self.make_config = make_config
        self.join_timeout = join_timeout
        self.probe_seconds = probe_seconds
        self.probe_bytes = probe_bytes
        self.measure = measure
        self.listener = socket.create_server(bind)
        self.port: int = self.listener.getsockname()[1]
        self.events: queue.Queue[tuple[int, proto.Message | None]] = queue.Queue()
        self.streams: dict[int, FrameStream] = {}
        self.config: RunConfig | None = None
        self.failure: str | None = None
        self._stop = threading.Event()
        self._stopping = threading.Event()  # stop(): refuse the ranks, then close
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="crew-rdzv-accept", daemon=True).start()
        self._thread = threading.Thread(target=self._run, name="crew-rdzv", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self) -> None:
        """End the exchange from any thread: every rank that joined is refused, naming the
        stop, and the host then closes itself (a bare close would read as another secret)."""
        self._stopping.set()

    def close(self) -> None:
        """Stop: the listener and every connection close. While the refusal is being sent to
        every rank, wait for it (at most ``REFUSAL_WAIT_S``): rank 0 reads its copy first and
        closes this host, and the other ranks must still get theirs, not a bare close that
        they would have to read as another secret."""
        thread = self._thread
        # failure is set before the refusal goes out (_run), so a rank that read its copy and
        # closes this host finds it set
        if self.failure is not None and thread not in (None, threading.current_thread()):
            thread.join(REFUSAL_WAIT_S)
        self._stop.set()
        try:
            self.listener.close()
        except OSError:
            pass
        with self._lock:
            streams = list(self.streams.values())
        for stream in streams:
            stream.close()

    # -- network -----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        conns = itertools.count()

        def accepted(sock: socket.socket, _addr: Address) -> None:
            conn = next(conns)
            stream = FrameStream(sock, self.codec)
            with self._lock:
                self.streams[conn] = stream
            threading.Thread(
                target=self._reader, args=(conn, stream), name=f"crew-rdzv-{conn}", daemon=True
            ).start()

        accept_loop(self.listener, self._stop.is_set, accepted, name="rendezvous", poll_s=0.25)

    def _reader(self, conn: int, stream: FrameStream) -> None:
        try:
            accept_session(
                stream, HOST_ID, HANDSHAKE_S, [self.codec], lambda rank, _: 0 <= rank < self.world
            )
        except (FrameError, OSError) as exc:  # another secret, another run, garbage
            log.warning("rendezvous: connection %d refused at its handshake: %s", conn, exc)
            stream.close()
            self.events.put((conn, None))
            return
        while not self._stop.is_set():
            try:
                msg = proto.decode(control_body(stream.recv()))
            except FrameError as exc:  # another secret, another run, garbage: drop it
                log.warning("rendezvous: connection %d refused: %s", conn, exc)
                break
            except (OSError, proto.ProtocolError):
                break
            self.events.put((conn, msg))
        stream.close()
        self.events.put((conn, None))

    def _send(self, conn: int, msg: proto.Message) -> None:
        with self._lock:
            stream = self.streams.get(conn)
        if stream is not None:
            stream.send_control(HOST_ID, self.codec.run, msg.to_dict(), f"rendezvous peer {conn}")

    # -- the exchange ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._exchange()
        except JoinRefused as exc:
            self.failure = str(exc)
            log.error("rendezvous: %s", exc)
            with self._lock:
                conns = list(self.streams)
            for conn in conns:
                self._send(conn, proto.Refused(str(exc)))
        finally:
            time.sleep(0.2)  # let the last replies leave before the sockets close
            self.close()

    def _next(self, deadline: float) -> tuple[int, proto.Message | None] | None:
        if self._stopping.is_set():
            raise JoinRefused("the coordinator was stopped during start-up")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            return self.events.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            return (-1, None) if time.monotonic() < deadline else None

    def _exchange(self) -> None:
        ranks = self._gather_joins()
        by_rank = sorted(ranks.items())
        addresses = [(join.host, join.port) for _, (_, join) in by_rank]
        probe_bytes = self.probe_bytes if self.measure else 0
        plan = plan_probe(self.world, probe_bytes, self.probe_seconds)
        roster = proto.Roster(
            [[h, p] for h, p in addresses], plan.probe_bytes if plan.rounds else 0,
            plan.round_seconds,
        )  # fmt: skip
        started = time.monotonic()
        for _, (conn, _) in by_rank:
            self._send(conn, roster)
        bw = [[0.0] * self.world for _ in range(self.world)]
        conn_rank = {conn: r for r, (conn, _) in ranks.items()}
        # A transport refuses HELLOs from peers it does not know: nobody sends before all know.
        self._wait_all(conn_rank, proto.RosterTaken, self.join_timeout, "take the roster")
        measured = 0
        if plan.rounds:
            samples = self._probe_rounds(conn_rank, plan)
            measured = sum(len(v) for v in samples.values())
            reports = {dst: proto.LinkRates(dst, v) for dst, v in samples.items()}
            bw = capacity_matrix(self.world, reports)
        figures = ProbeFigures(
            time.monotonic() - started, plan.bytes_per_worker, len(plan.rounds), measured
        )
        self.config = self.make_config(addresses, bw, figures)
        start = proto.Start(json_object(self.config))
        for _, (conn, _) in by_rank:
            self._send(conn, start)

    def _probe_rounds(
        self, conn_rank: dict[int, int], plan: ProbePlan
    ) -> dict[int, list[list[float]]]:
        """Run ``plan``'s rounds; every rank's samples (``[src, bytes, seconds]``), by rank."""
        samples: dict[int, list[list[float]]] = {r: [] for r in conn_rank.values()}
        wait = plan.round_seconds + REPORT_SLACK_S + COLLECT_TIMEOUT_S
        for r in range(len(plan.rounds)):
            for conn, rank in conn_rank.items():
                self._send(conn, proto.Probe(*plan.part(r, rank)))
            what = f"report probe round {r + 1}/{len(plan.rounds)}"
            for rank, msg in self._wait_all(conn_rank, proto.LinkRates, wait, what).items():
                assert isinstance(msg, proto.LinkRates)
                src = plan.part(r, rank)[1]
                samples[rank] += [s for s in msg.samples if s and src >= 0 and int(s[0]) == src]
        return samples

    def _gather_joins(self) -> dict[int, tuple[int, proto.Join]]:
        joined: dict[int, tuple[int, proto.Join]] = {}
        deadline = time.monotonic() + self.join_timeout
        while len(joined) < self.world:
            item = self._next(deadline)
            if item is None:
                missing = sorted(set(range(self.world)) - set(joined))
                raise JoinRefused(
                    f"ranks {missing} did not join within {self.join_timeout:g} s"
                    f" (joined: {sorted(joined)})"
                )
            conn, msg = item
            if msg is None:
                left = [r for r, (c, _) in joined.items() if c == conn]
                if left:
                    raise JoinRefused(f"rank {left[0]} left during start-up")
                continue
            if not isinstance(msg, proto.Join):
                continue
            problem = self._check_join(msg, joined)
            if problem is not None:
                if problem.startswith("shape"):
                    # the whole job is refused: _run's broadcast tells every connection,
                    # this one too, and close() waits for it (a lone send first would not)
                    raise JoinRefused(problem)
                self._send(conn, proto.Refused(problem))
                continue
            joined[msg.worker] = (conn, msg)
            log.info("rendezvous: rank %d joined from %s:%d", msg.worker, msg.host, msg.port)
        return joined

    def _check_join(self, msg: proto.Join, joined: dict[int, tuple[int, proto.Join]]) -> str | None:
        if msg.world != self.world:
            return f"rank {msg.worker} expects a world of {msg.world}, the job has {self.world}"
        if not 0 <= msg.worker < self.world:
            return f"rank {msg.worker} is outside 0..{self.world - 1}"
        if msg.worker in joined:
            return f"rank {msg.worker} joined twice"
        if joined:
            ref_rank, (_, ref) = min(joined.items())
            if msg.shapes != ref.shapes:
                return (
                    f"shapes differ: rank {msg.worker} averages tensors of shapes"
                    f" {describe_shapes(msg.shapes)}, rank {ref_rank} of"
                    f" {describe_shapes(ref.shapes)}; every rank must average the same model"
                )
        return None

    def _wait_all(
        self, conn_rank: dict[int, int], kind: type[proto.Message], timeout: float, what: str
    ) -> dict[int, proto.Message]:
        got: dict[int, proto.Message] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(conn_rank):
            item = self._next(deadline)
            if item is None:
                missing = sorted(set(conn_rank.values()) - set(got))
                raise JoinRefused(f"ranks {missing} did not {what} within {timeout:g} s")
            conn, msg = item
            if conn not in conn_rank:
                continue
            if msg is None:
                raise JoinRefused(f"rank {conn_rank[conn]} left during start-up")
            if isinstance(msg, kind):
                got[conn_rank[conn]] = msg
        return got


def describe_shapes(shapes: Sequence[Sequence[int]], limit: int = 4) -> str:
    """``[64x640, 640, ...] (8 tensors, 451,850 values)``: short enough for an error line."""
    total = 0
    for shape in shapes:
        count = 1
        for d in shape:
            count *= d
        total += count
    head = ", ".join("x".join(map(str, s)) or "scalar" for s in shapes[:limit])
    more = ", ..." if len(shapes) > limit else ""
    return f"[{head}{more}] ({len(shapes)} tensors, {total:,} values)"


def json_object(cfg: RunConfig) -> dict:
    import json

    return json.loads(cfg.to_json())


def capacity_matrix(world: int, reports: dict[int, proto.LinkRates]) -> list[list[float]]:
    """``bw[src][dst]`` in Mbit/s from each receiver's ``LinkRates``; a link without a sample
    gets the median of the measured ones (with a warning)."""
    bw = [[0.0] * world for _ in range(world)]
    measured: list[float] = []
    for dst, msg in reports.items():
        for src_f, nbytes, seconds in msg.samples:
            src = int(src_f)
            if 0 <= src < world and src != dst and seconds > 0 and nbytes > 0:
                bw[src][dst] = nbytes * 8 / seconds / 1e6 / TCP_GOODPUT
                measured.append(bw[src][dst])
    fill = statistics.median(measured) if measured else FALLBACK_MBIT
    unmeasured = [(s, d) for s in range(world) for d in range(world) if s != d and bw[s][d] <= 0]
    if unmeasured:
        log.warning(
            "probe: no sample for links %s; assuming %.0f Mbit/s (the median) until measured",
            unmeasured,
            fill,
        )
    for s, d in unmeasured:
        bw[s][d] = fill
    return bw


# -- the worker's side -------------------------------------------------------------------------


def probe_round(
    transport: Transport,
    probe: ProbeReceiver,
    me: int,
    world: int,
    part: proto.Probe,
    probe_bytes: int,
    round_seconds: float,
) -> proto.LinkRates:
    """Rank ``me``'s part of one probe round: its burst to ``part.send_to`` and the sample of
    the burst from ``part.time_from`` (-1: none), within ``round_seconds + REPORT_SLACK_S``."""
    for peer in (part.send_to, part.time_from):
        if peer != -1 and not (0 <= peer < world and peer != me):
            raise JoinRefused(f"rank {me}: probe round names rank {peer} in a world of {world}")
    started = time.monotonic()
    if part.send_to >= 0:
        send_burst(transport, me, transport.codec.run, part.send_to, probe_bytes, round_seconds)
    if part.time_from < 0:
        return proto.LinkRates(me, [])
    left = started + round_seconds + REPORT_SLACK_S - time.monotonic()
    if not probe.wait(part.time_from, left):
        log.warning("probe: %d's burst to %d did not close in time; timing what came",
                    part.time_from, me)  # fmt: skip
    sample = probe.take(part.time_from)
    return proto.LinkRates(me, [sample] if sample is not None else [])


def join_job(
    codec: FrameCodec,
    coordinator: Address,
    join: proto.Join,
    transport: Transport,
    probe: ProbeReceiver,
    *,
    timeout: float = 60.0,
) -> RunConfig:
    """Take part in the start-up exchange as rank ``join.worker``; the job's RunConfig.

    ``transport`` is this worker's started data-plane transport (its address is in ``join``);
    the roster's peers are set on it; ``probe`` must be fed the frames it receives. Raises
    :class:`CoordinatorUnreachable`, :class:`SecretError` or :class:`JoinRefused`, each within
    ``timeout`` (plus the probe)."""
    where = f"{coordinator[0]}:{coordinator[1]}"
    deadline = time.monotonic() + timeout
    stream = None
    last: OSError | None = None
    while stream is None:
        try:
            stream = FrameStream.connect(coordinator, codec, timeout=5.0)
        except OSError as exc:
            last = exc
            if time.monotonic() + 0.5 >= deadline:
                raise CoordinatorUnreachable(
                    f"no CREW coordinator at {where} after {timeout:g} s ({last}); check"
                    f" MASTER_ADDR/MASTER_PORT (or CREW_COORDINATOR) and that rank 0 or"
                    f" `python -m crew.runtime.coordinator` is running"
                ) from exc
            time.sleep(0.5)
    # The host fails a start-up that takes longer than its own timeout and says why: wait a
    # little longer than it, so that its reason, not a bare timeout, reaches the user.
    deadline = time.monotonic() + timeout + HOST_SLACK_S
    answered = False
    world = 0
    probe_params = (0, 0.0)
    try:
        try:
            open_session(stream, join.worker, timeout)
        except FrameError as exc:
            raise SecretError(
                f"rank {join.worker}: the coordinator's answer failed authentication ({exc}):"
                f" this rank's secret (CREW_SECRET / CREW_SECRET_FILE) differs"
            ) from exc
        except OSError as exc:
            raise SecretError(
                f"rank {join.worker}: the coordinator at {where} closed the connection"
                f" without answering: this rank's secret (CREW_SECRET / CREW_SECRET_FILE)"
                f" most likely differs from the coordinator's"
            ) from exc
        stream.send(control_frame(join.worker, codec.run, join.to_dict()))
        while True:
            remaining = deadline - time.monotonic()
            try:
                frame = stream.recv(idle_timeout=max(remaining, 0.01))
            except TimeoutError:
                raise JoinRefused(
                    f"rank {join.worker}: no answer from the coordinator at {where} within"
                    f" {timeout:g} s"
                ) from None
            except FrameError as exc:
                raise SecretError(
                    f"rank {join.worker}: the coordinator's reply failed authentication ({exc}):"
                    f" this rank's secret (CREW_SECRET / CREW_SECRET_FILE) differs"
                ) from exc
            except (StreamClosed, OSError) as exc:
                if answered:
                    raise JoinRefused(
                        f"rank {join.worker}: the coordinator at {where} went away during"
                        f" start-up ({exc})"
                    ) from exc
                raise SecretError(
                    f"rank {join.worker}: the coordinator at {where} closed the connection"
                    f" without answering: this rank's secret (CREW_SECRET / CREW_SECRET_FILE)"
                    f" most likely differs from the coordinator's"
                ) from exc
            answered = True
            deadline = time.monotonic() + timeout + HOST_SLACK_S  # each phase has its own wait
            msg = proto.decode(control_body(frame))
            if isinstance(msg, proto.Refused):
                raise JoinRefused(f"rank {join.worker}: {msg.reason}")
            if isinstance(msg, proto.Roster):
                world = len(msg.peers)
                for j in range(world):
                    if j != join.worker:
                        host, port = msg.peers[j]
                        transport.set_peer(j, (str(host), int(port)))
                probe_params = (msg.probe_bytes, msg.probe_seconds)
                taken = proto.RosterTaken(join.worker)
                stream.send(control_frame(join.worker, codec.run, taken.to_dict()))
            elif isinstance(msg, proto.Probe):
                report = probe_round(transport, probe, join.worker, world, msg, *probe_params)
                stream.send(control_frame(join.worker, codec.run, report.to_dict()))
                deadline = time.monotonic() + timeout + HOST_SLACK_S
            elif isinstance(msg, proto.Start):
                transport.arrival_rates()  # the probe's bursts: timed above, not in heartbeats
                return RunConfig.from_dict(msg.config, where="the coordinator's Start")
    finally:
        stream.close()
