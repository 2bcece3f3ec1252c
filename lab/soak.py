"""Soak benchmark: a lab under seeded random faults for minutes, then what it left behind.

``sudo python -m lab.soak --minutes 10 [--topology default] [--seed S]`` runs a lab (no
dashboard) with a ``chaos`` timeline (``lab.scenario``): from ``--warmup`` seconds after the
start until ``--cooldown`` seconds before the end, one fault every ``--every`` seconds (a worker
killed and restarted, a worker slowed, a link cut, a link re-rated, background contention),
each undone after a while, and all undone before the cool-down. It then reports:

* **groups** completed and abandoned, and the run's rounds per worker;
* **faults** injected (applied fault-start commands), commands rejected;
* **recoveries**: per fault, the latency from the command being applied to the next completed
  group (``next_done``), and to the completion of the first group *formed* after the fault
  (``first_new``; a stricter measure, since a group already past the fault may finish first);
  median, 90th percentile and maximum, and faults with no completion after them;
* **leaks**, all of which must be zero: descriptors of this process (before the lab vs after),
  processes the lab recorded that are still alive (plus any process whose command line names
  the run directory), root-namespace interfaces named ``crw<tag>*``, the lab's state file, and
  iptables rules (``crew-cut``/``crew-loss``) left in the hosts' namespaces once every fault
  was undone (checked before teardown, since the namespaces die with it);
* **memory**: RSS of this process, the coordinator and each worker process, sampled every
  ``--sample-every`` seconds; growth is the last sample minus the first one taken after the
  warm-up (a restarted worker is a new process: its own first sample counts);
* the **audit** (``lab.audit``) of the finished run.

It is a benchmark, not a test: it prints figures and exits 1 if a leak or an audit violation
was found. Other labs on the same machine do not disturb its leak figures (they count only
what carries this lab's tag or run directory), but they do share its CPUs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from crew.cli_options import add_config_flags, add_out_flag, command_parser
from crew.runtime import rundb
from crew.runtime.rundb import CommandStatus, GroupStatus
from lab.audit import audit
from lab.net import shaping
from lab.net.cleanup import ProcRecord, StateError, is_same_process
from lab.net.preflight import PreflightError, check
from lab.orchestrate.runner import REPO, LabRun, RunOptions, lab_limits, new_run_id
from lab.orchestrate.summary import summarize
from lab.report.pace import is_fault_start, read_pace
from lab.spec.scenario import Scenario, ScenarioError, parse_scenario
from lab.spec.shipped import add_topology_flag, default_topology
from lab.spec.topology import TopologyError, TopologySpec, load_topology

log = logging.getLogger(__name__)

POLL_S = 0.5
PROGRESS_EVERY_S = 30.0
SETTLE_S = 45.0  # a (re)started worker's RSS counts for growth from this long after it appeared
LAB_RULE_COMMENTS = ("crew-cut", "crew-loss")
# Commands that start a fault; their undo counterparts (restart, restore, stop, factor 1,
# the configured rate) are not faults.


@dataclass(frozen=True)
class SoakOptions:
    minutes: float = 10.0
    topology: Path = field(default_factory=default_topology)
    seed: int = 0
    every_s: float = 15.0  # one fault starts this often during the chaos window
    warmup_s: float = 60.0  # no faults while the workers start and the first groups form
    cooldown_s: float = 60.0  # no new faults, and every fault undone, this long before the end
    sample_every_s: float = 15.0
    p: int = 3
    width: int = 640
    run_dir: Path | None = None
    # chaos fault kinds to draw from (lab.spec.scenario.ChaosFault values); (): every kind
    faults: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.minutes <= 0:
            raise ValueError(f"minutes={self.minutes} must be > 0")
        if self.warmup_s + self.cooldown_s >= self.minutes * 60:
            raise ValueError(
                f"minutes={self.minutes} leaves no chaos window after warmup_s={self.warmup_s}"
                f" and cooldown_s={self.cooldown_s}"
            )
        for name in ("every_s", "sample_every_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")


@dataclass(frozen=True)
class LatencyStats:
    count: int
    median_s: float | None
    p90_s: float | None
    max_s: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> LatencyStats:
        if not values:
            return cls(0, None, None, None)
        v = sorted(values)
        p90 = v[min(len(v) - 1, int(round(0.9 * (len(v) - 1))))]
        return cls(len(v), round(statistics.median(v), 2), round(p90, 2), round(v[-1], 2))


@dataclass
class SoakReport:
    run_dir: str
    tag: str
    minutes: float
    seed: int
    topology: str
    cooldown_s: float = 0.0
    groups_completed: int = 0
    groups_abandoned: int = 0
    rounds_per_worker: dict[str, int] = field(default_factory=dict)
    faults_planned: int = 0
    faults_injected: int = 0
    faults_by_kind: dict[str, int] = field(default_factory=dict)
    commands_rejected: list[str] = field(default_factory=list)
    recovery_events: int = 0
    next_done: LatencyStats | None = None
    first_new: LatencyStats | None = None
    unrecovered: list[str] = field(default_factory=list)
    recoveries: list[str] = field(default_factory=list)  # per fault: what, and both latencies
    groups_in_cooldown: int = 0  # completed once every fault was undone: must be > 0
    longest_gap_s: float = 0.0  # longest time without a completed group after the warm-up
    longest_gap_from_s: float = 0.0  # when that gap began, seconds since the lab started
    fds_before: int = 0
    fds_after: int = 0
    fds_leaked: list[str] = field(default_factory=list)
    procs_recorded: int = 0
    procs_alive: list[str] = field(default_factory=list)
    interfaces_left: list[str] = field(default_factory=list)
    state_file_left: bool = False
    ns_rules_left: list[str] = field(default_factory=list)
    rss_mb: dict[str, dict[str, float]] = field(default_factory=dict)
    # Per process, (seconds since the lab started, RSS MB) at every sample.
    rss_series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    audit_ok: bool | None = None
    audit_violations: list[str] = field(default_factory=list)
    pace: str = ""  # lab.report.pace: groups per 10 s against the pre-fault rate
    error: str | None = None

    @property
    def leaks(self) -> int:
        return (
            len(self.fds_leaked)
            + len(self.procs_alive)
            + len(self.interfaces_left)
            + int(self.state_file_left)
            + len(self.ns_rules_left)
        )

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.leaks == 0
            and bool(self.audit_ok)
            and self.groups_in_cooldown > 0
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"leaks": self.leaks, "ok": self.ok}


# -- the schedule ----------------------------------------------------------------------------


def chaos_scenario(topo: TopologySpec, opts: SoakOptions, limits: Any) -> Scenario:
    """The seeded fault timeline for this soak, through the scenario loader's chaos macro."""
    until = opts.minutes * 60 - opts.cooldown_s
    doc = {
        "name": "soak",
        "description": f"soak: a chaos fault every {opts.every_s:g} s from "
        f"{opts.warmup_s:g} s to {until:g} s",
        "seed": opts.seed,
        "steps": [
            {
                "at": opts.warmup_s,
                "do": "chaos",
                "args": {"until": until, "every": opts.every_s}
                | ({"kinds": list(opts.faults)} if opts.faults else {}),
            }
        ],
    }
    return parse_scenario(doc, topo.n, limits=limits, rates=topo.bw_matrix())


