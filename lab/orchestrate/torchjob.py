"""A user's script on a lab network: one ``torchrun --nnodes n --node-rank i`` per host.

Each host namespace runs ``EXAMPLE`` through ``torchrun`` (static rendezvous at host 0's
identity address) over the shaped WAN links, exactly as on real machines; rank 0 hosts the
CREW coordinator (``crew.runtime.launch``). ``lab.torchrun`` waits for such a job;
``lab.hostile --target torchrun`` attacks one while it runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from crew.runtime.capacity_probe import DEFAULT_PROBE_SECONDS
from lab.net.mesh import LabNetwork

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
RDZV_PORT = 29400
EXAMPLE = "examples/train_digits.py"


def rank_env(
    net: LabNetwork,
    i: int,
    secret: str,
    run_dir: Path,
    *,
    probe_bytes: int = 4 << 20,
    probe_seconds: float = DEFAULT_PROBE_SECONDS,
) -> dict[str, str]:
    """The environment of host ``i``'s torchrun: the run's secret (the same on every rank), the
    address its data plane is reached at, and where rank 0 keeps the run database."""
    return {
        **os.environ,
        "CREW_SECRET": secret,
        "CREW_DATA_HOST": net.identity_address(i),
        "CREW_RUN_DIR": str(run_dir),
        "CREW_PROBE_BYTES": str(probe_bytes),
        "CREW_PROBE_SECONDS": str(probe_seconds),
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
    }


def start_ranks(
    net: LabNetwork,
    work: Path,
    script_args: list[str],
    envs: list[dict[str, str]],
    wrappers: Mapping[int, Sequence[str]] | None = None,
) -> list[subprocess.Popen]:
    """One ``torchrun`` of ``EXAMPLE script_args`` per host of ``net`` (static rendezvous at
    host 0), each with its environment and its output in ``work/w<i>.log``; not waited for.
    Each one's temporary files (torchrun's ``torchelastic_*`` logs, which it leaves behind)
    go to ``work/w<i>.tmp``, with the job's other files, not to the host's ``/tmp``.
    ``wrappers``: host -> a module and its arguments that host's torchrun runs instead, with
    ``EXAMPLE script_args`` after them (``python -m lab.orchestrate.poisoner ... --script``)."""
    host0 = net.identity_address(0)
    procs = []
    for i, env in enumerate(envs):
        wrapper = list((wrappers or {}).get(i, ()))
        launch = ["-m", *wrapper] if wrapper else []
        argv = [
            str(TORCHRUN),
            "--nnodes", str(net.n),
            "--node-rank", str(i),
            "--nproc-per-node", "1",
            "--rdzv-backend", "static",
            "--rdzv-endpoint", f"{host0}:{RDZV_PORT}",
            "--master-addr", host0,
            "--master-port", str(RDZV_PORT),
            *launch, EXAMPLE, *script_args,
        ]  # fmt: skip
        tmp = work / f"w{i}.tmp"
        tmp.mkdir(exist_ok=True)
        # The child holds the log open; this process needs no handle on it.
        with open(work / f"w{i}.log", "w") as log:
            procs.append(
                net.popen(
                    i,
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                    env={**env, "TMPDIR": str(tmp)},
                )
            )
    return procs
