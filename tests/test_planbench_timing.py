"""lab.studies.planbench timing: the per-group planning figures and the replay of a bench run's
groups
through the coordinator's planning. No root: the run is a real RunDB with completed groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lifecycle_kit import make_cfg

from crew.config import Scheme
from crew.runtime.planahead import PLAN_COSTS_META, PlanCost, PlanSource, costs_json
from crew.runtime.rundb import GroupStatus, RunDB
from lab.studies import planbench

HETERO = [
    [0.0, 19.8, 18.6, 38.4, 45.6],
    [18.0, 0.0, 52.2, 32.4, 109.2],
    [17.4, 55.8, 0.0, 55.8, 38.4],
    [19.2, 48.0, 27.0, 0.0, 32.4],
    [41.4, 22.8, 27.6, 27.6, 0.0],
]
GROUPS = [(0, 1, 2, 3), (1, 2, 3, 4), (0, 2, 3, 4)]
OPS = [0.9, 0.8, 0.7]


def bench_run(tmp_path: Path, warmup: int = 0, costs: dict[int, PlanCost] | None = None) -> Path:
    """A lab.bench run folder of GROUPS with OPS, after ``warmup`` untimed groups of all five;
    ``costs``: the planning costs its coordinator recorded (none: a run from before them)."""
    run = tmp_path / "crew"
    run.mkdir()
    extra = {"bench": True, "size_elems": 500_000, "warmup": warmup}
    cfg = make_cfg(n=5, p=4, bw=HETERO, extra=extra)
    cfg.save(run / "config.json")
    db = RunDB(run / "lab.db")
    groups = [(0, 1, 2, 3, 4)] * warmup + GROUPS
    ops = [5.0] * warmup + OPS
    for gid, (g, op) in enumerate(zip(groups, ops, strict=True), start=1):
        db.add_closed_group(
            group_id=gid,
            scheme=Scheme.CREW,
            members=g,
            weights=[1 / len(g)] * len(g),
            formed_at=10.0 * gid,
            started_at=10.0 * gid,
            ended_at=10.0 * gid + op,
            status=GroupStatus.COMPLETED,
        )
    if costs is not None:
        db.set_meta({PLAN_COSTS_META: costs_json(costs)})
    db.close()
    return run / "lab.db"


def test_timing_prints_every_mode_and_the_share(tmp_path: Path, capsys) -> None:
    db = bench_run(tmp_path)
    argv = [
        "timing",
        "--sizes",
        "8",
        "--reps",
        "3",
        "--db",
        str(db),
        "--replay-passes",
        "2",
        "--json",
        "-",
    ]
    assert planbench.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    row = out["timing"]["8"]
    for mode in ("lp_cold", "cold", "warm", "cached"):
        assert 0 < row[mode]["median_ms"] <= row[mode]["p90_ms"]
    # a cached plan skips the route LP: it cannot take longer than the cold LP alone plus
    # the rest of the group's planning
    assert row["cached"]["median_ms"] < row["cold"]["median_ms"]
    rep = out["replay"]
    assert rep["groups"] == 3 and rep["n"] == 5 and rep["passes"] == 2
    assert rep["group_median_s"] == pytest.approx(0.8)
    assert any("% of the median op" in line for line in out["share"])
    assert any(line.startswith("n=8 random matrices, cold") for line in out["share"])


def test_replay_leaves_out_the_warmup_groups(tmp_path: Path) -> None:
    """The warm-up groups are no ops: neither their planning nor their (long) times count."""
    rep = planbench.replay(bench_run(tmp_path, warmup=2), passes=2)
    assert rep["groups"] == 3 and rep["passes"] == 2
    assert rep["group_median_s"] == pytest.approx(0.8)


def test_replay_reports_the_planning_waits_the_run_recorded(tmp_path: Path) -> None:
    """The coordinator's own record (crew.runtime.planahead) of the timed groups (ids 3..5
    after 2 warm-up groups) is summarised next to the replay; a run without one says so."""
    costs = {
        1: PlanCost((0, 1, 2, 3, 4), PlanSource.INLINE, 0.5),  # warm-up: left out
        2: PlanCost((0, 1, 2, 3, 4), PlanSource.AHEAD, 0.4),
        3: PlanCost(GROUPS[0], PlanSource.WAITED, 0.012),
        4: PlanCost(GROUPS[1], PlanSource.AHEAD, 0.0001),
        5: PlanCost(GROUPS[2], PlanSource.INLINE, 0.030),
    }
    rep = planbench.replay(bench_run(tmp_path, warmup=2, costs=costs), passes=1)
    assert rep["recorded"]["median_ms"] == pytest.approx(12.0)
    assert rep["recorded"]["ahead"] == 2
    line = [s for s in planbench.share_lines({}, None, rep) if s.startswith("recorded")]
    assert line and "median 12.00 ms" in line[0] and "2 of 3 planned ahead" in line[0]
    (tmp_path / "old").mkdir()
    old = planbench.replay(bench_run(tmp_path / "old"), passes=1)
    assert old["recorded"] is None
    assert any("recorded no planning costs" in s for s in planbench.share_lines({}, None, old))


def test_replay_passes_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--replay-passes: must be >= 1"):
        planbench.replay(bench_run(tmp_path), passes=0)


def test_replay_refuses_a_run_without_groups(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    make_cfg(n=5, p=4, bw=HETERO).save(run / "config.json")
    RunDB(run / "lab.db").close()
    with pytest.raises(SystemExit, match="no completed groups"):
        planbench.replay(run / "lab.db")
