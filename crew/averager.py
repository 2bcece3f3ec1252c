"""The public API: average a model with CREW's partial reduce from any training loop.

::

    import crew

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with crew.Averager(model, group_size=2) as averager:   # reads torchrun's variables
        for batch in data:
            loss = train_step(model, optimizer, batch)     # your step, unchanged
            round = averager.step()                        # ready; maybe averaged in place
            if round.averaged:
                print(f"averaged with ranks {round.peers} in {round.seconds:.3f} s")

What :meth:`Averager.step` does: it offers a copy of the parameters to the coordinator as
*ready*. As soon as ``group_size`` workers are ready, the coordinator forms a group of them
and plans how their data travels over the measured links; the members average their copies
(weighted) and every member writes the average back into its parameters, in place. A worker
that is not in a group meanwhile keeps carrying other groups' blocks in background threads,
but its own parameters are only read when it offers them and only written at the end of its
own call, so the training loop never sees a half-written model. If a group is abandoned (a
member died, a link failed and no re-plan could finish it), the worker keeps its own
parameters, and the call says so.

Only the parameters are averaged: optimizer state (momentum, Adam moments) stays local, as in
local SGD and DiLoCo-style training. The wire format is float32; tensors of other floating
dtypes (or on another device) are converted for the wire and written back in their own dtype
and device.

Launch: :class:`Averager` reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and
``CREW_SECRET`` / ``CREW_SECRET_FILE``, and optionally ``CREW_DATA_PORT`` and
``CREW_CONTROL_PORT`` (see :mod:`crew.runtime.launch`); rank 0 hosts the coordinator. At
start-up the ranks measure their links with a short probe (:mod:`crew.runtime.rendezvous`)
unless ``capacities`` are given.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from crew.config import COMPRESS, RunConfig
from crew.control.utilisation import TimeSplit
from crew.control.worker_control import Settlement
from crew.errors import CoordinatorLost, PortError
from crew.runtime.capacity_probe import DEFAULT_PROBE_BYTES, DEFAULT_PROBE_SECONDS, ProbeReceiver
from crew.runtime.launch import (
    JobHost,
    LaunchEnv,
    aggregation,
    check_mode,
    control_port,
    data_port_range,
    encryption,
    read_secret,
    rendezvous_number,
)
from crew.runtime.node import Node, Settled
from crew.runtime.rendezvous import join_job
from crew.train.outer import OuterLoop
from crew.train.overlap import DelayedUpdates, OverlapError
from crew.wire import protocol as proto
from crew.wire.frames import Frame, FrameCodec, FrameError
from crew.wire.transport import Transport

__all__ = ["Averager", "Round"]

log = logging.getLogger("crew.averager")


@dataclass(frozen=True)
class Round:
    """What one :meth:`Averager.step` did.

    ``averaged``: the parameters now hold the group's weighted average.
    ``group``: the coordinator's id of the group (None if no group formed, e.g. stopped).
    ``peers``: the ranks whose models were averaged, this one included (empty if none).
    ``staleness``: local steps this worker took since its parameters were last averaged
    (1 when it averages after every step; larger when it trained on alone).
    ``seconds``: wall time from offering the parameters to the end of the call (waiting for a
    group, then the reduce).
    ``reason``: why not averaged ("" when averaged).
    ``stopped``: the job is over (the coordinator said stop): stop training.
    ``time_split``: this worker's wall time since it joined, split into computing (outside
    :meth:`Averager.step`), ready-waiting for a group, reducing in groups that applied and
    stalled in groups that were abandoned (:class:`crew.control.utilisation.TimeSplit`).
    ``utilisation``: its compute share, ``time_split.compute_s / time_split.wall_s``.
    """

    averaged: bool
    group: int | None
    peers: tuple[int, ...]
    staleness: int
    seconds: float
    reason: str = ""
    stopped: bool = False
    time_split: TimeSplit = TimeSplit()

    @property
    def utilisation(self) -> float:
        return self.time_split.utilisation


class PendingRound:
    """A round offered by :meth:`Averager.start`, reducing while the caller trains on.

    :meth:`wait` blocks until the group has ended and applies its result as a delta against
    the offered snapshot (or nothing, when the group was abandoned); it returns the
    :class:`Round`, and the same Round again on later calls. :meth:`ready` tells, without
    blocking, whether :meth:`wait` would return at once."""

    def __init__(
        self,
        averager: Averager,
        begun: tuple[int, float, int | None] | None,
        done: Round | None,
    ) -> None:
        self._averager = averager
        self._begun = begun
        self._round = done

    def ready(self) -> bool:
        """True when :meth:`wait` would not block: the group has ended (or the job is over).
        A training loop asks between its steps and applies the result as soon as it is here,
        so fewer steps are taken from the model it offered."""
        return self._round is not None or self._averager._node.settled()

    def wait(self) -> Round:
        if self._round is None:
            assert self._begun is not None
            staleness, started, ticket = self._begun
            averager = self._averager
            self._round = averager._end(averager._node.settle(), staleness, started, ticket)
        return self._round


def _tensors_of(params: nn.Module | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    tensors = list(params.parameters()) if isinstance(params, nn.Module) else list(params)
    if not tensors:
        raise ValueError("params: nothing to average (no tensors)")
    for k, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"params[{k}]: expected a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"params[{k}]: dtype {t.dtype} is not a floating-point type")
    return tensors


class _Deferred:
    """The transport's callbacks before the Node exists (the transport starts first, for the
    start-up probe): the probe's bursts go to a ProbeReceiver, nothing else arrives."""

    def __init__(self) -> None:
        self.node: Node | None = None
        self.probe = ProbeReceiver()

    def on_frame(self, frame: Frame) -> None:
        if self.node is not None:
            self.node.on_frame(frame)
        else:
            self.probe.on_frame(frame)

    def on_send_error(self, dst: int, err: BaseException, unsent: list[Frame]) -> None:
        if self.node is not None:
            self.node._send_failed(dst, err, unsent)

    def on_reject(self, peer: tuple[str, int], err: FrameError) -> None:
        if self.node is not None:
            self.node._rejected(peer, err)
        else:
            log.warning("rejected a data-plane frame from %s during start-up: %s", peer, err)


