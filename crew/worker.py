"""A CREW worker: trains its shard, offers its model when ready, and carries groups' data.

Run one per host namespace::

    python -m crew.worker --config runs/<id>/config.json --id 3

Threads:

* the **training loop** (main thread): one local iteration, then ``Ready``; a worker that is
  put in a group waits for that group's ``Commit`` (apply the average) or ``Abandon`` (keep
  its own model) before training on. While it trains, its transport threads keep aggregating
  and forwarding other groups' blocks: that is CREW's "non-members work in the background";
* the **control reader**: messages from the coordinator over the management network;
* the **heartbeat**: so the coordinator notices a silent worker;
* the **transport** (``crew.transport``): data-plane frames over the emulated WAN links.

A completed local update is never lost: until a group commits, the worker keeps its own model,
and it saves a checkpoint after every commit and when it stops.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from crew import protocol as proto
from crew.config import RunConfig
from crew.frames import Frame, FrameCodec, FrameError, FrameKind, control_body, control_frame
from crew.probes import LinkStateChange, Prober
from crew.reduce import ReduceEngine, prescatter_frames
from crew.transport import FlowOrder, FrameStream, Transport
from crew.verify import check_vector, project
from crew.worker_control import (
    Action,
    CancelPrescatter,
    DeliverOutcome,
    FinishCarried,
    JoinGroup,
    Outcome,
    SetSlowdown,
    Settlement,
    StopWorker,
    WorkerControl,
    evaluation_due,
)

log = logging.getLogger("crew.worker")

CONNECT_ATTEMPTS = 60  # x 0.5 s: the coordinator may start a moment after the workers
HEALTH_S = 0.5  # LinkHealth (probe states, group progress) period; changes go at once
PROGRESS_KEYS = 64  # group revisions whose received bytes are remembered
GROUP_DATA = (FrameKind.SCATTER, FrameKind.RESULT, FrameKind.RELAY)


class Worker:
    """One worker process. ``cfg.extra["bench"]`` makes it a numpy-only benchmark worker that
    offers a fixed random vector and only carries groups (no torch, no training)."""

    def __init__(self, cfg: RunConfig, me: int):
        self.cfg = cfg
        self.me = me
        self.bench = bool(cfg.extra.get("bench"))
        self.codec = FrameCodec(cfg.secret(), cfg.run_num, max_payload=cfg.max_payload)
        self.checkpoint = Path(cfg.run_dir) / "checkpoints" / f"w{me}.pt"
        self.trainer = None if self.bench else self._make_trainer()
        if self.bench:
            size = int(cfg.extra["size_elems"])
            rng = np.random.default_rng([cfg.seed, me])
            self.base_vector = rng.standard_normal(size).astype(np.float32)
        self.stop_event = threading.Event()
        self.outcomes: queue.Queue[Outcome] = queue.Queue()
        self.ctl = WorkerControl(me, bench=self.bench, nonblocking=cfg.nonblocking)
        self._vector_offered: np.ndarray | None = None
        self._lock = threading.Lock()
        self.check = check_vector(cfg.run_num, self._vector().size)
        self.engine = ReduceEngine(me, cfg.n, cfg.run_num, self._send_data, self._have_all)
        peers = {j: (cfg.identities[j], cfg.data_port) for j in range(cfg.n) if j != me}
        self.transport = Transport(
            me,
            (cfg.identities[me], cfg.data_port),
            peers,
            self.codec,
            on_frame=self._on_data_frame,
            on_send_error=self._send_failed,
            on_reject=self._rejected,
            flow_order=FlowOrder(cfg.flow_order),
            stall_timeout=cfg.stall_timeout_s,
        )
        self.control: FrameStream | None = None
        self.rejected = 0
        self.prober = Prober(
            me, (cfg.identities[me], cfg.data_port), peers, self.codec, self._link_changed
        )
        self._received: dict[tuple[int, int], int] = {}  # (group, rev) -> data bytes in
        self._received_lock = threading.Lock()

    def _make_trainer(self):  # noqa: ANN202 - torch types stay out of this module's imports
        from crew.datasets import Partition, load_split, shard
        from crew.stragglers import ComputeDelay, get_profile
        from crew.training import ModelConfig, TrainConfig, Trainer

        cfg, me = self.cfg, self.me
        train, test = load_split(seed=cfg.seed, cache_dir=cfg.data_dir)
        trainer = Trainer(
            ModelConfig(width=cfg.width, depth=cfg.depth),
            TrainConfig(
                lr=cfg.lr, batch_size=cfg.batch_size, local_steps=cfg.local_steps, seed=cfg.seed
            ),
            shard(train, cfg.n, me, Partition(cfg.partition), cfg.seed),
            test,
        )
        if self.checkpoint.exists():
            trainer.load(self.checkpoint)
            log.info(
                "worker %d: resumed from %s at iteration %d", me, self.checkpoint, trainer.iteration
            )
        spec = cfg.stragglers[me] if me < len(cfg.stragglers) else None
        self.delay = ComputeDelay(get_profile(spec) if spec else None, seed=cfg.seed * 1000 + me)
        return trainer

    def _vector(self) -> np.ndarray:
        return self.base_vector if self.trainer is None else self.trainer.get_vector()

    @property
    def iteration(self) -> int:
        return 0 if self.trainer is None else self.trainer.iteration

    # -- plumbing ----------------------------------------------------------------------------

    def _send_data(self, dst: int, frame: Frame) -> None:
        self.transport.send(dst, frame)

    def _tell(self, msg: proto.Message) -> None:
        stream = self.control
        if stream is None:
            return
        try:
            stream.send(control_frame(self.me, self.cfg.run_num, msg.to_dict()))
        except OSError as exc:  # the control reader notices too, and reconnects or stops
            log.warning("worker %d: control send failed: %s", self.me, exc)

    def _have_all(self, group: int, rev: int, bytes_sent: int) -> None:
        result = self.engine.result(group)
        proj = project(self.check, result) if result is not None else float("nan")
        self._tell(proto.HaveAll(self.me, group, rev, bytes_sent, proj))

    def _send_failed(self, dst: int, err: BaseException, unsent: list[Frame]) -> None:
        log.warning(
            "worker %d: link %d->%d failed (%s); %d frames unsent",
            self.me,
            self.me,
            dst,
            err,
            len(unsent),
        )
        self._tell(proto.LinkFailed(self.me, self.me, dst, str(err)[:200]))

    def _on_data_frame(self, frame: Frame) -> None:
        if frame.kind in GROUP_DATA:
            with self._received_lock:
                key = (frame.group, frame.rev)
                self._received[key] = self._received.pop(key, 0) + frame.nbytes
                if len(self._received) > PROGRESS_KEYS:
                    del self._received[next(iter(self._received))]  # the least recent
        self.engine.on_frame(frame)

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
        self._tell(self._health())

    def _health_reports(self) -> None:
        while not self.stop_event.wait(HEALTH_S):
            self._tell(self._health())

    def _rejected(self, peer: tuple[str, int], err: FrameError) -> None:
        self.rejected += 1
        log.warning("worker %d: rejected frame from %s: %s", self.me, peer, err)
        self._tell(proto.Rejected(self.me, f"{peer[0]}:{peer[1]}", type(err).__name__))

    def connect(self) -> bool:
        """Reach the coordinator and register; False if told to stop before that."""
        addr = (self.cfg.coordinator_host, self.cfg.coordinator_port)
        last: OSError | None = None
        for _ in range(CONNECT_ATTEMPTS):
            if self.stop_event.is_set():
                return False
            try:
                self.control = FrameStream.connect(addr, self.codec, timeout=5.0)
                break
            except OSError as exc:
                last = exc
                self.stop_event.wait(0.5)
        else:
            raise ConnectionError(f"cannot reach the coordinator at {addr}: {last}")
        self._tell(proto.Register(self.me, os.getpid(), self.iteration, int(self._vector().size)))
        return True

    # -- threads -----------------------------------------------------------------------------

    def _heartbeats(self) -> None:
        while not self.stop_event.wait(self.cfg.heartbeat_s):
            self._tell(proto.Heartbeat(self.me, self.iteration))
            samples = [
                [float(src), float(b), s]
                for src, (b, s) in self.transport.arrival_rates().items()
                if s > 0
            ]
            if samples:
                self._tell(proto.LinkRates(self.me, samples))

    def _control_reader(self) -> None:
        assert self.control is not None
        while not self.stop_event.is_set():
            try:
                frame = self.control.recv()
            except FrameError as exc:
                log.warning("worker %d: bad control frame: %s", self.me, exc)
                break
            except OSError as exc:  # StreamClosed included
                log.warning("worker %d: lost the coordinator: %s", self.me, exc)
                if self.stop_event.is_set() or not self._reconnect():
                    break
                continue
            try:
                msg = proto.decode(control_body(frame))
                self._dispatch(msg)
            except (FrameError, ValueError) as exc:  # ProtocolError, ReduceError, bad values
                log.warning("worker %d: ignored control message: %s", self.me, exc)
        self.stop_event.set()

    def _reconnect(self) -> bool:
        """Wait for a restarted coordinator (the lab restarts it), register again, and end
        the groups it abandoned at its restart; False if it does not come back."""
        old, self.control = self.control, None
        if old is not None:
            old.close()
        try:
            if not self.connect():
                return False
        except ConnectionError as exc:
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
        """Carry out one of the control logic's actions (``crew.worker_control``)."""
        if isinstance(action, JoinGroup):
            self.engine.assign(action.assign, vector if action.member else None)
        elif isinstance(action, CancelPrescatter):
            keep = action.keep
            self._cancel_prescatter(lambda f: (f.block, f.offset) not in keep)
        elif isinstance(action, DeliverOutcome):
            self.outcomes.put(action.outcome)
        elif isinstance(action, FinishCarried):
            self.engine.finish(action.group)
        elif isinstance(action, SetSlowdown):
            if self.trainer is not None:
                self.delay.slowdown = action.factor
            log.info("worker %d: slowdown now x%.2f", self.me, action.factor)
        elif isinstance(action, StopWorker):
            log.info("worker %d: stop (%s)", self.me, action.reason)
            self.stop_event.set()

    # -- the three ways a worker spends its time ---------------------------------------------

    def _prescatter(self, vector: np.ndarray, iteration: int) -> int:
        """Non-blocking mode: start sending the a2a split before the group exists."""
        with self._lock:
            split = self.ctl.prescatter_split()
        if split is None:
            return -1
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
        return split.epoch

    def _cancel_prescatter(self, also: Callable[[Frame], bool]) -> None:
        """Drop this worker's queued pre-scattered parts that the group will not use."""
        self.transport.cancel(lambda f: f.kind == FrameKind.PRESCATTER and also(f))

    def _wait_for_group(self) -> None:
        """Block until the group this worker joined commits or is abandoned."""
        assert self.trainer is not None
        while not self.stop_event.is_set():
            try:
                out = self.outcomes.get(timeout=0.5)
            except queue.Empty:
                continue
            result = self.engine.finish(out.group)
            with self._lock:
                settlement, cleanup = self.ctl.settle(out, have_result=result is not None)
                self._vector_offered = None
            if settlement is Settlement.APPLY_AVERAGE:
                assert result is not None
                self.trainer.set_vector(result)
                self.trainer.save(self.checkpoint)
            elif settlement is Settlement.KEEP_OWN_MISSING:
                log.error(
                    "worker %d: commit of group %d without a full result; keeping own model",
                    self.me,
                    out.group,
                )
            else:
                log.info(
                    "worker %d: group %d abandoned (%s); keeping own model",
                    self.me,
                    out.group,
                    out.reason,
                )
            self._act(cleanup, None)
            return

    def _local_iteration(self, last_eval: float) -> float:
        """One local iteration with its straggler padding and metrics; returns last_eval."""
        assert self.trainer is not None
        started = time.perf_counter()
        loss = self.trainer.step()
        pad = self.delay.padding(time.perf_counter() - started)
        if pad > 0:
            self.stop_event.wait(pad)
        accuracy = None
        now = time.time()
        if evaluation_due(now, last_eval, self.cfg.eval_every_s):
            _, accuracy = self.trainer.evaluate()
            last_eval = now
        self._tell(proto.Metrics(self.me, self.trainer.iteration, loss, accuracy, now))
        return last_eval

    def _train_partial(self) -> None:
        last_eval = 0.0
        while not self.stop_event.is_set():
            last_eval = self._local_iteration(last_eval)
            if self.stop_event.is_set():
                break
            offered = self._vector()
            with self._lock:
                self._vector_offered = offered
                self.ctl.offer()
            epoch = self._prescatter(offered, self.iteration)
            self._tell(proto.Ready(self.me, self.iteration, project(self.check, offered), epoch))
            self._wait_for_group()

    def _gloo(self):  # noqa: ANN202 - crew.gloo imports torch lazily
        from crew.gloo import GlooAllReduce, GlooSpec

        return GlooAllReduce(
            GlooSpec(
                rank=self.me,
                world=self.cfg.n,
                addresses=self.cfg.identities,
                store_port=self.cfg.data_port + 1,
                timeout_s=self.cfg.group_timeout_min_s * 4,
            )
        )

    def _train_gloo(self) -> None:
        """Synchronous data parallel: every iteration, all n average through Gloo."""
        assert self.trainer is not None
        last_eval = 0.0
        with self._gloo() as gloo:
            op = 0
            while not self.stop_event.is_set():
                last_eval = self._local_iteration(last_eval)
                started = time.time()
                averaged = gloo.average(self._vector())
                self.trainer.set_vector(averaged)
                op += 1
                if self.me == 0:
                    self._tell(
                        proto.OpTime(self.me, op, started, time.time(), int(averaged.nbytes))
                    )

    def _bench_gloo(self) -> None:
        ops = int(self.cfg.extra.get("ops", 10))
        with self._gloo() as gloo:
            for op in range(1, ops + 1):
                if self.stop_event.is_set():
                    return
                gloo.barrier()
                started = time.time()
                averaged = gloo.average(self.base_vector)
                ended = time.time()
                if self.me == 0:
                    self._tell(proto.OpTime(self.me, op, started, ended, int(averaged.nbytes)))
        self.stop_event.wait()

    def run(self) -> int:
        self.transport.start()
        self.prober.start()
        gloo = self.cfg.scheme == "gloo"
        try:
            if not self.connect():
                log.info("worker %d: stopped before it reached the coordinator", self.me)
                return 0
            threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True).start()
            threading.Thread(target=self._control_reader, name="control", daemon=True).start()
            threading.Thread(target=self._health_reports, name="health", daemon=True).start()
            if self.bench and gloo:
                self._bench_gloo()
            elif self.bench:
                # Offer the fixed vector once; the coordinator drives groups from its trace.
                with self._lock:
                    self._vector_offered = self.base_vector
                    self.ctl.offer()
                self._tell(proto.Ready(self.me, 0, project(self.check, self.base_vector), -1))
                self.stop_event.wait()
            elif gloo:
                self._train_gloo()
            else:
                self._train_partial()
        finally:
            if self.trainer is not None:
                self.trainer.save(self.checkpoint)
            self.stop_event.set()
            if self.control is not None:
                self.control.close()
            self.transport.close()
            self.prober.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crew.worker",
        description="One CREW worker: trains its shard and takes part in partial reduce."
        " Started by the lab inside the worker's network namespace.",
    )
    parser.add_argument("--config", required=True, help="the run's config.json")
    parser.add_argument("--id", type=int, required=True, help="this worker's index, 0..n-1")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format=f"%(asctime)s w{args.id} %(levelname)s %(name)s: %(message)s",
    )
    cfg = RunConfig.load(args.config)
    if not 0 <= args.id < cfg.n:
        parser.error(f"--id: must be between 0 and {cfg.n - 1}")
    if not cfg.extra.get("bench") or cfg.scheme == "gloo":
        import torch

        torch.set_num_threads(1)
    worker = Worker(cfg, args.id)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: worker.stop_event.set())
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