# -- what a process holds ----------------------------------------------------------------------


def open_fds() -> dict[int, str]:
    """This process's descriptors and what they point to."""
    out: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # the descriptor listdir itself used, closed meanwhile
    return out


TIMELINE_COLUMNS = 7


def rss_timeline(
    series: dict[str, list[tuple[float, float]]], columns: int = TIMELINE_COLUMNS
) -> list[str]:
    """RSS over time as text: one row per process, its sample nearest to each of ``columns``
    times spread evenly over the run ("-" where the process did not exist then)."""
    points = [t for pts in series.values() for t, _ in pts]
    if not points:
        return []
    t0, t1 = min(points), max(points)
    at = [t0 + (t1 - t0) * k / (columns - 1) for k in range(columns)]
    step = (t1 - t0) / (columns - 1) if columns > 1 else 0.0
    head = "".join(f"{t / 60:>8.0f}" for t in at)
    lines = ["RSS MB over time, at minute:", f"  {'':<22}{head}"]
    for key, pts in series.items():
        cells = []
        for t in at:
            near = min(pts, key=lambda p: abs(p[0] - t))
            cells.append(f"{near[1]:>8.1f}" if abs(near[0] - t) <= step / 2 + 1 else f"{'-':>8}")
        lines.append(f"  {key:<22}{''.join(cells)}")
    return lines


