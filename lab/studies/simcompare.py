"""Simulated against emulated: per-op times and training runs.

``python -m lab.studies.simcompare RESULTS.json --topology Y`` replays a ``lab.bench`` results
file's trace in ``crew.sim``'s network model and prints simulated / emulated per op for every
scheme; the model and its executor costs are described in ``lab.report.simagree``, which
``lab.bench --sim`` also calls.

**Training runs** (``--train RUN_DIR``, a ``lab.run`` folder): the run's topology, scheme, p,
seed and ``--helpers`` (from its database), simulated for the run's training window (first
iteration's start to the coordinator's stop) with the same executor model (its CPU per byte:
``--cpu-s-per-gb``, default the bench's crew figure on this lab). Three inputs come from the
run, none of them the rounds compared:
the vector's size (its plans), each worker's registration (a simulated worker starts then: they
spread over 1.5-5 s at n = 20 to 32), and the real step time the straggler samples pad up to
(``compute_s``: the median, over the workers without a straggler profile, of training -> ready in
``worker_states``; it holds torch's step and evaluation on the shared host). With
``--lab-plan-times`` a fourth: how long each of the run's plans held its coordinator
(``meta.plan_costs``), which the simulated coordinator then plans for in place of its own planner's
time here. With ``--hop-waits FILE`` (``lab.studies.grouptime --hop-waits`` of a traced run of the
same setting) each simulated hop draws its wait from the lab's measured ones instead of the
constant ``--hop-queue-ms``, seeded from the run's seed; ``--draws K`` compares the median of K
draws. Prints rounds per worker, simulated / emulated, and where a worker's round goes in each
(``state_split``: seconds per completed round training, ready and reducing, from the coordinator's
``worker_states`` in the run's database and in the simulation's, which the same life-cycle code
writes), so a gap in rounds shows which part of the round it comes from, and each one's
``turnaround`` (the round's control latency outside its group, which ``--turnaround-ms`` gives the
simulator). The lab sends pure TCP ACKs ahead of the data (``lab.net.shaping``), so its links are
independent of their reverse, as the simulator's are. A run recorded before it did (no
``meta.ack_queue``) queued them behind the data: for those, the simulated links below
``LAB_ACK_CLOCK_MBIT`` hold back a faster reverse while they carry data, as that lab's did
(``crew.sim.network.ExecutorModel.ack_clock_mbit``; ``--no-ack-clock``: off).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from crew.cli_options import command_parser
from crew.config import Scheme
from crew.plan.candidates import helpers_for
from crew.runtime.planahead import read_costs
from crew.runtime.rundb import GroupStatus, WorkerState, reading
from crew.sim.engine import PlanDelay, SimConfig, SimResult, Simulation
from crew.sim.network import ExecutorModel
from crew.sim.record import Recorder
from crew.train.stragglers import ComputeDelay
from lab.net.shaping import ACK_QUEUE_DIRECT, QUEUE_EXTRA_S
from lab.orchestrate.hostbusy import training_load
from lab.report.simagree import (
    GOODPUT,
    LAB_ACK_CLOCK_MBIT,
    LAB_CPU_S_PER_GB,
    PACED_HOP_QUEUE_S,
    TRAIN_HOP_QUEUE_S,
    bench_report,
    lab_executor,
)
from lab.spec.simulated import sim_topology
from lab.spec.topology import TopologySpec, parse_topology
from lab.studies.grouptime import HopWaitsError, read_hop_waits


def trained_until(conn: sqlite3.Connection) -> float:
    """When a run's coordinator stopped: its last worker state or group end (at the stop it
    abandons the open groups and sends their members training), at most ``meta.ended_at``.
    ``ended_at`` itself comes after the lab's teardown, 1-2 s later at n = 20 and 18 s later
    at n = 32, where the workers did not train."""
    end = float(conn.execute("SELECT value FROM meta WHERE key = 'ended_at'").fetchone()[0])
    last = conn.execute(
        "SELECT MAX(t) FROM (SELECT MAX(t) AS t FROM worker_states"
        " UNION ALL SELECT MAX(ended_at) FROM groups)"
    ).fetchone()[0]
    return end if last is None else min(end, float(last))


def _run_facts(run_dir: Path) -> dict[str, Any]:
    """What a lab run's database says about its inputs and its rounds (read-only)."""
    with reading(run_dir / "lab.db") as conn:
        meta = {r["key"]: r["value"] for r in conn.execute("SELECT key, value FROM meta")}
        options = json.loads(meta.get("options", "{}"))
        spec = parse_topology(json.loads(meta["topology"]))
        plan = conn.execute("SELECT plan FROM groups WHERE plan IS NOT NULL LIMIT 1").fetchone()
        if plan is None:
            raise SystemExit(f"{run_dir}: no planned group, nothing to compare")
        total = sum(json.loads(plan["plan"])["elems"])
        steps: list[float] = []
        plain = {w.index for w in spec.workers if not w.straggler}
        last: dict[int, float] = {}
        for r in conn.execute("SELECT t, worker, state FROM worker_states ORDER BY t"):
            w = r["worker"]
            if r["state"] == WorkerState.TRAINING.value:  # the database holds the value
                last[w] = r["t"]
            elif w in last and w in plain:
                steps.append(r["t"] - last.pop(w))
            else:
                last.pop(w, None)
        first = conn.execute("SELECT MIN(t) AS t FROM worker_states").fetchone()["t"]
        trained = trained_until(conn)
        starts = dict(conn.execute("SELECT worker, MIN(t) FROM worker_states GROUP BY worker"))
        rounds = [0] * spec.n
        done = conn.execute(
            "SELECT members FROM groups WHERE status = ?", (GroupStatus.COMPLETED.value,)
        )
        for g in done:
            for m in json.loads(g["members"]):
                rounds[m] += 1
        costs = read_costs(conn)
        load = training_load(conn)
    return {
        "spec": spec,
        "scheme": meta["scheme"],
        "p": int(meta["p"]),
        "seed": int(options.get("seed", 0)),
        "size_bytes": 4 * total,
        # Every iteration lasted at least the run's floor (RunConfig.min_iteration_s), also
        # where every worker has a straggler profile and no plain step was measured.
        "compute_s": max(
            statistics.median(steps) if steps else 0.0,
            float(options.get("min_iteration_s", 0.0)),
        ),
        "window_s": trained - float(first),
        "rounds": rounds,
        # Each worker's registration after the first one's: the simulated workers start then.
        "join_at": tuple(max(0.0, starts.get(w, first) - first) for w in range(spec.n)),
        # Runs recorded before the lab sent pure ACKs direct have no ack_queue.
        "acks_direct": meta.get("ack_queue") == ACK_QUEUE_DIRECT,
        # Each group's first plan: the seconds the coordinator's event loop waited for it, in
        # group order (empty for a run whose coordinator did not stop cleanly).
        "plan_times": tuple(costs[g][1] / 1e3 for g in sorted(costs)),
        # Planned over each group's members and this many others (-1: every worker).
        "helpers": int(options.get("helpers", -1)),
        # The host while the workers trained (None for a run recorded without it).
        "host_busy_share": None if load is None else load.busy.share,
        "host_cpu_s_per_link_gb": None if load is None else load.cpu_s_per_link_gb,
    }


