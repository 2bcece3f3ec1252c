"""Applying commands to a running lab: the one fault-injection path.

The dashboard and scripted scenarios write rows into the ``commands`` table; the lab's main
loop calls ``FaultInjector.apply_pending``, which re-validates each row with
``lab.orchestrate.commands.parse_row`` (the same rules the dashboard applied) and carries it out,
then marks it ``applied`` or ``rejected`` with the reason. Nothing is half-applied: a command either
passes every check before the first change, or changes nothing.

Faults are injected into the network, never announced to the system under test: a cut link is
an iptables drop at the receiver, and the workers must notice it themselves. Only changes that
an operator would know about (a link restored or re-rated, a new p or scheme) are passed on to
the coordinator.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from crew.runtime import rundb
from crew.runtime.rundb import CommandStatus, LinkStateRow
from lab.net.mesh import LabError
from lab.net.shaping import ShapingError
from lab.orchestrate import commands as cmds

if TYPE_CHECKING:
    from lab.orchestrate.runner import LabRun

log = logging.getLogger(__name__)

CONTENTION_BASE_PORT = 7800
ADMIN_RETRY_S = 30.0  # how long a command may wait for the coordinator to be reachable
CONTENTION_MAX_S = 24 * 3600.0  # flows end by themselves at the latest after a day


class FaultError(RuntimeError):
    """A valid command that cannot be carried out in the lab's current state."""