def rss_mb(pid: int | str) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def processes_naming(text: str) -> list[str]:
    """Live processes whose command line contains ``text`` (for reporting only; never used to
    signal anything)."""
    needle = text.encode()
    mine = _ancestors()  # e.g. a `timeout` wrapper whose arguments name the run directory
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmd:
            shown = cmd.replace(b"\0", b" ").decode(errors="replace")[:120]
            out.append(f"{entry.name}: {shown}")
    return out


def _ancestors() -> set[int]:
    """This process and its parents, up to init (bounded by the process tree depth)."""
    out, pid = set(), os.getpid()
    for _ in range(1024):
        if pid <= 1 or pid in out:
            break
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def root_interfaces(prefix: str) -> list[str]:
    out = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=True
    ).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@", 1)[0]
            if name.startswith(prefix):
                names.append(name)
    return names


def namespace_rules(lab: LabRun) -> list[str]:
    """The lab's iptables rules still present in its hosts' namespaces."""
    assert lab.net is not None
    left = []
    for i in range(lab.topo.n):
        try:
            text = shaping.run(lab.net.host_pid(i), ["iptables", "-w", "5", "-S"])
        except shaping.ShapingError as exc:
            left.append(f"host {i}: cannot list rules: {exc}")
            continue
        left += [
            f"host {i}: {r}" for r in text.splitlines() if any(c in r for c in LAB_RULE_COMMENTS)
        ]
    return left


class Sampler:
    """Remembers every process the lab recorded, and samples RSS over time."""

    def __init__(self, lab: LabRun, after: float, settle_s: float = SETTLE_S) -> None:
        self.lab = lab
        self.after = after  # samples from this wall-clock time on count for growth
        self.settle_s = settle_s  # ... and from this long after a process was first seen
        self.records: dict[int, ProcRecord] = {}
        self.series: dict[str, list[tuple[float, float]]] = {}

    def note_processes(self) -> None:
        net = self.lab.net
        if net is None or net.state is None:
            return
        for rec in net.state.procs:
            self.records.setdefault(rec.pid, rec)
        for proc in [*self.lab.workers.values(), self.lab.coordinator]:
            if proc is not None and proc.pid not in self.records and proc.poll() is None:
                try:
                    self.records[proc.pid] = ProcRecord.of(proc.pid, "proc")
                except StateError:
                    pass  # ended between the poll and the record

    def sample(self, now: float) -> None:
        procs: list[tuple[str, int | str]] = [("lab", "self")]
        if self.lab.coordinator is not None:
            procs.append(("coordinator", self.lab.coordinator.pid))
        procs += [(f"w{i}", p.pid) for i, p in sorted(self.lab.workers.items()) if p.poll() is None]
        for name, pid in procs:
            mb = rss_mb(pid)
            if mb is not None:
                key = name if name == "lab" else f"{name}/pid{pid}"
                self.series.setdefault(key, []).append((now, mb))

    def growth(self) -> dict[str, dict[str, float]]:
        """Per process: first sample after the warm-up (and after the process settled:
        a worker imports torch and loads its data first), last sample, growth (MB), and the
        growth over the second half of that span."""
        out: dict[str, dict[str, float]] = {}
        for key, points in sorted(self.series.items()):
            since = max(self.after, points[0][0] + self.settle_s)
            pts = [p for p in points if p[0] >= since] or points[-1:]
            first, last = pts[0], pts[-1]
            # The second half of the span: a cache that fills and stops shows here as ~0.
            mid = next(p for p in pts if p[0] >= (first[0] + last[0]) / 2)
            out[key] = {
                "first_mb": round(first[1], 1),
                "last_mb": round(last[1], 1),
                "growth_mb": round(last[1] - first[1], 1),
                "second_half_growth_mb": round(last[1] - mid[1], 1),
                "span_s": round(last[0] - first[0], 0),
                "samples": len(pts),
            }
        return out


