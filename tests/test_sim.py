"""The flow-level simulator (crew.sim): hand-timed small runs, and invariants on random seeds."""

from __future__ import annotations

import itertools
import json
import sqlite3
from dataclasses import replace

import numpy as np
import pytest
from sim_kit import uniform

from crew.plan.candidates import CandidateError, candidates, plan_on_candidates, planner_over
from crew.plan.routes import Route, validate_routes
from crew.plan.schemes import plan_group
from crew.sim.__main__ import main as sim_main
from crew.sim.engine import (
    LARGE_PLAN_ROUNDS,
    Fault,
    FaultKind,
    PlanDelay,
    SimConfig,
    Simulation,
    default_plan_rounds,
)
from crew.sim.network import ExecutorModel, LinkQueues, NetworkError, RouteTimer, part_bytes
from crew.sim.record import Recorder
from crew.sim.topogen import SimTopology, generate

MB = 1_000_000


def _run(topo: SimTopology, **kw):  # noqa: ANN202
    cfg = SimConfig(**({"goodput": 1.0, "seed": 1} | kw))
    return Simulation(topo, cfg).run()


def test_two_workers_timed_by_hand_preduce() -> None:
    # 8 Mbit/s = 1 MB/s each way, 4 MB model, both ready at t=1. Each worker aggregates half:
    # preduce scatters 2 MB each way (2 s) then broadcasts 2 MB (2 s): both end at t=5; the
    # next iteration readies them at 6, done at 10.
    res = _run(uniform(2), scheme="preduce", p=2, size_bytes=4 * MB, duration_s=12.0)
    assert [(round(a, 9), round(b, 9)) for _, a, b in res.group_times[:2]] == [
        (1.0, 5.0),
        (6.0, 10.0),
    ]
    assert res.rounds == [2, 2]


def test_two_workers_timed_by_hand_crew() -> None:
    # Same run with crew. The route LP's optimum is degenerate here: ONE route rooted at worker
    # 0 (links 1->0 and 0->1 carry the whole 4 MB each) and two half-vector stars both give
    # T_bw = 4 s. crew takes the stars on such a tie (schemes._star_on_tie), and they finish
    # as planned: each root holds its own half, so broadcast parts follow scatter parts with
    # no relay wait, and the group ends at 1 + 4 s, like preduce. The single-root plan would
    # end one part time later (the root forwards the last 500,000 B part only once it has it).
    res = _run(uniform(2), scheme="crew", p=2, size_bytes=4 * MB, duration_s=12.0)
    expect = [(1.0, 5.0), (6.0, 10.0)]
    got = [(a, b) for _, a, b in res.group_times[:2]]
    assert np.allclose(got, expect, atol=1e-9), got
    assert res.rounds == [2, 2]


def test_three_workers_timed_by_hand() -> None:
    # n=3, p=2, crew, 1 MB/s links, 4 MB. All ready at t=1; FIFO takes {0, 1}. crew's LP puts
    # half the vector on worker 2 (a non-member), whose links carry 2 MB each way, and splits
    # the other half between 0 and 1 (link 0->1 carries S1 + S0 = 2 MB): 2 s of link time.
    # Worker 2 can broadcast a part only once it arrived from both: the last part of its
    # block leaves it one part after 2 s. The executor cuts that 2 MB route into 8 parts
    # (crew.control.assignment.route_part_elems: 62,500 elements, below the run's quarter
    # block of 333,332 bytes and the 256 KiB cap): 250,000 bytes.
    assert part_bytes(4 * MB, 3) == 333_332
    part = 250_000
    res = _run(uniform(3), scheme="crew", p=2, size_bytes=4 * MB, duration_s=7.0)
    first_end = 1.0 + 2.0 + part / MB
    # Group 2: worker 2 (queued since t=1) and worker 0 (ready one second after group 1).
    second_start = first_end + 1.0
    expect = [(1.0, first_end), (second_start, second_start + 2.0 + part / MB)]
    got = [(a, b) for _, a, b in res.group_times[:2]]
    assert np.allclose(got, expect, atol=1e-5), got
    assert res.rounds == [2, 1, 1]


