"""Writes a simulated run into the lab's run database (``crew.runtime.rundb``), same schema.

Rows are collected in memory and written in a few bulk inserts at the end: a 60-worker run
makes ~200k link samples, and one transaction per row would cost more than the simulation.
Times are ``epoch + simulated seconds``. Everything the dashboard reads is there: ``meta``
(with ``simulated = 1`` and the simulator's options), workers, links and their cuts, 1 Hz link
samples (bytes scaled back to wire bytes, ``/ goodput``, so a saturated link reads its
configured rate as in the lab), groups with plans, members, iterations, worker states, events.
Loss and accuracy are NULL: the simulator moves no model.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from crew.control import lifecycle as lc
from crew.control.grouping import WorkerState
from crew.runtime.coordinator import write_record
from crew.runtime.rundb import (
    EventRow,
    IterationRow,
    LinkRow,
    LinkSampleRow,
    LinkStateRow,
    RunDB,
    WorkerRow,
    WorkerStatusRow,
)

if TYPE_CHECKING:
    from crew.sim.engine import Fault, SimConfig, Simulation
    from crew.sim.topogen import SimTopology

DB_NAME = "lab.db"


def _plain(x: object) -> object:
    """JSON for the options' enums and dataclasses (the executor model)."""
    if isinstance(x, enum.Enum):
        return x.value
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.asdict(x)
    raise TypeError(f"not JSON: {x!r}")


class Recorder:
    def __init__(self, run_dir: str | Path, run_id: str | None = None, epoch: float | None = None):
        self.run_dir = Path(run_dir)
        self.run_id = run_id or self.run_dir.name
        self.epoch = time.time() if epoch is None else float(epoch)
        self.iterations: list[IterationRow] = []
        self.samples: list[LinkSampleRow] = []
        self.events: list[EventRow] = []
        self.link_state: list[LinkStateRow] = []
        self.dead: set[int] = set()

    def t(self, sim_t: float) -> float:
        return self.epoch + sim_t

    # ---- what the engine reports ----------------------------------------------------------

    def iteration(self, now: float, worker: int, iteration: int) -> None:
        self.iterations.append(IterationRow(self.t(now), worker, iteration, None, None))

    def event(self, now: float, kind: str, message: str, level: str = "info", worker=None) -> None:  # noqa: ANN001
        self.events.append(EventRow(self.t(now), level, kind, worker, message))

    def fault(self, now: float, f: Fault) -> None:
        from crew.sim.engine import FaultKind

        self.event(now, "command", f"scenario: {f.describe()}", "info", None)
        if f.kind is FaultKind.CUT_LINK:
            self.link_state.append(
                LinkStateRow(self.t(now), f.a, f.b, 0.0, False, "cut (simulated)")
            )

    def worker_dead(self, worker: int) -> None:
        self.dead.add(worker)

    def link_sample(self, now: float, sent: np.ndarray, last: np.ndarray, cfg: SimConfig) -> None:
        idx = np.flatnonzero(sent > 0)
        if not idx.size:
            return
        n = int(round(np.sqrt(sent.size)))
        wire = sent[idx] / cfg.goodput
        mbit = (sent[idx] - last[idx]) / cfg.goodput * 8 / 1e6 / cfg.sample_s
        src, dst = np.divmod(idx, n)
        t = self.t(now)
        self.samples.extend(
            LinkSampleRow(*row)
            for row in zip(
                [t] * idx.size,
                src.tolist(),
                dst.tolist(),
                np.round(wire).astype(np.int64).tolist(),
                mbit.tolist(),
                strict=True,
            )
        )

    # ---- writing ---------------------------------------------------------------------------

    def shift(self, rec: lc.Output) -> lc.Output:
        """A life-cycle record with its simulated times moved to ``epoch + t``."""
        rp = dataclasses.replace
        if isinstance(rec, lc.EventRecord | lc.IterationRecord):
            return rp(rec, t=self.t(rec.t))
        if isinstance(rec, lc.GroupOpenedRecord):
            g = rp(rec.group, formed_at=self.t(rec.group.formed_at))
            return rp(rec, group=g, started_at=self.t(rec.started_at))
        if isinstance(rec, lc.GroupUnplannedRecord):
            g = rp(rec.group, formed_at=self.t(rec.group.formed_at))
            return rp(rec, group=g, ended_at=self.t(rec.ended_at))
        if isinstance(rec, lc.GroupClosedRecord):
            return rp(rec, ended_at=self.t(rec.ended_at))
        if isinstance(rec, lc.WorkerStatusRecord):
            return rp(rec, t=self.t(rec.t))
        return rec

    def start(self, topo: SimTopology, cfg: SimConfig, faults: list[Fault]) -> None:
        """Nothing is written before the run ends; this only records what to write."""
        self._topo, self._cfg, self._faults = topo, cfg, faults

    def finish(self, sim: Simulation) -> Path:
        topo, cfg = sim.topo, sim.cfg
        path = self.run_dir / DB_NAME
        self.run_dir.mkdir(parents=True, exist_ok=True)
        db = RunDB(path)
        try:
            n = topo.n
            db.set_meta(
                {
                    "run_id": self.run_id,
                    "started_at": str(self.epoch),
                    "ended_at": str(self.t(sim.now)),
                    "scheme": cfg.scheme,
                    "p": str(cfg.p),
                    "n": str(n),
                    "topology_name": topo.name,
                    "topology": json.dumps(topo.to_dict()),
                    "simulated": "1",
                    "sim_options": json.dumps(
                        {k: v for k, v in cfg.__dict__.items() if k != "epoch"}
                        | {"faults": [f.describe() for f in sim.faults]},
                        default=_plain,
                    ),
                }
            )
            db.add_workers(
                WorkerRow(i, topo.names[i], topo.clouds[i], "simulated") for i in range(n)
            )
            db.add_links(
                LinkRow(i, j, float(topo.rate_mbit[i, j]), float(topo.delay_ms[i, j]))
                for i in range(n)
                for j in range(n)
                if i != j
            )
            db.add_link_states(self.link_state)
            db.add_link_samples(self.samples)
            db.add_iterations(self.iterations)
            # Groups, their members, the life cycle's events and worker states: the records
            # of the real life cycle, written by the coordinator's own code.
            for rec in sim.life.records:
                write_record(db, self.shift(rec))
            now = self.t(sim.now)
            db.set_worker_statuses(
                WorkerStatusRow(
                    w,
                    (WorkerState.DEAD if w in self.dead else WorkerState.TRAINING).value,
                    sim.iteration[w],
                    None,
                    now,
                )
                for w in range(n)
            )
            start_msg = (
                f"simulated run started: {n} workers, scheme {cfg.scheme}, p={cfg.p},"
                f" {cfg.duration_s:g} s simulated"
            )
            stop_msg = (
                f"simulated run ended: {sim.completed} groups completed,"
                f" {sim.abandoned} abandoned, {sim.revisions} revisions"
            )
            db.add_events(
                [
                    EventRow(self.epoch, "info", "start", None, start_msg),
                    *sorted(self.events, key=lambda e: e.t),
                    EventRow(now, "info", "stop", None, stop_msg),
                ]
            )
        finally:
            db.close()
        return path
