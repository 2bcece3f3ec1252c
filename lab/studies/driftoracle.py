"""Crew's estimator against the oracle on links that drift: how much do stale rates cost?

``sudo python -m lab.studies.driftoracle [--topology default-drift] [--duration 90]
[--repeats 3]`` runs whole lab runs (``lab.run``, synthetic workers: no torch, so the two cores
carry the data path, not training) on a topology whose links follow rate traces, one arm after
another and the arms in turn ``--repeats`` times, so that the machine's drift falls on every arm
alike. Every run replays the same traces (they are the topology's) and the same seeded
stragglers:

* ``crew/measured`` -- crew planning on rates it measures online from arriving data (the
  estimator, ``crew.control.capacity``);
* ``crew/oracle`` -- crew told each link's true rate as the lab sets it (``--capacity oracle``):
  what crew could do if it knew the network;
* ``crew/configured`` -- crew planning on the topology's mean rates, never updated;
* ``preduce/measured`` and ``blink-pipe/measured`` -- for reference, under the same traces.

It prints, per arm, the median over repeats (and range) of the median group time and of the
rounds per worker per minute, then the two ratios the comparison is about: crew/measured ÷
crew/oracle in median group time (≤ 1.15 is within 15%), crew/oracle ÷ crew/measured in rounds
(the same sense: above 1 the oracle did better), and each arm's rounds ÷ the best arm's.

It is a benchmark, not a test: it needs root, takes the machine's two cores for
``arms × repeats × (duration + ~10 s)``, and prints figures rather than judging them.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from crew.cli_options import add_json_flag, command_parser, write_json
from lab.orchestrate.runner import REPO

DEFAULT_ARMS = (
    "crew/measured",
    "crew/oracle",
    "crew/configured",
    "preduce/measured",
    "blink-pipe/measured",
)
ESTIMATOR, ORACLE = "crew/measured", "crew/oracle"
RUN_SLACK_S = 120.0  # start-up and tear-down beyond --duration before a run counts as hung


@dataclass(frozen=True)
class ArmFigures:
    """One arm over its repeats: the medians and ranges of its runs' figures."""

    arm: str
    median_group_s: float
    group_s_range: tuple[float, float]
    rounds_per_min: float
    rounds_range: tuple[float, float]
    runs: int


def run_figures(summary: Mapping[str, Any]) -> tuple[float, float]:
    """A run summary's (median group time, mean rounds per worker per minute)."""
    per_min = summary.get("rounds_per_worker_per_min") or {}
    rounds = statistics.fmean(per_min.values()) if per_min else 0.0
    group_s = summary.get("median_group_s")
    return (float(group_s) if group_s is not None else float("inf"), float(rounds))


def arm_figures(arm: str, summaries: Sequence[Mapping[str, Any]]) -> ArmFigures:
    figs = [run_figures(s) for s in summaries]
    times, rounds = [f[0] for f in figs], [f[1] for f in figs]
    return ArmFigures(
        arm,
        statistics.median(times),
        (min(times), max(times)),
        statistics.median(rounds),
        (min(rounds), max(rounds)),
        len(figs),
    )


def comparison(arms: Sequence[ArmFigures]) -> dict[str, float | str | None]:
    """The ratios the study reports: estimator ÷ oracle (both senses: above 1, the oracle did
    better) and the fastest arm by rounds and by group time."""
    by = {a.arm: a for a in arms}
    out: dict[str, float | str | None] = {
        "estimator_over_oracle_group_s": None,
        "oracle_over_estimator_rounds": None,
    }
    if ESTIMATOR in by and ORACLE in by:
        est, ora = by[ESTIMATOR], by[ORACLE]
        out["estimator_over_oracle_group_s"] = est.median_group_s / ora.median_group_s
        out["oracle_over_estimator_rounds"] = (
            ora.rounds_per_min / est.rounds_per_min if est.rounds_per_min else float("inf")
        )
    if arms:
        out["most_rounds"] = max(arms, key=lambda a: a.rounds_per_min).arm
        out["shortest_groups"] = min(arms, key=lambda a: a.median_group_s).arm
    return out