SPLIT_STATES = (WorkerState.TRAINING, WorkerState.READY, WorkerState.GROUPED)


def state_split(db: Path) -> dict[str, float]:
    """Seconds per completed round that the workers spent in each of ``SPLIT_STATES``.

    Every worker's ``worker_states`` rows, from its first to the coordinator's stop
    (:func:`trained_until`), summed over the workers and divided by their completed rounds.
    Other states (absent, dead) are left out.
    """
    with reading(db) as conn:
        end = trained_until(conn)
        spent: dict[str, float] = defaultdict(float)
        last: dict[int, tuple[float, str]] = {}
        for r in conn.execute("SELECT t, worker, state FROM worker_states ORDER BY t"):
            if r["worker"] in last:
                t0, state = last[r["worker"]]
                spent[state] += max(0.0, min(r["t"], end) - t0)
            last[r["worker"]] = (r["t"], r["state"])
        for t0, state in last.values():
            spent[state] += max(0.0, end - t0)
        rounds = sum(
            len(json.loads(g["members"]))
            for g in conn.execute(
                "SELECT members FROM groups WHERE status = ?", (GroupStatus.COMPLETED.value,)
            )
        )
    return {s.value: spent[s.value] / rounds if rounds else float("nan") for s in SPLIT_STATES}


