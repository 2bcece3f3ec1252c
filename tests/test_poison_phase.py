"""lab.hostile's poison phase without root: reading plans and logs, counting, the verdicts, and
how the lab starts a worker as the poisoner (the live run is
tests/integration/test_hostile_poison.py)."""

from __future__ import annotations

import io
import logging
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from crew.plan.schemes import plan_group
from crew.train.synthetic import SyntheticRule, SyntheticTrainer
from lab.net.preflight import Capabilities
from lab.orchestrate import poison_phase as pp
from lab.orchestrate import poisoner
from lab.orchestrate.runner import REPO, LabRun, RunOptions
from lab.spec.topology import load_topology

CAPS = Capabilities(root=True, tools={}, htb=True, netem=False, iptables_statistic=True)
K = 2  # the poisoner in these records


def _small_plan(members: tuple[int, ...]) -> str:
    topo = load_topology(REPO / "topologies" / "small.yaml")
    return plan_group("crew", topo.bw_matrix(), members, 100_000).to_json()


def test_a_plan_of_two_of_three_workers_is_relayed_by_the_third() -> None:
    plan = _small_plan((0, 1))
    assert pp.relayed_by(plan, (0, 1), 2)
    assert not pp.relayed_by(plan, (0, 1), 0)  # a member carries its own group
    assert not pp.relayed_by(None, (0, 1), 2)  # a group never planned
    assert not pp.relayed_by(_small_plan((0, 1, 2)), (0, 1, 2), 2)


def test_the_poisoners_log_lines_are_read_back() -> None:
    text = "\n".join(
        [
            poisoner.TAMPERED.format(me=K, group=4, rev=0, parts=3),
            poisoner.TAMPERED.format(me=K, group=4, rev=1, parts=5),
            poisoner.TAMPERED.format(me=K, group=9, rev=0, parts=8),
            poisoner.TAMPERED.format(me=1, group=11, rev=0, parts=99),  # another poisoner
        ]
    )
    assert pp.tampered_from_log(text, K) == ({4, 9}, 8)
    done = text + "\n" + poisoner.DONE.format(parts=12)
    assert pp.tampered_from_log(done, K) == ({4, 9}, 12)
    assert pp.tampered_from_log("", K) == (set(), 0)


def test_a_wrong_average_the_synthetic_workload_applies_is_counted(caplog) -> None:
    rule = SyntheticRule(n=3, size=64, seed=1)
    good = 0.5 * rule.vector(0, 0).astype(np.float64) + 0.5 * rule.vector(1, 0)
    trainer = SyntheticTrainer(rule, 0)
    with caplog.at_level(logging.ERROR):
        assert trainer.set_vector(good.astype(np.float32), (0, 1)).ok
    assert pp.wrong_averages([caplog.text]) == 0
    with caplog.at_level(logging.ERROR):
        assert not trainer.set_vector((good + 5.0).astype(np.float32), (0, 1)).ok
    assert pp.wrong_averages([caplog.text]) == 1
    assert pp.wrong_averages([caplog.text, caplog.text]) == 2


def _records() -> list[pp.GroupRecord]:
    relayed = _small_plan((0, 1))
    secret = "secret check failed: deviation 3e+04 is 1e+05x the tolerance"
    return [
        pp.GroupRecord(1, (0, 2), "completed", "", _small_plan((0, 2)), 10.0),
        pp.GroupRecord(2, (0, 1), "abandoned", secret, relayed, 11.0),
        pp.GroupRecord(3, (1, 2), "completed", "", _small_plan((1, 2)), 12.0),
        pp.GroupRecord(4, (0, 1), "abandoned", secret, relayed, 13.0),
        pp.GroupRecord(5, (0, 2), "completed", "", _small_plan((0, 2)), 14.0),
        pp.GroupRecord(6, (0, 1), "abandoned", "the lab stopped", relayed, 15.0),
    ]


def _log(groups: tuple[int, ...]) -> str:
    return "\n".join(
        poisoner.TAMPERED.format(me=K, group=g, rev=0, parts=4 * (i + 1))
        for i, g in enumerate(groups)
    )


def _counted(records: list[pp.GroupRecord], log: str, worker_logs: tuple[str, ...] = ()):
    r = pp.PoisonReport("runs/x-poison", worker=K, scale=1e4, p=2, duration_s=10.0)
    r.count(records, log, worker_logs, (5.0, 15.0))
    return r