class Averager:
    """Averages ``params`` (a ``torch.nn.Module`` or a list of tensors) with the other ranks
    of a CREW job, ``group_size`` at a time. One :meth:`step` after each local step.

    Started by ``torchrun`` (or anything that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
    and ``MASTER_PORT``), with ``CREW_SECRET`` or ``CREW_SECRET_FILE`` set on every rank.
    The constructor blocks until every rank has joined (at most ``timeout`` seconds) and
    the links are measured; then the parameters of every rank should be equal (seed your
    model's initialisation, or load the same checkpoint).

    Arguments read on rank 0 only (it hosts the coordinator): ``group_size`` (p: how many
    ready workers average together; default half the world, at least 1), ``capacities``
    (Mbit/s, ``[src][dst]``: skip the probe and plan on these), ``probe_bytes`` and
    ``probe_seconds`` (the start-up probe's burst per link and its time budget, see
    :mod:`crew.runtime.capacity_probe`; default 2 MiB and 30 s, or ``CREW_PROBE_BYTES`` /
    ``CREW_PROBE_SECONDS``), ``run_dir``
    (where the coordinator keeps its run database; ``CREW_RUN_DIR`` or a temporary dir),
    ``compress`` (the codec of group payloads on the wire, :mod:`crew.train.compress`:
    ``"none"`` float32, ``"fp16"`` or ``"int8"``).

    ``data_port`` (any rank): where this rank's data plane listens, a port or a range
    ``"A-B"`` of which it takes the first free one (several ranks on one host); default
    ``CREW_DATA_PORT``, else any free port. Bad values raise :class:`crew.PortError`.

    ``outer`` (any rank): a :class:`crew.train.outer.OuterLoop` for LocalSGD or DiLoCo. Then
    :meth:`step` offers ``outer.before_reduce(parameters)`` (DiLoCo: the member's outer
    Nesterov step), loads ``outer.after_reduce(average)`` and calls ``outer.on_abandon()``
    when no group averaged; call :meth:`step` every H local steps. None: offer the parameters.

    Raises :class:`crew.LaunchError` subclasses: :class:`crew.SecretError` (no secret, or
    not the coordinator's), :class:`crew.CoordinatorUnreachable`, :class:`crew.JoinRefused`
    (a rank with other tensor shapes, ranks missing after ``timeout``, a rank that left
    during start-up).
    """

    def __init__(
        self,
        params: nn.Module | Iterable[torch.Tensor],
        *,
        group_size: int | None = None,
        capacities: Sequence[Sequence[float]] | None = None,
        timeout: float = 60.0,
        probe_bytes: int | None = None,
        probe_seconds: float | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        outer: OuterLoop | None = None,
        compress: str = "none",
        data_port: int | str | None = None,
    ) -> None:
        self._tensors = _tensors_of(params)
        self._outer = outer
        if compress not in COMPRESS:
            raise ValueError(f"compress: one of {', '.join(COMPRESS)}, got {compress!r}")
        environ = dict(os.environ) if env is None else env
        launch = LaunchEnv.from_environ(environ)
        secret = read_secret(environ)
        rendezvous_run = rendezvous_number(secret, launch.run_id)
        ports = data_port_range(data_port, environ)
        self.rank = launch.rank
        self.world_size = launch.world
        self.host: JobHost | None = None
        encrypt = encryption(environ)
        # Until the job's own run number arrives in its RunConfig, the transport speaks the
        # rendezvous' (the start-up probe's bursts); the Node then switches it to the job's.
        codec = FrameCodec(secret, rendezvous_run, encrypt=encrypt)
        deferred = _Deferred()
        try:
            transport = Transport(
                launch.rank,
                ("0.0.0.0", 0),
                {},
                codec,
                on_frame=deferred.on_frame,
                on_send_error=deferred.on_send_error,
                on_reject=deferred.on_reject,
                listen_ports=ports.ports,
            )
        except OSError as exc:
            raise PortError(
                f"rank {launch.rank}: the data plane cannot listen on {ports.source}={ports}: {exc}"
            ) from exc
        try:
            if launch.host_coordinator and launch.rank == 0:
                p = group_size if group_size is not None else max(1, launch.world // 2)
                self.host = JobHost(
                    secret,
                    launch.world,
                    ("", launch.coordinator[1]),
                    launch.coordinator[0],
                    rendezvous_run=rendezvous_run,
                    encrypt=encrypt,
                    check=check_mode(environ),
                    aggregation=aggregation(environ),
                    group_size=p,
                    capacities=capacities,
                    run_dir=run_dir or environ.get("CREW_RUN_DIR"),
                    join_timeout=timeout,
                    probe_bytes=probe_bytes
                    or int(environ.get("CREW_PROBE_BYTES", DEFAULT_PROBE_BYTES)),
                    probe_seconds=probe_seconds
                    or float(environ.get("CREW_PROBE_SECONDS", DEFAULT_PROBE_SECONDS)),
                    control_port=control_port(environ),
                    compress=compress,
                )
                self.host.start()
            transport.start()
            data_host = environ.get("CREW_DATA_HOST") or _route_to(launch.coordinator)
            join = proto.Join(
                launch.rank,
                launch.world,
                data_host,
                transport.port,
                [list(t.shape) for t in self._tensors],
                os.getpid(),
            )
            cfg = join_job(
                codec, launch.coordinator, join, transport, deferred.probe, timeout=timeout
            )
        except BaseException:
            transport.close()
            if self.host is not None:
                self.host.close()
            raise
        self._start(cfg, launch.rank, secret, transport=transport, deferred=deferred)

    @classmethod
    def for_run(
        cls,
        params: nn.Module | Iterable[torch.Tensor],
        cfg: RunConfig,
        rank: int,
        *,
        secret: bytes | None = None,
        iteration: int = 0,
        on_slowdown: Any = None,
        outer: OuterLoop | None = None,
    ) -> Averager:
        """Join a run whose configuration already exists (the lab's ``config.json``, with a
        coordinator started by ``python -m crew.runtime.coordinator --config``) as worker ``rank``.
        ``iteration`` is the local iteration to resume from (a checkpoint's)."""
        self = cls.__new__(cls)
        self._tensors = _tensors_of(params)
        self._outer = outer
        self.rank = rank
        self.world_size = cfg.n
        self.host = None
        self._start(cfg, rank, secret, iteration=iteration, on_slowdown=on_slowdown)
        return self

    def _start(
        self,
        cfg: RunConfig,
        rank: int,
        secret: bytes | None,
        *,
        transport: Transport | None = None,
        deferred: _Deferred | None = None,
        iteration: int = 0,
        on_slowdown: Any = None,
    ) -> None:
        self.config = cfg
        if transport is not None:
            transport.set_stall_timeout(cfg.stall_timeout_s)
        self.iteration = iteration
        self._last_averaged = iteration
        self._delayed = DelayedUpdates(limit=1)
        self._closed = False
        size = sum(t.numel() for t in self._tensors)
        self._node = Node(
            cfg,
            rank,
            size,
            secret=secret,
            iteration=lambda: self.iteration,
            on_slowdown=on_slowdown,
            transport=transport,
        )
        if deferred is not None:
            deferred.node = self._node
        try:
            started = self._node.start(transport_started=transport is not None)
        except BaseException:
            self._node.close()
            if self.host is not None:
                self.host.close()
            raise
        if not started:
            self.close()

    # -- the loop's calls --------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        """The job is over: the coordinator said stop, was lost, or :meth:`close` was called."""
        return self._closed or self._node.stop_event.is_set()

    @property
    def num_values(self) -> int:
        """How many values are averaged (the sum of the tensors' sizes)."""
        return self._node.vector_len

    def vector(self) -> np.ndarray:
        """A flat float32 copy of the parameters, in the order given."""
        with torch.no_grad():
            flat = torch.cat(
                [t.detach().reshape(-1).to("cpu", torch.float32) for t in self._tensors]
            )
        return flat.numpy()

    def load_vector(self, vector: np.ndarray) -> None:
        """Write a flat float32 vector (as :meth:`vector` returns) into the parameters."""
        if vector.shape != (self.num_values,):
            raise ValueError(f"vector: shape {vector.shape}, expected ({self.num_values},)")
        if not np.isfinite(vector).all():
            raise ValueError("vector: has non-finite values")
        flat = torch.from_numpy(np.array(vector, dtype=np.float32))  # a writable copy
        offset = 0
        with torch.no_grad():
            for t in self._tensors:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view(t.shape))
                offset += n

    def step(self) -> Round:
        """Report this worker ready after a local step; return when its group has averaged
        (the parameters now hold the average) or was given up (they are unchanged).

        Blocks while the group forms and reduces; the coordinator's group deadlines bound
        that wait. Returns a :class:`Round` with ``stopped=True`` at once if the job is over."""
        begun = self._begin(blocking=True)
        if isinstance(begun, Round):
            return begun
        staleness, started, _ = begun
        settled = self._node.settle()
        return self._end(settled, staleness, started, None)

    def start(self) -> PendingRound:
        """Offer the parameters as they are now and return at once: training goes on while
        the group forms and reduces. :meth:`PendingRound.wait` then applies the group's result
        as a delta against this snapshot, so the local steps taken meanwhile are kept
        (``crew.train.overlap``). One round may be in flight at a time."""
        begun = self._begin(blocking=False)
        if isinstance(begun, Round):
            return PendingRound(self, None, begun)
        return PendingRound(self, begun, None)

    def _begin(self, *, blocking: bool) -> Round | tuple[int, float, int | None]:
        """Offer a round: (staleness, start time, overlap ticket), or the Round of a job that
        is over."""
        if self._delayed.in_flight:
            raise OverlapError("a start()ed round is still in flight: wait() for it first")
        self.iteration += 1
        staleness = self.iteration - self._last_averaged
        if self.stopped:
            return Round(False, None, (), staleness, 0.0, "stopped", stopped=True)
        started = time.perf_counter()
        snapshot = self.vector()
        offered = snapshot if self._outer is None else self._outer.before_reduce(snapshot)
        ticket = None if blocking else self._delayed.offer(snapshot)  # once the offer is made
        self._node.offer(offered, self.iteration, blocking=blocking)
        return staleness, started, ticket

    def _end(
        self, settled: Settled | None, staleness: int, started: float, ticket: int | None
    ) -> Round:
        """Apply (or not) a round's outcome; ``ticket``: an overlapped round's snapshot."""
        seconds = time.perf_counter() - started
        if settled is not None and settled.settlement is Settlement.APPLY_AVERAGE:
            assert settled.result is not None
            synced = settled.result
            if self._outer is not None:
                synced = self._outer.after_reduce(synced)
            if ticket is not None:
                synced = self._delayed.resolve(ticket, self.vector(), synced)
            self.load_vector(synced)
            self._last_averaged = self.iteration
            return Round(
                True,
                settled.outcome.group,
                settled.members,
                staleness,
                seconds,
                time_split=self._node.time_split(),
            )
        if self._outer is not None:
            self._outer.on_abandon()
        if ticket is not None:
            self._delayed.abandon(ticket)
        if settled is None:
            if self._node.lost is not None:
                raise CoordinatorLost(
                    f"rank {self.rank}: {self._node.lost}; the job cannot go on (in a launched"
                    " job the coordinator runs in rank 0: see rank 0's output for why it ended)"
                )
            return Round(
                False,
                None,
                (),
                staleness,
                seconds,
                "stopped",
                stopped=True,
                time_split=self._node.time_split(),
            )
        reason = settled.outcome.reason or "no full result"
        return Round(
            False,
            settled.outcome.group,
            settled.members,
            staleness,
            seconds,
            reason,
            time_split=self._node.time_split(),
        )

    def report(
        self, loss: float, accuracy: float | None = None, *, iteration: int | None = None
    ) -> None:
        """Record this worker's training loss (and held-out accuracy) in the run database, at
        ``iteration`` (default: the steps taken so far)."""
        if math.isfinite(loss):
            it = self.iteration if iteration is None else iteration
            self._node.tell(proto.Metrics(self.rank, it, loss, accuracy, time.time()))

    def stop(self) -> None:
        """Ask this worker to leave: a waiting :meth:`step` returns with ``stopped=True`` and
        so does every later one. Safe from a signal handler; call :meth:`close` afterwards."""
        self._node.stop_event.set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until the job is over (benchmarks that only carry groups); True if it is."""
        return self._node.stop_event.wait(timeout)

    def close(self, timeout: float = 120.0) -> None:
        """Leave the job: stop the threads and close the sockets. On the rank that hosts the
        coordinator, first wait (at most ``timeout`` s) until the other ranks have left, so
        their last groups can finish. Idempotent."""
        if self._closed and self.host is None:
            return
        self._closed = True
        self._node.close()
        if self.host is not None:
            host, self.host = self.host, None
            host.serve(timeout)

    def __enter__(self) -> Averager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Averager(rank={self.rank}, world_size={self.world_size}, p={self.config.p},"
            f" values={self.num_values}, iteration={self.iteration})"
        )


def _route_to(addr: tuple[str, int]) -> str:
    """The local address this host uses to reach ``addr`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
