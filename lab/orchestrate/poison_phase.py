"""``lab.hostile``'s poison phase: a lab whose worker ``k`` is a poisoning relay, under the secret
check, and the counts that say whether any poisoned average got through.

The poisoner (``lab.orchestrate.poisoner``) must be in place from the start, so the phase is a
lab run of its own (:func:`run_poison`): the synthetic workload, ``check = "secret"``
(``crew.control.secretcheck``), groups of ``min(p, n - 1)`` (the lab's default ``p``) so that
every group leaves a worker out who may carry its data, and worker ``k`` started as
``python -m lab.orchestrate.poisoner --scale S`` (``LabRun``'s ``worker_modules``). It runs
``duration_s`` seconds from the first group that ends, then the lab stops and the counts are
read from what the run left:

* the run database's ``groups``: completed, abandoned by the secret check (``reason`` starting
  with :data:`SECRET_FAILED`), abandoned otherwise (the lab's stop ends open groups); the groups
  whose plan routed data through ``k`` while ``k`` was not a member (:func:`relayed_by`);
* the poisoner's log (``logs/w{k}.log``): the groups it tampered with and its tampered part
  count (``lab.orchestrate.poisoner.TAMPERED`` and ``DONE``);
* every worker's log: the synthetic workload verifies every average it applies exactly
  (``crew.train.synthetic.SyntheticTrainer.set_vector``) and logs each that is wrong at ERROR
  (:data:`WRONG_AVERAGE`): a poisoned average applied is one of those.

Targets (:meth:`PoisonReport.verdicts`): the poisoner tampered with at least one group (else
the phase proves nothing), no tampered or relayed group completed, the secret check abandoned
some, no worker applied a wrong average, groups completed after the first abandonment, and no
worker crashed.

Scale. The synthetic model's elements are integers of order 1000 (``||v||`` about ``640
sqrt(N)`` for ``N`` elements); the secret check's tolerance for a group of such vectors is
about ``0.5 sqrt(N)``, and ``r_g . delta`` is normal with standard deviation ``S sqrt(N)`` for a
tamper of ``S`` per element, so a group passes with probability about ``0.4 / S``: the default
``0.5`` of ``lab.orchestrate.poisoner`` (made for the weights of a small model) would pass most
of the time, :data:`DEFAULT_SCALE` (``1e4``, about 16 times a member's model norm) lets one in
about 25 000 tampered groups through, small enough for "0 applied" to be the target (measured
on 4 MB vectors: a deviation 680 to 28 000 times the secret tolerance). The public check's
float32 rounding of such a tamper stays about 1000 times below its tolerance, so what abandons
the groups is the secret check alone.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from crew.config import RunConfig
from crew.runtime import rundb
from crew.runtime.rundb import GroupStatus
from lab.net.preflight import Capabilities
from lab.orchestrate.runner import LabRun, RunOptions
from lab.spec.topology import TopologySpec

POISONER = "lab.orchestrate.poisoner"
DEFAULT_SCALE = 1e4
DEFAULT_WORKER = 0
SECRET_FAILED = "secret check failed"  # crew.control.secretcheck's abandon reasons
WRONG_AVERAGE = "the group's average is wrong"  # crew.train.synthetic's ERROR line
WINDOW_S = 10.0  # pace: groups completed per this many seconds
POLL_S = 0.5
JOB_SCALE = 0.5
"""The tamper per element against a torchrun job's MLP: of the order of its weights, so the
float32 sums it is added to keep their precision and the public check passes it; 1e4 would
leave a rounding error the public check catches before the secret check is asked."""
JOB_HIDDEN = 16384
"""The torchrun job's MLP width in the phase: 1.2 M parameters (4.7 MB), as large as the lab's
synthetic vector, so that plans route data through workers outside the group; the example's
default 128 (38 KB) goes straight between the members."""
_TAMPERED = re.compile(r"poisoner (\d+): tampered with group (\d+) revision \d+ \((\d+) parts")
_DONE = re.compile(r"poisoner: done, (\d+) parts tampered")


@dataclass(frozen=True)
class GroupRecord:
    """One row of the run's ``groups`` table, as the counts need it."""

    id: int
    members: tuple[int, ...]
    status: str
    reason: str
    plan: str | None
    ended_at: float | None