# -- after the run -----------------------------------------------------------------------------


def analyse_db(db_path: Path, report: SoakReport, opts: SoakOptions) -> None:
    """Groups, faults, recovery latencies and liveness, from the run database alone."""
    with rundb.reading(db_path) as conn:
        rates = {
            (r["src"], r["dst"]): float(r["rate_mbit"])
            for r in conn.execute("SELECT src, dst, rate_mbit FROM links")
        }
        groups = conn.execute(
            "SELECT id, formed_at, ended_at FROM groups WHERE status=? ORDER BY ended_at",
            (GroupStatus.COMPLETED.value,),
        ).fetchall()
        commands = conn.execute(
            "SELECT id, kind, args, status, reason, applied_at FROM commands ORDER BY id"
        ).fetchall()
        report.recovery_events = int(
            conn.execute("SELECT COUNT(*) FROM events WHERE kind='recovery'").fetchone()[0]
        )
        run_end = conn.execute("SELECT value FROM meta WHERE key='ended_at'").fetchone()
        started = float(conn.execute("SELECT value FROM meta WHERE key='started_at'").fetchone()[0])
        end = float(run_end[0]) if run_end else time.time()
        report.pace = read_pace(conn, started, end).describe()
    ends = [(float(g["ended_at"]), float(g["formed_at"])) for g in groups]
    _liveness(report, [e for e, _ in ends], started, end, opts)
    next_done, first_new = [], []
    by_kind: dict[str, int] = {}
    for c in commands:
        if c["status"] == CommandStatus.REJECTED:
            report.commands_rejected.append(f"#{c['id']} {c['kind']} {c['args']}: {c['reason']}")
            continue
        args = json.loads(c["args"])
        if c["status"] != CommandStatus.APPLIED or not is_fault_start(c["kind"], args, rates):
            continue
        t = float(c["applied_at"])
        by_kind[c["kind"]] = by_kind.get(c["kind"], 0) + 1
        done = [e for e, _ in ends if e > t]
        new = [e for e, f in ends if f > t]
        if done:
            next_done.append(min(done) - t)
        if new:
            first_new.append(min(new) - t)
        report.recoveries.append(
            f"#{c['id']} {c['kind']} {c['args']}: next_done "
            f"{f'{min(done) - t:.1f} s' if done else 'never'}, first_new "
            f"{f'{min(new) - t:.1f} s' if new else 'never'}"
        )
        if not new:
            report.unrecovered.append(
                f"#{c['id']} {c['kind']} {c['args']} at {t - end:+.0f} s before the end"
            )
    report.faults_injected = sum(by_kind.values())
    report.faults_by_kind = by_kind
    report.next_done = LatencyStats.of(next_done)
    report.first_new = LatencyStats.of(first_new)


def _liveness(
    report: SoakReport, ended: list[float], started: float, end: float, opts: SoakOptions
) -> None:
    """Groups completed in the cool-down, and the longest stretch with none after warm-up."""
    stop = min(end, started + opts.minutes * 60)
    report.groups_in_cooldown = sum(1 for e in ended if e >= stop - opts.cooldown_s)
    marks = (
        [started + opts.warmup_s]
        + sorted(e for e in ended if started + opts.warmup_s < e <= stop)
        + [stop]
    )
    gaps = [(b - a, a) for a, b in zip(marks, marks[1:], strict=False)]
    gap, at = max(gaps) if gaps else (0.0, started)
    report.longest_gap_s = round(gap, 1)
    report.longest_gap_from_s = round(at - started, 1)


# -- the run -----------------------------------------------------------------------------------