def test_per_hop_queue_delays_every_hop_of_a_store_and_forward_op() -> None:
    # The two-worker preduce case with a 50 ms standing queue per hop: scatter arrives at
    # 3.05, the broadcast at 5.10; the next round readies at 6.10 and ends at 10.20.
    ex = ExecutorModel(hop_queue_s=0.05)
    res = _run(uniform(2), scheme="preduce", p=2, size_bytes=4 * MB, duration_s=12.0, executor=ex)
    got = [(a, b) for _, a, b in res.group_times[:2]]
    assert np.allclose(got, [(1.0, 5.1), (6.1, 10.2)], atol=1e-9), got


def test_a_one_value_hop_wait_sample_times_as_that_constant_does() -> None:
    # The case above, with the 50 ms drawn from a sample that holds only 50 ms.
    ex = ExecutorModel(hop_waits=(0.05,), hop_wait_seed=7)
    res = _run(uniform(2), scheme="preduce", p=2, size_bytes=4 * MB, duration_s=12.0, executor=ex)
    got = [(a, b) for _, a, b in res.group_times[:2]]
    assert np.allclose(got, [(1.0, 5.1), (6.1, 10.2)], atol=1e-9), got
    assert "per-hop wait drawn from 1 (median 50.0 ms" in ex.describe()


def test_hop_waits_are_drawn_from_the_sample_seeded() -> None:
    # One 1 MB job a call on a 1 MB/s link: it ends 1 s after it is queued, and arrives 0 or
    # 2 s after that, as the seeded draws from (0, 2) say; the same seed draws the same waits.
    rate = np.full((2, 2), 8.0)  # 8 Mbit/s = 1 MB/s

    def arrivals(seed: int) -> list[float]:
        q = LinkQueues(rate, executor=ExecutorModel(hop_waits=(0.0, 2.0), hop_wait_seed=seed))
        return [
            q.arrival(0, 1, 10.0 * k, q.queue(0, 1, MB, 10.0 * k)) - 10.0 * k for k in range(40)
        ]

    a = arrivals(3)
    assert set(a) == {1.0, 3.0}
    assert a == arrivals(3) and a != arrivals(4)


def test_a_negative_hop_wait_never_arrives_before_its_job_was_queued() -> None:
    # A frame through faster than its rate (HTB's burst) has a negative wait beyond its
    # serialisation; one that would arrive before it was sent arrives as it was queued.
    q = LinkQueues(np.full((2, 2), 8.0), executor=ExecutorModel(hop_waits=(-0.25,)))
    assert q.arrival(0, 1, 5.0, q.queue(0, 1, MB, 5.0)) == pytest.approx(5.75)
    assert q.arrival(0, 1, 9.0, q.queue(0, 1, MB / 10, 9.0)) == 9.0


def test_bad_hop_waits_are_refused() -> None:
    with pytest.raises(NetworkError, match="not both"):
        ExecutorModel(hop_queue_s=0.05, hop_waits=(0.01,))
    with pytest.raises(NetworkError, match="hop_waits"):
        ExecutorModel(hop_waits=(0.01, float("nan")))


@pytest.mark.parametrize(
    ("executor", "expect", "described"),
    [
        # 0.3 s of control messages per revision: the first group ends at 5.3, the next one
        # readies at 6.3 and ends at 10.6.
        (ExecutorModel(control_s=0.3), [(1.0, 5.3), (6.3, 10.6)], "control 300 ms per revision"),
        # 0.2 s of turnaround per round: ready at 1.2, the group ends at 5.2, the next readies
        # at 6.4 and ends at 10.4.
        (ExecutorModel(turnaround_s=0.2), [(1.2, 5.2), (6.4, 10.4)], "turnaround 200 ms per round"),
    ],
)
def test_control_latencies_delay_the_two_worker_case_by_hand(executor, expect, described) -> None:
    # The two-worker preduce case: 4 s per op at 1 MB/s, each iteration 1 s.
    res = _run(
        uniform(2), scheme="preduce", p=2, size_bytes=4 * MB, duration_s=12.0, executor=executor
    )
    got = [(a, b) for _, a, b in res.group_times[:2]]
    assert np.allclose(got, expect, atol=1e-9), got
    assert described in executor.describe()


