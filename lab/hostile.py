"""Attacks on a running lab or torchrun job, with counts: does the run keep going?

``sudo python -m lab.hostile`` starts a run on a lab network (``--topology``, default
``default``), waits for its first groups, measures its pace (completed groups per 10 s, read
from the run database) over ``--baseline`` seconds, then attacks it in the phases ``--phases``
names (default ``flood,replay,poison``; the first two on that run, the third on a run of its
own). The run is ``--target``:

* ``lab`` (the default): a lab (``lab.orchestrate.runner``; the synthetic workload, no
  dashboard). Its listeners and keys come from its run folder (``config.json``, ``secret``,
  ``admin-secret``); its coordinator runs in the root namespace.
* ``torchrun``: ``examples/train_digits.py`` through one ``torchrun`` per host namespace (as
  ``lab.torchrun`` runs it), rank 0 hosting the coordinator, groups of the lab's default p, at
  most ``--steps`` steps (each waits for its group, so the default outlasts the suite, which
  stops the job when it is done). The job is given a fresh secret in its environment, also
  written to ``OUT/secret`` as an insider would hold it. Its listeners come from what it
  publishes: the ``config`` rank 0 records in its run database (``OUT/run/run.db``) once every
  rank has joined, with the roster of data-plane ports, the coordinator's port and the job's
  fresh run number. The coordinator runs in host 0's namespace, inside rank 0's process; each
  rank's trainer is the process whose memory is watched.

Both are described the same way to the attackers (``lab.orchestrate.hostile_target``).

**flood** (``lab.orchestrate.flood``): ``--connections`` pre-authentication connections in all,
spread evenly over the coordinator's control port and every worker's data port, opened over the
first half of ``--duration`` seconds and held without a byte until the target ends them; on
every target at the same time, ``--slowloris`` connections that send one byte of a HELLO every
``--drip`` seconds (renewed when cut), and ``--frames`` connections each carrying one hostile
message of ``lab.fuzz attack``'s kinds (wrong MAC, garbage, oversized header). The attacker has
no key. Each listener is attacked from a thread inside its own namespace, over its loopback
(the root namespace for a lab's coordinator). During the phase the RSS of the coordinator and
of every worker is sampled. Reported: connections attempted, refused (closed at once: a
connection cap), cut (closed at the handshake deadline) and kept open; the pace during the
phase over the baseline (target ``>= 0.8``); each process's RSS growth (target ``<= 50 MB``);
and, after the phase, that groups still complete with every worker in one (``--recover``
seconds at most).

**replay and impersonation** (``lab.orchestrate.replay``), with the run's keys as an insider
holds them: recorded HELLOs and frames replayed on fresh connections to the coordinator and
every worker; frames naming another sender than the connection's authenticated peer; a
recorded session of the lab's own Admin replayed (a lab only: a launched job has no admin key,
so no such session exists); a HELLO naming the lab under the run's key; ``Admin`` sent on a
genuine worker session (the coordinator must refuse it: p stays, a ``security`` event says
so). A torchrun job draws a fresh run number, so its frames are made under that number, read
from its record. ``--replays`` tries of each. Every attack runs against the live run; none
needs a loopback stand-in. Groups must complete after this phase too.

**poison** (``lab.orchestrate.poison_phase``): an insider among the workers. Worker
``--poisoner`` (default 0) runs ``lab.orchestrate.poisoner``: the normal worker whose reduce
engine adds a tamper orthogonal to the run's public check vector, ``--poison-scale`` a element
(default 1e4 for a lab, about 16 times the synthetic model's norm; 0.5 for a torchrun job, of
the order of the MLP's weights, where 1e4 would swamp them in float32 and the public check
would catch the rounding first), to every partial sum and result it
carries for a group it is not a member of. It must be in place from the start, so the phase is a
lab run of its own after the others, in ``OUT-poison`` beside the run's folder: the synthetic
workload, the secret check (``crew.control.secretcheck``), groups of ``min(p, n - 1)`` so that
every group leaves out a worker who may carry its data, ``--poison-duration`` seconds from its
first group. Reported from its database and logs: groups completed, abandoned by the secret
check, routed through the poisoner by their plans, tampered with (the poisoner's log), tampered
groups committed (target 0) and averages applied that the synthetic rule found wrong (target 0:
no poisoned average applied), and groups completed after the first abandonment (the run goes
on). A poisoner that tampered with nothing proves nothing: that misses a target (a topology of
three workers or more is needed). Against a torchrun target the phase is a torchrun job of its
own (``OUT-poison``), whose rank ``--poisoner`` runs ``examples/train_digits.py`` inside
``python -m lab.orchestrate.poisoner --script``, so the script's ``crew.Averager`` builds the
poisoning engine; the MLP's averages have no exact check, so there "no poisoned average applied"
is "no tampered group committed".

It prints a table of what was tried and the counts per phase, and exits 0 if every target was
met, 1 if one was missed or groups stopped completing, 2 on bad options or without root, 3 when
the machine lacks what the topology needs. ``--json PATH`` writes the figures. Everything it
creates ends with it: its sockets are closed by each attacker, and the run's teardown stops
the processes it started and removes the network.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from crew.cli_options import add_json_flag, add_out_flag, command_parser, write_json
from crew.runtime import rundb
from crew.runtime.rundb import GroupStatus
from lab.net.preflight import PreflightError, check
from lab.orchestrate import poison_phase
from lab.orchestrate.flood import FloodCounts, FloodPlan, flood, in_netns, in_thread
from lab.orchestrate.hostile_target import (
    HostileTarget,
    JobVictim,
    LabVictim,
    Listener,
    TargetKind,
    Victim,
)
from lab.orchestrate.replay import (
    ReplayCounts,
    admin_from_worker,
    admin_refused_in_db,
    replay_all,
)
from lab.orchestrate.runner import REPO, LabRun, RunOptions, new_run_id
from lab.soak import rss_mb
from lab.spec.shipped import add_topology_flag, default_topology
from lab.spec.topology import TopologyError, load_topology

log = logging.getLogger(__name__)

WINDOW_S = 10.0  # pace is groups completed per this many seconds
PACE_TARGET = 0.8  # pace during the flood over the pace before it
RSS_TARGET_MB = 50.0
SLACK_S = 2.0  # beyond a handshake deadline, for the cut to arrive
POLL_S = 0.5
SAMPLE_S = 2.0
FIRST_GROUPS = 3
TABLE_WIDTH = 120  # columns of the tables when the output is not a terminal
# A torchrun job's steps at most: each step waits for its group, so this outlasts any suite;
# the suite stops the job when it is done.
JOB_STEPS = 1_000_000
PHASES = ("flood", "replay", "poison")


@dataclass(frozen=True)
class HostileOptions:
    target: TargetKind = TargetKind.LAB
    topology: Path = field(default_factory=default_topology)
    connections: int = 1000
    slowloris: int = 4
    frames: int = 30
    drip_s: float = 2.0
    duration_s: float = 60.0
    baseline_s: float = 60.0
    recover_s: float = 90.0
    replays: int = 10
    start_wait_s: float = 300.0
    seed: int = 0
    run_dir: Path | None = None
    steps: int = JOB_STEPS  # a torchrun job's steps at most
    phases: tuple[str, ...] = PHASES
    poisoner: int = poison_phase.DEFAULT_WORKER
    poison_scale: float = 0.0  # 0: the target's (poison_phase.DEFAULT_SCALE, JOB_SCALE)
    poison_duration_s: float = 60.0

    def __post_init__(self) -> None:
        unknown = [ph for ph in self.phases if ph not in PHASES]
        if unknown or not self.phases:
            raise ValueError(f"phases {list(self.phases)}: choose among {', '.join(PHASES)}")
        if self.poisoner < 0 or not self.poison_scale >= 0 or not self.poison_duration_s > 0:
            raise ValueError("--poisoner and --poison-scale must be >= 0, --poison-duration > 0")
        for name in ("connections", "replays", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("slowloris", "frames"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        for name in ("drip_s", "duration_s", "baseline_s", "recover_s", "start_wait_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")
        if self.baseline_s < WINDOW_S or self.duration_s < WINDOW_S:
            raise ValueError(f"baseline and duration must be at least one {WINDOW_S:g} s window")

    def to_dict(self) -> dict[str, Any]:
        """The options as JSON values (paths as text)."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