def test_a_poisoned_run_whose_tampers_were_all_caught_passes() -> None:
    r = _counted(_records(), _log((2, 4, 6)))
    assert (r.groups, r.completed, r.abandoned_secret, r.abandoned_other) == (6, 3, 2, 1)
    assert (r.relayed, r.tampered, r.tampered_parts, r.tampered_abandoned_secret) == (3, 3, 12, 2)
    assert (r.poisoned_commits, r.wrong_averages, r.completed_after_detection) == (0, 0, 2)
    assert r.pace == pytest.approx(3.0)  # 3 groups in (5, 15]
    assert [c for c, met, _ in r.verdicts() if not met] == []


def test_each_missed_poison_target_fails_its_verdict() -> None:
    def missed(r: pp.PoisonReport) -> list[str]:
        return [c for c, met, _ in r.verdicts() if not met]

    # A tampered group that completed: the secret check let a poisoned average through.
    committed = _records()
    committed[1] = replace(committed[1], status="completed", reason="")
    r = _counted(committed, _log((2, 4)))
    assert r.poisoned_commits == 1
    assert missed(r) == ["tampered groups abandoned by the secret check"]
    # Without an exact check of each average (a torchrun job's MLP), that commit is the
    # poisoned average applied.
    assert missed(replace(r, exact_check=False)) == [
        "tampered groups abandoned by the secret check",
        "no poisoned average applied",
    ]
    # The poisoner carried nothing: the phase proves nothing.
    honest = [rec for rec in _records() if rec.members != (0, 1)]
    r = _counted(honest, "")
    assert missed(r)[0] == "the poisoner tampered (else the phase proves nothing)"
    # A worker applied an average the synthetic rule found wrong.
    r = _counted(_records(), _log((2,)), (f"ERROR worker 1: {pp.WRONG_AVERAGE}: element 9",))
    assert missed(r) == ["no poisoned average applied"]
    # Nothing completed once the poisoning was found out.
    stalled = [rec for rec in _records() if rec.id < 3]
    assert missed(_counted(stalled, _log((2,)))) == ["groups kept completing"]
    assert missed(replace(_counted(_records(), _log((2,))), crashed={K: 1})) == [
        "no worker crashed in the poison phase"
    ]


def test_lab_hostile_takes_the_poison_verdicts_from_the_report() -> None:
    good = _counted(_records(), _log((2, 4))).to_dict()
    assert all(met for _, met, _ in pp.poison_verdicts(good)) and pp.poison_verdicts(good)
    assert pp.poison_verdicts({}) == [("poison phase ran", False, "no report")]


def test_the_printed_poison_table_warns_when_nothing_was_tampered() -> None:
    out = io.StringIO()
    pp.print_poison(_counted(_records(), _log((2, 4))).to_dict(), Console(file=out, width=160))
    assert "tampered and committed" in out.getvalue() and "proves nothing" not in out.getvalue()
    out = io.StringIO()
    pp.print_poison(_counted(_records(), "").to_dict(), Console(file=out, width=160))
    assert "proves nothing" in out.getvalue()


def test_groups_leave_a_worker_out_for_the_poisoner_to_carry() -> None:
    assert pp.poison_group_size(3) == 2
    assert pp.poison_group_size(8) == 3  # the lab's default p
    with pytest.raises(ValueError):
        pp.poison_group_size(2)


class _Net:
    def __init__(self) -> None:
        self.argv: dict[int, list[str]] = {}

    def popen(self, i: int, argv: list[str], **_: Any) -> subprocess.Popen[bytes]:
        self.argv[i] = argv
        return subprocess.Popen(["true"])


def test_the_lab_starts_the_named_worker_as_another_module(tmp_path: Path) -> None:
    topo = load_topology(REPO / "topologies" / "small.yaml")
    lab = LabRun(
        topo,
        CAPS,
        RunOptions(),
        tmp_path / "run",
        worker_modules={1: (pp.POISONER, "--scale", "7")},
    )
    (tmp_path / "run" / "logs").mkdir(parents=True)
    lab.net = _Net()  # type: ignore[assignment]
    try:
        for i in range(topo.n):
            lab.start_worker(i)
        argv = lab.net.argv  # type: ignore[attr-defined]
        assert argv[0][argv[0].index("-m") + 1] == "crew.runtime.worker"
        assert argv[1][argv[1].index("-m") + 1] == pp.POISONER
        assert argv[1][argv[1].index("--id") + 1] == "1" and "--scale" in argv[1]
        assert "--scale" not in argv[2]
    finally:
        for proc in lab.workers.values():
            proc.wait(timeout=30)
        for fh in lab._logs:
            fh.close()
    with pytest.raises(ValueError):
        LabRun(topo, CAPS, RunOptions(), tmp_path / "r2", worker_modules={3: (pp.POISONER,)})
