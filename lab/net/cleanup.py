"""What a lab created, recorded as it is created, and the removal of labs that died.

Every ``LabNetwork`` writes a state file (JSON, ``<state_dir>/<tag>.json``) *before* it creates
each thing: host shells and the processes it starts (pid plus the start time from
``/proc/<pid>/stat``, so a reused pid is never killed), root-namespace interfaces and bridges,
and iptables rules. Rules inside a host's namespace die with the namespace; they are recorded
for the record only.

``cleanup_leftovers`` reads the state files of labs whose owner process is gone and removes
exactly what each recorded: it never kills by name and never runs ``mn -c``. A thing recorded
but never created (the owner died between recording and creating) is harmless: deleting a
missing interface or killing a dead pid is a no-op.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path("/run/crew-lab")
STATE_VERSION = 1
# How long a recorded process gets between SIGTERM and SIGKILL.
TERM_GRACE_S = 2.0
POLL_S = 0.05


class StateError(Exception):
    """A state file is unreadable or names something it should not."""


def proc_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or None when it does not exist.

    Field 22 of /proc/<pid>/stat; the command name (field 2) may hold spaces and parentheses,
    so fields are counted from the last ')'.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = raw[raw.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); starttime is field 22.
    return int(rest[22 - 3])


def is_same_process(pid: int, start_time: int) -> bool:
    """True when ``pid`` is alive and still the process that was recorded (not a reuse)."""
    if proc_start_time(pid) != start_time:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@dataclass(frozen=True)
class ProcRecord:
    """A process the lab started: ``pid`` with its start time; ``group`` when it leads its own
    process group (so its children are signalled with it)."""

    pid: int
    start_time: int
    kind: str
    label: str = ""
    group: bool = False

    @classmethod
    def of(cls, pid: int, kind: str, label: str = "", group: bool = False) -> ProcRecord:
        start = proc_start_time(pid)
        if start is None:
            raise StateError(f"pid {pid} ({kind} {label}) is gone before it could be recorded")
        return cls(pid=pid, start_time=start, kind=kind, label=label, group=group)


def terminate_recorded(procs: list[ProcRecord], grace_s: float = TERM_GRACE_S) -> list[int]:
    """SIGTERM, then SIGKILL after ``grace_s``, every recorded process that is still the same
    process. Returns the pids that were signalled."""
    live = [p for p in procs if is_same_process(p.pid, p.start_time)]
    for p in live:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(is_same_process(p.pid, p.start_time) for p in live):
        time.sleep(POLL_S)
    for p in live:
        if is_same_process(p.pid, p.start_time):
            log.warning("pid %d (%s %s) ignored SIGTERM; killing", p.pid, p.kind, p.label)
            _signal(p, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(is_same_process(p.pid, p.start_time) for p in live):
        time.sleep(POLL_S)
    return [p.pid for p in live]


def end_group(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM the process group ``proc`` leads (a child started in a new session, not yet
    reaped, so its pid is still its own), then SIGKILL it if ``proc`` is alive ``grace_s``
    later. Returns once ``proc`` has been reaped or the SIGKILL's wait timed out."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _signal(p: ProcRecord, sig: int) -> None:
    try:
        # Only signal the group when the recorded pid still leads it.
        if p.group and os.getpgid(p.pid) == p.pid:
            os.killpg(p.pid, sig)
        else:
            os.kill(p.pid, sig)
    except ProcessLookupError:
        pass


def delete_link(name: str) -> bool:
    """Delete a root-namespace interface by name; False when it did not exist."""
    res = subprocess.run(["ip", "link", "del", "dev", name], capture_output=True, text=True)
    if res.returncode != 0 and "Cannot find device" not in res.stderr:
        log.warning("ip link del %s failed: %s", name, res.stderr.strip())
    return res.returncode == 0


def root_link_names() -> set[str]:
    """Names of all interfaces in the root namespace."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True)
    names = set()
    for line in out.stdout.splitlines():
        # "3: name@peer: <...>" -> name
        names.add(line.split(":", 2)[1].strip().split("@", 1)[0])
    return names