# -- pure: arithmetic and verdicts --------------------------------------------------------------


def pace(ends: Iterable[float], start: float, end: float) -> float:
    """Groups completed in ``(start, end]``, per ``WINDOW_S`` seconds."""
    if end <= start:
        raise ValueError(f"empty window {start}..{end}")
    return sum(1 for e in ends if start < e <= end) * WINDOW_S / (end - start)


def pace_ratio(before: float, during: float) -> float | None:
    """The pace during an attack over the pace before it; None without a pace before."""
    return during / before if before > 0 else None


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` counts that differ by at most one, larger ones first."""
    if parts < 1:
        raise ValueError(f"parts={parts} must be >= 1")
    q, r = divmod(total, parts)
    return [q + (k < r) for k in range(parts)]


def rss_growth(before: dict[str, float], samples: dict[str, list[float]]) -> dict[str, float]:
    """Per process, its largest RSS sample (MB) minus its RSS before; a process with no sample
    before (it started meanwhile) grows from its first sample."""
    out = {}
    for key, values in samples.items():
        if values:
            out[key] = round(max(values) - before.get(key, values[0]), 1)
    return out


@dataclass
class HostileReport:
    run_dir: str
    topology: str
    options: dict[str, Any]
    target: str = TargetKind.LAB.value
    n: int = 0
    pace_before: float = 0.0  # groups per WINDOW_S over the baseline
    pace_during: float = 0.0  # ... over the flood
    flood_s: float = 0.0
    flood: list[dict[str, Any]] = field(default_factory=list)  # FloodCounts.to_dict per target
    rss_before_mb: dict[str, float] = field(default_factory=dict)
    rss_growth_mb: dict[str, float] = field(default_factory=dict)
    groups_after_flood: int = 0
    workers_back: int = 0  # workers in a group completed after the flood
    recovered_after_s: float | None = None  # flood end -> every worker in a completed group
    replay: dict[str, Any] = field(default_factory=dict)  # ReplayCounts.to_dict
    admin_identity: str = ""  # who may administer the run (HostileTarget.admin_identity)
    admin_sent: int = 0
    admin_refusal_events: int = 0
    p_before: str | None = None
    p_after: str | None = None
    groups_after_replay: int = 0
    crashed: dict[int, int] = field(default_factory=dict)
    coordinator_restarts: int = 0
    error: str | None = None
    phases: list[str] = field(default_factory=lambda: list(PHASES))
    poison: dict[str, Any] = field(default_factory=dict)  # PoisonReport.to_dict

    @property
    def pace_ratio(self) -> float | None:
        return pace_ratio(self.pace_before, self.pace_during)

    def verdicts(self) -> list[tuple[str, bool, str]]:
        """(check, met, figures) for every target of the phases run; the run passes if all
        are met."""
        idle = _sum(f["idle"] for f in self.flood)
        slow = _sum(f["slowloris"] for f in self.flood)
        frames = [f["frames"] or {} for f in self.flood]
        sent = sum(sum(f.get("sent", {}).values()) for f in frames)
        dropped = sum(f.get("dropped", 0) for f in frames)
        late = [
            f["target"]
            for f in self.flood
            if f["slowloris_longest_s"] > f["deadline_s"] + SLACK_S + 2 * self.options["drip_s"]
        ]
        attempts = sum(self.replay.get("attempts", {}).values())
        refused = sum(self.replay.get("refused", {}).values())
        errors = [f["error"] for f in self.flood if f["error"]] + self.replay.get("errors", [])
        attacked = {"flood", "replay"} & set(self.phases)
        checks: list[tuple[str, tuple[str, bool, str]]] = [
            (
                "any",
                (
                    "no attacker failed",
                    not errors and self.error is None,
                    "; ".join(errors) or "none",
                ),
            ),
        ]
        checks += [("flood", v) for v in self._flood_verdicts(idle, slow, sent, dropped, late)]
        checks += [("replay", v) for v in self._replay_verdicts(attempts, refused)]
        checks.append(
            (
                "attacked",
                (
                    "no worker crashed, no coordinator restart",
                    not self.crashed and self.coordinator_restarts == 0,
                    f"crashed {self.crashed or 'none'}, restarts {self.coordinator_restarts}",
                ),
            )
        )
        out = [
            v
            for phase, v in checks
            if phase == "any" or phase in self.phases or (phase == "attacked" and attacked)
        ]
        if "poison" in self.phases:
            out += [(c, bool(m), f) for c, m, f in poison_phase.poison_verdicts(self.poison)]
        return out

    def _flood_verdicts(
        self, idle: dict[str, int], slow: dict[str, int], sent: int, dropped: int, late: list[str]
    ) -> list[tuple[str, bool, str]]:
        ratio = self.pace_ratio
        worst = max(self.rss_growth_mb.values(), default=0.0)
        return [
            (
                "idle connections ended by the target",
                idle["kept_open"] == 0 and idle["answered"] == 0,
                f"{idle['kept_open']} kept open, {idle['answered']} answered",
            ),
            (
                "slowloris cut by the handshake deadline",
                slow["kept_open"] == 0 and not late,
                f"{slow['kept_open']} kept open; over the deadline: {late or 'none'}",
            ),
            ("hostile frames dropped", sent == dropped, f"{dropped} of {sent}"),
            (
                f"pace during the flood >= {PACE_TARGET:.0%} of before",
                ratio is not None and ratio >= PACE_TARGET,
                "n/a" if ratio is None else f"{ratio:.2f}",
            ),
            (
                f"RSS growth <= {RSS_TARGET_MB:g} MB per process",
                bool(self.rss_growth_mb) and worst <= RSS_TARGET_MB,
                f"largest {worst:+.1f} MB",
            ),
            (
                "every worker in a completed group after the flood",
                self.n > 0 and self.workers_back == self.n,
                f"{self.workers_back} of {self.n}, {self.groups_after_flood} groups",
            ),
        ]

    def _replay_verdicts(self, attempts: int, refused: int) -> list[tuple[str, bool, str]]:
        return [
            (
                "replays and impersonations refused",
                attempts > 0 and refused == attempts,
                f"{refused} of {attempts}",
            ),
            (
                "Admin from a worker refused",
                self.admin_sent > 0
                and self.p_after == self.p_before
                and self.admin_refusal_events > 0,
                f"p {self.p_before} -> {self.p_after}, {self.admin_refusal_events} refusal events",
            ),
            (
                "groups complete after the replays",
                self.groups_after_replay > 0,
                f"{self.groups_after_replay} groups",
            ),
        ]

    @property
    def ok(self) -> bool:
        return all(met for _, met, _ in self.verdicts())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "pace_ratio": self.pace_ratio,
            "verdicts": [{"check": c, "met": m, "figures": f} for c, m, f in self.verdicts()],
            "ok": self.ok,
        }


def _sum(counters: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {
        k: 0 for k in ("refused", "cut", "kept_open", "answered", "connect_failed")
    }
    for c in counters:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


# -- the run -----------------------------------------------------------------------------------


def completed(db_path: Path, since: float = 0.0) -> list[tuple[float, list[int]]]:
    """(end time, members) of the groups completed after ``since``, read-only."""
    with rundb.reading(db_path) as conn:
        rows = conn.execute(
            "SELECT ended_at, members FROM groups WHERE status=? AND ended_at > ?",
            (GroupStatus.COMPLETED.value, since),
        ).fetchall()
    return [(float(r["ended_at"]), json.loads(r["members"])) for r in rows]


class _Watch:
    """Polls the run and samples RSS while a phase runs in a thread of its own."""

    def __init__(self, victim: Victim) -> None:
        self.victim = victim
        self.samples: dict[str, list[float]] = {}

    def rss(self) -> dict[str, float]:
        out = {}
        for name, pid in self.victim.processes():
            mb = rss_mb(pid)
            if mb is not None:
                out[name] = round(mb, 1)
        return out

    def wait(self, until: Callable[[], bool], timeout_s: float, *, sample: bool = False) -> bool:
        """Poll until ``until()`` or ``timeout_s``; True if it held."""
        deadline = time.monotonic() + timeout_s
        next_sample = 0.0
        for _ in range(int(timeout_s / POLL_S) + 2):
            self.victim.poll()
            if sample and time.monotonic() >= next_sample:
                for k, v in self.rss().items():
                    self.samples.setdefault(k, []).append(v)
                next_sample = time.monotonic() + SAMPLE_S
            if until():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return until()

    def run(self, work: Callable[[], object], bound_s: float, *, sample: bool = False) -> object:
        """``work()`` in a thread while this one polls the run; its result or exception."""
        return in_thread(
            work,
            "hostile-phase",
            lambda thread: self.wait(lambda: not thread.is_alive(), bound_s, sample=sample),
            f"an attack phase ran over its bound of {bound_s:.0f} s",
        )


def _flood_all(targets: list[Listener], plans: list[FloodPlan]) -> list[FloodCounts]:
    results: list[FloodCounts | None] = [None] * len(targets)

    def one(k: int) -> None:
        results[k] = flood(targets[k][0], plans[k])

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(len(targets))]
    for t in threads:
        t.start()
    for t, (target, _), plan in zip(threads, targets, plans, strict=True):
        t.join(plan.time_bound_s(target) + 15)
    return [
        r if r is not None else FloodCounts(t.name, t.deadline_s, error="did not finish")
        for r, (t, _) in zip(results, targets, strict=True)
    ]


def victim_of(opts: HostileOptions, run_dir: Path) -> Victim:
    """The run to attack: a lab (the synthetic workload, no dashboard) or a torchrun job of
    ``examples/train_digits.py``, on the topology's network, groups of the lab's default p."""
    topo = load_topology(opts.topology)
    caps = check(topo)
    ropts = RunOptions(workload="synthetic", seed=opts.seed, dashboard=False, log_level="WARNING")
    if opts.target is TargetKind.TORCHRUN:
        return JobVictim(topo, caps, run_dir, group_size=min(ropts.p, topo.n), steps=opts.steps)
    return LabVictim(LabRun(topo, caps, ropts, run_dir), run_dir)


def run_hostile(opts: HostileOptions) -> HostileReport:
    topo = load_topology(opts.topology)
    tag = "hostile" if opts.target is TargetKind.LAB else f"hostile-{opts.target.value}"
    run_dir = opts.run_dir or (REPO / "runs" / f"{tag}-{new_run_id()}")
    report = HostileReport(str(run_dir), topo.name, opts.to_dict(), opts.target.value, topo.n)
    report.phases = list(opts.phases)
    try:
        if {"flood", "replay"} & set(opts.phases):
            victim = victim_of(opts, run_dir)
            with victim:
                _attack(victim, opts, report)
                victim.poll()
                report.crashed = dict(victim.crashed)
                report.coordinator_restarts = victim.restarts
        if "poison" in opts.phases:
            report.poison = _poison(opts, run_dir)
    except KeyboardInterrupt:
        report.error = "interrupted"
    except Exception as exc:  # reported with what was measured so far
        log.exception("the hostile run failed")
        report.error = f"{type(exc).__name__}: {exc}"
    return report


def _poison(opts: HostileOptions, run_dir: Path) -> dict[str, Any]:
    """The poison phase: a lab run, or a torchrun job, of its own beside the attacked run's
    folder."""
    topo = load_topology(opts.topology)
    common = {
        "worker": opts.poisoner,
        "duration_s": opts.poison_duration_s,
        "start_wait_s": opts.start_wait_s,
    }
    where = run_dir.with_name(f"{run_dir.name}-poison")
    if opts.target is TargetKind.TORCHRUN:
        scale = opts.poison_scale or poison_phase.JOB_SCALE
        job = poison_phase.run_poison_job(
            topo, check(topo), where, scale=scale, steps=opts.steps, **common
        )
        return job.to_dict()
    scale = opts.poison_scale or poison_phase.DEFAULT_SCALE
    lab = poison_phase.run_poison(topo, check(topo), where, scale=scale, seed=opts.seed, **common)
    return lab.to_dict()


def _attack(victim: Victim, opts: HostileOptions, report: HostileReport) -> None:
    watch = _Watch(victim)
    db = victim.db_path

    def started() -> bool:
        return victim.published() and len(completed(db)) >= FIRST_GROUPS

    if not watch.wait(started, opts.start_wait_s):
        raise RuntimeError(f"fewer than {FIRST_GROUPS} groups within {opts.start_wait_s:g} s")
    desc = victim.describe()
    report.admin_identity = desc.admin_identity
    if "flood" in opts.phases:
        _flood_phase(watch, desc, opts, report)
    if "replay" in opts.phases:
        _replay_phase(watch, desc, opts, report)


def _flood_phase(
    watch: _Watch, desc: HostileTarget, opts: HostileOptions, report: HostileReport
) -> None:
    db = watch.victim.db_path
    t0 = time.time()
    watch.wait(lambda: time.time() >= t0 + opts.baseline_s, opts.baseline_s + 5)
    report.pace_before = round(pace([e for e, _ in completed(db, t0)], t0, time.time()), 2)
    targets = list(desc.listeners)
    per = split_evenly(opts.connections, len(targets))
    plans = [
        FloodPlan(c, opts.slowloris, opts.frames, opts.duration_s, opts.drip_s, opts.seed + k)
        for k, c in enumerate(per)
    ]
    report.rss_before_mb = watch.rss()
    f0 = time.time()
    bound = max(p.time_bound_s(t) for p, (t, _) in zip(plans, targets, strict=True)) + 30
    counts = watch.run(lambda: _flood_all(targets, plans), bound, sample=True)
    f1 = time.time()
    report.flood_s = round(f1 - f0, 1)
    report.flood = [c.to_dict() for c in counts]  # type: ignore[union-attr]
    report.pace_during = round(pace([e for e, _ in completed(db, f0)], f0, f1), 2)
    report.rss_growth_mb = rss_growth(report.rss_before_mb, watch.samples)

    def back() -> bool:
        groups = completed(db, f1)
        report.groups_after_flood = len(groups)
        report.workers_back = len({m for _, members in groups for m in members})
        return report.workers_back == desc.n

    if watch.wait(back, opts.recover_s):
        report.recovered_after_s = round(time.time() - f1, 1)


def _replay_phase(
    watch: _Watch, desc: HostileTarget, opts: HostileOptions, report: HostileReport
) -> None:
    db = watch.victim.db_path
    targets = list(desc.listeners)
    keys = desc.keys
    report.p_before, _ = admin_refused_in_db(db, 0.0)
    p = int(report.p_before or desc.p)
    r0 = time.time()
    replays = watch.run(
        lambda: replay_all(targets, keys, opts.replays, p, wait_s=3.0), 60 * opts.replays + 120
    )
    assert isinstance(replays, ReplayCounts)
    report.replay = replays.to_dict()
    new_p = 2 if p != 2 else 3
    report.admin_sent = int(
        watch.run(  # type: ignore[arg-type]
            lambda: in_netns(
                desc.coordinator.netns_pid,
                lambda: admin_from_worker(desc.coordinator, keys, opts.replays, new_p),
                110,
            ),
            120,
        )
    )
    watch.wait(lambda: False, 2.0)  # the coordinator writes its events
    report.p_after, report.admin_refusal_events = admin_refused_in_db(db, r0)
    r1 = time.time()

    def again() -> bool:
        report.groups_after_replay = len(completed(db, r1))
        return report.groups_after_replay >= FIRST_GROUPS

    watch.wait(again, opts.recover_s)


# -- output ------------------------------------------------------------------------------------


def print_report(r: HostileReport, console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # a log file: wide enough for the flood table's columns
            console = Console(width=TABLE_WIDTH)
    console.print(
        f"[bold]lab.hostile[/] on a {r.target} on {r.topology} ({r.n} workers), run {r.run_dir};"
        f" phases {', '.join(r.phases)}"
    )
    if "flood" in r.phases:
        _print_flood(r, console)
    if "replay" in r.phases:
        _print_replay(r, console)
    if "poison" in r.phases:
        poison_phase.print_poison(r.poison, console)
    v = Table(title="verdicts")
    v.add_column("check")
    v.add_column("met")
    v.add_column("figures")
    for check_, met, figures in r.verdicts():
        v.add_row(check_, "[green]yes[/]" if met else "[red]NO[/]", figures)
    console.print(v)
    if r.error:
        console.print(f"[red]error:[/] {r.error}")


def _print_flood(r: HostileReport, console: Console) -> None:
    t = Table(title="flood: pre-authentication connections per target")
    for col in (
        "target",
        "idle",
        "refused",
        "cut",
        "kept open",
        "slowloris",
        "cut",
        "longest s",
        "deadline s",
        "frames",
        "dropped",
    ):
        t.add_column(col, justify="left" if col == "target" else "right")
    for f in r.flood:
        idle, slow, fr = _sum([f["idle"]]), _sum([f["slowloris"]]), f["frames"] or {}
        t.add_row(
            f["target"],
            str(sum(f["idle"].values())),
            str(idle["refused"]),
            str(idle["cut"]),
            str(idle["kept_open"] + slow["kept_open"]),
            str(sum(f["slowloris"].values())),
            str(slow["cut"]),
            f"{max(f['idle_longest_s'], f['slowloris_longest_s']):.1f}",
            f"{f['deadline_s']:g}",
            str(sum(fr.get("sent", {}).values())),
            str(fr.get("dropped", 0)),
        )
    console.print(t)
    total = sum(sum(f["idle"].values()) + sum(f["slowloris"].values()) for f in r.flood) + sum(
        sum((f["frames"] or {}).get("sent", {}).values()) for f in r.flood
    )
    ratio = r.pace_ratio
    console.print(
        f"{total} connections in {r.flood_s:g} s; pace {r.pace_before:g} groups/10 s before,"
        f" {r.pace_during:g} during ({'n/a' if ratio is None else f'{ratio:.2f}'});"
        f" {r.groups_after_flood} groups after, every worker back in"
        f" {r.recovered_after_s if r.recovered_after_s is not None else 'never'} s"
    )
    m = Table(title="RSS (MB) before the flood, growth to its peak during it")
    m.add_column("process")
    m.add_column("before", justify="right")
    m.add_column("growth", justify="right")
    for key, g in sorted(r.rss_growth_mb.items()):
        m.add_row(key, f"{r.rss_before_mb.get(key, float('nan')):.1f}", f"{g:+.1f}")
    console.print(m)


def _print_replay(r: HostileReport, console: Console) -> None:
    rp = Table(title="replay and impersonation")
    for col in ("attack@target", "attempts", "refused", "kept open"):
        rp.add_column(col, justify="left" if col == "attack@target" else "right")
    for key, a in sorted(r.replay.get("attempts", {}).items()):
        rp.add_row(
            key,
            str(a),
            str(r.replay.get("refused", {}).get(key, 0)),
            str(r.replay.get("kept", {}).get(key, 0)),
        )
    rp.add_row(
        "admin-from-worker@coordinator",
        str(r.admin_sent),
        f"{r.admin_refusal_events} events",
        f"p {r.p_before} -> {r.p_after}",
    )
    console.print(rp)
    if r.admin_identity:
        console.print(f"who may administer the run: {r.admin_identity}")


def build_parser() -> argparse.ArgumentParser:
    d = HostileOptions()
    p = command_parser(
        "python -m lab.hostile",
        __doc__,
        epilog="exit status: 0 every target met; 1 a target missed or groups stopped; 2 bad"
        " options or not root; 3 the machine lacks what the topology needs",
    )
    p.add_argument(
        "--target",
        type=TargetKind,
        choices=list(TargetKind),
        default=d.target,
        help="what to attack: a lab, or a torchrun job of examples/train_digits.py (default: lab)",
    )
    add_topology_flag(p, "a topology name under topologies/ or a YAML path (default: default)")
    for flag, name, kind, what in (
        ("--connections", "connections", int, "idle pre-authentication connections in all targets"),
        ("--slowloris", "slowloris", int, "slowloris connections at once per target"),
        ("--drip", "drip_s", float, "seconds between a slowloris connection's bytes"),
        ("--frames", "frames", int, "connections with one hostile message, per target"),
        ("--duration", "duration_s", float, "seconds of the flood phase"),
        ("--baseline", "baseline_s", float, "seconds of pace measured before the flood"),
        ("--recover", "recover_s", float, "seconds allowed for groups to complete after a phase"),
        ("--replays", "replays", int, "tries of each replay or impersonation per target"),
        ("--poisoner", "poisoner", int, "the worker that runs lab.orchestrate.poisoner"),
        (
            "--poison-scale",
            "poison_scale",
            float,
            f"the poisoner's tamper per element, 0 for the target's: {poison_phase.DEFAULT_SCALE:g}"
            f" for a lab, {poison_phase.JOB_SCALE:g} for a torchrun job",
        ),
        ("--poison-duration", "poison_duration_s", float, "seconds of poisoning after a 1st group"),
    ):
        default = getattr(d, name)
        p.add_argument(flag, type=kind, default=default, help=f"{what} ({default:g})")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the run and the attacks")
    p.add_argument(
        "--steps",
        type=int,
        default=d.steps,
        help=f"a torchrun job's steps at most; it is stopped when the suite ends ({d.steps})",
    )
    p.add_argument(
        "--phases",
        type=lambda text: tuple(x.strip() for x in text.split(",") if x.strip()),
        default=d.phases,
        help=f"the phases to run, comma-separated, always in the order {','.join(d.phases)}; poison"
        " is a run (a lab, or a torchrun job) of its own, in the folder OUT-poison",
    )
    add_out_flag(p, "the run's folder (default runs/hostile-<run-id>, runs/hostile-torchrun-...)")
    add_json_flag(p, "the figures and verdicts")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if os.geteuid() != 0:
        print("error: lab.hostile builds a lab network: run it as root", file=sys.stderr)
        return 2
    try:
        opts = HostileOptions(
            target=args.target,
            topology=args.topology,
            connections=args.connections,
            slowloris=args.slowloris,
            frames=args.frames,
            drip_s=args.drip,
            duration_s=args.duration,
            baseline_s=args.baseline,
            recover_s=args.recover,
            replays=args.replays,
            seed=args.seed,
            run_dir=args.out,
            steps=args.steps,
            phases=args.phases,
            poisoner=args.poisoner,
            poison_scale=args.poison_scale,
            poison_duration_s=args.poison_duration,
        )
        if "poison" in opts.phases:
            n = load_topology(opts.topology).n
            poison_phase.poison_group_size(n)
            if opts.poisoner >= n:
                raise ValueError(f"--poisoner {opts.poisoner}: the topology has {n} workers")
        load_topology(opts.topology)
    except (ValueError, TopologyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 2 * opts.connections + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    try:
        report = run_hostile(opts)
    except PreflightError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    if write_json(args.json, report.to_dict()):
        print_report(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