def run_soak(opts: SoakOptions) -> SoakReport:
    topo = load_topology(opts.topology)
    caps = check(topo)
    scenario = chaos_scenario(topo, opts, lab_limits(topo, caps))
    run_dir = opts.run_dir or (REPO / "runs" / f"soak-{new_run_id()}")
    ropts = RunOptions(
        p=opts.p, width=opts.width, seed=opts.seed, dashboard=False, log_level="WARNING"
    )
    fds_before = open_fds()
    lab = LabRun(topo, caps, ropts, run_dir, scenario=scenario)
    rates = {(lk.src, lk.dst): lk.rate_mbit for lk in topo.links}
    planned = sum(
        is_fault_start(s.command.KIND.value, asdict(s.command), rates) for s in scenario.steps
    )
    report = SoakReport(
        str(run_dir),
        lab.tag,
        opts.minutes,
        opts.seed,
        topo.name,
        opts.cooldown_s,
        faults_planned=planned,
    )
    report.fds_before = len(fds_before)
    sampler: Sampler | None = None
    state_path: Path | None = None
    try:
        with lab:
            assert lab.net is not None and lab.net.state is not None
            state_path = lab.net.state.path
            sampler = Sampler(lab, lab.started_at + opts.warmup_s)
            end = lab.started_at + opts.minutes * 60
            next_sample = next_progress = time.time()
            # Bounded by the clock: one iteration per POLL_S until the end.
            for _ in range(int(opts.minutes * 60 / POLL_S) + 10_000):
                now = time.time()
                if now >= end:
                    break
                lab.poll()
                sampler.note_processes()
                if now >= next_sample:
                    sampler.sample(now)
                    next_sample += opts.sample_every_s
                if now >= next_progress:
                    _progress(lab, now - lab.started_at)
                    next_progress += PROGRESS_EVERY_S
                time.sleep(POLL_S)
            lab.poll()  # the last undo commands
            sampler.note_processes()
            sampler.sample(time.time())
            report.ns_rules_left = namespace_rules(lab)
    except KeyboardInterrupt:  # the lab has been torn down; report what was gathered
        report.error = "interrupted"
    except Exception as exc:  # reported with the figures gathered so far
        log.exception("soak run failed")
        report.error = f"{type(exc).__name__}: {exc}"
    fds_after = open_fds()
    report.fds_after = len(fds_after)
    report.fds_leaked = sorted(
        f"{fd} -> {target}" for fd, target in fds_after.items() if fds_before.get(fd) != target
    )
    if sampler is not None:
        report.procs_recorded = len(sampler.records)
        report.procs_alive = [
            f"{r.pid} ({r.kind} {r.label})"
            for r in sampler.records.values()
            if is_same_process(r.pid, r.start_time)
        ]
        report.rss_mb = sampler.growth()
        report.rss_series = {
            key: [(round(t - lab.started_at, 1), round(mb, 1)) for t, mb in pts]
            for key, pts in sorted(sampler.series.items())
        }
    report.procs_alive += processes_naming(str(run_dir))
    report.interfaces_left = root_interfaces(f"crw{lab.tag}")
    report.state_file_left = state_path is not None and state_path.exists()
    if lab.db_path.exists():
        summary = summarize(lab.db_path)
        report.groups_completed = summary["groups_completed"]
        report.groups_abandoned = summary["groups_abandoned"]
        report.rounds_per_worker = summary["rounds_per_worker"]
        analyse_db(lab.db_path, report, opts)
        result = audit(run_dir)
        report.audit_ok = result.ok
        report.audit_violations = [f"{c.name}: {c.detail}" for c in result.violations]
    return report


def _progress(lab: LabRun, elapsed: float) -> None:
    assert lab.db is not None
    g = lab.db.query(
        "SELECT SUM(status=?) AS done, SUM(status=?) AS ab FROM groups",
        (GroupStatus.COMPLETED.value, GroupStatus.ABANDONED.value),
    )[0]
    c = lab.db.query(
        "SELECT COUNT(*) AS n FROM commands WHERE status=?", (CommandStatus.APPLIED.value,)
    )[0]
    print(
        f"[soak {elapsed:6.0f} s] groups completed {g['done'] or 0}, abandoned {g['ab'] or 0};"
        f" commands applied {c['n']}",
        file=sys.stderr,
        flush=True,
    )