class LabState:
    """The record of one lab, saved atomically after every change.

    The owner is the process that built the lab; while it lives, ``cleanup_leftovers`` leaves
    the lab alone.
    """

    def __init__(self, path: Path, tag: str, owner_pid: int | None = None):
        self.path = Path(path)
        self.tag = tag
        pid = os.getpid() if owner_pid is None else owner_pid
        self.owner = ProcRecord.of(pid, "owner", tag)
        self.created_at = time.time()
        self.procs: list[ProcRecord] = []
        self.root_links: list[str] = []
        self.bridges: list[str] = []
        self.root_rules: list[list[str]] = []
        self.ns_rules: list[dict[str, Any]] = []
        self.run_dbs: list[str] = []  # run databases this lab writes (closed if it is killed)

    # -- recording ---------------------------------------------------------------------------

    def add_proc(self, rec: ProcRecord) -> None:
        self.procs.append(rec)
        self.save()

    def remove_proc(self, pid: int) -> None:
        self.procs = [p for p in self.procs if p.pid != pid]
        self.save()

    def add_root_link(self, name: str) -> None:
        self.root_links.append(name)
        self.save()

    def remove_root_link(self, name: str) -> None:
        self.root_links = [n for n in self.root_links if n != name]
        self.save()

    def add_bridge(self, name: str) -> None:
        self.bridges.append(name)
        self.save()

    def remove_bridge(self, name: str) -> None:
        self.bridges = [n for n in self.bridges if n != name]
        self.save()

    def add_run_db(self, path: str) -> None:
        self.run_dbs.append(path)
        self.save()

    def add_ns_rule(self, host: int, argv: list[str]) -> None:
        self.ns_rules.append({"host": host, "argv": list(argv)})
        self.save()

    def remove_ns_rule(self, host: int, argv: list[str]) -> None:
        want = {"host": host, "argv": list(argv)}
        if want in self.ns_rules:
            self.ns_rules.remove(want)
            self.save()

    # -- persistence -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "tag": self.tag,
            "created_at": self.created_at,
            "owner": vars(self.owner),
            "procs": [vars(p) for p in self.procs],
            "root_links": self.root_links,
            "bridges": self.bridges,
            "root_rules": self.root_rules,
            "ns_rules": self.ns_rules,
            "run_dbs": self.run_dbs,
        }

    def save(self) -> None:
        """Write the state atomically: a reader sees the old file or the new, never half."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def remove_file(self) -> None:
        self.path.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path) -> LabState:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise StateError(f"cannot read lab state {path}: {e}") from e
        if data.get("version") != STATE_VERSION:
            raise StateError(f"{path}: field 'version' is {data.get('version')!r}")
        st = cls.__new__(cls)
        st.path = Path(path)
        st.tag = data["tag"]
        st.owner = ProcRecord(**data["owner"])
        st.created_at = data["created_at"]
        st.procs = [ProcRecord(**p) for p in data["procs"]]
        st.root_links = list(data["root_links"])
        st.bridges = list(data["bridges"])
        st.root_rules = [list(r) for r in data["root_rules"]]
        st.ns_rules = list(data["ns_rules"])
        st.run_dbs = [str(p) for p in data.get("run_dbs", [])]
        for name in st.root_links + st.bridges:
            # Only names this module could have made are deleted: a corrupted or foreign file
            # must not make us delete eth0.
            if not name.startswith(ROOT_NAME_PREFIX):
                raise StateError(f"{path}: interface {name!r} lacks prefix {ROOT_NAME_PREFIX!r}")
        return st

    def owner_alive(self) -> bool:
        return is_same_process(self.owner.pid, self.owner.start_time)


# Every root-namespace interface a lab creates starts with this (see lab.net.mesh).
ROOT_NAME_PREFIX = "crw"


@dataclass
class CleanupReport:
    """What ``cleanup_leftovers`` did; ``skipped`` holds labs whose owner still runs."""

    cleaned: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    deleted_links: list[str] = field(default_factory=list)
    closed_groups: list[int] = field(default_factory=list)  # open groups of killed labs' runs
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"cleaned {len(self.cleaned)} lab(s) {self.cleaned}, skipped live {self.skipped}, "
            f"killed pids {self.killed}, deleted interfaces {self.deleted_links}"
            + (f", closed groups {self.closed_groups}" if self.closed_groups else "")
            + (f", errors {self.errors}" if self.errors else "")
        )


def remove_recorded(state: LabState, report: CleanupReport) -> None:
    """Remove everything ``state`` recorded: processes (only if still the same), root rules,
    root interfaces, bridges. Deleting a veth end also deletes its peer."""
    report.killed += terminate_recorded(state.procs)
    for argv in state.root_rules:
        # Recorded as the "-A"/"-I" form; delete by the same spec.
        delete = ["iptables", "-D", *argv[2:]] if len(argv) > 2 else None
        if delete is None:
            continue
        res = subprocess.run(delete, capture_output=True, text=True)
        if res.returncode != 0:
            report.errors.append(f"{' '.join(delete)}: {res.stderr.strip()}")
    for name in state.root_links + state.bridges:
        if delete_link(name):
            report.deleted_links.append(name)
    for path in state.run_dbs:
        try:
            report.closed_groups += close_killed_run(Path(path))
        except (OSError, sqlite3.Error) as exc:
            report.errors.append(f"run database {path}: {exc}")


KILLED_REASON = "the lab was killed before the group ended"


def close_killed_run(path: Path) -> list[int]:
    """A killed lab's run database: its open groups become abandoned and the run gets an end
    (the last time anything was recorded), so the dashboard and the audit read a finished run.
    Returns the groups closed; a missing file or an ended run is left alone."""
    from crew.runtime.rundb import RunDB

    if not path.is_file():
        return []
    db = RunDB(path)
    try:
        if db.query("SELECT value FROM meta WHERE key = 'ended_at'"):
            return []
        last = db.query(
            "SELECT MAX(t) AS t FROM (SELECT MAX(t) AS t FROM events UNION ALL"
            " SELECT MAX(formed_at) FROM groups UNION ALL SELECT MAX(t) FROM link_samples)"
        )
        ended = float(last[0]["t"] or time.time())
        closed = db.abandon_open_groups(ended_at=ended, reason=KILLED_REASON)
        db.set_meta({"ended_at": str(ended)})
        db.event("stop", f"lab killed; {len(closed)} open group(s) closed as abandoned", t=ended)
        return closed
    finally:
        db.close()


def cleanup_leftovers(state_dir: Path | str = DEFAULT_STATE_DIR) -> CleanupReport:
    """Remove what dead labs left behind, from their state files in ``state_dir``.

    Labs whose owner process still runs are skipped. Unreadable state files are reported in
    ``errors`` and left in place for a human to look at.
    """
    report = CleanupReport()
    state_dir = Path(state_dir)
    if not state_dir.is_dir():
        return report
    for path in sorted(state_dir.glob("*.json")):
        try:
            state = LabState.load(path)
        except StateError as e:
            report.errors.append(str(e))
            continue
        if state.owner_alive():
            report.skipped.append(state.tag)
            continue
        log.info(
            "lab %s: owner pid %d is gone; removing what it recorded", state.tag, state.owner.pid
        )
        remove_recorded(state, report)
        state.remove_file()
        report.cleaned.append(state.tag)
    return report