@pytest.mark.parametrize("name", ["control", "turnaround"])
def test_a_bad_control_latency_is_refused(name) -> None:
    with pytest.raises(NetworkError, match=f"{name}_s"):
        ExecutorModel(**{f"{name}_s": float("inf")})
    with pytest.raises(SystemExit) as refused:
        sim_main(["--n", "4", f"--{name}-ms", "-1"])
    assert refused.value.code == 2


def _timed_plans(n: int, plan_s: float, duration_s: float):  # noqa: ANN202
    """The n-worker preduce case (p = 2, 4 MB at 1 MB/s) with a planner clock that advances
    ``plan_s`` per reading (a plan reads it twice: every plan takes ``plan_s``)."""
    cfg = SimConfig(
        scheme="preduce",
        p=2,
        size_bytes=4 * MB,
        duration_s=duration_s,
        goodput=1.0,
        seed=1,
        plan_delay=PlanDelay.MEASURED,
    )
    sim = Simulation(uniform(n), cfg)
    ticks = itertools.count()
    sim.life.clock = lambda: plan_s * next(ticks)
    return sim.run()


def test_measured_plan_delay_starts_the_routes_after_the_plan() -> None:
    # Every plan takes 0.25 s, so with PlanDelay.MEASURED the two-worker case ends 0.25 s later.
    res = _timed_plans(2, 0.25, 12.0)
    got = [(a, b) for _, a, b in res.group_times[:2]]
    assert np.allclose(got, [(1.0, 5.25), (6.25, 10.5)], atol=1e-9), got
    assert res.plan_seconds[:2] == [0.25, 0.25]


def test_a_delivery_while_the_coordinator_plans_waits_for_the_plan() -> None:
    # Four workers, plans of 3 s each. All ready at 1: A = (0, 1) forms and is planned 1 -> 4,
    # and moves its data 4 -> 8. The Readys of 2 and 3 wait for that plan: B = (2, 3) forms at
    # 4, is planned 4 -> 7, and its data arrive at 11. A's members are ready again at 9 and
    # their next group is planned 9 -> 12: B's delivery waits for that plan too, so B ends at 12.
    res = _timed_plans(4, 3.0, 13.0)
    got = [(a, b) for _, a, b in res.group_times[:2]]
    assert np.allclose(got, [(1.0, 8.0), (4.0, 12.0)], atol=1e-9), got


def test_given_plan_times_replace_the_planners_own_in_order_and_cycled() -> None:
    # The two-worker case with plans that take no time here, but 0.5 s and then 1.0 s as
    # given: the first group's routes start 0.5 s after it forms, the second's 1.0 s after,
    # and the third's 0.5 s again (the times repeat).
    cfg = SimConfig(
        scheme="preduce",
        p=2,
        size_bytes=4 * MB,
        duration_s=17.0,
        goodput=1.0,
        seed=1,
        plan_delay=PlanDelay.MEASURED,
        plan_times=(0.5, 1.0),
    )
    sim = Simulation(uniform(2), cfg)
    sim.life.clock = lambda: 0.0
    got = [(a, b) for _, a, b in sim.run().group_times[:3]]
    assert np.allclose(got, [(1.0, 5.5), (6.5, 11.5), (12.5, 17.0)], atol=1e-9), got
    with pytest.raises(ValueError, match="plan_times needs plan_delay=measured"):
        SimConfig(plan_times=(0.1,))
    for bad in [(), (0.1, float("nan")), (-0.1,)]:
        with pytest.raises(ValueError, match="plan_times: one or more finite seconds"):
            SimConfig(plan_delay=PlanDelay.MEASURED, plan_times=bad)


