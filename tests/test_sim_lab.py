"""The lab-side glue of the simulator: topology YAML, scenarios, the paper study, lab.bench."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from crew.sim.engine import FaultKind
from lab.net.shaping import QUEUE_EXTRA_S
from lab.report.simagree import lab_executor, simulate_op
from lab.simrun import main as simrun_main
from lab.simrun import trace_faults
from lab.spec.ratetraces import load_link_traces
from lab.spec.scenario import load_scenario
from lab.spec.simulated import scenario_faults, sim_topology
from lab.spec.topology import load_topology
from lab.studies.simpaper import link_failures

ROOT = Path(__file__).resolve().parents[1]


def test_topology_yaml_becomes_the_simulators_view() -> None:
    spec = load_topology(ROOT / "topologies" / "aws-8-regions.yaml")
    topo = sim_topology(spec)
    assert topo.n == spec.n
    assert topo.rate_mbit[0, 1] == spec.link(0, 1).rate_mbit
    assert topo.delay_ms[1, 0] == spec.link(1, 0).delay_ms
    assert topo.rate_mbit[2, 2] == 0.0
    assert topo.stragglers == tuple(w.straggler for w in spec.workers)


def test_scenario_steps_become_faults() -> None:
    sc = load_scenario(ROOT / "scenarios" / "worker-crash.yaml", 8)
    faults, skipped = scenario_faults(sc)
    assert [(f.at, f.kind, f.a) for f in faults] == [(30.0, FaultKind.KILL_WORKER, 1)]
    assert not skipped


def test_paper_failures_use_the_lab_macro() -> None:
    faults = link_failures(12, 5, seed=3, start=5.0, until=45.0)
    assert len({(f.a, f.b) for f in faults}) == 5
    assert all(f.kind is FaultKind.CUT_LINK and 5.0 <= f.at <= 45.0 for f in faults)
    assert link_failures(12, 0, seed=3, start=5.0, until=45.0) == []


def test_simrun_on_a_lab_topology_writes_a_run(tmp_path: Path) -> None:
    run = tmp_path / "r"
    argv = ["--topology", str(ROOT / "topologies" / "aws-8-regions.yaml"), "--p", "3"]
    argv += ["--duration", "10", "--size-mb", "4", "--out", str(run)]
    assert simrun_main(argv) == 0
    import sqlite3

    conn = sqlite3.connect(run / "lab.db")
    try:
        # Worker states carry the simulated clock, as groups do: a member becomes "reducing"
        # at its group's formation, not at the moment the records were written after the run.
        formed = dict(conn.execute("SELECT id, formed_at FROM groups"))
        grouped = conn.execute(
            "SELECT group_id, t FROM worker_states WHERE state = 'reducing'"
        ).fetchall()
        t0, t1 = conn.execute("SELECT MIN(t), MAX(t) FROM worker_states").fetchone()
    finally:
        conn.close()
    assert len(grouped) > 10
    assert all(t == pytest.approx(formed[gid], abs=1e-6) for gid, t in grouped)
    assert t1 - t0 > 5.0  # spread over the simulated 10 s, not bunched at the write


DRIFTING = """
name: drifting
defaults: {mbit: 40}
rate_trace: {generate: {spread: 0.3, tau_s: 5, duration_s: 30, seed: 4}}
clouds: [{name: a}, {name: b}, {name: c}]
"""


def test_a_drifting_topology_steps_its_links_in_the_simulator_as_in_the_lab(
    tmp_path: Path,
) -> None:
    topo = tmp_path / "drifting.yaml"
    topo.write_text(DRIFTING, encoding="utf-8")
    _, traces = load_link_traces(topo)
    faults = trace_faults(traces, 20.0)
    assert {(f.a, f.b) for f in faults} == set(traces) and len(traces) == 6
    assert all(f.kind is FaultKind.SET_RATE and 0 <= f.at <= 20 for f in faults)
    for f in faults:  # each step is the trace's rate at the second it is applied
        assert f.mbit == traces[(f.a, f.b)].rate_at(f.at)
    for capacity in ("configured", "oracle"):
        run = tmp_path / capacity
        argv = ["--topology", str(topo), "--p", "2", "--duration", "20", "--size-mb", "1"]
        assert simrun_main([*argv, "--capacity", capacity, "--out", str(run)]) == 0
        assert (run / "lab.db").is_file()


def test_a_bench_op_alone_takes_the_planners_time() -> None:
    # preduce on 3 members at 8 Mbit/s (goodput 0.95): the p2p LP's X + Y.
    rate = np.full((3, 3), 8.0)
    np.fill_diagonal(rate, 0.0)
    t = simulate_op("preduce", rate, np.zeros((3, 3)), (0, 1, 2), 3_000_000, 0)
    assert abs(t - 2 * (1_000_000 / (1e6 * 0.95))) < 1e-6
    assert json.dumps(t)  # a plain float


def test_the_lab_executor_adds_the_shaped_queue_per_hop() -> None:
    # The same preduce op with the lab's executor model: two hops (scatter, broadcast), each
    # 50 ms later (lab.net.shaping.QUEUE_EXTRA_S); 3 MB over 3 links is far below the host
    # CPU's 2 cores / 12 CPU s per GB, so the CPU does not bind.
    rate = np.full((3, 3), 8.0)
    np.fill_diagonal(rate, 0.0)
    ex = lab_executor(12.0)
    assert ex.hop_queue_s == QUEUE_EXTRA_S == 0.05 and ex.cpu_s_per_byte == 12e-9
    t = simulate_op("preduce", rate, np.zeros((3, 3)), (0, 1, 2), 3_000_000, 0, ex)
    assert abs(t - 2 * (1_000_000 / (1e6 * 0.95) + 0.05)) < 1e-6
    assert lab_executor(12.0, host=False).host_cores == 0.0


def test_older_train_runs_are_ack_clocked_below_the_rate_where_the_queue_floor_binds() -> None:
    # Below LAB_ACK_CLOCK_MBIT the lab's leaf queue is QUEUE_MIN_PKTS frames, longer than
    # QUEUE_EXTRA_S; above it, QUEUE_EXTRA_S at the rate. A run's own database says whether
    # its ACKs waited in that queue (the default None: see the step-time test below).
    import inspect

    from lab.net import shaping
    from lab.report.simagree import LAB_ACK_CLOCK_MBIT
    from lab.studies.simcompare import train_compare

    assert LAB_ACK_CLOCK_MBIT == pytest.approx(15.5, abs=0.05)
    assert shaping.queue_limit(LAB_ACK_CLOCK_MBIT - 0.1) == shaping.QUEUE_MIN_PKTS
    assert shaping.queue_limit(LAB_ACK_CLOCK_MBIT + 0.5) > shaping.QUEUE_MIN_PKTS
    assert inspect.signature(train_compare).parameters["ack_clock_mbit"].default is None
    assert lab_executor(12.0, ack_clock_mbit=LAB_ACK_CLOCK_MBIT).ack_clock_mbit == (
        LAB_ACK_CLOCK_MBIT
    )


def test_the_hop_queue_can_be_set_and_a_bad_one_is_refused(capsys) -> None:
    # Paced connections keep HTB's queue far below 50 ms, so simcompare takes --hop-queue-ms.
    rate = np.full((3, 3), 8.0)
    np.fill_diagonal(rate, 0.0)
    ex = lab_executor(12.0, hop_queue_s=0.0)
    t = simulate_op("preduce", rate, np.zeros((3, 3)), (0, 1, 2), 3_000_000, 0, ex)
    assert abs(t - 2 * (1_000_000 / (1e6 * 0.95))) < 1e-6
    from lab.report.simagree import PACED_HOP_QUEUE_S, hop_queue_for
    from lab.studies.simcompare import main as simcompare_main

    assert hop_queue_for({"pace": 0.95}) == PACED_HOP_QUEUE_S < QUEUE_EXTRA_S
    assert hop_queue_for({"pace": 0}) == hop_queue_for({}) == QUEUE_EXTRA_S
    import inspect

    from lab.studies.simcompare import TRAIN_HOP_QUEUE_S, train_compare

    default = inspect.signature(train_compare).parameters["hop_queue_s"].default
    assert default == TRAIN_HOP_QUEUE_S < QUEUE_EXTRA_S

    with pytest.raises(SystemExit) as refused:
        simcompare_main(["x.json", "--topology", "t.yaml", "--hop-queue-ms", "-5"])
    assert refused.value.code == 2
    assert "--hop-queue-ms must be finite and >= 0, got -5" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        simcompare_main(["--train", "RUN", "--control-ms", "nan"])
    assert refused.value.code == 2
    assert "--control-ms must be finite and >= 0, got nan" in capsys.readouterr().err


def test_drawn_hop_waits_replace_the_constant_and_bad_ones_are_refused(
    tmp_path: Path,
    capsys,  # noqa: ANN001
) -> None:
    # The op above, each of its two hops (scatter, broadcast) waiting a drawn 0.5 s instead of
    # the constant queue, which the executor then leaves at 0.
    rate = np.full((3, 3), 8.0)
    np.fill_diagonal(rate, 0.0)
    ex = lab_executor(12.0, hop_queue_s=0.05, hop_waits=(0.5,), hop_wait_seed=1)
    assert ex.hop_queue_s == 0.0
    t = simulate_op("preduce", rate, np.zeros((3, 3)), (0, 1, 2), 3_000_000, 0, ex)
    assert t == pytest.approx(2 * (1_000_000 / (1e6 * 0.95) + 0.5))
    from lab.studies.simcompare import main as simcompare_main

    with pytest.raises(SystemExit) as refused:
        simcompare_main(["--train", "RUN", "--hop-waits", "w.json", "--hop-queue-ms", "5"])
    assert refused.value.code == 2 and "not both" in capsys.readouterr().err
    bad = tmp_path / "waits.json"
    bad.write_text('{"hop_waits_s": []}')
    with pytest.raises(SystemExit) as refused:
        simcompare_main(["--train", "RUN", "--hop-waits", str(bad)])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and f"--hop-waits: {bad}: needs a non-empty list" in err
    with pytest.raises(SystemExit) as refused:  # more than one draw needs waits to draw
        simcompare_main(["--train", "RUN", "--draws", "3"])
    assert refused.value.code == 2 and "--draws must be 1, or more with" in capsys.readouterr().err


def test_several_draws_compare_the_median_simulation(tmp_path: Path) -> None:
    from lab.studies.simcompare import train_compare

    _tiny_run(tmp_path)
    heard: list[str] = []
    c = train_compare(tmp_path, hop_waits=(0.0, 0.5, 2.0), draws=3, progress=heard.append)
    assert heard == [f"{tmp_path}: simulation {k} of 3" for k in (1, 2, 3)]
    assert len(c["sim_draws"]) == 3 and c["sim_draws"] == sorted(c["sim_draws"])
    assert c["sim_mean"] == c["sim_draws"][1] and c["hop_waits"] == 3
    with pytest.raises(ValueError, match="draws"):  # nothing to draw from
        train_compare(tmp_path, draws=2)


def _tiny_run(tmp_path: Path) -> None:
    """A run database of preduce on small.yaml, p = 2: one completed group of a 40-byte
    vector, worker 0 training 1.0 -> 1.3 and worker 1 2.0 -> 2.5, stopped at 20 s."""
    import yaml

    from crew.runtime.rundb import connect

    topo = yaml.safe_load((ROOT / "topologies" / "small.yaml").read_text())
    conn = connect(tmp_path / "lab.db")
    with conn:
        for k, v in {
            "topology": json.dumps(topo),
            "scheme": "preduce",
            "p": "2",
            "options": json.dumps({"seed": 3}),
            "ended_at": "20.0",
        }.items():
            conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (k, v))
        plan = {"elems": [5, 5, 0]}
        conn.execute(
            "INSERT INTO groups (id, scheme, members, weights, formed_at, status, plan)"
            " VALUES (1, 'preduce', '[0, 1]', '[0.5, 0.5]', 1.0, 'completed', ?)",
            (json.dumps(plan),),
        )
        for t, w, state in [(1.0, 0, "training"), (1.3, 0, "ready"), (2.0, 1, "training")]:
            conn.execute(
                "INSERT INTO worker_states (t, worker, state) VALUES (?, ?, ?)", (t, w, state)
            )
        conn.execute("INSERT INTO worker_states (t, worker, state) VALUES (2.5, 1, 'ready')")
    conn.close()


def test_train_compare_reads_the_step_time_from_worker_states(tmp_path: Path) -> None:
    # The run database stores states as strings: comparing them with the WorkerState member
    # (a plain Enum) matched nothing, and every training comparison simulated a 0 ms step.
    from crew.runtime.rundb import connect
    from lab.studies.simcompare import _run_facts

    _tiny_run(tmp_path)
    facts = _run_facts(tmp_path)
    assert facts["compute_s"] == pytest.approx(0.4)  # median of 0.3 and 0.5
    assert facts["size_bytes"] == 40 and facts["seed"] == 3 and facts["rounds"] == [1, 1, 0]
    # No ack_queue: a run whose ACKs queued behind the data, which simcompare ACK-clocks.
    assert facts["acks_direct"] is False
    from lab.net.shaping import ACK_QUEUE_DIRECT

    with connect(tmp_path / "lab.db") as conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('ack_queue', ?)", (ACK_QUEUE_DIRECT,))
    assert _run_facts(tmp_path)["acks_direct"] is True
    # A run whose iterations had a floor: the simulated steps take at least that long.
    with connect(tmp_path / "lab.db") as conn:
        conn.execute(
            "UPDATE meta SET value = ? WHERE key = 'options'",
            (json.dumps({"seed": 3, "min_iteration_s": 2.0}),),
        )
    assert _run_facts(tmp_path)["compute_s"] == 2.0
    # No recorded plan costs: nothing to replay, and asking for the lab's plan times says so.
    assert facts["plan_times"] == ()
    from lab.studies.simcompare import train_compare

    with pytest.raises(SystemExit, match="no recorded plan times"):
        train_compare(tmp_path, lab_plan_times=True)
    # The coordinator's record of each group's first plan, replayed in group order.
    costs = {
        "10": {"source": "inline", "blocked_ms": 80.0},
        "9": {"source": "ahead", "blocked_ms": 2.5},
    }
    with connect(tmp_path / "lab.db") as conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('plan_costs', ?)", (json.dumps(costs),))
    assert _run_facts(tmp_path)["plan_times"] == pytest.approx((0.0025, 0.080))


def test_state_split_is_seconds_per_completed_round_in_each_state(tmp_path: Path) -> None:
    from crew.runtime.rundb import connect
    from lab.studies.simcompare import state_split

    conn = connect(tmp_path / "lab.db")
    with conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('ended_at', '10.0')")
        for gid, members in [(1, "[0, 1]"), (2, "[0, 1]")]:
            conn.execute(
                "INSERT INTO groups (id, scheme, members, weights, formed_at, status)"
                " VALUES (?, 'crew', ?, '[0.5, 0.5]', 1.0, 'completed')",
                (gid, members),
            )
        conn.execute(  # an abandoned group's members are no rounds
            "INSERT INTO groups (id, scheme, members, weights, formed_at, status)"
            " VALUES (3, 'crew', '[0, 1]', '[0.5, 0.5]', 1.0, 'abandoned')"
        )
        rows = [  # worker 0: 2 s training, 1 s ready, 3 s reducing, then training to the end
            (0.0, 0, "training"),
            (2.0, 0, "ready"),
            (3.0, 0, "reducing"),
            (6.0, 0, "training"),
            # worker 1: 4 s ready, 5 s reducing, then dead (not counted) to the end
            (1.0, 1, "ready"),
            (5.0, 1, "reducing"),
            (10.0, 1, "dead"),
        ]
        conn.executemany("INSERT INTO worker_states (t, worker, state) VALUES (?, ?, ?)", rows)
    conn.close()
    split = state_split(tmp_path / "lab.db")  # four completed rounds
    assert split == pytest.approx({"training": 6 / 4, "ready": 5 / 4, "reducing": 8 / 4})


def test_the_window_ends_at_the_coordinators_stop_not_the_teardown(tmp_path: Path) -> None:
    from crew.runtime.rundb import connect
    from lab.studies.simcompare import trained_until

    conn = connect(tmp_path / "lab.db")
    with conn:  # the lab's teardown took 18 s after the coordinator stopped at 46
        conn.execute("INSERT INTO meta (key, value) VALUES ('ended_at', '64.0')")
        conn.execute(
            "INSERT INTO groups (id, scheme, members, weights, formed_at, ended_at, status)"
            " VALUES (1, 'crew', '[0, 1]', '[0.5, 0.5]', 40.0, 45.0, 'completed')"
        )
        conn.execute("INSERT INTO worker_states (t, worker, state) VALUES (46.0, 0, 'training')")
    assert trained_until(conn) == 46.0
    with conn:
        conn.execute("DELETE FROM worker_states")
    assert trained_until(conn) == 45.0  # no state: the last group's end
    with conn:
        conn.execute("DELETE FROM groups")
    assert trained_until(conn) == 64.0  # nothing at all: the recorded end
    conn.close()


def test_turnaround_is_a_rounds_time_training_less_its_compute(tmp_path: Path) -> None:
    from crew.runtime.rundb import connect
    from lab.spec.topology import parse_topology
    from lab.studies.simcompare import turnaround

    # Worker 0 has no straggler profile: each iteration's compute is compute_s = 0.5 s.
    # Worker 1's profile draws exactly 1 s for every iteration.
    clouds = [{"name": "a"}, {"name": "b", "straggler": "4@1:1"}]
    spec = parse_topology({"name": "t", "defaults": {"mbit": 10}, "clouds": clouds})
    conn = connect(tmp_path / "lab.db")
    with conn:
        rows = [
            (0.0, 0, "training", 0),  # its first iteration holds start-up: not counted
            (0.9, 0, "ready", 1),
            (1.0, 0, "reducing", 1),
            (2.0, 0, "training", 1),  # the group ended
            (2.7, 0, "ready", 2),  # 0.7 s training, 0.5 s of it compute: 0.2 s
            (3.0, 0, "reducing", 2),
            (4.0, 0, "training", 2),
            (4.6, 0, "ready", 3),  # 0.1 s
            (0.0, 1, "training", 0),
            (1.1, 1, "ready", 1),
            (1.2, 1, "reducing", 1),
            (2.0, 1, "training", 1),
            (3.3, 1, "ready", 2),  # 1.3 s training, 1 s of it its sample: 0.3 s
        ]
        conn.executemany(
            "INSERT INTO worker_states (t, worker, state, iteration) VALUES (?, ?, ?, ?)", rows
        )
    conn.close()
    assert turnaround(tmp_path / "lab.db", spec, 0, 0.5) == pytest.approx(0.2)
    # A real step longer than the sample counts instead: (-0.5 - 0.6 + 0.1) / 3
    assert turnaround(tmp_path / "lab.db", spec, 0, 1.2) == pytest.approx(-1.0 / 3)


def test_compare_pairs_pooled_rounds_with_the_trace_of_each_round() -> None:
    # lab.bench --rounds 2: the pooled ops are the trace's twice over, in round order.
    from lab.report.simagree import compare

    topo = ROOT / "topologies" / "small.yaml"
    trace = [[0, 1], [1, 2]]
    one = {"trace": trace, "size_bytes": 400_000, "seed": 0, "pace": 0.95}
    emulated = {"preduce": {"op_times_s": [0.5, 0.6], "cpu_s_per_gb": None}}
    single = compare(one | {"schemes": emulated}, topo, plan_time=False)["preduce"]
    pooled_ops = {"preduce": {"op_times_s": [0.5, 0.6, 0.5, 0.6], "cpu_s_per_gb": None}}
    pooled = compare(one | {"round_count": 2, "schemes": pooled_ops}, topo, plan_time=False)
    pooled = pooled["preduce"]
    assert pooled == single  # the same ops, each simulated against its own group (no wall time)


def test_train_compare_reports_the_runs_host_load_per_link_gb(tmp_path: Path) -> None:
    from crew.runtime.rundb import connect
    from lab.orchestrate.hostbusy import HostBusy
    from lab.studies.simcompare import train_compare, train_report

    _tiny_run(tmp_path)
    c = train_compare(tmp_path)
    assert c["host_cpu_s_per_link_gb"] is None  # recorded without the window
    assert "the lab's host while training" not in train_report(c)
    with connect(tmp_path / "lab.db") as conn:
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('host_busy', ?)",
            (HostBusy(1.0, 11.0, busy_s=15.0, cores=2).to_json(),),
        )
        conn.executemany(
            "INSERT INTO link_samples (t, src, dst, tx_bytes, mbit) VALUES (?, ?, ?, ?, 1.0)",
            [(1.0, 0, 1, 0), (11.0, 0, 1, 300_000_000), (12.0, 0, 1, 900_000_000)],
        )
    c = train_compare(tmp_path, cpu_s_per_gb=50.0)
    assert c["host_busy_share"] == pytest.approx(0.75)  # 15 CPU s over 10 s on 2 cores
    assert c["host_cpu_s_per_link_gb"] == pytest.approx(50.0)  # 15 CPU s over 0.3 GB
    assert (
        "the lab's host while training: 0.75 busy, 50.0 CPU s per link GB"
        " (simulated with 50.0: --cpu-s-per-gb)" in train_report(c)
    )


def test_train_compare_plans_over_the_runs_helpers(tmp_path: Path) -> None:
    from crew.runtime.rundb import connect
    from lab.studies.simcompare import _run_facts, train_compare, train_report

    _tiny_run(tmp_path)
    assert _run_facts(tmp_path)["helpers"] == -1  # a run recorded without the option
    with connect(tmp_path / "lab.db") as conn:
        conn.execute(
            "UPDATE meta SET value = ? WHERE key = 'options'",
            (json.dumps({"seed": 3, "helpers": 1}),),
        )
    c = train_compare(tmp_path)
    assert c["helpers"] == 1
    assert "members + 1 helpers" in train_report(c)