def render(arms: Sequence[ArmFigures], cmp: Mapping[str, Any]) -> str:
    best = max((a.rounds_per_min for a in arms), default=0.0)
    lines = [
        f"{'arm':<22} {'median group s (range)':<26} {'rounds/worker/min (range)':<28}"
        f" {'÷ best':>7}  runs"
    ]
    for a in arms:
        lo, hi = a.group_s_range
        rlo, rhi = a.rounds_range
        share = a.rounds_per_min / best if best else float("nan")
        lines.append(
            f"{a.arm:<22} {a.median_group_s:6.3f} ({lo:.3f}-{hi:.3f})"
            f"{'':<6} {a.rounds_per_min:7.1f} ({rlo:.1f}-{rhi:.1f}){'':<8} {share:7.2f}  {a.runs}"
        )
    group_ratio = cmp.get("estimator_over_oracle_group_s")
    if group_ratio is not None:
        lines.append(
            f"crew estimator ÷ oracle: median group time x{group_ratio:.3f},"
            f" rounds (oracle ÷ estimator) x{cmp['oracle_over_estimator_rounds']:.3f}"
        )
    if arms:
        lines.append(
            f"most rounds: {cmp['most_rounds']}; shortest groups: {cmp['shortest_groups']}"
        )
    return "\n".join(lines)


def parse_arm(text: str) -> tuple[str, str]:
    scheme, sep, capacity = text.partition("/")
    if not sep or not scheme or capacity not in ("configured", "measured", "oracle"):
        raise ValueError(f"arm {text!r}: SCHEME/CAPACITY, capacity configured, measured or oracle")
    return scheme, capacity


def run_arm(arm: str, args: Any, seed: int, out: Path) -> dict[str, Any]:
    """One ``lab.run`` of ``arm``; its summary JSON. Raises RuntimeError naming the run's log
    when it fails or outlives its duration by RUN_SLACK_S."""
    scheme, capacity = parse_arm(arm)
    summary = out / "summary.json"
    cmd = [
        sys.executable, "-m", "lab.run", "--topology", args.topology,
        "--workload", args.workload, "--duration", str(args.duration),
        "--scheme", scheme, "--capacity", capacity, "--group-size", str(args.group_size),
        "--seed", str(seed), "--no-dashboard", "--out", str(out / "run"),
        "--json", str(summary),
    ]  # fmt: skip
    if args.model_mb is not None:
        cmd += ["--model-mb", str(args.model_mb)]
    log = out / "lab.log"
    with log.open("w") as fh:
        try:
            rc = subprocess.run(
                cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                timeout=args.duration + RUN_SLACK_S, check=False,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{arm}: lab.run did not end in time; see {log}") from None
    if rc != 0 or not summary.is_file():
        raise RuntimeError(f"{arm}: lab.run exited {rc}; see {log}")
    return json.loads(summary.read_text())


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("sudo python -m lab.studies.driftoracle", __doc__)
    parser.add_argument(
        "--topology", default="default-drift", help="a topology with rate traces (default-drift)"
    )
    parser.add_argument("--duration", type=float, default=90.0, help="seconds per run (90)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per arm, in turn (3)")
    parser.add_argument("--group-size", type=int, default=3, help="p, the group size (3)")
    parser.add_argument("--seed", type=int, default=0, help="stragglers' seed, every run (0)")
    parser.add_argument(
        "--workload", default="synthetic", choices=("synthetic", "mlp", "lm"),
        help="what the workers train (synthetic)",
    )  # fmt: skip
    parser.add_argument("--model-mb", type=float, default=None, help="synthetic vector size")
    parser.add_argument(
        "--arms", default=",".join(DEFAULT_ARMS),
        help=f"comma-separated SCHEME/CAPACITY arms (default {','.join(DEFAULT_ARMS)})",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="keep every run's folder here")
    add_json_flag(parser, "every run's figures and the comparison")
    args = parser.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    try:
        for a in arms:
            parse_arm(a)
    except ValueError as exc:
        parser.error(str(exc))
    if args.repeats < 1 or args.duration <= 0:
        parser.error("--repeats must be at least 1 and --duration positive")
    root = args.out or Path(tempfile.mkdtemp(prefix="crew-driftoracle-"))
    summaries: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    started = time.monotonic()
    total = len(arms) * args.repeats
    for r in range(args.repeats):
        for k, arm in enumerate(arms):
            out = root / f"{r}-{arm.replace('/', '-')}"
            out.mkdir(parents=True, exist_ok=False)
            done = r * len(arms) + k
            print(
                f"[{done + 1}/{total}] {arm}, repeat {r + 1} ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
            try:
                s = run_arm(arm, args, args.seed, out)
            except RuntimeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            group_s, rounds = run_figures(s)
            print(f"  median group {group_s:.3f} s, {rounds:.1f} rounds/worker/min", flush=True)
            summaries[arm].append(s)
    figures = [arm_figures(a, summaries[a]) for a in arms]
    cmp = comparison(figures)
    data = {
        "topology": args.topology,
        "duration_s": args.duration,
        "repeats": args.repeats,
        "arms": [asdict(f) for f in figures],
        "comparison": cmp,
        "runs": {a: [s.get("db") for s in summaries[a]] for a in arms},
    }
    if write_json(args.json, data):
        print(render(figures, cmp))
        print(f"runs kept in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
