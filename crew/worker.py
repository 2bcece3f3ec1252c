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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crew import protocol as proto
from crew.config import RunConfig
from crew.frames import Frame, FrameCodec, FrameError, control_body, control_frame
from crew.reduce import ReduceEngine, ReduceError
from crew.transport import FlowOrder, FrameStream, Transport
from crew.verify import check_vector, project

log = logging.getLogger("crew.worker")

CONNECT_ATTEMPTS = 60  # x 0.5 s: the coordinator may start a moment after the workers


@dataclass(frozen=True)
class Outcome:
    group: int
    committed: bool
    reason: str = ""


class Worker:
    def __init__(self, cfg: RunConfig, me: int):
        from crew.datasets import Partition, load_split, shard
        from crew.stragglers import ComputeDelay, get_profile
        from crew.training import ModelConfig, TrainConfig, Trainer

        self.cfg = cfg
        self.me = me
        self.codec = FrameCodec(cfg.secret(), cfg.run_num, max_payload=cfg.max_payload)
        train, test = load_split(seed=cfg.seed)
        self.trainer = Trainer(
            ModelConfig(width=cfg.width, depth=cfg.depth),
            TrainConfig(
                lr=cfg.lr, batch_size=cfg.batch_size, local_steps=cfg.local_steps, seed=cfg.seed
            ),
            shard(train, cfg.n, me, Partition(cfg.partition), cfg.seed),
            test,
        )
        self.checkpoint = Path(cfg.run_dir) / "checkpoints" / f"w{me}.pt"
        if self.checkpoint.exists():
            self.trainer.load(self.checkpoint)
            log.info("worker %d: resumed from %s at iteration %d", me, self.checkpoint,
                     self.trainer.iteration)
        spec = cfg.stragglers[me] if me < len(cfg.stragglers) else None
        self.delay = ComputeDelay(get_profile(spec) if spec else None, seed=cfg.seed * 1000 + me)
        self.stop_event = threading.Event()
        self.outcomes: queue.Queue[Outcome] = queue.Queue()
        self.my_group: int | None = None
        self._vector_offered: np.ndarray | None = None
        self._lock = threading.Lock()
        self.check = check_vector(cfg.run_num, self.trainer.get_vector().size)
        self.engine = ReduceEngine(me, cfg.n, cfg.run_num, self._send_data, self._have_all)
        peers = {
            j: (cfg.identities[j], cfg.data_port) for j in range(cfg.n) if j != me
        }
        self.transport = Transport(
            me,
            (cfg.identities[me], cfg.data_port),
            peers,
            self.codec,
            on_frame=self.engine.on_frame,
            on_send_error=self._send_failed,
            on_reject=self._rejected,
            flow_order=FlowOrder(cfg.flow_order),
            stall_timeout=cfg.stall_timeout_s,
        )
        self.control: FrameStream | None = None
        self.rejected = 0

    # -- plumbing ----------------------------------------------------------------------------

    def _send_data(self, dst: int, frame: Frame) -> None:
        self.transport.send(dst, frame)

    def _tell(self, msg: proto.Message) -> None:
        stream = self.control
        if stream is None:
            return
        try:
            stream.send(control_frame(self.me, self.cfg.run_num, msg.to_dict()))
        except OSError as exc:
            log.warning("worker %d: control send failed: %s", self.me, exc)
            self.stop_event.set()

    def _have_all(self, group: int, rev: int, bytes_sent: int) -> None:
        result = self.engine.result(group)
        proj = project(self.check, result) if result is not None else float("nan")
        self._tell(proto.HaveAll(self.me, group, rev, bytes_sent, proj))

    def _send_failed(self, dst: int, err: BaseException, unsent: list[Frame]) -> None:
        log.warning("worker %d: link %d->%d failed (%s); %d frames unsent",
                    self.me, self.me, dst, err, len(unsent))
        self._tell(proto.LinkFailed(self.me, self.me, dst, str(err)[:200]))

    def _rejected(self, peer: tuple[str, int], err: FrameError) -> None:
        self.rejected += 1
        log.warning("worker %d: rejected frame from %s: %s", self.me, peer, err)

    def connect(self) -> None:
        addr = (self.cfg.coordinator_host, self.cfg.coordinator_port)
        last: OSError | None = None
        for _ in range(CONNECT_ATTEMPTS):
            try:
                self.control = FrameStream.connect(addr, self.codec, timeout=5.0)
                break
            except OSError as exc:
                last = exc
                time.sleep(0.5)
        else:
            raise ConnectionError(f"cannot reach the coordinator at {addr}: {last}")
        vec = self.trainer.get_vector()
        self._tell(proto.Register(self.me, os.getpid(), self.trainer.iteration, int(vec.size)))

    # -- threads -----------------------------------------------------------------------------

    def _heartbeats(self) -> None:
        while not self.stop_event.wait(self.cfg.heartbeat_s):
            self._tell(proto.Heartbeat(self.me, self.trainer.iteration))

    def _control_reader(self) -> None:
        assert self.control is not None
        while not self.stop_event.is_set():
            try:
                frame = self.control.recv()
            except FrameError as exc:
                log.warning("worker %d: bad control frame: %s", self.me, exc)
                break
            except OSError as exc:
                log.warning("worker %d: lost the coordinator: %s", self.me, exc)
                break
            try:
                msg = proto.decode(control_body(frame))
                self._dispatch(msg)
            except (FrameError, proto.ProtocolError, ReduceError) as exc:
                log.warning("worker %d: ignored control message: %s", self.me, exc)
        self.stop_event.set()

    def _dispatch(self, msg: proto.Message) -> None:
        if isinstance(msg, proto.Assign):
            member = self.me in msg.members
            with self._lock:
                vector = self._vector_offered if member else None
                if member:
                    self.my_group = msg.group
            self.engine.assign(msg, vector)
        elif isinstance(msg, proto.Commit | proto.Abandon):
            with self._lock:
                mine = msg.group == self.my_group
            if mine:
                committed = isinstance(msg, proto.Commit)
                self.outcomes.put(Outcome(msg.group, committed, getattr(msg, "reason", "")))
            else:
                self.engine.finish(msg.group)  # a group this worker only aggregated for
        elif isinstance(msg, proto.SetSlowdown):
            self.delay.slowdown = msg.factor
            log.info("worker %d: slowdown now x%.2f", self.me, msg.factor)
        elif isinstance(msg, proto.Stop):
            log.info("worker %d: stop (%s)", self.me, msg.reason)
            self.stop_event.set()
        else:
            raise proto.ProtocolError(f"type: {msg.TYPE!r} is not for workers")

    # -- training ----------------------------------------------------------------------------

    def _wait_for_group(self) -> None:
        """Block until the group this worker joined commits or is abandoned."""
        while not self.stop_event.is_set():
            try:
                out = self.outcomes.get(timeout=0.5)
            except queue.Empty:
                continue
            result = self.engine.finish(out.group)
            if out.committed:
                if result is None:
                    log.error("worker %d: commit of group %d without a full result; keeping"
                              " own model", self.me, out.group)
                else:
                    self.trainer.set_vector(result)
                    self.trainer.save(self.checkpoint)
            else:
                log.info("worker %d: group %d abandoned (%s); keeping own model",
                         self.me, out.group, out.reason)
            with self._lock:
                self.my_group = None
                self._vector_offered = None
            return

    def run(self) -> int:
        self.transport.start()
        self.connect()
        threads = [
            threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True),
            threading.Thread(target=self._control_reader, name="control", daemon=True),
        ]
        for t in threads:
            t.start()
        last_eval = 0.0
        try:
            while not self.stop_event.is_set():
                started = time.perf_counter()
                loss = self.trainer.step()
                pad = self.delay.padding(time.perf_counter() - started)
                if pad > 0 and self.stop_event.wait(pad):
                    break
                accuracy = None
                now = time.time()
                if now - last_eval >= self.cfg.eval_every_s:
                    _, accuracy = self.trainer.evaluate()
                    last_eval = now
                self._tell(proto.Metrics(self.me, self.trainer.iteration, loss, accuracy, now))
                offered = self.trainer.get_vector()
                with self._lock:
                    self._vector_offered = offered
                self._tell(proto.Ready(self.me, self.trainer.iteration,
                                       project(self.check, offered)))
                self._wait_for_group()
        finally:
            self.trainer.save(self.checkpoint)
            self.stop_event.set()
            if self.control is not None:
                self.control.close()
            self.transport.close()
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
    import torch

    torch.set_num_threads(1)
    worker = Worker(cfg, args.id)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: worker.stop_event.set())
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