def test_a_late_join_delays_that_workers_first_iteration() -> None:
    # Worker 1 starts at 2: its first iteration ends at 3, when the first group forms.
    late = _run(
        uniform(2), scheme="preduce", p=2, size_bytes=4 * MB, duration_s=8.0, join_at=(0.0, 2.0)
    )
    assert np.allclose([late.group_times[0][1:]], [(3.0, 7.0)], atol=1e-9), late.group_times
    with pytest.raises(ValueError, match="join_at: 1 starts for 2 workers"):
        Simulation(uniform(2), SimConfig(p=2, join_at=(0.0,)))
    with pytest.raises(ValueError, match="join_at"):
        SimConfig(join_at=(0.0, -1.0))


def test_a_rate_step_times_later_jobs_at_the_new_rate_and_counts_each_at_its_own() -> None:
    links = LinkQueues(np.array([[0, 8.0], [8.0, 0]]))  # 1 MB/s
    assert links.queue(0, 1, MB, 0.0) == pytest.approx(1.0)
    links.set_rate(0, 1, 16.0)  # 2 MB/s from now on; the queued job keeps its end
    assert links.queue(0, 1, MB, 1.0) == pytest.approx(1.5)
    assert links.sent_by(1.5)[1] == pytest.approx(2 * MB)
    links.cut(0, 1, 2.0)
    links.set_rate(0, 1, 8.0)  # a cut link stays cut
    assert links.rate(0, 1) == 0.0
    with pytest.raises(NetworkError, match="rate must be finite"):
        links.set_rate(1, 0, float("nan"))


def test_a_slower_link_slows_the_ops_and_only_the_oracle_plans_for_it() -> None:
    # preduce on two workers: 4 s per op at 1 MB/s. At 5.5 s both directions drop to 0.25 MB/s.
    steps = [Fault(5.5, FaultKind.SET_RATE, a, b, mbit=2.0) for a, b in ((0, 1), (1, 0))]
    cfg = SimConfig(scheme="preduce", p=2, size_bytes=4 * MB, duration_s=40.0, goodput=1.0)
    steady = Simulation(uniform(2), cfg).run()
    slow = Simulation(uniform(2), cfg, steps).run()
    told = Simulation(uniform(2), replace(cfg, oracle=True), steps)
    told_res = told.run()
    assert len(slow.group_times) < len(steady.group_times)
    durations = [b - a for _, a, b in slow.group_times]
    assert durations[0] == pytest.approx(4.0) and durations[1] == pytest.approx(16.0)
    # The oracle's planner holds the new rate; without it, the configured one.
    assert told.life.life.capacity.planning[0, 1] == pytest.approx(2.0)
    assert len(told_res.group_times) == len(slow.group_times)  # two workers: no other route


def test_host_cpu_is_one_fcfs_queue_for_every_link() -> None:
    # Two links of 1 MB/s on a host whose cores handle 0.5 MB of link bytes per second: the
    # first job ends at 2 s, the second (another link) waits for the CPU: 4 s. Its link's
    # byte counter still runs at the link's rate.
    ex = ExecutorModel(cpu_s_per_byte=2e-6, host_cores=1.0)
    links = LinkQueues(np.array([[0, 8.0], [8.0, 0]]), executor=ex)
    assert links.queue(0, 1, MB, 0.0) == pytest.approx(2.0)
    assert links.queue(1, 0, MB, 0.0) == pytest.approx(4.0)
    assert links.sent_by(1.0)[2] == pytest.approx(MB)
    with pytest.raises(NetworkError, match="host_cores"):
        ExecutorModel(host_cores=-1.0)


