"""A CREW worker: trains its shard, offers its model when ready, and carries groups' data.

Run one per host namespace::

    python -m crew.runtime.worker --config runs/<id>/config.json --id 3

The lab's worker is a user of the public API: its training loop is a local iteration (with
its straggler padding), then :meth:`crew.Averager.step`, exactly what a user's script does;
the Averager's :class:`~crew.runtime.node.Node` holds the transport, the reduce engine and the
control connection. Gloo baselines and benchmark workers (a fixed numpy vector that is only
offered once and then carries groups) run on the same Node.

A completed local update is never lost: until a group commits, the worker keeps its own model,
and it saves a checkpoint after every commit and when it stops.

Training modes (``cfg.workload``, ``cfg.sync``, ``cfg.local_steps``; ``docs/training.md``): one
local iteration is H optimiser steps of the ``mlp`` or ``lm`` workload (with ``cfg.overlap``
the next iteration trains while the last one's group reduces, ``crew.train.overlap``); with
``local-sgd`` or ``diloco`` the Averager offers through a :class:`crew.train.outer.OuterLoop`,
whose state (the last synchronised parameters and the outer momentum) is checkpointed beside
the model. For
``lm`` the evaluation rows of the database carry the held-out loss (nats per byte) in ``loss``
and the next-byte accuracy in ``accuracy``; other rows carry the training loss.

The ``synthetic`` workload (:mod:`crew.train.synthetic`) imports no torch: its loop offers its
vector on the Node directly (the Averager's offer, settle and load, without tensors) and
checks every average it receives exactly; its rows carry the worst verification ratio in
``loss`` and the share of averages that verified in ``accuracy``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from crew.config import RunConfig, Scheme
from crew.control.worker_control import Settlement, evaluation_due
from crew.runtime import memprofile
from crew.runtime.node import Node
from crew.runtime.stopsignals import call_on_signals
from crew.wire import protocol as proto

log = logging.getLogger("crew.runtime.worker")


class Worker:
    """One worker process. ``cfg.extra["bench"]`` makes it a numpy-only benchmark worker that
    offers a fixed random vector and only carries groups (no torch, no training)."""

    def __init__(self, cfg: RunConfig, me: int):
        self.cfg = cfg
        self.me = me
        self.bench = bool(cfg.extra.get("bench"))
        self.synthetic = cfg.workload == "synthetic"
        self.checkpoint = Path(cfg.run_dir) / "checkpoints" / f"w{me}.pt"
        self.outer_checkpoint = Path(cfg.run_dir) / "checkpoints" / f"w{me}.outer.npz"
        self.delay = None
        self.trainer = None if self.bench else self._make_trainer()
        self.outer = None if self.bench else self._make_outer()
        if self.bench:
            size = int(cfg.extra["size_elems"])
            rng = np.random.default_rng([cfg.seed, me])
            self.base_vector = rng.standard_normal(size).astype(np.float32)
        self.stop_event = threading.Event()
        self.node: Node | None = None
        self.averager = None  # crew.Averager while training with partial reduce
        self._pending = None  # overlap: the round reducing while the next iteration trains

    def _make_trainer(self):  # noqa: ANN202 - torch types stay out of this module's imports
        from crew.train.datasets import Partition
        from crew.train.stragglers import ComputeDelay
        from crew.train.workloads import Workload, make_trainer

        cfg, me = self.cfg, self.me
        trainer = make_trainer(
            Workload(cfg.workload),
            n=cfg.n,
            index=me,
            partition=Partition(cfg.partition),
            seed=cfg.seed,
            lr=cfg.lr,
            batch_size=cfg.batch_size,
            local_steps=cfg.local_steps,
            cache_dir=cfg.data_dir,
            width=cfg.width,
            depth=cfg.depth,
            model_mb=cfg.model_mb,
            verify=cfg.compress == "none",  # a lossy codec's average is not exact
        )
        if self.checkpoint.exists():
            trainer.load(self.checkpoint)
            log.info(
                "worker %d: resumed from %s at iteration %d", me, self.checkpoint, trainer.iteration
            )
        spec = cfg.stragglers[me] if me < len(cfg.stragglers) else None
        self.delay = ComputeDelay.for_worker(spec, cfg.seed, me, cfg.min_iteration_s)
        return trainer

    def _make_outer(self):  # noqa: ANN202 - OuterLoop | None; crew.train imported lazily
        """The outer loop for local-sgd and diloco (None for every-step: offer the model)."""
        from crew.train.outer import OuterConfig, OuterLoop, OuterStateError, SyncMode

        cfg = self.cfg
        mode = SyncMode(cfg.sync)
        if mode is SyncMode.EVERY_STEP:
            return None
        assert self.trainer is not None
        loop = OuterLoop(
            OuterConfig(mode, cfg.local_steps, cfg.outer_lr, cfg.outer_momentum),
            self.trainer.get_vector(),
        )
        if self.outer_checkpoint.exists():
            try:
                loop.load(self.outer_checkpoint)
            except OuterStateError as exc:  # restart the momentum, take the model as theta
                log.warning("worker %d: outer state not restored: %s", self.me, exc)
        return loop

    def _save(self) -> None:
        assert self.trainer is not None
        self.trainer.save(self.checkpoint)
        if self.outer is not None:
            self.outer.save(self.outer_checkpoint)

    def _vector(self) -> np.ndarray:
        return self.base_vector if self.trainer is None else self.trainer.get_vector()

    @property
    def iteration(self) -> int:
        return 0 if self.trainer is None else self.trainer.iteration

    def stop(self) -> None:
        """End the worker (SIGTERM, SIGINT): the current wait returns, the loop ends."""
        self.stop_event.set()
        for part in (self.node, self.averager):
            if part is not None:
                part.stop()

    def _set_slowdown(self, factor: float) -> None:
        if self.delay is not None:
            self.delay.slowdown = factor

    def _local_iteration(
        self, last_eval: float, between_steps: Callable[[], None] | None = None
    ) -> tuple[float, float | None, float]:
        """One local iteration with its straggler padding: (loss, accuracy or None, last_eval).

        A torch iteration of H steps is paced step by step (``IterationPace``), and
        ``between_steps`` runs after each step (the overlapped loop applies a result there)."""
        assert self.trainer is not None and self.delay is not None
        started = time.perf_counter()
        trainer = self.trainer
        slept = 0.0
        if self.synthetic:
            pace = self.delay.pace()
            loss = trainer.step()
        else:
            pace = self.delay.pace(trainer.train_cfg.local_steps)

            def after_step(done: int) -> None:
                nonlocal slept
                if between_steps is not None:
                    between_steps()
                wait = pace.after_step(done, time.perf_counter() - started)
                if wait > 0:
                    self.stop_event.wait(wait)
                    slept += wait

            loss = trainer.step(after_step)
        elapsed = time.perf_counter() - started
        pad = pace.at_end(max(0.0, elapsed - slept), elapsed)
        if pad > 0:
            self.stop_event.wait(pad)
        accuracy = None
        now = time.time()
        if evaluation_due(now, last_eval, self.cfg.eval_every_s):
            held_out, accuracy = self.trainer.evaluate()
            if self.cfg.workload == "lm":  # the lm's quality is its held-out loss
                loss = held_out
            last_eval = now
        return loss, accuracy, last_eval

    def _settle_pending(self, *, block: bool) -> None:
        """Overlap: apply the round in flight (and checkpoint if it averaged). Between two
        local steps (``block`` False) only once its group has ended, so the rest of the
        iteration trains from the group's result; before the next offer, waiting for it."""
        pending = self._pending
        if pending is None or (not block and not pending.ready()):
            return
        self._pending = None
        if pending.wait().averaged:
            self._save()

    def _train_partial(self) -> None:
        """Partial reduce through the public API: the same loop as a user's script."""
        from crew.averager import Averager

        assert self.trainer is not None
        averager = Averager.for_run(
            self.trainer.model,
            self.cfg,
            self.me,
            iteration=self.trainer.iteration,
            on_slowdown=self._set_slowdown,
            outer=self.outer,
        )
        self.averager = averager
        if self.stop_event.is_set():
            averager.stop()
        last_eval = 0.0
        between = functools.partial(self._settle_pending, block=False) if self.cfg.overlap else None
        try:
            while not averager.stopped:
                loss, accuracy, last_eval = self._local_iteration(last_eval, between)
                averager.report(loss, accuracy, iteration=self.trainer.iteration)
                if averager.stopped:
                    break
                if not self.cfg.overlap:
                    if averager.step().averaged:
                        self._save()
                    continue
                # One round in flight: the previous one reduced during this iteration, and its
                # result was applied between steps if it arrived in time.
                self._settle_pending(block=True)
                self._pending = averager.start()
        finally:
            averager.close()

    def _train_synthetic(self, node: Node) -> None:
        """Partial reduce of the synthetic vector: :meth:`crew.Averager.step`'s offer, settle
        and load on the Node itself (no torch), with each average checked exactly."""
        trainer = self.trainer
        assert trainer is not None
        last_eval = 0.0
        while not node.stop_event.is_set():
            loss, accuracy, last_eval = self._local_iteration(last_eval)
            node.tell(proto.Metrics(self.me, trainer.iteration, loss, accuracy, time.time()))
            if node.stop_event.is_set():
                break
            node.offer(trainer.get_vector(), trainer.iteration)
            settled = node.settle()
            if settled is None:  # stopped
                break
            if settled.settlement is Settlement.APPLY_AVERAGE:
                assert settled.result is not None
                trainer.set_vector(settled.result, settled.members)
                self._save()

    def _start_node(self, *, bench: bool) -> Node | None:
        node = Node(
            self.cfg,
            self.me,
            int(self._vector().size),
            bench=bench,
            iteration=lambda: self.iteration,
            on_slowdown=self._set_slowdown,
        )
        self.node = node
        if self.stop_event.is_set() or not node.start():
            log.info("worker %d: stopped before it reached the coordinator", self.me)
            node.close()
            return None
        return node

    def _gloo(self):  # noqa: ANN202 - crew.runtime.gloo imports torch lazily
        from crew.runtime.gloo import GlooAllReduce, GlooSpec

        return GlooAllReduce(
            GlooSpec(
                rank=self.me,
                world=self.cfg.n,
                addresses=self.cfg.identities,
                store_port=self.cfg.data_port + 1,
                timeout_s=self.cfg.group_timeout_min_s * 4,
            )
        )

    def _train_gloo(self, node: Node) -> None:
        """Synchronous data parallel: every iteration, all n average through Gloo."""
        assert self.trainer is not None
        last_eval = 0.0
        with self._gloo() as gloo:
            op = 0
            while not node.stop_event.is_set():
                loss, accuracy, last_eval = self._local_iteration(last_eval)
                node.tell(proto.Metrics(self.me, self.iteration, loss, accuracy, time.time()))
                started = time.time()
                offered = self._vector()
                if self.outer is not None:
                    offered = self.outer.before_reduce(offered)
                averaged = gloo.average(offered)
                if self.outer is not None:
                    averaged = self.outer.after_reduce(averaged)
                self.trainer.set_vector(averaged)
                op += 1
                if self.me == 0:
                    node.tell(proto.OpTime(self.me, op, started, time.time(), int(averaged.nbytes)))

    def _bench_gloo(self, node: Node) -> None:
        ops = int(self.cfg.extra.get("ops", 10))
        with self._gloo() as gloo:
            for op in range(1, ops + 1):
                if node.stop_event.is_set():
                    return
                gloo.barrier()
                started = time.time()
                averaged = gloo.average(self.base_vector)
                ended = time.time()
                if self.me == 0:
                    node.tell(proto.OpTime(self.me, op, started, ended, int(averaged.nbytes)))
        node.stop_event.wait()

    def run(self) -> int:
        gloo = self.cfg.scheme is Scheme.GLOO
        try:
            if not self.bench and not gloo and not self.synthetic:
                self._train_partial()
                return 0
            node = self._start_node(bench=self.bench)
            if node is None:
                return 0
            try:
                if self.bench and gloo:
                    self._bench_gloo(node)
                elif self.bench:
                    # Offer the fixed vector once; the coordinator drives groups from its trace.
                    node.offer_fixed(self.base_vector)
                    node.stop_event.wait()
                elif self.synthetic and not gloo:
                    self._train_synthetic(node)
                else:
                    self._train_gloo(node)
            finally:
                node.close()
        finally:
            if self.trainer is not None:
                self._save()
            self.stop_event.set()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crew.runtime.worker",
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
    if (not cfg.extra.get("bench") and cfg.workload != "synthetic") or cfg.scheme is Scheme.GLOO:
        import torch

        torch.set_num_threads(1)
    worker = Worker(cfg, args.id)
    call_on_signals(lambda _: worker.stop())
    profiler = memprofile.from_env(f"w{args.id}")  # CREW_TRACEMALLOC: a diagnostic
    try:
        return worker.run()
    finally:
        if profiler is not None:
            profiler.stop()


if __name__ == "__main__":
    sys.exit(main())