def turnaround(db: Path, spec: TopologySpec, seed: int, compute_s: float) -> float | None:
    """The mean time, in seconds, from a group's end to a member's next Ready at the
    coordinator, less that iteration's compute time (``max(sample, compute_s)``: the straggler
    samples are redrawn as the worker drew them, ``ComputeDelay.for_worker``). That is the round's
    control latency outside the group (``ExecutorModel.turnaround_s``): the Commit reaching the
    member, the result applied, and the Ready reaching the coordinator. Rounds that follow a
    group only (a worker's first iteration also holds its start-up); None without one.
    Assumes no slowdown was commanded during the run."""
    draws = {w.index: ComputeDelay.for_worker(w.straggler, seed, w.index) for w in spec.workers}
    samples: dict[int, list[float]] = {w: [] for w in draws}
    spans: list[float] = []
    with reading(db) as conn:
        state: dict[int, tuple[str, float]] = {}  # worker -> its previous row's state and time
        trained_at: dict[int, float] = {}  # worker -> when it went training after a group
        rows = conn.execute("SELECT t, worker, state, iteration FROM worker_states ORDER BY t")
        for r in rows:
            w, now = r["worker"], r["t"]
            if w not in draws:
                continue
            before = state.get(w, ("", 0.0))[0]
            if r["state"] == WorkerState.TRAINING.value and before == WorkerState.GROUPED.value:
                trained_at[w] = now
            elif r["state"] == WorkerState.READY.value and w in trained_at and r["iteration"]:
                drawn = samples[w]
                while len(drawn) < r["iteration"]:  # bounded by the iteration number
                    drawn.append(draws[w].sample())
                step = max(drawn[r["iteration"] - 1], compute_s)
                spans.append(now - trained_at.pop(w) - step)
            state[w] = (r["state"], now)
    return statistics.mean(spans) if spans else None