@pytest.mark.parametrize(
    ("ack_clock_mbit", "reverse_first", "nbytes", "end"),
    [
        # 0 -> 1 at 8 MB/s, its reverse at 1 MB/s (8 Mbit/s) busy for 1 s: the first MB goes
        # at the reverse's rate, the rest at the link's own.
        (8.0, True, MB, 1.0),
        (8.0, True, 3 * MB, 1.25),
        (8.0, False, MB, 0.125),  # the reverse idle when the job starts: its own rate
        (4.0, True, MB, 0.125),  # the reverse faster than the threshold: independent
        (0.0, True, MB, 0.125),  # off
    ],
)
def test_a_fast_link_runs_at_its_busy_slow_reverses_rate(
    ack_clock_mbit: float, reverse_first: bool, nbytes: float, end: float
) -> None:
    ex = ExecutorModel(ack_clock_mbit=ack_clock_mbit)
    links = LinkQueues(np.array([[0, 64.0], [8.0, 0]]), executor=ex)
    if reverse_first:
        assert links.queue(1, 0, MB, 0.0) == pytest.approx(1.0)
    assert links.queue(0, 1, nbytes, 0.0) == pytest.approx(end)
    assert links.sent_by(10.0)[1] == pytest.approx(nbytes)  # every byte counted on its link
    with pytest.raises(NetworkError, match="ack_clock_mbit"):
        ExecutorModel(ack_clock_mbit=-1.0)
    with pytest.raises(SystemExit) as refused:
        sim_main(["--n", "4", "--ack-clock-mbit", "-1"])
    assert refused.value.code == 2
    if ack_clock_mbit:
        assert f"<= {ack_clock_mbit:g} Mbit/s" in ex.describe()


def test_candidates_are_the_members_and_the_best_connected_others() -> None:
    bw = np.full((6, 6), 10.0)
    np.fill_diagonal(bw, 0.0)
    bw[4, [0, 1]] = bw[[0, 1], 4] = 100.0  # 4: fast both ways to both members
    bw[5, [0, 1]] = 100.0  # 5: fast only towards the members
    assert candidates(bw, (0, 1), None, 1) == (0, 1, 4)
    assert candidates(bw, (1, 0), [0, 1, 2, 3, 5], 2) == (0, 1, 2, 3)  # 4 inactive; tie: low index
    assert candidates(bw, (0, 1), None, 0) == (0, 1)


