"""A user's script in the lab: one ``torchrun --nnodes n --node-rank i`` per emulated cloud.

No lab runner and no ``config.json``: each host namespace runs the script through ``torchrun``
(static rendezvous at host 0's identity address) over the shaped WAN links, exactly as on real
machines, and rank 0 hosts the CREW coordinator. Used by the root integration test and as
the benchmark of the start-up probe (``crew.runtime.capacity_probe``) against a topology's
emulated capacities::

    sudo python -m lab.torchrun --topology topologies/default.yaml --steps 2

prints the probe's rounds, time and bytes against its bounds and, per directed link, measured,
emulated and the error; the exit status is 1 if a run failed (not if the probe misses 15%).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from crew.cli_options import command_parser
from crew.runtime import rundb
from crew.runtime.capacity_probe import DEFAULT_PROBE_SECONDS, plan_probe
from lab.net.mesh import LabNetwork
from lab.orchestrate.torchjob import rank_env, start_ranks
from lab.spec.shipped import default_topology, topology_arg
from lab.spec.topology import TopologySpec, load_topology


@dataclass(frozen=True)
class ScriptRun:
    codes: list[int | None]  # per host; None: killed after the timeout
    output: str  # every host's output, host by host
    db: Path  # rank 0's run database


def run_in_lab(
    topo: TopologySpec,
    work: Path,
    script_args: list[str],
    *,
    mgmt_subnet: str = "198.19.246.0/24",
    probe_bytes: int = 4 << 20,
    probe_seconds: float = DEFAULT_PROBE_SECONDS,
    timeout: float = 300.0,
) -> ScriptRun:
    """Run ``EXAMPLE script_args`` on every host of ``topo`` through torchrun; wait for all."""
    n = topo.n
    run_dir = work / "run"
    with LabNetwork(
        topo, tag="t" + secrets.token_hex(2), state_dir=work / "state", mgmt_subnet=mgmt_subnet
    ) as net:
        secret = secrets.token_hex(16)  # the same on every rank of this run
        envs = [
            rank_env(net, i, secret, run_dir, probe_bytes=probe_bytes, probe_seconds=probe_seconds)
            for i in range(n)
        ]
        procs = start_ranks(net, work, script_args, envs)
        codes: list[int | None] = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                net.stop_process(proc)
                codes.append(None)
    output = "\n".join((work / f"w{i}.log").read_text(errors="replace") for i in range(n))
    return ScriptRun(codes, output, run_dir / "run.db")


@dataclass(frozen=True)
class ProbeResult:
    message: str  # the coordinator's event: time and bytes
    seconds: float
    bytes_per_worker: int
    rounds: int
    links_measured: int
    measured: dict[tuple[int, int], float]  # Mbit/s, per directed link
    emulated: dict[tuple[int, int], float]

    @property
    def ratio(self) -> dict[tuple[int, int], float]:
        """measured / emulated, per directed link."""
        return {k: m / self.emulated[k] for k, m in self.measured.items()}


def probe_result(db: Path, topo: TopologySpec) -> ProbeResult:
    """The start-up probe's record in ``db`` against ``topo``'s emulated capacities."""
    try:
        with rundb.reading(db) as conn:
            row = conn.execute("SELECT message, data FROM events WHERE kind = 'probe'").fetchone()
    except sqlite3.Error as exc:
        raise RuntimeError(f"{db}: no probe record: {exc}") from exc
    if row is None:
        raise RuntimeError(f"{db}: no probe record")
    data = json.loads(row["data"])
    bw, emulated = data["bw_mbit"], topo.bw_matrix()
    links = [(i, j) for i in range(topo.n) for j in range(topo.n) if i != j]
    return ProbeResult(
        row["message"],
        data["seconds"],
        data["bytes_per_worker"],
        data.get("rounds", 0),
        data.get("links_measured", 0),
        {(i, j): float(bw[i][j]) for i, j in links},
        {(i, j): float(emulated[i][j]) for i, j in links},
    )


def probe_report(res: ProbeResult, topo: TopologySpec, probe_bytes: int, seconds: float) -> str:
    """The benchmark's figures: the probe's cost against its plan, and its error per link."""
    plan = plan_probe(topo.n, probe_bytes, seconds)
    errs = sorted(abs(r - 1) for r in res.ratio.values())
    lines = [
        f"{topo.name}: n={topo.n}, burst {probe_bytes / 2**20:g} MiB per link,"
        f" budget {seconds:g} s",
        f"probe: {res.seconds:.2f} s (bound {plan.seconds_bound:.1f} s), {res.rounds} rounds"
        f" (planned {len(plan.rounds)}), {res.bytes_per_worker / 2**20:g} MiB sent per worker,"
        f" {topo.n * res.bytes_per_worker / 2**20:g} MiB in all;"
        f" {res.links_measured}/{topo.n * (topo.n - 1)} links measured",
        f"measured/emulated: median error {statistics.median(errs):.1%}, max {errs[-1]:.1%};"
        f" within 15%: {sum(e <= 0.15 for e in errs)}/{len(errs)}",
        "  link      measured  emulated  error",
    ]
    for (i, j), r in sorted(res.ratio.items()):
        lines.append(
            f"  {i}->{j}  {res.measured[i, j]:8.1f}  {res.emulated[i, j]:8.1f}  {r - 1:+6.1%}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("python -m lab.torchrun", __doc__)
    parser.add_argument("--topology", type=topology_arg, default=default_topology())
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--probe-bytes", type=int, default=4 << 20, help="burst per link")
    parser.add_argument(
        "--probe-seconds", type=float, default=DEFAULT_PROBE_SECONDS, help="the probe's budget"
    )
    args = parser.parse_args(argv)
    topo = load_topology(args.topology)
    with tempfile.TemporaryDirectory(prefix="crew-torchrun-") as tmp:
        run = run_in_lab(
            topo,
            Path(tmp),
            ["--group-size", "2", "--steps", str(args.steps)],
            probe_bytes=args.probe_bytes,
            probe_seconds=args.probe_seconds,
        )
        if run.codes != [0] * topo.n:
            print(run.output[-4000:])
            print(f"exit codes {run.codes}")
            return 1
        res = probe_result(run.db, topo)
    print(probe_report(res, topo, args.probe_bytes, args.probe_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
