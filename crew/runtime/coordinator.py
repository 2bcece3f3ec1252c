"""The coordinator: the socket shell around the group life cycle (``crew.control.lifecycle``).

Runs in the lab's root namespace, reached by every worker over the unshaped management
network, and is the only writer of groups, iterations and worker states in the run database.

All decisions are made by one :class:`~crew.control.lifecycle.GroupLifecycle` on one thread, the
event loop, fed by a queue: the connection readers only decode and enqueue. So group state needs no
locks, and the order of events in the database is the order in which they were decided. This module
only turns frames into events, sends the life cycle's messages and writes its records
(docs/architecture.md §2 "Layers")."""

from __future__ import annotations

import argparse
import logging
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from crew.config import RunConfig, Scheme
from crew.control import lifecycle as lc
from crew.control.former import former_for
from crew.control.throttle import Throttle
from crew.plan.candidates import planner_over
from crew.plan.schemes import GROUP_SCHEMES, GroupPlanner
from crew.runtime.planahead import PLAN_COSTS_META, AheadPlanner, CostRecord, costs_json
from crew.runtime.rundb import GroupMemberRow, GroupStatus, IterationRow, RunDB, UtilisationRow
from crew.runtime.stopsignals import call_on_signals
from crew.train.compress import Codec, reduce_tolerance
from crew.wire import protocol as proto
from crew.wire.frames import COORDINATOR, FrameCodec, FrameError, control_body, control_frame
from crew.wire.listener import Address, accept_loop
from crew.wire.outbox import FLUSH_TIMEOUT_S, Outbox
from crew.wire.session import Peer, accept_session
from crew.wire.transport import FrameStream, ImpersonationError

log = logging.getLogger("crew.runtime.coordinator")

TICK_S = 0.25
HANDSHAKE_S = 10.0  # a connection's HELLO and CHALLENGE, whole (crew.wire.session)
ADMIN_KEY = 1  # the index in Coordinator.keys of the lab's admin key


@dataclass(frozen=True)
class _Event:
    kind: str  # "msg" (a decoded message), "closed" (connection ended), "rejected" (bad frame)
    conn: int
    msg: proto.Message | None = None


def write_record(db: RunDB, rec: lc.Output) -> None:
    """Write one of the life cycle's records to the run database (SendTo/StopRequested: no)."""
    if isinstance(rec, lc.EventRecord):
        db.event(
            rec.kind,
            rec.message,
            level=rec.level.value,
            worker=rec.worker,
            data=None if rec.data is None else dict(rec.data),
            t=rec.t,
        )
    elif isinstance(rec, lc.WorkerStatusRecord):
        db.set_worker_status(
            rec.worker,
            rec.state.value,
            iteration=rec.iteration,
            group_id=rec.group_id,
            pid=rec.pid,
            t=rec.t,
        )
    elif isinstance(rec, lc.GroupOpenedRecord):
        g = rec.group
        db.open_group(
            g.id,
            scheme=rec.scheme,
            members=g.members,
            weights=g.weights,
            formed_at=g.formed_at,
            started_at=rec.started_at,
            predicted_s=rec.predicted_s,
            bound_s=rec.bound_s,
            plan_json=rec.plan_json,
            member_rows=[
                GroupMemberRow(g.id, m, it, max(g.iterations) - it + 1, w)
                for m, it, w in zip(g.members, g.iterations, g.weights, strict=True)
            ],
            formed_by=None if g.formed_by is None else g.formed_by.value,
        )
    elif isinstance(rec, lc.GroupUnplannedRecord):
        g = rec.group
        db.add_closed_group(
            group_id=g.id,
            scheme=rec.scheme,
            members=g.members,
            weights=g.weights,
            formed_at=g.formed_at,
            started_at=None,
            ended_at=rec.ended_at,
            status=GroupStatus.ABANDONED,
            reason=rec.reason,
        )
    elif isinstance(rec, lc.GroupClosedRecord):
        db.close_group(
            rec.group_id,
            ended_at=rec.ended_at,
            status=GroupStatus(rec.outcome.value),
            bytes_moved=rec.bytes_moved,
            reason=rec.reason or None,
            members=rec.members,
            weights=rec.weights,
            plan_json=rec.plan_json,
            revisions=rec.revisions,
            verify_err=rec.verify_err,
            dropped=rec.dropped,
        )
    elif isinstance(rec, lc.MetaRecord):
        db.set_meta(dict(rec.values))
    elif isinstance(rec, lc.IterationRecord):
        db.add_iterations([IterationRow(rec.t, rec.worker, rec.iteration, rec.loss, rec.accuracy)])
    elif isinstance(rec, lc.UtilisationRecord):
        s = rec.split
        db.add_utilisation(
            [
                UtilisationRow(
                    rec.t, rec.worker, s.compute_s, s.ready_s, s.group_s, s.stalled_s, rec.wan_bytes
                )
            ]
        )
    elif isinstance(rec, lc.AllReduceRecord):
        db.add_closed_group(
            group_id=None,
            scheme=rec.scheme,
            members=list(range(rec.n)),
            weights=[1 / rec.n] * rec.n,
            formed_at=rec.started,
            started_at=rec.started,
            ended_at=rec.ended,
            status=GroupStatus.COMPLETED,
            bytes_moved=rec.bytes_moved,
        )


