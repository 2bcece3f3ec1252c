"""The synthetic workload: its vectors, exact verification of averages the real reduce engine
forms, its checkpoint, and a worker that never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from config_kit import loopback_config
from reduce_kit import MEMBERS, ROUTES, TOTAL, N, Net, assign_routes

from crew.config import ConfigError
from crew.config_checks import check_training
from crew.train.synthetic import (
    Contribution,
    SyntheticError,
    SyntheticRule,
    SyntheticTrainer,
    elements_for,
)
from crew.train.workloads import Workload, make_trainer, num_params

REPO = Path(__file__).resolve().parents[1]
STEPS = {0: 3, 1: 7, 2: 4}  # each member's step when it offers


def _reduce(rule: SyntheticRule, weights: tuple[float, ...], group: int = 5) -> np.ndarray:
    """Members 0, 1, 2 average their step vectors through the real ReduceEngine (path and
    tree routes, parts of 256 elements); member 0's result."""
    net = Net()
    assign = assign_routes(ROUTES, TOTAL, group, MEMBERS, weights, part_elems=256)
    net.run(assign, {m: rule.vector(m, STEPS[m]) for m in MEMBERS})
    result = net.engines[0].finish(group)
    assert result is not None
    return result


def test_each_step_gives_a_new_vector_with_its_header() -> None:
    rule = SyntheticRule(seed=1, n=N, size=TOTAL)
    a, b = rule.vector(2, 5), rule.vector(2, 6)
    assert a.dtype == np.float32 and a.shape == (TOTAL,)
    assert np.count_nonzero(a[2 * N :] != b[2 * N :]) > TOTAL // 2
    assert a[2] == 6 and a[N + 2] == 1 and np.count_nonzero(a[: 2 * N]) == 2
    assert np.array_equal(a, SyntheticRule(seed=1, n=N, size=TOTAL).vector(2, 5))
    body = a[2 * N :]
    assert np.array_equal(body, np.round(body)) and np.abs(body).max() <= 2048


def test_an_average_with_power_of_two_weights_is_bit_exact() -> None:
    rule = SyntheticRule(seed=2, n=N, size=TOTAL)
    result = _reduce(rule, (0.25, 0.25, 0.5))
    verdict = rule.verify(result, MEMBERS)
    assert verdict.ok, verdict.reason
    assert verdict.error == 0.0
    assert verdict.members == tuple(
        Contribution(m, STEPS[m], w) for m, w in zip(MEMBERS, (0.25, 0.25, 0.5), strict=True)
    )


def test_an_average_with_thirds_stays_within_the_float32_bound() -> None:
    rule = SyntheticRule(seed=3, n=N, size=TOTAL)
    result = _reduce(rule, (1 / 3, 1 / 3, 1 / 3))
    verdict = rule.verify(result, MEMBERS)
    assert verdict.ok, verdict.reason
    assert verdict.ratio <= 1.0
    assert verdict.tolerance < 1e-3  # tight: a unit change is thousands of tolerances


@pytest.mark.parametrize(
    "corrupt",
    [
        "one_element",
        "swapped_parts",
        "stale_step",
        "missing_member",
        "wrong_group",
        "nan",
    ],
)
def test_wrong_averages_are_caught(corrupt: str) -> None:
    rule = SyntheticRule(seed=4, n=N, size=TOTAL)
    weights = (0.25, 0.25, 0.5)
    result = _reduce(rule, weights).copy()
    members: tuple[int, ...] = MEMBERS
    if corrupt == "one_element":
        result[1234] += 1.0
    elif corrupt == "swapped_parts":
        result[512:768], result[1024:1280] = result[1024:1280].copy(), result[512:768].copy()
    elif corrupt == "stale_step":  # member 1's body from the step before the one its header names
        result[2 * N :] += np.float32(0.25) * (
            rule.vector(1, STEPS[1] - 1)[2 * N :] - rule.vector(1, STEPS[1])[2 * N :]
        )
    elif corrupt == "missing_member":
        result[2 * N :] -= np.float32(0.5) * rule.vector(2, STEPS[2])[2 * N :]
    elif corrupt == "wrong_group":
        members = (0, 1, 3)
    else:
        result[2999] = np.nan
    verdict = rule.verify(result, members)
    assert not verdict.ok
    assert verdict.reason


def test_a_forged_header_is_rejected() -> None:
    rule = SyntheticRule(seed=5, n=N, size=TOTAL)
    result = _reduce(rule, (0.25, 0.25, 0.5)).copy()
    result[1] = 0.25 * 7.5  # not a whole step
    assert "not a whole step" in rule.verify(result).reason
    result[1] = 0.0
    result[N + 1] = 0.0  # member 1 vanished: the weights no longer sum to 1
    assert "sum to" in rule.verify(result).reason


def test_sizes_and_bad_parameters_get_clear_errors() -> None:
    assert elements_for(4, 32) == 1_000_000
    assert num_params(Workload.SYNTHETIC, model_mb=0.5, n=8) == 125_000
    with pytest.raises(SyntheticError, match="need at least 65"):
        elements_for(0.0001, 32)
    with pytest.raises(SyntheticError, match="model_mb"):
        elements_for(float("nan"), 2)
    with pytest.raises(SyntheticError, match="worker"):
        SyntheticRule(0, 4, 100).vector(4, 0)
    assert "float32" in SyntheticRule(0, 4, 100).verify(np.zeros(100)).reason
    for changed, named in (
        ({"sync": "diloco", "local_steps": 4}, "sync"),
        ({"overlap": True}, "overlap: the synthetic workload"),
    ):
        with pytest.raises(ConfigError, match=named):
            check_training(**(SYNTHETIC_TRAINING | changed))