# -- pure: reading the records and counting -----------------------------------------------------


def relayed_by(plan_json: str | None, members: Sequence[int], k: int) -> bool:
    """Whether a group's plan (``GroupPlan.to_json``) routes data through ``k``, not a member:
    ``k`` is a route's root or on one of its reduce or broadcast edges."""
    if k in members or not plan_json:
        return False
    for start, stop, root, up, down in json.loads(plan_json).get("routes", []):
        if stop > start and (root == k or any(k in edge for edge in (*up, *down))):
            return True
    return False


def tampered_from_log(text: str, k: int) -> tuple[set[int], int]:
    """The groups poisoner ``k`` says it tampered with, and its tampered part count (its final
    total, or the last running count when it was stopped before it could say)."""
    groups: set[int] = set()
    parts = 0
    for m in _TAMPERED.finditer(text):
        if int(m.group(1)) == k:
            groups.add(int(m.group(2)))
            parts = max(parts, int(m.group(3)))
    for m in _DONE.finditer(text):
        parts = max(parts, int(m.group(1)))
    return groups, parts


def wrong_averages(texts: Iterable[str]) -> int:
    """Averages the synthetic workload found wrong after applying them, over worker logs."""
    return sum(t.count(WRONG_AVERAGE) for t in texts)


@dataclass
class PoisonReport:
    run_dir: str = ""
    worker: int = DEFAULT_WORKER
    scale: float = DEFAULT_SCALE
    p: int = 0
    duration_s: float = 0.0
    groups: int = 0
    completed: int = 0
    abandoned_secret: int = 0  # abandoned with a "secret check failed" reason
    abandoned_other: int = 0  # e.g. open when the lab stopped
    relayed: int = 0  # groups whose plan routed data through the poisoner, not a member
    tampered: int = 0  # groups the poisoner says it tampered with
    tampered_parts: int = 0
    tampered_abandoned_secret: int = 0  # ... of them abandoned by the secret check
    poisoned_commits: int = 0  # tampered or relayed groups that completed (target 0)
    wrong_averages: int = 0  # applied averages the synthetic rule found wrong (target 0)
    # Whether the workers verify every average they apply (the synthetic workload); a torchrun
    # job's MLP cannot, and then a tampered group committed is the poisoned average applied.
    exact_check: bool = True
    completed_after_detection: int = 0  # completed after the first secret-check abandonment
    pace: float = 0.0  # groups completed per WINDOW_S over the phase
    crashed: dict[int, int] = field(default_factory=dict)
    error: str | None = None

    def count(
        self,
        records: Sequence[GroupRecord],
        poisoner_log: str,
        worker_logs: Iterable[str],
        window: tuple[float, float],
    ) -> None:
        """Fill the counts from the group records, the poisoner's log and every worker's log;
        ``window`` is the phase's (start, end), over which the pace is taken."""
        k = self.worker
        tampered, self.tampered_parts = tampered_from_log(poisoner_log, k)
        done = [r for r in records if r.status == GroupStatus.COMPLETED.value]
        secret = [
            r
            for r in records
            if r.status == GroupStatus.ABANDONED.value and r.reason.startswith(SECRET_FAILED)
        ]
        secret_ids = {r.id for r in secret}
        relayed = {r.id for r in records if relayed_by(r.plan, r.members, k)}
        self.groups = len(records)
        self.completed = len(done)
        self.abandoned_secret = len(secret)
        self.abandoned_other = sum(
            1 for r in records if r.status == GroupStatus.ABANDONED.value
        ) - len(secret)
        self.relayed = len(relayed)
        self.tampered = len(tampered)
        self.tampered_abandoned_secret = len(tampered & secret_ids)
        self.poisoned_commits = sum(1 for r in done if r.id in tampered | relayed)
        self.wrong_averages = wrong_averages(worker_logs)
        first = min((r.ended_at or 0.0 for r in secret), default=None)
        self.completed_after_detection = (
            0 if first is None else sum(1 for r in done if (r.ended_at or 0.0) > first)
        )
        start, end = window
        if end > start:
            inside = sum(1 for r in done if r.ended_at is not None and start < r.ended_at <= end)
            self.pace = round(inside * WINDOW_S / (end - start), 2)

    def verdicts(self) -> list[tuple[str, bool, str]]:
        """(check, met, figures) for every target of the phase."""
        return [
            ("poison phase ran", self.error is None, self.error or "yes"),
            (
                "the poisoner tampered (else the phase proves nothing)",
                self.tampered > 0,
                f"{self.tampered} groups, {self.tampered_parts} parts; {self.relayed} relayed",
            ),
            (
                "tampered groups abandoned by the secret check",
                self.abandoned_secret > 0 and self.poisoned_commits == 0,
                f"{self.tampered_abandoned_secret} of {self.tampered} tampered"
                f" ({self.abandoned_secret} in all, {self.abandoned_other} otherwise);"
                f" {self.poisoned_commits} committed",
            ),
            (
                "no poisoned average applied",
                self.wrong_averages == 0 if self.exact_check else self.poisoned_commits == 0,
                f"{self.wrong_averages} wrong averages applied"
                if self.exact_check
                else f"{self.poisoned_commits} tampered groups committed (the MLP's averages"
                " have no exact check)",
            ),
            (
                "groups kept completing",
                self.completed_after_detection > 0,
                f"{self.completed} completed, {self.completed_after_detection} after the first"
                f" abandonment; {self.pace:g} per {WINDOW_S:g} s",
            ),
            (
                "no worker crashed in the poison phase",
                not self.crashed,
                f"crashed {self.crashed or 'none'}",
            ),
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "verdicts": [{"check": c, "met": m, "figures": f} for c, m, f in self.verdicts()]
        }


