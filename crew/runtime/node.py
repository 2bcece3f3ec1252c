"""One worker's side of CREW, without training: the engine under :class:`crew.Averager`.

A :class:`Node` owns the worker's data-plane :class:`~crew.wire.transport.Transport`, its
:class:`~crew.runtime.reduce.ReduceEngine`, its control connection to the coordinator and two
threads:

* the **control reader**: messages from the coordinator, turned into actions by the pure
  :class:`~crew.control.worker_control.WorkerControl` and carried out here;
* the **heartbeat**: so the coordinator notices a silent worker, with the measured arrival
  rates of the data-plane links (the online capacity estimator's input);
* the **health report**: every ``HEALTH_S`` (and at once when a link changes state) the
  incoming links its probes (``crew.wire.probes``) found dead and the bytes each group revision
  received, so the coordinator re-plans around dead links and stalled revisions.

If the control connection breaks, the node waits for a restarted coordinator, registers
again and ends the groups the restart abandoned (``WorkerControl.coordinator_lost``).

The caller's training loop calls :meth:`Node.offer` with its flat float32 vector after a local
step and then :meth:`Node.settle`, which blocks until the worker's group commits (the average
is returned) or is abandoned. While the loop trains, the transport threads keep aggregating
and forwarding other groups' blocks: CREW's "non-members work in the background".

Both the public API (``crew.averager``) and the lab's benchmark worker (``crew.runtime.worker``,
which offers one fixed vector and only carries groups) run on this class: one code path."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from crew.config import RunConfig
from crew.control.clipcheck import clip_parts, clip_proof
from crew.control.clipping import ClipRule
from crew.control.secretcheck import secret_projections
from crew.control.utilisation import TimeSplit, UtilisationMeter
from crew.control.verify import check_vector, project
from crew.control.worker_control import (
    Action,
    CancelPrescatter,
    DeliverOutcome,
    FinishCarried,
    JoinGroup,
    Outcome,
    ProveGroup,
    SetSlowdown,
    Settlement,
    StopWorker,
    UseSplit,
    WorkerControl,
)
from crew.errors import CoordinatorUnreachable
from crew.runtime.prescatter import prescatter_frames
from crew.runtime.reduce import ReduceEngine
from crew.train.compress import Codec, error_norm
from crew.train.partcodec import PartCodec
from crew.wire import protocol as proto
from crew.wire.frames import Frame, FrameCodec, FrameError, FrameKind, control_body, control_frame
from crew.wire.probes import START_GRACE_S, LinkStateChange, Prober
from crew.wire.session import open_session
from crew.wire.transport import FlowOrder, FrameStream, Transport

log = logging.getLogger("crew.runtime.node")

CONNECT_ATTEMPTS = 60  # x 0.5 s: the coordinator may start a moment after the workers
HEALTH_S = 0.5  # LinkHealth (probe states, group progress) period; changes go at once
UTILISATION_EVERY_S = 5.0  # cumulative time split sent to the run database this often
PROGRESS_KEYS = 64  # group revisions whose received bytes are remembered
GROUP_DATA = (FrameKind.SCATTER, FrameKind.RESULT, FrameKind.RELAY)
# Pace every data connection at this fraction of its link's configured rate (``cfg.bw_mbit``);
# 0 (the default) leaves them unpaced. Pacing just below an HTB link's rate keeps its queue
# empty (``crew.wire.transport.set_pacing`` has the measurement). ``CREW_PACE`` overrides it.
PACE_FRACTION = 0.0


def pace_fraction() -> float:
    raw = os.environ.get("CREW_PACE", "")
    try:
        value = float(raw) if raw else PACE_FRACTION
    except ValueError:
        raise ValueError(f"CREW_PACE={raw!r}: expected a fraction such as 0.95") from None
    if not 0 <= value <= 1:
        raise ValueError(f"CREW_PACE={raw!r}: must be between 0 and 1")
    return value


def link_pacing(
    me: int, bw_mbit: tuple[tuple[float, ...], ...], fraction: float
) -> dict[int, float]:
    """Bytes/s to pace each outgoing link of ``me`` at: ``fraction`` of its configured rate;
    links without a known positive rate (or fraction 0) are left out, i.e. unpaced."""
    if fraction <= 0:
        return {}
    out = {}
    for j, mbit in enumerate(bw_mbit[me]):
        if j != me and 0 < mbit < float("inf"):
            out[j] = fraction * mbit * 1e6 / 8
    return out


@dataclass(frozen=True)
class Settled:
    """How the worker's own group ended, from :meth:`Node.settle`."""

    settlement: Settlement
    outcome: Outcome
    result: np.ndarray | None  # the weighted average when ``settlement`` is APPLY_AVERAGE
    members: tuple[int, ...]  # the group's members as last assigned (empty if never assigned)