def print_report(r: SoakReport) -> None:
    def lat(s: LatencyStats | None) -> str:
        if s is None or not s.count:
            return "none"
        return f"n={s.count}, median {s.median_s} s, p90 {s.p90_s} s, max {s.max_s} s"

    lines = [
        f"soak of {r.topology} for {r.minutes:g} min (seed {r.seed}), run {r.run_dir}",
        f"groups: {r.groups_completed} completed, {r.groups_abandoned} abandoned; rounds per "
        f"worker {r.rounds_per_worker}",
        f"faults: {r.faults_injected} injected of {r.faults_planned} planned {r.faults_by_kind};"
        f" {len(r.commands_rejected)} commands rejected",
        f"recovery events logged by the coordinator: {r.recovery_events}",
        f"fault -> next completed group: {lat(r.next_done)}",
        f"fault -> first group formed after it completes: {lat(r.first_new)}",
        f"faults with no group formed and completed after them: {len(r.unrecovered)}",
        f"pace: {r.pace}",
        f"liveness: {r.groups_in_cooldown} groups completed in the {r.cooldown_s:g} s cool-down"
        f" (all faults undone); longest gap without a completed group {r.longest_gap_s} s,"
        f" from t={r.longest_gap_from_s} s",
        f"leaks: fds {r.fds_before} before, {r.fds_after} after ({len(r.fds_leaked)} new); "
        f"processes alive {len(r.procs_alive)} of {r.procs_recorded} recorded; "
        f"interfaces crw{r.tag}* {len(r.interfaces_left)}; state file "
        f"{'LEFT' if r.state_file_left else 'removed'}; namespace iptables rules "
        f"{len(r.ns_rules_left)}",
        "memory (RSS MB, first after warm-up -> last):",
    ]
    for key, m in r.rss_mb.items():
        lines.append(
            f"  {key:<22} {m['first_mb']:>7.1f} -> {m['last_mb']:>7.1f}"
            f"  ({m['growth_mb']:+.1f} over {m['span_s']:.0f} s, second half"
            f" {m['second_half_growth_mb']:+.1f}, {m['samples']} samples)"
        )
    lines += rss_timeline(r.rss_series)
    lines.append(f"audit: {'ok' if r.audit_ok else 'VIOLATIONS' if r.audit_ok is False else 'n/a'}")
    lines += [f"  {v}" for v in r.audit_violations]
    for title, items in (
        ("per fault", r.recoveries),
        ("rejected commands", r.commands_rejected),
        ("unrecovered", r.unrecovered),
        ("leaked fds", r.fds_leaked),
        ("live processes", r.procs_alive),
        ("interfaces", r.interfaces_left),
        ("iptables rules", r.ns_rules_left),
    ):
        if items:
            lines.append(f"{title}:")
            lines += [f"  {x}" for x in items[:60]]
    if r.error:
        lines.append(f"ERROR: {r.error}")
    lines.append(f"verdict: {'ok' if r.ok else 'PROBLEMS'} ({r.leaks} leaks)")
    print("\n".join(lines), flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("python -m lab.soak", __doc__)
    p.add_argument("--minutes", type=float, default=10.0, help="run length (default 10)")
    add_topology_flag(p, "a topology name under topologies/ or a YAML path (default: default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault timeline and the run")
    p.add_argument("--every", type=float, default=15.0, help="seconds between faults (15)")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before the first fault")
    p.add_argument(
        "--cooldown",
        type=float,
        default=60.0,
        help="fault-free seconds at the end, all faults undone (60)",
    )
    p.add_argument("--sample-every", type=float, default=15.0, help="RSS sampling period (15)")
    p.add_argument(
        "--faults",
        default="",
        metavar="KINDS",
        help="comma-separated fault kinds to draw from: kill, slow, cut, rate, contention"
        " (default all); without kill, every worker lives through the run, so its memory"
        " can be followed for the whole soak",
    )
    add_config_flags(p, ("p", "width"))
    add_out_flag(p, "the run's folder (default runs/soak-<run-id>)", old=("--run-dir",))
    p.add_argument("--json", type=Path, default=None, help="also write the report here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        opts = SoakOptions(
            minutes=args.minutes,
            topology=args.topology,
            seed=args.seed,
            every_s=args.every,
            warmup_s=args.warmup,
            cooldown_s=args.cooldown,
            sample_every_s=args.sample_every,
            p=args.p,
            width=args.width,
            run_dir=args.out,
            faults=tuple(k.strip() for k in args.faults.split(",") if k.strip()),
        )
        report = run_soak(opts)
    except (ValueError, TopologyError, ScenarioError, PreflightError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_dict(), indent=1))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
