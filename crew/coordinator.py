"""The coordinator: forms groups from ready workers, plans them, and sees them through.

Runs in the lab's root namespace, reached by every worker over the unshaped management
network, and is the only writer of groups, iterations and worker states in the run database.

All decisions happen on one thread, the event loop, fed by a queue: the connection readers
only decode and enqueue. So group state needs no locks, and the order of events in the
database is the order in which they were decided.

A group's life::

    Ready x p ──► form (crew.grouping) ──► plan (crew.planner) ──► Assign rev 0 to every
    worker with a role ──► HaveAll from every member ──► Commit ──► completed

and when something breaks while it is open:

* a member dies: the survivors get a new revision, planned without it, and average among
  themselves; with no survivor left the group is abandoned;
* an aggregator that is no member dies, or a link the plan uses fails: a new revision is
  planned on what is left (the LP moves the blocks to backup aggregators);
* no revision completes within its deadline (a multiple of the predicted time, at least
  ``group_timeout_min_s``), or revisions run out: the group is abandoned, its members keep
  their own models and train on. Every outcome is recorded: no group is left hanging.

What the planner sees is ``self.bw``: the configured capacity matrix with failed links at 0
(retried after ``RETRY_LINK_S``, doubling), with measured rates instead of configured ones under
``capacity="measured"``, and, for each new group, minus what groups in flight still send
(``committed_capacity``). The lower bound recorded with each group uses the same matrix
without that last deduction.
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crew import planner
from crew import protocol as proto
from crew.config import RunConfig
from crew.frames import COORDINATOR, FrameCodec, FrameError, control_body, control_frame
from crew.grouping import Group, GroupFormer, GroupingError
from crew.rundb import RunDB
from crew.schemes import GROUP_SCHEMES, GroupPlan, plan_group, plan_group_nonblocking
from crew.transport import FrameStream
from crew.verify import CHECK_TOLERANCE, relative_error

log = logging.getLogger("crew.coordinator")

TICK_S = 0.25
MAX_REVISIONS = 8
DEADLINE_FACTOR = 10.0  # a revision may take this many times its predicted time
RETRY_LINK_S = 20.0  # a failed link is tried again after this, doubling on each failure
EWMA = 0.3  # weight of a new rate measurement
DRIFT = 0.25  # relative change of a link's estimate that makes the planner use it
REJECT_WINDOW_S = 5.0  # rejected frames: at most REJECT_EVENTS rows per worker, reason, window
REJECT_EVENTS = 50
TCP_GOODPUT = 0.95  # payload share of the frames HTB counts (DESIGN.md §4)


@dataclass
class OpenGroup:
    group: Group
    scheme: str
    rev: int
    members: tuple[int, ...]
    weights: tuple[float, ...]
    plan: GroupPlan
    participants: set[int]
    deadline: float
    have_all: set[int] = field(default_factory=set)
    result_projs: dict[int, float] = field(default_factory=dict)
    bytes_moved: int = 0  # what the plans of all its revisions put on the links
    prescatter: list[list[int]] = field(default_factory=list)  # rev 0 of a non-blocking group
    split_epoch: int = -1
    rev_started: float = 0.0


@dataclass(frozen=True)
class _Event:
    kind: str  # "msg" (a decoded message), "closed" (connection ended), "rejected" (bad frame)
    conn: int
    msg: proto.Message | None = None


class Coordinator:
    """One run's coordinator; ``run()`` serves until stopped (admin "stop", SIGTERM)."""

    def __init__(self, cfg: RunConfig, db: RunDB, host: str, port: int):
        self.cfg = cfg
        self.db = db
        self.codec = FrameCodec(cfg.secret(), cfg.run_num, max_payload=cfg.max_payload)
        self.former = GroupFormer(
            cfg.n, cfg.p, heartbeat_timeout=cfg.heartbeat_timeout_s, staleness=cfg.staleness
        )
        bw = np.array(cfg.bw_mbit, dtype=float)
        np.fill_diagonal(bw, np.inf)
        self.bw = bw
        self.scheme = cfg.scheme
        self.size_elems: int | None = None
        self.events: queue.Queue[_Event] = queue.Queue()
        self.streams: dict[int, FrameStream] = {}  # conn id -> stream
        self.worker_conn: dict[int, int] = {}  # worker -> conn id
        self.open: dict[int, OpenGroup] = {}
        self.offered_proj: dict[int, float] = {}  # worker -> projection of its offered vector
        # Benchmark mode: groups come from a fixed trace, one at a time, not from readiness.
        trace = cfg.extra.get("trace")
        self.trace: list[tuple[int, ...]] | None = (
            [tuple(int(m) for m in g) for g in trace] if trace is not None else None
        )
        self.trace_next = 0
        # Non-blocking mode: the a2a split ready workers scatter with before their group forms.
        self.split: planner.Plan | None = None
        self.split_epoch = -1
        self.ready_at: dict[int, tuple[float, int]] = {}  # worker -> (time, split epoch used)
        self.configured_bw = bw.copy()
        self.estimated_bw = bw.copy()  # online estimates, used with capacity="measured"
        self.failed_links: dict[tuple[int, int], tuple[float, int]] = {}  # -> (retry at, tries)
        # (worker, reason) -> [window start, seen, suppressed, peers of the suppressed]
        self.reject_windows: dict[tuple[int, str], list[Any]] = {}
        self.stop_event = threading.Event()
        self._next_conn = 0
        self._conn_lock = threading.Lock()
        self.listener = socket.create_server((host, port), reuse_port=False)
        self.port = self.listener.getsockname()[1]

    # -- network -----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        self.listener.settimeout(0.5)
        while not self.stop_event.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            sock.settimeout(None)
            with self._conn_lock:
                conn = self._next_conn
                self._next_conn += 1
                self.streams[conn] = FrameStream(sock, self.codec)
            threading.Thread(
                target=self._reader, args=(conn,), name=f"conn{conn}", daemon=True
            ).start()

    def _reader(self, conn: int) -> None:
        stream = self.streams[conn]
        while not self.stop_event.is_set():
            try:
                frame = stream.recv()
            except FrameError as exc:
                log.warning("connection %d: bad frame, closing: %s", conn, exc)
                self.events.put(_Event("rejected", conn, None))
                break
            except OSError:
                break
            try:
                msg = proto.decode(control_body(frame))
            except (FrameError, proto.ProtocolError) as exc:
                log.warning("connection %d: ignored message: %s", conn, exc)
                continue
            self.events.put(_Event("msg", conn, msg))
        self.events.put(_Event("closed", conn))

    def _send(self, worker: int, msg: proto.Message) -> None:
        conn = self.worker_conn.get(worker)
        stream = self.streams.get(conn) if conn is not None else None
        if stream is None:
            return
        try:
            stream.send(control_frame(COORDINATOR, self.cfg.run_num, msg.to_dict()))
        except OSError as exc:
            log.warning("send to worker %d failed: %s", worker, exc)

    # -- the event loop ----------------------------------------------------------------------

    def run(self) -> None:
        threading.Thread(target=self._accept_loop, name="accept", daemon=True).start()
        self.db.event("coordinator", f"coordinator listening on port {self.port}")
        while not self.stop_event.is_set():
            try:
                ev = self.events.get(timeout=TICK_S)
            except queue.Empty:
                ev = None
            now = time.time()
            if ev is not None:
                try:
                    self._handle(ev, now)
                except (GroupingError, planner.PlanError, proto.ProtocolError) as exc:
                    log.warning("event %s from connection %d refused: %s", ev.kind, ev.conn, exc)
                    self.db.event("warning", f"refused {ev.kind}: {exc}", level="warning")
            self._tick(now)
        self._shutdown("coordinator stopping")

    def _handle(self, ev: _Event, now: float) -> None:
        if ev.kind == "closed":
            self.streams.pop(ev.conn, None)
            for worker, conn in list(self.worker_conn.items()):
                if conn == ev.conn:
                    del self.worker_conn[worker]
                    self._worker_lost(worker, now, "control connection closed")
            return
        if ev.kind == "rejected":
            self.db.event(
                "security", f"connection {ev.conn} sent a frame that failed checks", level="warning"
            )
            return
        msg = ev.msg
        if isinstance(msg, proto.Admin):
            self._admin(msg, now)
            return
        worker = getattr(msg, "worker", None)
        if not isinstance(worker, int) or not 0 <= worker < self.cfg.n:
            raise proto.ProtocolError(f"worker: {worker!r} is not a worker of this run")
        if isinstance(msg, proto.Register):
            self._register(msg, ev.conn, now)
            return
        if self.worker_conn.get(worker) != ev.conn:
            raise proto.ProtocolError(f"worker {worker}: message on a connection it does not own")
        if isinstance(msg, proto.Heartbeat):
            self.former.heartbeat(worker, now)
        elif isinstance(msg, proto.Ready) and self.trace is not None:
            self.offered_proj[worker] = msg.proj  # benchmark: the fixed vector it offers
        elif isinstance(msg, proto.Ready):
            self.former.heartbeat(worker, now)
            self.offered_proj[worker] = msg.proj
            self.ready_at[worker] = (now, msg.split_epoch)
            self.db.set_worker_status(worker, "ready", iteration=msg.iteration)
            for group in self.former.ready(worker, msg.iteration, now):
                self._start_group(group, now)
        elif isinstance(msg, proto.Metrics):
            self.db.execute(
                "INSERT INTO iterations (t, worker, iteration, loss, accuracy) VALUES (?,?,?,?,?)",
                (msg.t, worker, msg.iteration, msg.loss, msg.accuracy),
            )
        elif isinstance(msg, proto.HaveAll):
            self._have_all(msg, now)
        elif isinstance(msg, proto.LinkFailed):
            self._link_failed(msg.src, msg.dst, msg.reason, now)
        elif isinstance(msg, proto.LinkRates):
            self._link_rates(msg, now)
        elif isinstance(msg, proto.Rejected):
            self._rejected(worker, msg, now)
        elif isinstance(msg, proto.OpTime):
            self._op_time(msg)
        else:
            raise proto.ProtocolError(f"type: {msg.TYPE!r} is not for the coordinator")

    def _register(self, msg: proto.Register, conn: int, now: float) -> None:
        if self.size_elems is None:
            self.size_elems = msg.vector_len
        elif msg.vector_len != self.size_elems:
            raise proto.ProtocolError(
                f"register.vector_len: {msg.vector_len} differs from the run's {self.size_elems}"
            )
        old = self.worker_conn.get(msg.worker)
        if old is not None and old != conn:
            self._worker_lost(msg.worker, now, "re-registered on a new connection")
        self.worker_conn[msg.worker] = conn
        self._forget_link_failures(msg.worker)
        self.former.join(msg.worker, now)
        self.db.set_worker_status(msg.worker, "training", iteration=msg.iteration, pid=msg.pid)
        self.db.event(
            "worker", f"worker {msg.worker} registered (pid {msg.pid})", worker=msg.worker
        )
        self._update_split()

    def _update_split(self) -> None:
        """Non-blocking mode: re-solve the a2a split when the workers or links change."""
        if not self.cfg.nonblocking or self.size_elems is None or self.trace is not None:
            return
        try:
            split = planner.solve_a2a(self.bw, self.size_elems * 4, active=self._alive())
        except planner.PlanError as exc:
            log.warning("no a2a split (%s): groups will not pre-scatter", exc)
            split = None
        self.split = split
        self.split_epoch += 1
        segments = [] if split is None else [[s.worker, s.start, s.stop] for s in split.segments]
        for w in list(self.worker_conn):
            self._send(
                w, proto.Split(self.split_epoch, segments, self.cfg.part_elems_for(self.size_elems))
            )

    # -- groups ------------------------------------------------------------------------------

    def _alive(self) -> list[int]:
        return sorted(w for w in self.former.alive() if w in self.worker_conn)

    def _planning_bw(self, now: float) -> np.ndarray:
        """Capacity as a new group will find it: minus what groups in flight still send.

        Each open group is assumed to be ``elapsed / predicted`` done, so the bytes its plan
        still puts on each link are committed over the longest remaining predicted time
        (``planner.residual_capacity``). A heuristic, not a bound: the lower bound is always
        computed on the full matrix."""
        if not self.cfg.committed_capacity or not self.open:
            return self.bw
        committed = np.zeros_like(self.bw)
        horizon = 0.0
        for og in self.open.values():
            predicted = max(og.plan.predicted_s, 1e-3)
            left = max(0.0, 1.0 - (now - og.rev_started) / predicted)
            committed += og.plan.link_bytes() * left
            horizon = max(horizon, predicted * left)
        if horizon <= 0.0:
            return self.bw
        return planner.residual_capacity(self.bw, committed, horizon)

    def _plan(
        self, members: tuple[int, ...], scheme: str, now: float | None = None
    ) -> tuple[GroupPlan, float]:
        assert self.size_elems is not None
        size = self.size_elems * 4
        active = self._alive()
        bw = self._planning_bw(time.time() if now is None else now)
        plan = plan_group(scheme, bw, members, size, active=active, seed=self.cfg.seed)
        bound = planner.lower_bound(self.bw, members, size, active=active)
        return plan, bound

    def _plan_nonblocking(
        self, members: tuple[int, ...], now: float
    ) -> tuple[GroupPlan, float] | None:
        """Re-solve with what the members have presumably sent already (DESIGN.md §2).

        The coordinator does not see the bytes; it estimates them from the time since each
        member became ready and the link's rate. The estimate only steers the split: which
        parts are really reused is decided from the plan alone (``crew.reduce.covered_parts``).
        """
        if (
            not self.cfg.nonblocking
            or self.split is None
            or self.trace is not None
            or self.scheme not in ("crew", "crew-paper")
        ):
            return None
        if any(self.ready_at.get(m, (0.0, -1))[1] != self.split_epoch for m in members):
            return None  # someone scattered with an older split: plan normally
        assert self.size_elems is not None
        size = self.size_elems * 4
        a2a_bytes = np.array(self.split.elems, dtype=float) * 4
        sent = np.zeros_like(self.bw)
        for g in members:
            elapsed = max(0.0, now - self.ready_at[g][0])
            rate = np.where(np.isfinite(self.bw[g]), self.bw[g], 0.0) * 1e6 / 8
            sent[g] = np.minimum(a2a_bytes, elapsed * rate)
        active = self._alive()
        plan = plan_group_nonblocking(
            self.scheme, self.bw, members, size, sent, self.split, active=active
        )
        return plan, planner.lower_bound(self.bw, members, size, active=active)

    def _start_group(self, group: Group, now: float) -> None:
        try:
            nonblocking = self._plan_nonblocking(group.members, now)
            plan, bound = nonblocking or self._plan(group.members, self.scheme, now)
        except planner.PlanError as exc:
            self.db.execute(
                "INSERT INTO groups (id, scheme, members, weights, formed_at, status, reason,"
                " ended_at) VALUES (?,?,?,?,?, 'abandoned', ?, ?)",
                (
                    group.id,
                    self.scheme,
                    json.dumps(group.members),
                    json.dumps(group.weights),
                    group.formed_at,
                    f"no plan: {exc}",
                    now,
                ),
            )
            if self.trace is None:
                self.former.abandon(group.id, now)
            for m in group.members:
                self._send(m, proto.Abandon(group.id, f"no plan: {exc}", list(group.members)))
            return
        og = OpenGroup(
            group=group,
            scheme=self.scheme,
            rev=0,
            members=group.members,
            weights=group.weights,
            plan=plan,
            participants=set(),
            deadline=0.0,
        )
        if nonblocking is not None:
            assert self.split is not None
            og.prescatter = [[s.worker, s.start, s.stop] for s in self.split.segments]
            og.split_epoch = self.split_epoch
        self.open[group.id] = og
        self.db.execute(
            "INSERT INTO groups (id, scheme, members, weights, formed_at, started_at, status,"
            " predicted_s, bound_s, plan) VALUES (?,?,?,?,?,?, 'open', ?,?,?)",
            (
                group.id,
                self.scheme,
                json.dumps(group.members),
                json.dumps(group.weights),
                group.formed_at,
                now,
                plan.predicted_s,
                bound,
                plan.to_json(),
            ),
        )
        self.db.executemany(
            "INSERT INTO group_members (group_id, worker, iteration, staleness, weight)"
            " VALUES (?,?,?,?,?)",
            [
                (group.id, m, it, max(group.iterations) - it + 1, w)
                for m, it, w in zip(group.members, group.iterations, group.weights, strict=True)
            ],
        )
        for m in group.members:
            self.db.set_worker_status(m, "reducing", group_id=group.id)
        self._assign(og, now)

    def _assign(self, og: OpenGroup, now: float) -> None:
        assert self.size_elems is not None
        msg = proto.Assign(
            group=og.group.id,
            rev=og.rev,
            scheme=og.scheme,
            members=list(og.members),
            weights=list(og.weights),
            routes=[r.to_list() for r in og.plan.routes],
            pipelined=og.plan.pipelined,
            total=self.size_elems,
            part_elems=self.cfg.part_elems_for(self.size_elems),
            prescatter=og.prescatter if og.rev == 0 else [],
            iterations=[og.group.iterations[og.group.members.index(m)] for m in og.members],
            split_epoch=og.split_epoch,
        )
        og.participants = og.plan.participants()
        og.bytes_moved += int(og.plan.link_bytes().sum())
        og.rev_started = now
        og.have_all = set()
        og.result_projs = {}
        og.deadline = now + max(self.cfg.group_timeout_min_s, DEADLINE_FACTOR * og.plan.predicted_s)
        for w in sorted(og.participants):
            self._send(w, msg)

    def _have_all(self, msg: proto.HaveAll, now: float) -> None:
        og = self.open.get(msg.group)
        if og is None or msg.rev != og.rev or msg.worker not in og.members:
            return  # a late report from a superseded revision
        og.have_all.add(msg.worker)
        og.result_projs[msg.worker] = msg.proj
        if og.have_all >= set(og.members):
            self._finish(og, now, committed=True, reason="")

    def _finish(self, og: OpenGroup, now: float, *, committed: bool, reason: str) -> None:
        gid = og.group.id
        del self.open[gid]
        for w in sorted(og.participants | set(og.group.members)):
            self._send(
                w, proto.Commit(gid, og.rev) if committed else proto.Abandon(gid, reason, [])
            )
        if self.trace is None:
            if committed:
                self.former.complete(gid, now)
            else:
                self.former.abandon(gid, now)
        err = None
        if committed:
            err = relative_error(
                [og.result_projs[m] for m in og.members],
                og.weights,
                [self.offered_proj.get(m, float("nan")) for m in og.members],
            )
            if not err <= CHECK_TOLERANCE:  # also catches NaN
                self.db.event(
                    "error",
                    f"group {gid} result check failed: relative error {err}",
                    level="error",
                    data={"group": gid},
                )
        self.db.execute(
            "UPDATE groups SET ended_at=?, status=?, bytes=?, reason=?, members=?, weights=?,"
            " plan=?, revisions=?, verify_err=? WHERE id=?",
            (
                now,
                "completed" if committed else "abandoned",
                og.bytes_moved,
                reason or None,
                json.dumps(og.members),
                json.dumps(og.weights),
                og.plan.to_json(),
                og.rev,
                err,
                gid,
            ),
        )
        if set(og.members) != set(og.group.members):
            dropped = sorted(set(og.group.members) - set(og.members))
            self.db.execute(
                f"DELETE FROM group_members WHERE group_id=? AND worker IN"
                f" ({','.join('?' * len(dropped))})",
                (gid, *dropped),
            )
        for m in og.group.members:
            if m in self.worker_conn:
                self.db.set_worker_status(m, "training", group_id=None)
        if not committed:
            self.db.event(
                "group",
                f"group {gid} abandoned: {reason}",
                level="warning",
                data={"group": gid, "members": list(og.members)},
            )

    def _revise(self, og: OpenGroup, now: float, why: str) -> None:
        if og.rev + 1 >= MAX_REVISIONS:
            self._finish(og, now, committed=False, reason=f"too many revisions ({why})")
            return
        try:
            plan, _ = self._plan(og.members, og.scheme)
        except planner.PlanError as exc:
            self._finish(og, now, committed=False, reason=f"no plan after {why}: {exc}")
            return
        og.rev += 1
        og.plan = plan
        self.db.event(
            "recovery",
            f"group {og.group.id} revision {og.rev}: {why}",
            data={"group": og.group.id, "rev": og.rev},
        )
        self._assign(og, now)

    def _worker_lost(self, worker: int, now: float, why: str) -> None:
        self.former.mark_dead(worker, now)
        self.db.set_worker_status(worker, "dead")
        self.db.event("fault", f"worker {worker} lost: {why}", level="warning", worker=worker)
        self._update_split()
        for og in list(self.open.values()):
            if worker in og.members:
                survivors = tuple(m for m in og.members if m != worker)
                if not survivors:
                    self._finish(og, now, committed=False, reason=f"worker {worker} lost")
                    continue
                if self.trace is None:
                    shrunk = self.former.drop_member(og.group.id, worker)
                    og.members, og.weights = shrunk.members, shrunk.weights
                else:
                    og.members = survivors
                    og.weights = tuple(1.0 / len(survivors) for _ in survivors)
                self._revise(og, now, f"member {worker} lost")
            elif worker in og.participants:
                self._revise(og, now, f"aggregator {worker} lost")

    def _link_failed(self, src: int, dst: int, reason: str, now: float) -> None:
        if self.bw[src, dst] > 0:
            # Retry the link later, backing off: a failure may be transient, and with TCP a
            # one-way cut also fails the reverse direction (its ACKs are lost), which
            # nobody would ever report repaired.
            tries = self.failed_links.get((src, dst), (0.0, 0))[1] + 1
            self.failed_links[(src, dst)] = (now + RETRY_LINK_S * 2 ** (tries - 1), tries)
            self.bw[src, dst] = 0.0
            self.db.event(
                "fault",
                f"link {src}->{dst} failed: {reason}",
                level="warning",
                data={"src": src, "dst": dst},
            )
            self._update_split()
        for og in list(self.open.values()):
            if og.plan.uses(src, dst):
                phase = og.plan.phase_of(src, dst)
                self._revise(og, now, f"link {src}->{dst} failed during {phase}")

    def _link_rates(self, msg: proto.LinkRates, now: float) -> None:
        """Fold measured arrival rates into the estimates; re-plan on drift ("measured" mode).

        A link's estimate is an exponential average of its bursts' rates, scaled up by the
        TCP/IP overhead so it is comparable to the configured (frame-level) rate. When it
        differs from what the planner uses by more than DRIFT, the planner switches to it."""
        dst = msg.worker
        for src_f, nbytes, seconds in msg.samples:
            src = int(src_f)
            if not 0 <= src < self.cfg.n or src == dst or seconds <= 0 or nbytes <= 0:
                continue
            mbit = nbytes * 8 / seconds / 1e6 / TCP_GOODPUT
            old = self.estimated_bw[src, dst]
            self.estimated_bw[src, dst] = est = (1 - EWMA) * old + EWMA * mbit
            planned = self.bw[src, dst]
            if self.cfg.capacity != "measured" or planned <= 0:
                continue  # a failed link waits for its retry, whatever it measured
            if abs(est - planned) > DRIFT * planned:
                self.bw[src, dst] = est
                self.db.event(
                    "capacity",
                    f"link {src}->{dst} measured {est:.1f} Mbit/s, "
                    f"planned {planned:.1f}: re-planning with the measurement",
                    data={"src": src, "dst": dst, "mbit": est, "was": planned},
                )
                self._update_split()

    def _forget_link_failures(self, worker: int) -> None:
        """A (re)started worker is a new process: failures of links to or from its predecessor
        (peers' connections to it were reset when it died) say nothing about its links."""
        for src, dst in list(self.failed_links):
            if worker in (src, dst):
                del self.failed_links[(src, dst)]
                self.bw[src, dst] = self.configured_bw[src, dst]
                self.estimated_bw[src, dst] = self.configured_bw[src, dst]

    def _retry_links(self, now: float) -> None:
        retried = [
            link
            for link, (at, _) in self.failed_links.items()
            if at <= now and self.bw[link] == 0.0
        ]
        for src, dst in retried:
            self.bw[src, dst] = self.configured_bw[src, dst]
            self.estimated_bw[src, dst] = self.configured_bw[src, dst]
            self.db.event(
                "recovery",
                f"retrying link {src}->{dst} in new plans",
                data={"src": src, "dst": dst},
            )
        if retried:
            self._update_split()

    def _rejected(self, worker: int, msg: proto.Rejected, now: float) -> None:
        """One event per rejected frame, up to REJECT_EVENTS per worker and reason in each
        REJECT_WINDOW_S; beyond that they are counted and written as one summary, so a flood
        of bad connections cannot become a flood of rows."""
        key = (worker, msg.reason)
        window = self.reject_windows.get(key)
        if window is None or now - window[0] >= REJECT_WINDOW_S:
            self._flush_rejections(key)
            window = self.reject_windows[key] = [now, 0, 0, set()]
        window[1] += 1
        if window[1] <= REJECT_EVENTS:
            self._security_event(worker, msg.reason, 1, [msg.peer])
        else:
            window[2] += 1
            window[3].add(msg.peer)

    def _flush_rejections(self, key: tuple[int, str] | None = None) -> None:
        """Write the summaries of suppressed rejections (of one key, or all)."""
        for k in [key] if key is not None else list(self.reject_windows):
            window = self.reject_windows.pop(k, None)
            if window is not None and window[2]:
                self._security_event(k[0], k[1], window[2], sorted(window[3]))

    def _security_event(self, worker: int, reason: str, count: int, peers: list[str]) -> None:
        self.db.event(
            "security",
            f"worker {worker} rejected {count} frame(s) ({reason}) from {', '.join(peers)}",
            level="warning",
            worker=worker,
            data={"reason": reason, "count": count, "peers": peers},
        )

    def _tick(self, now: float) -> None:
        for key, window in list(self.reject_windows.items()):
            if now - window[0] >= REJECT_WINDOW_S:
                self._flush_rejections(key)
        self._retry_links(now)
        for worker in self.former.expire(now):
            if worker in self.worker_conn:
                self._worker_lost(worker, now, "no heartbeat")
        for og in list(self.open.values()):
            if now > og.deadline:
                self._revise(og, now, f"revision {og.rev} missed its deadline")
        if self.trace is not None:
            self._next_trace_group(now)
            return
        # The isolation guard may hold a group back for a while; only a later call forms it.
        for group in self.former.form(now):
            self._start_group(group, now)

    def _next_trace_group(self, now: float) -> None:
        """Benchmark mode: start the next group of the trace once the previous one ended."""
        assert self.trace is not None
        if self.open or self.trace_next >= len(self.trace):
            return
        if len(self.offered_proj) < self.cfg.n:
            return  # not every worker has registered and offered its vector yet
        members = self.trace[self.trace_next]
        self.trace_next += 1
        weights = tuple(1.0 / len(members) for _ in members)
        group = Group(
            id=self.trace_next,
            members=members,
            iterations=(0,) * len(members),
            weights=weights,
            formed_at=now,
        )
        self._start_group(group, now)
        if self.trace_next == len(self.trace):
            self.db.set_meta({"trace_started_all": "1"})

    def _op_time(self, msg: proto.OpTime) -> None:
        """An all-reduce among all workers (Gloo): recorded as a group of everyone."""
        members = list(range(self.cfg.n))
        self.db.execute(
            "INSERT INTO groups (scheme, members, weights, formed_at, started_at, ended_at,"
            " status, bytes) VALUES (?,?,?,?,?,?, 'completed', ?)",
            (
                self.scheme,
                json.dumps(members),
                json.dumps([1 / self.cfg.n] * self.cfg.n),
                msg.started,
                msg.started,
                msg.ended,
                2 * (self.cfg.n - 1) * msg.nbytes,
            ),
        )  # Gloo's ring all-reduce: each of n ranks sends 2(n-1)/n of the vector

    # -- the lab's requests ------------------------------------------------------------------

    def _admin(self, msg: proto.Admin, now: float) -> None:
        args: dict[str, Any] = msg.args
        if msg.op == "set_p":
            self.former.set_p(int(args["p"]))
            self.db.set_meta({"p": str(int(args["p"]))})
            for group in self.former.form(now):
                self._start_group(group, now)
        elif msg.op == "set_scheme":
            scheme = str(args["scheme"])
            if scheme not in GROUP_SCHEMES:
                raise proto.ProtocolError(f"admin.args.scheme: unknown {scheme!r}")
            self.scheme = scheme
            self.db.set_meta({"scheme": scheme})
        elif msg.op == "set_link":
            src, dst, rate = int(args["src"]), int(args["dst"]), float(args["rate_mbit"])
            self.bw[src, dst] = self.configured_bw[src, dst] = max(rate, 0.0)
            self.estimated_bw[src, dst] = max(rate, 0.0)
            self.failed_links.pop((src, dst), None)
            self._update_split()
        elif msg.op == "slow_worker":
            self._send(int(args["worker"]), proto.SetSlowdown(float(args["factor"])))
        elif msg.op == "stop":
            self.stop_event.set()
        else:
            raise proto.ProtocolError(f"admin.op: unknown {msg.op!r}")

    def _shutdown(self, reason: str) -> None:
        now = time.time()
        self._flush_rejections()
        for og in list(self.open.values()):
            self._finish(og, now, committed=False, reason="run stopped")
        for w in list(self.worker_conn):
            self._send(w, proto.Stop(reason))
        self.listener.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crew.coordinator",
        description="The CREW coordinator: forms partial-reduce groups and plans them."
        " Started by the lab in the root namespace.",
    )
    parser.add_argument("--config", required=True, help="the run's config.json")
    parser.add_argument("--db", required=True, help="the run database (SQLite)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s coord %(levelname)s %(name)s: %(message)s"
    )
    cfg = RunConfig.load(args.config)
    db = RunDB(args.db)
    coord = Coordinator(cfg, db, cfg.coordinator_host, cfg.coordinator_port)
    signal.signal(signal.SIGTERM, lambda *_: coord.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: coord.stop_event.set())
    coord.run()
    db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