RESTART_REASON = "coordinator restarted"


def resume_from_db(db: RunDB, life: lc.GroupLifecycle, now: float) -> int:
    """A coordinator started on a run database that already has groups: it restarts a run.

    The groups open at the crash are abandoned explicitly (``RESTART_REASON``): their members
    abandon them too when they reconnect (``crew.control.worker_control``), keeping their own
    models, so no update is lost. New groups take ids after the recorded ones. Workers, their
    readiness and the link states come back as the workers re-register and report. Returns how many
    groups were abandoned."""
    last = db.query("SELECT MAX(id) AS m FROM groups")[0]["m"]
    if last is None:
        return 0
    life.former.continue_ids_after(int(last))
    # What the lab changed at run time: p, the scheme, link rates (cuts: the probes tell).
    meta = {r["key"]: r["value"] for r in db.query("SELECT key, value FROM meta")}
    if "p" in meta:
        life.former.set_p(int(meta["p"]))
    if meta.get("scheme") in GROUP_SCHEMES:
        life.scheme = Scheme(meta["scheme"])
    for r in db.query(
        "SELECT src, dst, rate_mbit FROM link_state WHERE id IN"
        " (SELECT MAX(id) FROM link_state GROUP BY src, dst)"
    ):
        if 0 <= r["src"] < life.cfg.n and 0 <= r["dst"] < life.cfg.n and r["src"] != r["dst"]:
            life.capacity.set_link(int(r["src"]), int(r["dst"]), float(r["rate_mbit"]))
    open_ids = db.abandon_open_groups(ended_at=now, reason=RESTART_REASON)
    db.event(
        "recovery",
        f"coordinator restarted: {len(open_ids)} open group(s) abandoned, ids go on after {last}",
        data={"abandoned": open_ids},
        t=now,
    )
    return len(open_ids)