def test_a_plan_on_candidates_is_exact_on_the_full_network() -> None:
    topo = generate(40, 2, 7)
    bw = topo.rate_mbit.copy()
    np.fill_diagonal(bw, np.inf)
    members = (3, 17, 22, 39, 8)
    size = 36_000_004
    plan = plan_on_candidates(plan_group, 6, "crew", bw, members, size, active=range(40), seed=1)
    cand = set(candidates(topo.rate_mbit, members, None, 6))
    assert plan.n == 40 and set(plan.members) == set(members)
    assert plan.participants() <= cand
    validate_routes(plan.routes, members, 40, size // 4)  # every element, each once
    load = plan.link_bytes()
    assert load.sum() > 0 and np.all(load[~np.isin(np.arange(40), list(cand))] == 0)


def test_planner_over_every_worker_is_the_planner_and_over_k_plans_on_candidates() -> None:
    assert planner_over(plan_group, -1) is plan_group
    topo = generate(12, 2, 3)
    bw = topo.rate_mbit.copy()
    members = (1, 5, 9)
    plan = planner_over(plan_group, 2)("crew", bw, members, 4_000_000, active=range(12), seed=1)
    assert plan.participants() <= set(candidates(bw, members, None, 2))
    with pytest.raises(CandidateError, match="shared"):
        planner_over(plan_group, 2)("crew", bw, members, 4_000_000, shared=(object(),))


def test_store_and_forward_aggregator_broadcasts_when_its_own_scatter_is_in() -> None:
    # One star, root 0, members 1 and 2: 1 -> 0 at 1 MB/s, 2 -> 0 at 0.5 MB/s; 1 MB range.
    # The root has everything at 2 s, then broadcasts 1 MB to each at 1 MB/s: done at 3 s.
    rate = np.array([[0, 8, 8], [8, 0, 8], [4, 8, 0]], dtype=float)
    links = LinkQueues(rate)
    route = Route(0, MB // 4, 0, ((1, 0), (2, 0)), ((0, 1), (0, 2)))
    timer = RouteTimer(links, [route], pipelined=False, part=65536)
    assert timer.start(0.0) is None
    (wake,) = timer.take_wakeups()
    assert wake[0] == pytest.approx(2.0)
    timer.release(*wake)
    assert timer.finished and timer.end == pytest.approx(3.0)


def test_fcfs_link_serves_in_arrival_order_at_full_rate() -> None:
    links = LinkQueues(np.array([[0, 8.0], [8.0, 0]]))
    assert links.queue(0, 1, MB, 0.0) == pytest.approx(1.0)
    assert links.queue(0, 1, MB, 0.5) == pytest.approx(2.0)  # waits for the first
    assert links.queue(0, 1, MB, 5.0) == pytest.approx(6.0)  # idle link: starts at once
    sent = links.sent_by(1.5)
    assert sent[1] == pytest.approx(1.5 * MB)


@pytest.mark.parametrize(
    ("seed", "scheme"), [(3, "crew"), (11, "preduce"), (29, "crew-paper"), (5, "ring")]
)
def test_invariants_on_random_runs(tmp_path, seed: int, scheme: str) -> None:  # noqa: ANN001
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 10))
    p = int(rng.integers(2, 5))
    topo = generate(n, int(rng.integers(1, 4)), seed)
    faults = [
        Fault(float(rng.uniform(2, 15)), FaultKind.CUT_LINK, 0, 1),
        Fault(float(rng.uniform(2, 15)), FaultKind.CUT_LINK, 2, 1),
        Fault(float(rng.uniform(5, 15)), FaultKind.KILL_WORKER, n - 1),
    ]
    cfg = SimConfig(scheme=scheme, p=p, duration_s=20.0, seed=seed, size_bytes=8 * MB)
    res = Simulation(topo, cfg, faults, Recorder(tmp_path, epoch=0.0)).run()
    db = sqlite3.connect(tmp_path / "lab.db")
    groups = db.execute("SELECT id, members, formed_at, ended_at, status FROM groups").fetchall()
    assert groups and {g[4] for g in groups} <= {"completed", "abandoned"}
    assert sum(g[4] == "completed" for g in groups) == res.completed
    # no worker in two open groups: its groups' [start, end) intervals never overlap
    spans: dict[int, list[tuple[float, float]]] = {}
    for _, members, start, end, _ in groups:
        for m in json.loads(members):
            spans.setdefault(m, []).append((start, end))
    for m, s in spans.items():
        s.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(s, s[1:], strict=False)), (m, s)
    # link loads never exceed capacity (the samples are wire Mbit/s over 1 s)
    rate = {(a, b): r for a, b, r in db.execute("SELECT src, dst, rate_mbit FROM links")}
    for src, dst, mbit in db.execute("SELECT src, dst, mbit FROM link_samples"):
        assert mbit <= rate[(src, dst)] * (1 + 1e-9), (src, dst, mbit)
    # rounds agree with the completed memberships, and the dead worker stopped
    done = db.execute(
        "SELECT m.worker, COUNT(*) FROM group_members m JOIN groups g ON g.id = m.group_id"
        " WHERE g.status = 'completed' GROUP BY m.worker"
    ).fetchall()
    assert {w: c for w, c in done} == {w: r for w, r in enumerate(res.rounds) if r}
    assert db.execute("SELECT state FROM worker_status WHERE worker=?", (n - 1,)).fetchone() == (
        "dead",
    )


def test_cli_writes_a_run_the_dashboard_reads(tmp_path, capsys) -> None:  # noqa: ANN001
    from dashboard import queries

    run = tmp_path / "r1"
    assert sim_main(["--n", "8", "--p", "3", "--duration", "10", "--out", str(run)]) == 0
    assert "rounds per worker" in capsys.readouterr().out
    conn = sqlite3.connect(run / "lab.db")
    info = queries.run_info(conn)
    assert (info.n, info.p, info.scheme) == (8, 3, "crew")
    assert queries.meta(conn)["simulated"] == "1"
    with pytest.raises(SystemExit) as refused:
        sim_main(["--n", "8", "--out", str(run)])  # refuses to overwrite a run
    # A message as the exit code: Python prints it and exits with status 1.
    assert refused.value.code == f"--out: {run} already holds a run"


def test_plan_rounds_caps_crew_planning_and_stays_deterministic() -> None:
    with pytest.raises(ValueError, match="plan_rounds"):
        SimConfig(plan_rounds=0)
    topo = generate(20, 2, 3)
    runs = [_run(topo, scheme="crew", p=5, duration_s=20.0, seed=3, plan_rounds=2) for _ in "ab"]
    assert runs[0].rounds == runs[1].rounds  # rounds, not seconds: the machine does not matter
    assert runs[0].completed > 0
    assert default_plan_rounds(8) is None and default_plan_rounds(60) == LARGE_PLAN_ROUNDS