class Node:
    """One worker's transport, reduce engine and control connection (see the module doc).

    The transport listens at ``cfg``'s address for ``me``; ``secret`` is the run's key
    (``cfg.secret()`` when None). ``iteration`` reports the caller's local iteration in
    heartbeats; ``on_slowdown`` receives the coordinator's straggler factor (lab experiments).
    ``transport``: one the caller made (a launched job's, which carried the start-up probe);
    it adopts this run's codec here (``Transport.adopt``)."""

    def __init__(
        self,
        cfg: RunConfig,
        me: int,
        vector_len: int,
        *,
        secret: bytes | None = None,
        bench: bool = False,
        iteration: Callable[[], int] = lambda: 0,
        on_slowdown: Callable[[float], None] | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.cfg = cfg
        self.me = me
        self.vector_len = vector_len
        self.codec = FrameCodec(
            cfg.secret() if secret is None else secret,
            cfg.run_num,
            max_payload=cfg.max_payload,
            encrypt=cfg.encrypt,
        )
        self._iteration = iteration
        self._on_slowdown = on_slowdown
        self.stop_event = threading.Event()
        self.lost: str | None = None  # why the coordinator was lost for good (None: it was not)
        self.outcomes: queue.Queue[Outcome] = queue.Queue()
        self.ctl = WorkerControl(me, bench=bench, nonblocking=cfg.nonblocking)
        self._vector_offered: np.ndarray | None = None
        self._assigns: dict[int, proto.Assign] = {}  # group -> latest assignment, own groups only
        self._assigned_at: dict[int, float] = {}  # group -> when its first assignment came
        self._lock = threading.Lock()
        self.meter = UtilisationMeter(time.monotonic())
        self._utilisation_sent = 0.0  # time.monotonic() of the last Utilisation report
        self.check = check_vector(cfg.run_num, vector_len)
        codec = self.compress = Codec(cfg.compress)
        self.engine = ReduceEngine(
            me,
            cfg.n,
            cfg.run_num,
            self._send_data,
            self._have_all,
            codec=None if codec is Codec.NONE else PartCodec(codec, self.check),
            check=self.check,
            prescatter=cfg.nonblocking,
            clip=None if cfg.clip_rho is None else ClipRule(cfg.clip_rho),
        )
        # Before the transport: its frames reach self.prober (on_frame).
        self.prober = Prober(
            me,
            cfg.data_address(me),
            {j: cfg.data_address(j) for j in range(cfg.n) if j != me},
            self.codec,
            self._link_changed,
            first_grace=START_GRACE_S,
        )
        if transport is None:
            transport = Transport(
                me,
                cfg.data_address(me),
                {j: cfg.data_address(j) for j in range(cfg.n) if j != me},
                self.codec,
                on_frame=self.on_frame,
                on_send_error=self._send_failed,
                on_reject=self._rejected,
                flow_order=FlowOrder(cfg.flow_order),
                stall_timeout=cfg.stall_timeout_s,
                pacing=link_pacing(me, cfg.bw_mbit, pace_fraction()),
            )
        else:
            # A launched job's transport carried the start-up probe under the rendezvous'
            # codec, before this run's number was agreed: from here it speaks this run's only.
            transport.adopt(self.codec)
        self.transport = transport
        self.control: FrameStream | None = None
        self.rejected = 0
        self._threads: list[threading.Thread] = []
        self._received: dict[tuple[int, int], int] = {}  # (group, rev) -> data bytes in
        self._received_lock = threading.Lock()

    # -- plumbing ----------------------------------------------------------------------------

    def on_frame(self, frame: Frame) -> None:
        """The transport's frame handler: start-up probe bursts are only counted (by the
        transport's arrival rates), everything else goes to the reduce engine. Any frame says
        that its sender's link into this worker is alive (``Prober.heard``)."""
        self.prober.heard(frame.sender)
        if frame.kind == FrameKind.PAYLOAD:
            return
        if frame.kind in GROUP_DATA:
            with self._received_lock:
                key = (frame.group, frame.rev)
                self._received[key] = self._received.pop(key, 0) + frame.nbytes
                if len(self._received) > PROGRESS_KEYS:
                    del self._received[next(iter(self._received))]  # the least recent
        self.engine.on_frame(frame)

    def _send_data(self, dst: int, frame: Frame, priority: int = 0) -> None:
        self.transport.send(dst, frame, priority)

    def tell(self, msg: proto.Message) -> None:
        """Send one message to the coordinator (dropped while it is unreachable: the control
        reader notices the broken connection too, and reconnects or stops)."""
        stream = self.control
        if stream is None:
            return
        try:
            stream.send(control_frame(self.me, self.cfg.run_num, msg.to_dict()))
        except OSError as exc:
            log.warning("worker %d: control send failed: %s", self.me, exc)

    def _have_all(self, group: int, rev: int, bytes_sent: int) -> None:
        # The engine projected each result part as it arrived, so no pass over the whole
        # result is left for the op's tail. Less the codec's accounted error, so the
        # coordinator's check stays exact (crew.train.partcodec derives it; 0 without compression).
        proj = self.engine.result_projection(group)
        proj = float("nan") if proj is None else proj - self.engine.codec_error(group)
        self.tell(proto.HaveAll(self.me, group, rev, bytes_sent, proj))

    def _prove(self, reveal: proto.Reveal) -> None:
        """Answer a secret check (``crew.control.secretcheck``) with this member's projections
        on the revealed check vector; nothing if it holds no whole result of that revision (the
        coordinator's deadline then abandons the group). Cost: one pass over both vectors."""
        held = self.engine.held(reveal.group, reveal.rev)
        if held is None:
            log.warning(
                "worker %d: no result of group %d rev %d to prove",
                self.me,
                reveal.group,
                reveal.rev,
            )
            return
        offered, result = held
        rho, assign = self.cfg.clip_rho, self._assigns.get(reveal.group)
        if rho is not None and assign is not None and assign.rev == reveal.rev:
            # Clipped: the fixed point's residual on r_g as well (crew.control.clipcheck), at
            # the radius the roots clipped with.
            parts = clip_parts(assign, self.cfg.n)
            rho = ClipRule(rho).radius(assign)
            c = clip_proof(self.cfg.run_num, reveal.nonce, offered, result, parts, rho)
            p = proto.Proof(self.me, reveal.group, reveal.rev, c.offered_proj, c.result_proj, 0)
            self.tell(replace(p, clip_residual=c.residual, clip_scale=c.scale, clip_norm=c.norm))
            return
        proj_offered, proj_result = secret_projections(
            self.cfg.run_num, reveal.nonce, offered, result
        )
        bound = 0.0 if self.compress is Codec.NONE else error_norm(self.compress, offered)
        self.tell(proto.Proof(self.me, reveal.group, reveal.rev, proj_offered, proj_result, bound))

    def _send_failed(self, dst: int, err: BaseException, unsent: list[Frame]) -> None:
        log.warning(
            "worker %d: link %d->%d failed (%s); %d frames unsent",
            self.me,
            self.me,
            dst,
            err,
            len(unsent),
        )
        self.tell(proto.LinkFailed(self.me, self.me, dst, str(err)[:200]))

    def _health(self) -> proto.LinkHealth:
        with self._received_lock:
            received = [[g, r, b] for (g, r), b in self._received.items()]
        return proto.LinkHealth(self.me, self.prober.down(), received)

    def _link_changed(self, change: LinkStateChange) -> None:
        log.warning(
            "worker %d: link %d->%d %s (probes; %.1f s since the last one)",
            self.me,
            change.src,
            change.dst,
            "alive" if change.alive else "dead",
            change.silent_s,
        )
        self.tell(self._health())

    def _rejected(self, peer: tuple[str, int], err: FrameError) -> None:
        self.rejected += 1
        log.warning("worker %d: rejected frame from %s: %s", self.me, peer, err)
        self.tell(proto.Rejected(self.me, f"{peer[0]}:{peer[1]}", type(err).__name__))

    # -- start and stop ----------------------------------------------------------------------

    def connect(self, attempts: int | None = None) -> bool:
        """Reach the coordinator and register; False if told to stop before that.

        Raises :class:`CoordinatorUnreachable` after ``attempts`` (default
        ``CONNECT_ATTEMPTS``, read at the call) x 0.5 s without success."""
        attempts = CONNECT_ATTEMPTS if attempts is None else attempts
        addr = (self.cfg.coordinator_host, self.cfg.coordinator_port)
        last: Exception | None = None
        for _ in range(attempts):
            if self.stop_event.is_set():
                return False
            try:
                stream = FrameStream.connect(addr, self.codec, timeout=5.0)
            except OSError as exc:
                last = exc
                self.stop_event.wait(0.5)
                continue
            try:
                open_session(stream, self.me, 5.0)
                self.control = stream
                break
            except (FrameError, OSError) as exc:  # another key or run, or a coordinator restart
                stream.close()
                last = exc
                self.stop_event.wait(0.5)
        else:
            raise CoordinatorUnreachable(
                f"cannot reach the CREW coordinator at {addr[0]}:{addr[1]} after"
                f" {attempts * 0.5:.0f} s: {last}"
            )
        self.tell(proto.Register(self.me, os.getpid(), self._iteration(), self.vector_len))
        return True

    def start(self, *, transport_started: bool = False) -> bool:
        """Start the transport, register with the coordinator and start the control threads.
        False if stopped before the coordinator was reached."""
        if not transport_started:
            self.transport.start()
        self.prober.start()
        if not self.connect():
            return False
        for target, name in (
            (self._heartbeats, "heartbeat"),
            (self._control_reader, "control"),
            (self._health_reports, "health"),
        ):
            thread = threading.Thread(target=target, name=f"crew-{name}-{self.me}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return True

    def stop(self) -> None:
        """Make waits return and the threads end; safe from a signal handler."""
        self.stop_event.set()

    def close(self) -> None:
        """Stop the threads and close the control connection and the transport (bounded)."""
        self.stop_event.set()
        if self.control is not None:
            self.control.close()
        self.transport.close()
        self.prober.close()
        for thread in self._threads:
            thread.join(timeout=2.0)

    # -- threads -----------------------------------------------------------------------------

    def time_split(self) -> TimeSplit:
        """This worker's wall time so far, split into computing and waiting."""
        with self._lock:
            return self.meter.split(time.monotonic())

    def _report_utilisation(self) -> None:
        now = time.monotonic()
        if now - self._utilisation_sent < UTILISATION_EVERY_S:
            return
        self._utilisation_sent = now
        split = self.time_split()
        wan = sum(self.transport.stats().bytes_sent.values())
        self.tell(
            proto.Utilisation(
                self.me,
                time.time(),
                split.compute_s,
                split.ready_s,
                split.group_s,
                split.stalled_s,
                wan,
            )
        )

    def _heartbeats(self) -> None:
        while not self.stop_event.wait(self.cfg.heartbeat_s):
            self.tell(proto.Heartbeat(self.me, self._iteration()))
            if self.meter.rounds:  # a worker that offers rounds (not a bench or Gloo node)
                self._report_utilisation()
            samples = [
                [float(src), float(b), s]
                for src, (b, s) in self.transport.arrival_rates().items()
                if s > 0
            ]
            if samples:
                self.tell(proto.LinkRates(self.me, samples))

    def _control_reader(self) -> None:
        assert self.control is not None
        while not self.stop_event.is_set():
            try:
                frame = self.control.recv()
            except FrameError as exc:
                log.warning("worker %d: bad control frame: %s", self.me, exc)
                self.lost = f"its control connection sent a bad frame ({exc})"
                break
            except OSError as exc:  # StreamClosed included
                if self.stop_event.is_set():
                    break
                log.warning("worker %d: lost the coordinator: %s", self.me, exc)
                if not self._reconnect():
                    if not self.stop_event.is_set():
                        self.lost = f"the coordinator closed the connection ({exc}) and is gone"
                    break
                continue
            try:
                msg = proto.decode(control_body(frame))
                self._dispatch(msg)
            except (FrameError, ValueError) as exc:  # ProtocolError, ReduceError, bad values
                log.warning("worker %d: ignored control message: %s", self.me, exc)
        self.stop_event.set()

    def _health_reports(self) -> None:
        while not self.stop_event.wait(HEALTH_S):
            self.tell(self._health())

    def _reconnect(self) -> bool:
        """Wait for a restarted coordinator (the lab restarts it), register again, and end
        the groups it abandoned at its restart; False if it does not come back."""
        old, self.control = self.control, None
        if old is not None:
            old.close()
        try:
            if not self.connect():
                return False
        except CoordinatorUnreachable as exc:
            log.error("worker %d: %s", self.me, exc)
            return False
        with self._lock:
            actions = self.ctl.coordinator_lost()
            mine = self.ctl.my_group
        for g in self.engine.groups():
            if g != mine:
                self.engine.finish(g)
        for action in actions:
            self._act(action, None)
        log.info("worker %d: registered with the restarted coordinator", self.me)
        return True

    def _dispatch(self, msg: proto.Message) -> None:
        with self._lock:
            actions = self.ctl.on_message(msg)
            vector = self._vector_offered
        for action in actions:
            self._act(action, vector)

    def _act(self, action: Action, vector: np.ndarray | None) -> None:
        """Carry out one of the control logic's actions (``crew.control.worker_control``)."""
        if isinstance(action, JoinGroup):
            if action.member:
                self._assigns[action.assign.group] = action.assign
                self._assigned_at.setdefault(action.assign.group, time.monotonic())
            self.engine.assign(action.assign, vector if action.member else None)
            if action.assign.rev > 0:  # queued frames of routes the revision dropped: unsend
                self.transport.cancel(self.engine.superseded())
        elif isinstance(action, UseSplit):
            self.engine.set_split(action.split)
        elif isinstance(action, CancelPrescatter):
            keep = action.keep
            self.transport.cancel(
                lambda f: f.kind == FrameKind.PRESCATTER and (f.block, f.offset) not in keep
            )
        elif isinstance(action, ProveGroup):
            self._prove(action.reveal)
        elif isinstance(action, DeliverOutcome):
            self.outcomes.put(action.outcome)
        elif isinstance(action, FinishCarried):
            self.engine.finish(action.group)
        elif isinstance(action, SetSlowdown):
            if self._on_slowdown is not None:
                self._on_slowdown(action.factor)
            log.info("worker %d: slowdown now x%.2f", self.me, action.factor)
        elif isinstance(action, StopWorker):
            log.info("worker %d: stop (%s)", self.me, action.reason)
            self.stop_event.set()

    # -- a round: offer, then settle -----------------------------------------------------------

    def offer(self, vector: np.ndarray, iteration: int, *, blocking: bool = True) -> None:
        """Offer ``vector`` (flat float32, kept unchanged until settled) and send ``Ready``;
        in non-blocking mode, start pre-scattering it first. ``blocking=False``: the caller
        computes on until it calls :meth:`settle` (counted as compute, not as waiting)."""
        with self._lock:
            self._vector_offered = vector
            self.ctl.offer()
            self.meter.offered(time.monotonic(), blocking=blocking)
            split = self.ctl.prescatter_split()
        epoch = -1
        if split is not None:
            for dst, frame in prescatter_frames(
                self.me,
                self.cfg.run_num,
                vector,
                split.segments,
                split.epoch,
                iteration,
                split.part_elems,
            ):
                self.transport.send(dst, frame)
            epoch = split.epoch
        self.tell(proto.Ready(self.me, iteration, project(self.check, vector), epoch))

    def settled(self) -> bool:
        """True when :meth:`settle` would return at once: a group's outcome is waiting, or
        the node has stopped."""
        return not self.outcomes.empty() or self.stop_event.is_set()

    def settle(self, timeout: float | None = None) -> Settled | None:
        """Block until the offered vector's group commits or is abandoned; None if the node
        stopped (or ``timeout`` seconds passed) first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self.meter.in_round:
                self.meter.waiting(time.monotonic())
        while not self.stop_event.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return None
            try:
                out = self.outcomes.get(timeout=0.5)
            except queue.Empty:
                continue
            result = self.engine.finish(out.group)
            with self._lock:
                settlement, cleanup = self.ctl.settle(out, have_result=result is not None)
                self._vector_offered = None
                assigned_at = self._assigned_at.pop(out.group, None)
                if self.meter.in_round:  # (an outcome always ends the round it settles)
                    applied = settlement is Settlement.APPLY_AVERAGE
                    self.meter.settled(time.monotonic(), assigned_at, applied)
            self._act(cleanup, None)
            assign = self._assigns.pop(out.group, None)
            members = () if assign is None else tuple(assign.members)
            if settlement is Settlement.KEEP_OWN_MISSING:
                log.error(
                    "worker %d: commit of group %d without a full result; keeping own model",
                    self.me,
                    out.group,
                )
            elif settlement is Settlement.KEEP_OWN_ABANDONED:
                log.info(
                    "worker %d: group %d abandoned (%s); keeping own model",
                    self.me,
                    out.group,
                    out.reason,
                )
            return Settled(
                settlement,
                out,
                result if settlement is Settlement.APPLY_AVERAGE else None,
                members,
            )
        return None

    def offer_fixed(self, vector: np.ndarray) -> None:
        """Benchmark mode: offer one fixed vector once; groups are driven by the coordinator's
        trace and never settled by this node."""
        with self._lock:
            self._vector_offered = vector
            self.ctl.offer()
        self.tell(proto.Ready(self.me, 0, project(self.check, vector), -1))