SYNTHETIC_TRAINING = {
    "compress": "none",
    "nonblocking": False,
    "scheme": "crew",
    "sync": "every-step",
    "workload": "synthetic",
    "local_steps": 1,
    "outer_lr": 0.7,
    "outer_momentum": 0.9,
}


def test_the_trainer_counts_verdicts_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    rule = SyntheticRule(seed=6, n=N, size=TOTAL)
    trainers = {m: SyntheticTrainer(rule, m) for m in MEMBERS}
    for m, t in trainers.items():
        for _ in range(STEPS[m]):
            assert t.step() == 0.0
        assert np.array_equal(t.get_vector(), rule.vector(m, STEPS[m]))
    result = _reduce(rule, (0.25, 0.25, 0.5))
    assert trainers[0].set_vector(result, MEMBERS).ok  # type: ignore[union-attr]
    bad = result.copy()
    bad[100] += 3
    assert not trainers[0].set_vector(bad, MEMBERS).ok  # type: ignore[union-attr]
    assert trainers[0].evaluate() == (pytest.approx(1e30), 0.5)
    assert trainers[0].step() == pytest.approx(1e30) and trainers[0].step() == 0.0
    path = tmp_path / "w0.pt"
    trainers[0].save(path)
    again = SyntheticTrainer(rule, 0)
    again.load(path)
    assert again.iteration == STEPS[0] + 2
    assert np.array_equal(again.get_vector(), rule.vector(0, STEPS[0] + 2))
    with pytest.raises(SyntheticError, match="worker 0"):
        SyntheticTrainer(rule, 1).load(path)


NO_TORCH = """
import json, sys, time
started = time.perf_counter()
from crew.config import RunConfig
from crew.runtime.worker import Worker
worker = Worker(RunConfig.load(sys.argv[1]), 1)
built = time.perf_counter() - started
trainer = worker.trainer
trainer.step()
worker.delay.padding(0.0)
trainer.set_vector(trainer.get_vector(), None)
print(json.dumps({
    "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
    "kind": type(trainer).__name__,
    "size": trainer.num_params,
    "verified": trainer.verified,
    "built_s": built,
}))
"""


def test_a_synthetic_worker_builds_and_steps_without_importing_torch(tmp_path: Path) -> None:
    cfg = loopback_config(
        tmp_path,
        3,
        run_id="synthetic",
        run_num=5,
        workload="synthetic",
        model_mb=0.5,
        stragglers=("2", "2", "2"),
    )
    cfg.save(tmp_path / "config.json")
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH, str(tmp_path / "config.json")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=True,
    )
    seen = json.loads(out.stdout)
    assert seen["torch"] == []
    assert seen["kind"] == "SyntheticTrainer"
    assert seen["size"] == 125_000
    # a single worker's own vector is the average of the group {1} with weight 1
    assert seen["verified"] == 1


def test_make_trainer_builds_the_synthetic_trainer() -> None:
    t = make_trainer(
        Workload.SYNTHETIC,
        n=4,
        index=3,
        partition=None,  # type: ignore[arg-type]
        seed=0,
        lr=0.05,
        batch_size=32,
        local_steps=1,
        cache_dir=None,
        model_mb=0.001,
    )
    assert isinstance(t, SyntheticTrainer) and t.num_params == 250


def test_synthetic_workers_reduce_on_loopback_and_every_average_verifies(tmp_path: Path) -> None:
    """The real coordinator and four worker processes on 127.0.0.1 (no root): groups of three
    (weights of a third, not exact in binary) complete, and every worker checked every
    average it took."""
    from lab.studies.workerstart import LoopbackRun

    with LoopbackRun(
        tmp_path / "run", 4, 3, workload="synthetic", model_mb=0.5, eval_every_s=0.2
    ) as run:
        done = run.wait_completed(8, timeout_s=90.0)
        rows = run.query(
            "SELECT worker, MAX(iteration), MAX(loss), MIN(accuracy), COUNT(accuracy)"
            " FROM iterations GROUP BY worker"
        )
    assert done >= 8
    assert len(rows) == 4
    for worker, iteration, worst_ratio, share, evaluations in rows:
        assert iteration >= 2, worker
        assert worst_ratio <= 1.0, worker  # every average within its float32 bound
        assert evaluations >= 1 and share == 1.0, worker  # and all of them verified
    for log in (tmp_path / "run").glob("w*.log"):
        assert "average is wrong" not in log.read_text()


def test_a_coordinator_with_helpers_plans_each_group_over_its_members_and_that_many(
    tmp_path: Path,
) -> None:
    """--helpers 1 on five loopback workers, every link 10 Mbit/s in the planner's view: over
    every worker, crew routes a 2 MB group of two through up to all three others; with the
    limit, each plan routes through the group's members and one other worker only."""
    import json

    from crew.plan.routes import Route
    from lab.studies.workerstart import LoopbackRun

    bw = tuple(tuple(0.0 if i == j else 10.0 for j in range(5)) for i in range(5))
    with LoopbackRun(
        tmp_path / "run", 5, 2, workload="synthetic", model_mb=2, helpers=1, bw_mbit=bw
    ) as run:
        # Eight groups: a plan may leave its helper out (the links it shares with the group in
        # flight), so one group alone could route through none.
        done = run.wait_completed(8, timeout_s=90.0)
        plans = run.query("SELECT members, plan FROM groups WHERE status = 'completed'")
    assert done >= 8
    helpers_used = set()
    for members_json, plan_json in plans:
        members = set(json.loads(members_json))
        used = set().union(*(Route.from_list(r).nodes() for r in json.loads(plan_json)["routes"]))
        assert members <= used and len(used - members) <= 1, (members, used)
        helpers_used |= used - members
    assert helpers_used  # crew did route through a helper: the limit is what held it to one