def test_a_member_dropped_as_suspect_trains_on(tmp_path) -> None:  # noqa: ANN001
    # Two links into worker 1 are cut at once while it is in a group of three: it becomes
    # suspect and is dropped (crew.control.lifecycle), alive; it must compute and average
    # again, not wait for a group that no longer counts it.
    topo = uniform(6, mbit=8.0)
    faults = [Fault(1.5, FaultKind.CUT_LINK, 0, 1), Fault(1.5, FaultKind.CUT_LINK, 2, 1)]
    cfg = SimConfig(p=3, duration_s=20.0, seed=1, goodput=1.0, size_bytes=2 * MB)
    res = Simulation(topo, cfg, faults, Recorder(tmp_path, epoch=0.0)).run()
    db = sqlite3.connect(tmp_path / "lab.db")
    dropped = db.execute(
        "SELECT COUNT(*) FROM events WHERE message LIKE '%member 1 suspect%dropped%'"
    ).fetchone()[0]
    later = db.execute(
        "SELECT COUNT(*) FROM group_members m JOIN groups g ON g.id = m.group_id"
        " WHERE m.worker = 1 AND g.status = 'completed' AND g.formed_at > 6.0"
    ).fetchone()[0]
    assert dropped == 1
    assert later > 0, res.rounds


def test_plan_level_tol_reaches_the_planner_and_is_stated(monkeypatch) -> None:  # noqa: ANN001
    from crew.plan.routelp import colgen
    from crew.sim.__main__ import model_line

    with pytest.raises(ValueError, match="plan_level_tol"):
        SimConfig(plan_level_tol=1.0)
    seen: list[float] = []
    real = colgen.choose_level

    def spy(master, spu, settings):  # noqa: ANN001, ANN202
        seen.append(settings.level_tolerance)
        return real(master, spu, settings)

    monkeypatch.setattr(colgen, "choose_level", spy)
    res = _run(generate(8, 2, 5), scheme="crew", p=3, duration_s=10.0, plan_level_tol=0.02)
    assert res.completed > 0
    assert seen and set(seen) == {0.02}  # every crew plan of the run searched with it
    assert "latency levels within 2.00%" in model_line(SimConfig(plan_level_tol=0.02), 8)
    assert "latency levels exact" in model_line(SimConfig(), 8)


def test_run_config_helpers_are_every_worker_or_a_count_without_shared_capacities() -> None:
    from lifecycle_kit import make_cfg

    from crew.config import ConfigError
    from crew.plan.planner import SharedLink

    assert make_cfg().helpers == -1 and make_cfg(helpers=0).helpers == 0
    with pytest.raises(ConfigError, match="helpers: need -1"):
        make_cfg(helpers=-2)
    with pytest.raises(ConfigError, match="helpers: a candidate set"):
        make_cfg(helpers=2, host_cpu_s_per_gb=12.0, host_cores=2.0)
    with pytest.raises(ConfigError, match="helpers: a candidate set"):
        make_cfg(helpers=2, shared=(SharedLink(((0, 1),), 10.0),))


def test_the_helpers_flag_states_the_planners_default_and_resolves_to_it() -> None:
    from crew.config import RunConfig
    from crew.plan.candidates import (
        CANDIDATES_FROM_N,
        DEFAULT_HELPERS,
        default_helpers,
        helpers_for,
    )

    text = RunConfig.option("helpers").default_text
    assert f"up to {CANDIDATES_FROM_N} workers, {DEFAULT_HELPERS} above" in text
    assert default_helpers(CANDIDATES_FROM_N) is None
    assert default_helpers(CANDIDATES_FROM_N + 1) == DEFAULT_HELPERS
    assert helpers_for(None, 100) == DEFAULT_HELPERS and helpers_for(-1, 100) is None
    assert helpers_for(3, 8) == 3