class Coordinator:
    """One run's coordinator; ``run()`` serves until stopped (admin "stop", SIGTERM)."""

    def __init__(
        self,
        cfg: RunConfig,
        db: RunDB,
        host: str,
        port: int,
        *,
        secret: bytes | None = None,
        admin_secret: bytes | None = None,
    ):
        self.cfg = cfg
        self.db = db
        key = cfg.secret() if secret is None else secret
        self.codec = FrameCodec(key, cfg.run_num, max_payload=cfg.max_payload, encrypt=cfg.encrypt)
        # A connection's identity is the key its HELLO was made with: the run's (a worker) or
        # the lab's admin key (the lab), which no worker holds. Without one, nobody may Admin.
        self.keys = [self.codec]
        if admin_secret is not None:
            self.keys.append(FrameCodec(admin_secret, cfg.run_num, encrypt=cfg.encrypt))
        self.peers: dict[int, Peer] = {}  # conn id -> who opened it
        # Plans the life cycle announces ahead (a bench trace's next group) are made on a
        # background thread while the current group runs (crew.runtime.planahead), unless
        # cfg.plan_ahead is off; either way it records what each plan cost the event loop. One
        # GroupPlanner for the run: a group planned again, or on moved rates, reuses its work.
        # With cfg.helpers, each group is planned over its members and its best-connected
        # others only (crew.plan.candidates).
        self.ahead = AheadPlanner(planner_over(GroupPlanner(), cfg.helpers))
        # Groups from readiness, or a bench run's fixed trace (cfg.extra["trace"]).
        codec = Codec(cfg.compress)
        self.life = lc.GroupLifecycle(
            cfg,
            former=former_for(cfg),
            plan=self.ahead,
            codec_tolerance=None if codec is Codec.NONE else partial(reduce_tolerance, codec),
        )
        self.plan_costs = CostRecord()  # group id -> its first plan's cost, newest groups
        self.events: queue.Queue[_Event] = queue.Queue()
        self.streams: dict[int, FrameStream] = {}  # conn id -> stream
        # conn id -> its outbox: the loop only enqueues, a peer that stops reading never
        # holds it up (crew.wire.outbox)
        self.outboxes: dict[int, Outbox] = {}
        self.worker_conn: dict[int, int] = {}  # worker -> conn id
        self.stop_event = threading.Event()
        self.errors = Throttle()
        self._next_conn = 0
        self._conn_lock = threading.Lock()
        self.listener = socket.create_server((host, port), reuse_port=False)
        self.port = self.listener.getsockname()[1]
        resume_from_db(db, self.life, time.time())

    # -- network -----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        accept_loop(self.listener, self.stop_event.is_set, self._accepted, name="coordinator")

    def _accepted(self, sock: socket.socket, _addr: Address) -> None:
        with self._conn_lock:
            conn = self._next_conn
            self._next_conn += 1
            stream = self.streams[conn] = FrameStream(sock, self.codec)
            self.outboxes[conn] = Outbox(stream, f"connection {conn}")
        threading.Thread(target=self._reader, args=(conn,), name=f"conn{conn}", daemon=True).start()

    def _known(self, sender: int, key: int) -> bool:
        """Whether ``sender`` may open a connection under key ``key`` (see ``self.keys``)."""
        return sender == COORDINATOR if key == ADMIN_KEY else 0 <= sender < self.cfg.n

    def _reader(self, conn: int) -> None:
        stream = self.streams[conn]
        try:
            peer = accept_session(stream, COORDINATOR, HANDSHAKE_S, self.keys, self._known)
        except FrameError as exc:
            log.warning("connection %d: refused at its handshake: %s", conn, exc)
            self.events.put(_Event("rejected", conn, None))
            self.events.put(_Event("closed", conn))
            return
        except OSError:
            self.events.put(_Event("closed", conn))
            return
        self.peers[conn] = peer
        while not self.stop_event.is_set():
            try:
                frame = stream.recv()
                if frame.sender != peer.id:
                    raise ImpersonationError(
                        f"frame claims sender {frame.sender} on {peer.id}'s connection"
                    )
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
        outbox = self.outboxes.get(conn) if conn is not None else None
        if outbox is not None:
            frame = control_frame(COORDINATOR, self.cfg.run_num, msg.to_dict())
            if (
                not outbox.put(frame)
                and outbox.overflowed
                and self.errors.due("outbox", time.time())
            ):
                self.db.event(
                    "security",
                    f"worker {worker} stopped reading its messages; its connection was dropped",
                    level="warning",
                    worker=worker,
                )

    def _apply(self, outputs: list[lc.Output]) -> None:
        # Messages first: a group's Assign must not wait for its rows (several SQLite
        # transactions, which also wait for the lab's own writer). The next event is handled
        # only after every record is written, so the database never lags the life cycle.
        for out in outputs:
            if isinstance(out, lc.SendTo):
                self._send(out.worker, out.msg)
        costs = self.ahead.drain()
        for out in outputs:
            if isinstance(out, lc.GroupOpenedRecord):
                cost = next((c for c in costs if c.members == out.group.members), None)
                if cost is not None:
                    self.plan_costs.add(out.group.id, cost)
            elif isinstance(out, lc.PlanAhead) and self.cfg.plan_ahead:
                self.ahead.submit(out.call)
        for out in outputs:
            if isinstance(out, lc.StopRequested):
                self.stop_event.set()
            elif not isinstance(out, lc.SendTo | lc.PlanAhead):
                write_record(self.db, out)

    # -- the event loop ----------------------------------------------------------------------

    def run(self) -> None:
        threading.Thread(target=self._accept_loop, name="accept", daemon=True).start()
        self.db.event("coordinator", f"coordinator listening on port {self.port}")
        try:
            while not self.stop_event.is_set():
                try:
                    ev = self.events.get(timeout=TICK_S)
                except queue.Empty:
                    ev = None
                now = time.time()
                if ev is not None:
                    self._guarded(f"event {ev.kind}", now, self._handle, ev, now)
                self._guarded("tick", now, self._tick, now)
            self._apply(self.life.shutdown(time.time(), "coordinator stopping"))
            self.ahead.close()
            self.db.set_meta({PLAN_COSTS_META: costs_json(self.plan_costs.costs)})
        finally:
            # However the loop ended, the workers must see it: with the listener and every
            # control connection closed, they stop (or raise CoordinatorLost) instead of
            # waiting for a coordinator that no longer answers.
            self.stop_event.set()
            self.listener.close()
            for outbox in list(self.outboxes.values()):  # the Stop messages go out first
                outbox.flush()
                outbox.close(wait_s=FLUSH_TIMEOUT_S)
            for stream in list(self.streams.values()):
                stream.close()

    def _tick(self, now: float) -> None:
        self._apply(self.life.tick(now))

    def _guarded(self, what: str, now: float, step: Callable[..., None], *args: object) -> None:
        """Run one step of the loop; an error no check foresaw is recorded and the loop goes
        on, so that no message, however malformed, stops the coordinator."""
        try:
            step(*args)
        except Exception as exc:
            log.exception("coordinator: %s failed", what)
            if self.errors.due(f"{what} {type(exc).__name__}", now):
                try:
                    self.db.event("error", f"{what} failed: {exc!r}", level="error", t=now)
                except Exception:
                    log.exception("coordinator: recording the failure failed too")

    def _handle(self, ev: _Event, now: float) -> None:
        if ev.kind == "closed":
            stream = self.streams.pop(ev.conn, None)
            self.peers.pop(ev.conn, None)
            outbox = self.outboxes.pop(ev.conn, None)
            if outbox is not None:
                outbox.close()
            if stream is not None:
                stream.shutdown()  # its reader has ended; the outbox's sender gets an error
            for worker, conn in list(self.worker_conn.items()):
                if conn == ev.conn:
                    del self.worker_conn[worker]
                    self._apply(
                        self.life.handle(
                            lc.WorkerDisconnected(worker, "control connection closed"), now
                        )
                    )
            return
        if ev.kind == "rejected":
            if self.errors.due("rejected frame", now):  # a flood of bad frames: one row per 10 s
                self.db.event(
                    "security",
                    f"connection {ev.conn} sent a frame that failed checks",
                    level="warning",
                )
            return
        msg = ev.msg
        assert msg is not None
        peer = self.peers.get(ev.conn)
        if isinstance(msg, proto.Admin) and (peer is None or peer.key != ADMIN_KEY):
            if self.errors.due("admin refused", now):
                who = "an unknown peer" if peer is None else f"worker {peer.id}"
                self.db.event(
                    "security",
                    f"Admin {msg.op!r} from {who} refused: only the lab administers a run",
                    level="warning",
                    t=now,
                )
            return
        claimed = getattr(msg, "worker", None)
        if peer is not None and peer.key != ADMIN_KEY and claimed not in (None, peer.id):
            if self.errors.due("impersonation", now):
                self.db.event(
                    "security",
                    f"worker {peer.id} sent a message in worker {claimed}'s name; refused",
                    level="warning",
                    t=now,
                )
            return
        worker = getattr(msg, "worker", None)
        if not isinstance(worker, int) or not 0 <= worker < self.cfg.n:
            self._apply(self.life.handle(msg, now))  # refused there, or an Admin request
            return
        if not isinstance(msg, proto.Register):
            if self.worker_conn.get(worker) != ev.conn:
                exc = proto.ProtocolError(
                    f"worker {worker}: message on a connection it does not own"
                )
                log.warning("event msg from connection %d refused: %s", ev.conn, exc)
                self.db.event("warning", f"refused msg: {exc}", level="warning", t=now)
                return
            self._apply(self.life.handle(msg, now))
            return
        old = self.worker_conn.get(worker)
        if old is not None and old != ev.conn:
            del self.worker_conn[worker]
            lost = lc.WorkerDisconnected(worker, "re-registered on a new connection")
            self._apply(self.life.handle(lost, now))
        # Owned before the life cycle sees it, so the Split it answers with reaches the worker.
        self.worker_conn[worker] = ev.conn
        self._apply(self.life.handle(msg, now))
        if worker not in self.life.connected:  # refused (e.g. a vector of another size)
            del self.worker_conn[worker]