def poison_verdicts(poison: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """The poison phase's verdicts as its report recorded them; a phase that did not report
    fails."""
    found = [(v["check"], bool(v["met"]), v["figures"]) for v in poison.get("verdicts", [])]
    return found or [("poison phase ran", False, poison.get("error") or "no report")]


# -- the run -----------------------------------------------------------------------------------


def poison_group_size(n: int) -> int:
    """The lab's default p, less than n: every group leaves out a worker who may carry it."""
    if n < 3:
        raise ValueError(f"the poison phase needs 3 workers or more, the topology has {n}")
    return min(int(RunConfig.default("p")), n - 1)


def read_groups(db_path: Path) -> list[GroupRecord]:
    with rundb.reading(db_path) as conn:
        rows = conn.execute(
            "SELECT id, members, status, reason, plan, ended_at FROM groups ORDER BY id"
        ).fetchall()
    return [
        GroupRecord(
            int(r["id"]),
            tuple(json.loads(r["members"])),
            str(r["status"]),
            r["reason"] or "",
            r["plan"],
            None if r["ended_at"] is None else float(r["ended_at"]),
        )
        for r in rows
    ]


def _ended(db_path: Path) -> bool:
    with rundb.reading(db_path) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM groups WHERE status != ?", (GroupStatus.OPEN.value,)
        ).fetchone()
    return int(row[0]) > 0


def _wait(poll: Callable[[], None], until: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / POLL_S) + 2):
        poll()
        if until():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return bool(until())


def run_poison(
    topo: TopologySpec,
    caps: Capabilities,
    run_dir: Path,
    *,
    worker: int = DEFAULT_WORKER,
    scale: float = DEFAULT_SCALE,
    duration_s: float = 60.0,
    start_wait_s: float = 300.0,
    seed: int = 0,
    extra_options: Mapping[str, Any] | None = None,
) -> PoisonReport:
    """The phase on its own lab run in ``run_dir``; its counts, or what failed."""
    report = _new_report(topo, run_dir, worker, scale, duration_s)
    ropts = RunOptions(
        p=report.p,
        workload="synthetic",
        check="secret",
        seed=seed,
        dashboard=False,
        log_level="WARNING",
        **dict(extra_options or {}),
    )
    lab = LabRun(
        topo, caps, ropts, run_dir, worker_modules={worker: (POISONER, "--scale", f"{scale:g}")}
    )
    return _observe(report, lab, lab.db_path, run_dir / "logs", topo.n, start_wait_s)