class FaultInjector:
    def __init__(self, lab: LabRun):
        self.lab = lab
        self.flows: dict[tuple[int, int], tuple[subprocess.Popen[bytes], ...]] = {}

    def _limits(self) -> cmds.LabLimits:
        with rundb.reading(self.lab.db_path) as conn:
            return cmds.load_limits(conn)

    def apply_pending(self) -> int:
        """Apply every pending command in order; return how many were handled."""
        db = self.lab.db
        assert db is not None
        rows = db.query(
            "SELECT id, t, kind, args FROM commands WHERE status=? ORDER BY id",
            (CommandStatus.PENDING.value,),
        )
        if not rows:
            return 0
        limits = self._limits()
        for row in rows:
            try:
                command = cmds.parse_row(row, limits)
                outcome = self.apply(command)
            except OSError as exc:
                # The coordinator may not listen yet (start-up) or be restarting: try again on
                # the next poll, and give up on the command after a while.
                if time.time() - row["t"] < ADMIN_RETRY_S:
                    log.info("command #%d waits for the coordinator: %s", row["id"], exc)
                    break  # keep the order: later commands wait too
                exc = FaultError(f"coordinator unreachable for {ADMIN_RETRY_S:.0f} s: {exc}")
                db.settle_command(row["id"], CommandStatus.REJECTED, str(exc))
                continue
            except (cmds.CommandError, FaultError, LabError, ShapingError) as exc:
                db.settle_command(row["id"], CommandStatus.REJECTED, str(exc))
                db.event(
                    "command",
                    f"command #{row['id']} {row['kind']} rejected: {exc}",
                    level="warning",
                )
                continue
            db.settle_command(row["id"], CommandStatus.APPLIED, outcome)
            db.event(
                "fault" if row["kind"] not in ("set_p", "set_scheme") else "command",
                f"{outcome} (command #{row['id']})",
                data={"command": row["kind"]},
            )
        return len(rows)

    def apply(self, command: cmds.Command) -> str:
        """Carry out one validated command; return what was done."""
        lab = self.lab
        match command:
            case cmds.SetP(p=p):
                lab.admin("set_p", p=p)
            case cmds.SetScheme(scheme=scheme):
                lab.admin("set_scheme", scheme=scheme)
            case cmds.KillWorker(worker=w):
                proc = lab.workers.get(w)
                if proc is None or proc.poll() is not None:
                    raise FaultError(f"worker: {w} is not running")
                lab.stop_worker(w, kill=True)
            case cmds.RestartWorker(worker=w):
                proc = lab.workers.get(w)
                if proc is not None and proc.poll() is None:
                    raise FaultError(f"worker: {w} is already running; kill it first")
                lab.exit_codes.pop(w, None)
                lab.start_worker(w)
            case cmds.SlowWorker(worker=w, factor=f):
                lab.admin("slow_worker", worker=w, factor=f)
            case cmds.CutLink(src=s, dst=d, both=both):
                for i, j in _directions(s, d, both):
                    self._set_up(i, j, False)
            case cmds.RestoreLink(src=s, dst=d, both=both):
                for i, j in _directions(s, d, both):
                    self._set_up(i, j, True)
            case cmds.SetLink(
                src=s, dst=d, rate_mbit=rate, delay_ms=delay, loss_pct=loss, jitter_ms=jitter
            ):
                assert lab.net is not None
                st = lab.net.set_link(
                    s, d, rate_mbit=rate, delay_ms=delay, jitter_ms=jitter, loss_pct=loss
                )
                self._record_link(s, d, st.rate_mbit, st.up, cmds.describe(command))
                if rate is not None or delay is not None:
                    # The coordinator plans with rates and one-way delays: tell it of either.
                    extra = {} if delay is None else {"delay_ms": st.delay_ms}
                    lab.admin("set_link", src=s, dst=d, rate_mbit=st.rate_mbit, **extra)
            case cmds.StartContention(src=s, dst=d, rate_mbit=rate):
                self._start_flow(s, d, rate)
            case cmds.StopContention(src=s, dst=d):
                self._stop_flow(s, d)
            case cmds.KillCoordinator():
                coord = lab.coordinator
                if coord is None or coord.poll() is not None:
                    raise FaultError("kind: the coordinator is not running")
                lab.kill_coordinator()
            case _:
                raise FaultError(f"kind: no way to apply {command!r}")
        return cmds.describe(command)

    def _set_up(self, i: int, j: int, up: bool) -> None:
        net = self.lab.net
        assert net is not None
        st = net.set_link(i, j, up=up)
        self._record_link(i, j, st.rate_mbit, up, "restored" if up else "cut")
        if up:  # an operator knows a repaired link; a cut one the workers must discover
            self.lab.admin("set_link", src=i, dst=j, rate_mbit=st.rate_mbit)

    def _record_link(self, i: int, j: int, rate: float, up: bool, reason: str) -> None:
        assert self.lab.db is not None
        self.lab.db.add_link_states([LinkStateRow(time.time(), i, j, rate, up, reason)])

    def _start_flow(self, s: int, d: int, rate: float) -> None:
        net = self.lab.net
        assert net is not None
        if (s, d) in self.flows:
            raise FaultError(f"src/dst: a contention flow {s}->{d} is already running")
        port = CONTENTION_BASE_PORT + s * net.n + d
        addr = f"{net.identity_address(d)}:{port}"
        seconds = str(CONTENTION_MAX_S)
        sink = net.popen(
            d,
            [sys.executable, "-m", "lab.net.flows", "sink", "--bind", addr, "--seconds", seconds],
            label=f"flow-sink {s}->{d}",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        source = net.popen(
            s,
            [
                sys.executable,
                "-m",
                "lab.net.flows",
                "source",
                "--to",
                addr,
                "--rate-mbit",
                str(rate),
                "--seconds",
                seconds,
            ],
            label=f"flow-source {s}->{d}",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.flows[(s, d)] = (source, sink)

    def _stop_flow(self, s: int, d: int) -> None:
        procs = self.flows.pop((s, d), None)
        if procs is None:
            raise FaultError(f"src/dst: no contention flow {s}->{d} is running")
        assert self.lab.net is not None
        for proc in procs:
            self.lab.net.stop_process(proc, timeout=5.0)

    def close(self) -> None:
        for s, d in list(self.flows):
            self._stop_flow(s, d)


def _directions(s: int, d: int, both: bool) -> list[tuple[int, int]]:
    return [(s, d), (d, s)] if both else [(s, d)]