def train_compare(
    run_dir: Path,
    cpu_s_per_gb: float = LAB_CPU_S_PER_GB,
    hop_queue_s: float = TRAIN_HOP_QUEUE_S,
    control_s: float = 0.0,
    turnaround_s: float = 0.0,
    ack_clock_mbit: float | None = None,
    lab_plan_times: bool = False,
    hop_waits: tuple[float, ...] = (),
    draws: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Rounds per worker of a lab run and of its simulation (see the module docstring).
    ``ack_clock_mbit`` None: the run's own (:data:`LAB_ACK_CLOCK_MBIT` if it queued its ACKs
    behind the data, else 0). ``lab_plan_times``: each simulated plan takes as long as the
    run's own plans took, in their order (``SimConfig.plan_times``), not as long as the
    simulator's planner takes here. ``hop_waits``: each hop draws its wait from them
    (``crew.sim.network.ExecutorModel.hop_waits``) in place of ``hop_queue_s``, and ``draws``
    simulations, whose draws are seeded ``seed * 1000 + k``, give the median one's rounds, split
    and turnaround (``sim_draws``: every one's rounds per worker, for their spread).
    ``progress`` hears of each simulation as it starts."""
    check_draws(draws, bool(hop_waits))
    f = _run_facts(run_dir)
    if lab_plan_times and not f["plan_times"]:
        raise SystemExit(
            f"{run_dir}: no recorded plan times (meta.plan_costs); compare without --lab-plan-times"
        )
    if ack_clock_mbit is None:
        ack_clock_mbit = 0.0 if f["acks_direct"] else LAB_ACK_CLOCK_MBIT
    executor = lab_executor(
        cpu_s_per_gb,
        hop_queue_s=hop_queue_s,
        control_s=control_s,
        turnaround_s=turnaround_s,
        ack_clock_mbit=ack_clock_mbit,
        hop_waits=hop_waits,
    )
    sims = []
    for k in range(draws):
        if progress is not None:
            progress(f"{run_dir}: simulation {k + 1} of {draws}")
        seeded = replace(executor, hop_wait_seed=f["seed"] * 1000 + k)
        sims.append(_simulate(f, seeded, lab_plan_times))
    sims.sort(key=lambda sim: sim[0].rounds_per_worker)
    res, sim_split, sim_turn = sims[len(sims) // 2]
    emu = statistics.mean(f["rounds"])
    return {
        "run": str(run_dir),
        "scheme": f["scheme"],
        "p": f["p"],
        "seed": f["seed"],
        "window_s": f["window_s"],
        "size_bytes": f["size_bytes"],
        "compute_s": f["compute_s"],
        "emu_rounds": f["rounds"],
        "sim_rounds": res.rounds,
        "emu_mean": emu,
        "sim_mean": res.rounds_per_worker,
        "sim_draws": [sim[0].rounds_per_worker for sim in sims],
        "ratio": res.rounds_per_worker / emu if emu else float("nan"),
        "emu_split": state_split(run_dir / "lab.db"),
        "sim_split": sim_split,
        "emu_turnaround": turnaround(run_dir / "lab.db", f["spec"], f["seed"], f["compute_s"]),
        "sim_turnaround": sim_turn,
        "ack_clock_mbit": ack_clock_mbit,
        "lab_plan_times": lab_plan_times,
        "hop_waits": len(hop_waits),
        "helpers": f["helpers"],
        "cpu_s_per_gb": cpu_s_per_gb,
        "host_busy_share": f["host_busy_share"],
        "host_cpu_s_per_link_gb": f["host_cpu_s_per_link_gb"],
    }


def check_draws(draws: int, drawing: bool) -> None:
    """More than one simulation of a run differs only where hop waits are drawn."""
    if draws < 1 or (draws > 1 and not drawing):
        raise ValueError(f"draws must be 1, or more with hop waits to draw from; got {draws}")


def _simulate(
    f: dict[str, Any], executor: ExecutorModel, lab_plan_times: bool
) -> tuple[SimResult, dict[str, float], float | None]:
    """One simulation of the run ``f`` describes: its result, state split and turnaround."""
    cfg = SimConfig(
        scheme=Scheme(f["scheme"]),
        p=f["p"],
        duration_s=f["window_s"],
        seed=f["seed"],
        size_bytes=f["size_bytes"],
        goodput=GOODPUT,
        compute_s=f["compute_s"],
        executor=executor,
        plan_delay=PlanDelay.MEASURED,
        join_at=f["join_at"],
        plan_times=f["plan_times"] if lab_plan_times else None,
        helpers=helpers_for(f["helpers"], f["spec"].n),
    )
    with tempfile.TemporaryDirectory(prefix="crew-simcompare-") as tmp:
        res = Simulation(sim_topology(f["spec"]), cfg, recorder=Recorder(tmp)).run()
        split = state_split(Path(tmp) / "lab.db")
        turn = turnaround(Path(tmp) / "lab.db", f["spec"], f["seed"], f["compute_s"])
    return res, split, turn


def train_report(c: dict[str, Any]) -> str:
    flag = "" if 0.85 <= c["ratio"] <= 1.15 else "   (outside 0.85-1.15)"
    clock = f"below {c['ack_clock_mbit']:.1f} Mbit/s" if c["ack_clock_mbit"] else "off"
    waits = f", hop waits drawn from {c['hop_waits']}" if c["hop_waits"] else ""
    if c["helpers"] >= 0:
        waits += f", members + {c['helpers']} helpers"
    lines = [
        f"{c['run']}: {c['scheme']} p={c['p']} seed {c['seed']}, {c['window_s']:.0f} s,"
        f" {c['size_bytes'] / 1e6:.2f} MB, step {c['compute_s'] * 1e3:.0f} ms, ACK clock"
        f" {clock}, plans as long as {'the lab' if c['lab_plan_times'] else 'here'}{waits}"
    ]
    if len(c["sim_draws"]) > 1:
        each = ", ".join(f"{x:.2f}" for x in c["sim_draws"])
        lines.append(
            f"  {len(c['sim_draws'])} simulations' rounds per worker: {each} (the median one"
            f" below; sim/emu {c['sim_draws'][0] / c['emu_mean']:.2f}"
            f" to {c['sim_draws'][-1] / c['emu_mean']:.2f})"
        )
    lines.append(
        f"  rounds per worker: simulated {c['sim_mean']:.2f} {c['sim_rounds']},"
        f" emulated {c['emu_mean']:.2f} {c['emu_rounds']}; sim/emu {c['ratio']:.2f}{flag}"
    )
    split = "".join(
        f" {k} {c['sim_split'][k] * 1e3:.0f} / {c['emu_split'][k] * 1e3:.0f};"
        for k in c["emu_split"]
    )
    if c["host_cpu_s_per_link_gb"] is not None:
        lines.append(
            f"  the lab's host while training: {c['host_busy_share']:.2f} busy,"
            f" {c['host_cpu_s_per_link_gb']:.1f} CPU s per link GB"
            f" (simulated with {c['cpu_s_per_gb']:.1f}: --cpu-s-per-gb)"
        )
    lines.append(
        f"  a round, ms (simulated / emulated):{split}"
        f" turnaround {_ms(c['sim_turnaround'])} / {_ms(c['emu_turnaround'])}"
    )
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("python -m lab.studies.simcompare", __doc__)
    parser.add_argument("results", type=Path, nargs="?", help="a lab.bench results.json")
    parser.add_argument("--topology", type=Path, help="the topology the results ran on")
    parser.add_argument("--no-host", action="store_true", help="no shared-host CPU model")
    parser.add_argument("--no-plan-time", action="store_true", help="routes start at formation")
    parser.add_argument(
        "--train", type=Path, action="append", default=[], help="a lab.run folder to compare"
    )
    parser.add_argument("--cpu-s-per-gb", type=float, default=LAB_CPU_S_PER_GB)
    parser.add_argument(
        "--hop-queue-ms",
        type=float,
        default=None,
        help="standing queue per hop in the executor model, ms (default: "
        f"{PACED_HOP_QUEUE_S * 1e3:g} if the bench paced its connections, else HTB's "
        f"{QUEUE_EXTRA_S * 1e3:g}; --train: {TRAIN_HOP_QUEUE_S * 1e3:g}, measured)",
    )
    parser.add_argument(
        "--control-ms",
        type=float,
        default=0.0,
        help="--train: control-plane latency per group revision beyond its plan, in ms"
        " (crew.sim.network.ExecutorModel.control_s; lab.studies.grouptime's outside data less"
        " the plan time, from a frame trace of the same setting; default 0)",
    )
    parser.add_argument(
        "--turnaround-ms",
        type=float,
        default=0.0,
        help="--train: control latency per round outside the group, in ms"
        " (crew.sim.network.ExecutorModel.turnaround_s; the 'turnaround' this command prints"
        " for a lab run of the same setting; default 0)",
    )
    parser.add_argument(
        "--no-ack-clock",
        action="store_true",
        help="--train: links independent of their reverse (crew.sim.network.ExecutorModel."
        "ack_clock_mbit). By default that holds for runs whose lab sent pure ACKs ahead of the"
        " data (meta.ack_queue); in older runs a direction whose reverse is at most"
        f" {LAB_ACK_CLOCK_MBIT:.1f} Mbit/s and busy runs at the reverse's rate, as the lab's deep"
        " queues made TCP do",
    )
    parser.add_argument(
        "--lab-plan-times",
        action="store_true",
        help="--train: each simulated plan takes as long as the run's own plans took"
        " (meta.plan_costs, in group order, cycled), not as long as the simulator's planner"
        " takes on this quiet host: the lab's coordinator plans on a host busy with every"
        " worker's data path (lab.studies.grouptime's control time excludes that plan time)",
    )
    parser.add_argument(
        "--hop-waits",
        type=Path,
        metavar="FILE",
        help="--train: each hop's wait drawn from the lab's measured ones (lab.studies.grouptime"
        " --hop-waits, from a traced run of the same setting) instead of one constant per hop",
    )
    parser.add_argument(
        "--draws",
        type=int,
        default=1,
        metavar="K",
        help="--train with --hop-waits: simulate each run K times, with the hops' waits drawn"
        " anew (seeded seed * 1000 + k), and compare the median one (default 1)",
    )
    args = parser.parse_args(argv)
    try:
        check_draws(args.draws, args.hop_waits is not None)
    except ValueError as exc:
        parser.error(f"--{exc}")
    if args.hop_waits is not None and args.hop_queue_ms is not None:
        parser.error("--hop-waits draws each hop's wait: give it or --hop-queue-ms, not both")
    waits: tuple[float, ...] = ()
    if args.hop_waits is not None:
        try:
            waits = read_hop_waits(args.hop_waits)
        except HopWaitsError as exc:
            parser.error(f"--hop-waits: {exc}")
    for flag in ("hop_queue_ms", "control_ms", "turnaround_ms"):
        value = getattr(args, flag)
        if value is not None and not 0 <= value < float("inf"):
            parser.error(f"--{flag.replace('_', '-')} must be finite and >= 0, got {value}")
    if args.results is None and not args.train:
        parser.error("give a results.json (with --topology) or --train RUN_DIR")
    if args.results is not None:
        if args.topology is None:
            parser.error("--topology: the topology the results ran on")
        results = json.loads(args.results.read_text())
        print(
            bench_report(
                results,
                args.topology,
                not args.no_host,
                not args.no_plan_time,
                None if args.hop_queue_ms is None else args.hop_queue_ms / 1e3,
            )
        )
    for run_dir in args.train:
        queue = TRAIN_HOP_QUEUE_S if args.hop_queue_ms is None else args.hop_queue_ms / 1e3
        c = train_compare(
            run_dir,
            args.cpu_s_per_gb,
            queue,
            args.control_ms / 1e3,
            args.turnaround_ms / 1e3,
            0.0 if args.no_ack_clock else None,
            args.lab_plan_times,
            waits,
            args.draws,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
        print(train_report(c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