def _new_report(
    topo: TopologySpec, run_dir: Path, worker: int, scale: float, duration_s: float
) -> PoisonReport:
    if not 0 <= worker < topo.n:
        raise ValueError(f"poisoner {worker}: the topology has workers 0..{topo.n - 1}")
    return PoisonReport(str(run_dir), worker, scale, poison_group_size(topo.n), duration_s)


def _observe(
    report: PoisonReport, run: Any, db_path: Path, log_dir: Path, n: int, start_wait_s: float
) -> PoisonReport:
    """Start ``run`` (a ``LabRun`` or a torchrun ``JobVictim``: a context manager with
    ``poll()`` and ``crashed``), keep it for the phase's window, stop it, and count from the
    database and the workers' logs ``log_dir/w<i>.log`` it left."""
    window = (0.0, 0.0)
    try:
        with run:
            window = _watch(run.poll, db_path, report.duration_s, start_wait_s)
            report.crashed = dict(run.crashed)
    except Exception as exc:  # reported with what the run left
        report.error = f"{type(exc).__name__}: {exc}"
    logs = {i: log_dir / f"w{i}.log" for i in range(n)}
    texts = {i: f.read_text(errors="replace") for i, f in logs.items() if f.exists()}
    if db_path.exists():
        report.count(read_groups(db_path), texts.get(report.worker, ""), texts.values(), window)
    return report


def _watch(
    poll: Callable[[], None], db_path: Path, duration_s: float, start_wait_s: float
) -> tuple[float, float]:
    """Wait for the first group to end, then ``duration_s``: the phase's window."""
    if not _wait(poll, lambda: db_path.exists() and _ended(db_path), start_wait_s):
        raise RuntimeError(f"no group ended within {start_wait_s:g} s")
    t0 = time.time()
    _wait(poll, lambda: time.time() >= t0 + duration_s, duration_s + 5)
    poll()
    return t0, time.time()


def run_poison_job(
    topo: TopologySpec,
    caps: Capabilities,
    job_dir: Path,
    *,
    worker: int = DEFAULT_WORKER,
    scale: float = JOB_SCALE,
    duration_s: float = 60.0,
    start_wait_s: float = 300.0,
    steps: int = 1_000_000,
) -> PoisonReport:
    """The phase against a torchrun job (``lab.orchestrate.hostile_target.JobVictim``) whose
    rank ``worker`` runs the example script under the poisoner
    (``python -m lab.orchestrate.poisoner --script``); its counts, or what failed."""
    from lab.orchestrate.hostile_target import JobVictim  # it imports the lab's runner too

    report = replace(_new_report(topo, job_dir, worker, scale, duration_s), exact_check=False)
    wrapper = (POISONER, "--scale", f"{scale:g}", "--script")
    job = JobVictim(
        topo,
        caps,
        job_dir,
        group_size=report.p,
        steps=steps,
        wrappers={worker: wrapper},
        script_args=("--hidden", str(JOB_HIDDEN)),
    )
    return _observe(report, job, job.db_path, job_dir, topo.n, start_wait_s)


def print_poison(poison: dict[str, Any], console: Console) -> None:
    if not poison:
        return
    pt = Table(title=f"poison: worker {poison['worker']} relays with a tamper, secret check")
    pt.add_column("count")
    pt.add_column("groups", justify="right")
    for label, key in (
        ("groups formed", "groups"),
        ("completed", "completed"),
        ("abandoned by the secret check", "abandoned_secret"),
        ("abandoned otherwise (open at the end)", "abandoned_other"),
        ("routed through the poisoner (plans)", "relayed"),
        ("tampered with (the poisoner's log)", "tampered"),
        ("tampered parts", "tampered_parts"),
        ("tampered and committed", "poisoned_commits"),
        ("poisoned averages applied", "wrong_averages"),
        ("completed after the first abandonment", "completed_after_detection"),
    ):
        pt.add_row(label, str(poison.get(key, 0)))
    console.print(pt)
    console.print(
        f"groups of {poison['p']}, tamper {poison['scale']:g} a element,"
        f" {poison['duration_s']:g} s, {poison['pace']:g} groups/10 s; run {poison['run_dir']}"
    )
    if not poison.get("tampered"):
        console.print(
            "[bold red]the poisoner tampered with no group: the poison phase proves nothing[/]"
        )