def _serve_launched_job(args: argparse.Namespace) -> int:
    """A coordinator for a job started by torchrun (CREW_COORDINATOR=host:port on its ranks)."""
    from crew.errors import LaunchError
    from crew.runtime.launch import (
        JobHost,
        check_mode,
        control_port,
        encryption,
        read_secret,
        rendezvous_number,
    )

    try:
        secret = read_secret()
        host = JobHost(
            secret,
            args.world,
            ("", args.port),
            args.advertise,
            rendezvous_run=rendezvous_number(secret, args.run_id),
            encrypt=encryption(),
            check=check_mode(),
            group_size=args.group_size or max(1, args.world // 2),
            run_dir=args.run_dir,
            join_timeout=args.join_timeout,
            control_port=control_port(),
        )
    except (LaunchError, OSError) as exc:
        log.error("%s", exc)
        return 2
    host.start()
    call_on_signals(lambda _: host.stop(), (signal.SIGTERM,))
    log.info("waiting for the job's %d ranks on port %d", args.world, host.rendezvous.port)
    host.serve()
    if host.rendezvous.failure:
        log.error("the job did not start: %s", host.rendezvous.failure)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crew.runtime.coordinator",
        description="The CREW coordinator: forms partial-reduce groups and plans them."
        " With --config, a lab run's (started by the lab in the root namespace); with --world,"
        " a launched job's (its ranks set CREW_COORDINATOR=host:port and CREW_SECRET).",
    )
    parser.add_argument("--config", help="the run's config.json (a lab run)")
    parser.add_argument("--db", help="the run database (SQLite; a lab run)")
    parser.add_argument(
        "--admin-secret",
        help="a lab run: the file of the lab's own key, the only one Admin requests may use",
    )
    parser.add_argument("--world", type=int, help="a launched job: its number of ranks")
    parser.add_argument("--port", type=int, default=29501, help="a launched job: listen port")
    parser.add_argument(
        "--advertise",
        default="127.0.0.1",
        help="a launched job: this host's address as the ranks reach it",
    )
    parser.add_argument("--group-size", type=int, help="a launched job: p (default world/2)")
    parser.add_argument(
        "--run-id",
        default="crew",
        help="a launched job: its ranks' TORCHELASTIC_RUN_ID (keys the rendezvous)",
    )
    parser.add_argument("--run-dir", help="a launched job: where to keep run.db")
    parser.add_argument("--join-timeout", type=float, default=60.0)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s coord %(levelname)s %(name)s: %(message)s"
    )
    if args.world is not None:
        return _serve_launched_job(args)
    if not args.config or not args.db:
        parser.error("--config and --db (a lab run), or --world (a launched job)")
    cfg = RunConfig.load(args.config)
    db = RunDB(args.db)
    admin = Path(args.admin_secret).read_bytes() if args.admin_secret else None
    coord = Coordinator(cfg, db, cfg.coordinator_host, cfg.coordinator_port, admin_secret=admin)
    call_on_signals(lambda _: coord.stop_event.set())
    coord.run()
    db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
