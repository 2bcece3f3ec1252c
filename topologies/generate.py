"""Generate the shipped topologies in this directory from the measured data in crew/data/.

    python topologies/generate.py                 # rewrite topologies/*.yaml
    python topologies/generate.py --out-dir DIR   # write elsewhere (tests compare byte-for-byte)
    python topologies/generate.py --check         # exit 1 if a committed file is out of date

Output is a pure function of the data files and the seeds below. Random draws use
``random.Random(seed).random()``, whose sequence Python guarantees across versions, with our
own Fisher–Yates selection on top (``Random.sample`` and numpy's ``Generator.choice`` may change
their algorithms between releases).

Rate scaling: the lab shapes n(n-1) = 56 links at once on a 2-core machine, so the HotCloud'18
samples (20–398 Mbit/s) are multiplied by ``HOTCLOUD_SCALE`` and clipped to
[``RATE_MIN``, ``RATE_MAX``] (only the 350 and 398 samples hit the cap), keeping the spread
of the measurements while bounding the total emulated traffic.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# Run as a plain script from a clean clone, where the package may not be installed.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lab.spec.topology import format_topology_yaml, parse_topology  # noqa: E402

DEFAULT_DATA_DIR = REPO / "crew" / "data"
SEED_DEFAULT = 2018
SEED_BENCH = 2021
HOTCLOUD_SCALE = 0.6
RATE_MIN, RATE_MAX = 10.0, 120.0
AWS_SCALE = 0.1  # Gbit/s × 1000 × 0.1 → Mbit/s, i.e. 1 Gbit/s measured → 100 Mbit/s emulated
AWS_REGIONS = (
    "Oregon",
    "Virginia",
    "Tokyo",
    "Singapore",
    "Sydney",
    "London",
    "Frankfurt",
    "Ireland",
)
DEFAULT_CLOUDS = (
    "aws-virginia",
    "aws-frankfurt",
    "aws-singapore",
    "gcp-belgium",
    "gcp-iowa",
    "gcp-taiwan",
    "azure-tokyo",
    "azure-westus",
)
DEFAULT_STRAGGLERS = {"gcp-taiwan": "2@0.4", "azure-westus": "2@0.2"}
GENERIC_CLOUDS = tuple(f"cloud-{k}" for k in range(8))
SEED_PAPER = 2020
# The paper's scale on one host: n(n-1) shaped links and n workers on two cores. The measured
# rates are scaled down until the data path's CPU cannot bind (lab.run reports the CPU share):
# with every link busy at once, the workers' CPU per link byte (lab.report.simagree's
# LAB_CPU_S_PER_GB, 12.2 s/GB) must fit in one of the two cores, leaving the other to the
# coordinator's planning, the probes and the control messages. At n = 20 and x0.1 it did not
# (3.9 cores' worth of links; lab.run's CPU share 0.81); x0.025 puts 658 Mbit/s on the links,
# one core's worth. At n = 32 the host stays busy at both factors tried (crew's CPU share 0.9
# at x0.1, 0.88 at x0.025): every group costs a plan and control messages to some 26 helpers, and
# slower links only stretch the groups. x0.025 (1,690 Mbit/s) is still the better choice there:
# at x0.1 a relay's wait for the busy cores (tens of ms a hop, over routes of up to five hops)
# doubled a group's data time against its plan, and at x0.025 the data take less than their plan.
PAPER_SCALE = {20: 0.025, 32: 0.025}
# No link below 1 Mbit/s: the leaf queue holds at least 64 frames (lab.net.shaping), 0.78 s at
# 1 Mbit/s, and a probe behind a full queue must still arrive well within the probes'
# dead-after time (crew.wire.probes, 1.6 s), or busy slow links read as cut.
PAPER_RATE_MIN = 1.0
# crew.sim.topogen's "mixed" stragglers: worker i takes the i-th (mod 6) of these.
PAPER_STRAGGLERS = ("2", "2@0.2:0.4", "2@0.4:0.6", "2@0.6:0.8", "2@0.8:1.0", "2@1.0:1.2")


@dataclass(frozen=True)
class Generated:
    filename: str
    header: str
    data: dict[str, Any]


def _draw(values: Sequence[float], k: int, seed: int) -> list[float]:
    """k values without replacement: a partial Fisher–Yates shuffle driven by Random.random()."""
    if k > len(values):
        raise ValueError(f"cannot draw {k} of {len(values)} samples without replacement")
    rng = random.Random(seed)
    pool = list(values)
    for i in range(k):
        j = i + int(rng.random() * (len(pool) - i))
        pool[i], pool[j] = pool[j], pool[i]
    return pool[:k]


def _scaled(sample: float) -> float:
    return round(min(RATE_MAX, max(RATE_MIN, sample * HOTCLOUD_SCALE)), 1)


def _pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]


def _rate(forward: float, reverse: float) -> float | dict[str, float]:
    return forward if forward == reverse else {"forward": forward, "reverse": reverse}


def _hotcloud_links(
    names: Sequence[str], samples: Sequence[float], seed: int
) -> list[dict[str, Any]]:
    """Per-direction rates for every cloud pair: pair order, forward then reverse."""
    pairs = _pairs(names)
    drawn = [_scaled(s) for s in _draw(samples, 2 * len(pairs), seed)]
    return [
        {"between": [a, b], "mbit": _rate(drawn[2 * k], drawn[2 * k + 1])}
        for k, (a, b) in enumerate(pairs)
    ]


def _hotcloud_method(seed: int, source: str) -> str:
    return (
        f"Per-direction rates: drawn without replacement (seed {seed}) from the 110 samples in\n"
        f"crew/data/inter-cloud-bandwidth-samples.json ({source}),\n"
        f"multiplied by the scale factor {HOTCLOUD_SCALE}, clipped to [{RATE_MIN:g}, {RATE_MAX:g}]"
        " Mbit/s, rounded to 0.1.\n"
        "Draw order: cloud pairs in file order, forward (first→second) then reverse."
    )


def _banner(name: str) -> str:
    return (
        f"{name}: generated by topologies/generate.py; do not edit by hand.\n"
        "Regenerate with `python topologies/generate.py` (it is deterministic).\n"
    )


def make_default(data: dict[str, Any]) -> Generated:
    hc = data["inter-cloud-bandwidth-samples"]
    links = _hotcloud_links(DEFAULT_CLOUDS, hc["values"], SEED_DEFAULT)
    header = (
        _banner("default.yaml")
        + "8 workers, one per cloud.\n"
        + _hotcloud_method(SEED_DEFAULT, "HotCloud 2018")
        + "\nNo delay, jitter or loss: the development kernel has no sch_netem.\n"
        + "Stragglers (profiles of crew/data/straggler-profiles.json): "
        + ", ".join(f"{c} {p}" for c, p in DEFAULT_STRAGGLERS.items())
        + ";\n'2@0.4' is profile 2 shifted to start at 0.4 s."
    )
    return Generated(
        "default.yaml",
        header,
        {
            "name": "default",
            "description": (
                "8 clouds, uneven asymmetric WAN rates drawn from HotCloud'18 inter-cloud "
                f"measurements (x{HOTCLOUD_SCALE}), two straggling clouds"
            ),
            "intra_cloud_mbit": 1000,
            "clouds": [
                {"name": c, "workers": 1}
                | ({"straggler": DEFAULT_STRAGGLERS[c]} if c in DEFAULT_STRAGGLERS else {})
                for c in DEFAULT_CLOUDS
            ],
            "links": links,
        },
    )


SLOW_FACTOR = 10


def _slower(mbit: float | dict[str, float]) -> float | dict[str, float]:
    if isinstance(mbit, dict):
        return {k: round(v / SLOW_FACTOR, 2) for k, v in mbit.items()}
    return round(mbit / SLOW_FACTOR, 2)


def make_default_slow(data: dict[str, Any]) -> Generated:
    """default.yaml with every WAN rate divided by SLOW_FACTOR: a network that training waits
    for, where overlapping the reduce with compute should pay."""
    base = make_default(data)
    header = (
        _banner("default-slow.yaml")
        + f"default.yaml with every inter-cloud rate divided by {SLOW_FACTOR} (1-12 Mbit/s),\n"
        + "the same clouds and stragglers: the network the workers wait for."
    )
    return Generated(
        "default-slow.yaml",
        header,
        base.data
        | {
            "name": "default-slow",
            "description": f"default.yaml with every WAN rate / {SLOW_FACTOR}",
            "links": [lk | {"mbit": _slower(lk["mbit"])} for lk in base.data["links"]],
        },
    )


def make_default_heavy(data: dict[str, Any]) -> Generated:
    """default.yaml with every worker's iteration time drawn from the generated heavy-tailed
    profile: the network where a group should not wait for its slowest member."""
    base = make_default(data)
    header = (
        _banner("default-heavy.yaml")
        + "default.yaml's clouds and rates, every worker's iteration time drawn from the\n"
        + "generated heavy-tailed profile 'heavy' (crew/train/heavytail.py: Pareto, shape 1.5,\n"
        + "above 0.05 s; the slowest iteration 16x the median). Generated, not measured."
    )
    return Generated(
        "default-heavy.yaml",
        header,
        base.data
        | {
            "name": "default-heavy",
            "description": "default.yaml with heavy-tailed iteration times on every worker",
            "clouds": [
                {"name": c["name"], "workers": c["workers"], "straggler": "heavy"}
                for c in base.data["clouds"]
            ],
        },
    )


DRIFT = {"spread": 0.3, "tau_s": 30, "duration_s": 900, "seed": 0}


def make_default_drift(data: dict[str, Any]) -> Generated:
    """default.yaml with every WAN link's rate following its own generated trace: the network
    where the planner's estimates go stale, for crew's estimator against the oracle."""
    base = make_default(data)
    header = (
        _banner("default-drift.yaml")
        + "default.yaml's clouds, stragglers and mean rates; every inter-cloud link's rate\n"
        + "follows its own generated trace (crew/ratetrace.py: log-rate Ornstein-Uhlenbeck,\n"
        + f"sigma {DRIFT['spread']} of log rate, time constant {DRIFT['tau_s']} s, one sample a"
        + f" second for {DRIFT['duration_s']} s,\n"
        + f"seed {DRIFT['seed']}): rates moving by about +-30% over tens of seconds."
        + " Generated, not measured."
    )
    return Generated(
        "default-drift.yaml",
        header,
        base.data
        | {
            "name": "default-drift",
            "description": "default.yaml with every WAN rate drifting around its mean (generated)",
            "rate_trace": {"generate": dict(DRIFT)},
        },
    )


def make_aws(data: dict[str, Any]) -> Generated:
    aws = data["aws-10-regions"]
    measured = {frozenset((p["a"], p["b"])): p for p in aws["pairs"]}
    names = [f"aws-{r.lower()}" for r in AWS_REGIONS]
    links = []
    for a, b in _pairs(AWS_REGIONS):
        p = measured[frozenset((a, b))]
        links.append(
            {
                "between": [f"aws-{a.lower()}", f"aws-{b.lower()}"],
                "mbit": round(p["bandwidth_gbit"] * 1000 * AWS_SCALE, 1),
                "delay_ms": p["delay_ms"] / 2,
            }
        )
    header = (
        _banner("aws-8-regions.yaml")
        + "8 of the 10 AWS regions in crew/data/aws-10-regions.json, one worker each\n"
        + f"({', '.join(AWS_REGIONS)});\n"
        + "Ohio and Seoul are left out as near-duplicates of Virginia and Tokyo.\n"
        + f"Rate = measured bandwidth × {AWS_SCALE:g} (1 Gbit/s → {1000 * AWS_SCALE:g} Mbit/s);"
        + " one-way delay = published RTT / 2.\n"
        + f"Symmetric. Intra-region: the source's 2 Gbit/s × {AWS_SCALE:g}.\n"
        + "Requests delay: needs sch_netem (the Vagrant VM has it; the dev kernel does not)."
    )
    return Generated(
        "aws-8-regions.yaml",
        header,
        {
            "name": "aws-8-regions",
            "description": (
                f"8 AWS regions, DT-FM measured bandwidth x{AWS_SCALE:g} and one-way delay RTT/2"
            ),
            "intra_cloud_mbit": round(2000 * AWS_SCALE, 1),
            "clouds": [{"name": c, "workers": 1} for c in names],
            "links": links,
        },
    )


def make_uniform(_: dict[str, Any]) -> Generated:
    return Generated(
        "uniform.yaml",
        _banner("uniform.yaml") + "8 workers in 8 clouds; every directed link 50 Mbit/s.",
        {
            "name": "uniform",
            "description": "8 clouds, every pair 50 Mbit/s both ways (homogeneous control)",
            "intra_cloud_mbit": 1000,
            "defaults": {"mbit": 50},
            "clouds": [{"name": c, "workers": 1} for c in GENERIC_CLOUDS],
        },
    )


def make_small(_: dict[str, Any]) -> Generated:
    clouds = ("aws-virginia", "gcp-belgium", "azure-tokyo")
    return Generated(
        "small.yaml",
        _banner("small.yaml")
        + "3 workers in 3 clouds with hand-picked uneven, asymmetric rates (20–60 Mbit/s),\n"
        + "small enough for integration tests.",
        {
            "name": "small",
            "description": "3 clouds, uneven asymmetric rates 20-60 Mbit/s, for integration tests",
            "intra_cloud_mbit": 1000,
            "clouds": [{"name": c, "workers": 1} for c in clouds],
            "links": [
                {"between": [clouds[0], clouds[1]], "mbit": {"forward": 60, "reverse": 40}},
                {"between": [clouds[0], clouds[2]], "mbit": {"forward": 20, "reverse": 30}},
                {"between": [clouds[1], clouds[2]], "mbit": {"forward": 50, "reverse": 25}},
            ],
        },
    )


def make_clouds_4x2(_: dict[str, Any]) -> Generated:
    clouds = ("us-east", "eu-west", "ap-tokyo", "sa-paulo")
    return Generated(
        "clouds-4x2.yaml",
        _banner("clouds-4x2.yaml")
        + "4 clouds x 2 workers behind shared uplinks: each cloud pair's WAN rate (per\n"
        + "direction) is one capacity shared by the four worker pairs that cross it; workers of\n"
        + "one cloud talk at intra_cloud_mbit. Hand-picked uneven WAN rates, 20-80 Mbit/s.",
        {
            "name": "clouds-4x2",
            "description": "4 clouds x 2 workers, shared uneven WAN uplinks 20-80 Mbit/s",
            "intra_cloud_mbit": 500,
            "uplinks": "shared",
            "clouds": [{"name": c, "workers": 2} for c in clouds],
            "links": [
                {"between": [clouds[0], clouds[1]], "mbit": {"forward": 80, "reverse": 60}},
                {"between": [clouds[0], clouds[2]], "mbit": 30},
                {"between": [clouds[0], clouds[3]], "mbit": {"forward": 50, "reverse": 40}},
                {"between": [clouds[1], clouds[2]], "mbit": {"forward": 25, "reverse": 35}},
                {"between": [clouds[1], clouds[3]], "mbit": 20},
                {"between": [clouds[2], clouds[3]], "mbit": {"forward": 45, "reverse": 30}},
            ],
        },
    )


def _bench_hetero_links(data: dict[str, Any]) -> list[dict[str, Any]]:
    return _hotcloud_links(
        GENERIC_CLOUDS, data["inter-cloud-bandwidth-samples"]["values"], SEED_BENCH
    )


def make_bench_hetero(data: dict[str, Any]) -> Generated:
    return Generated(
        "bench-hetero.yaml",
        _banner("bench-hetero.yaml")
        + "Benchmark topology: 8 workers in 8 clouds, no stragglers.\n"
        + _hotcloud_method(SEED_BENCH, "HotCloud 2018, the CREW authors' 'bwd=2'"),
        {
            "name": "bench-hetero",
            "description": (
                "benchmark: 8 clouds, rates drawn from HotCloud'18 samples "
                f"(x{HOTCLOUD_SCALE}, seed {SEED_BENCH})"
            ),
            "intra_cloud_mbit": 1000,
            "clouds": [{"name": c, "workers": 1} for c in GENERIC_CLOUDS],
            "links": _bench_hetero_links(data),
        },
    )


def make_bench_uniform(data: dict[str, Any]) -> Generated:
    # Same total capacity as bench-hetero, so the two differ only in how it is spread.
    rates: list[float] = []
    for lk in _bench_hetero_links(data):
        m = lk["mbit"]
        rates.extend([m["forward"], m["reverse"]] if isinstance(m, dict) else [m, m])
    mean = round(sum(rates) / len(rates), 1)
    return Generated(
        "bench-uniform.yaml",
        _banner("bench-uniform.yaml")
        + "Benchmark topology: 8 workers in 8 clouds, every directed link at the mean rate of\n"
        + f"bench-hetero.yaml ({mean:g} Mbit/s), so both have the same total capacity.",
        {
            "name": "bench-uniform",
            "description": f"benchmark: 8 clouds, every pair {mean:g} Mbit/s (bench-hetero mean)",
            "intra_cloud_mbit": 1000,
            "defaults": {"mbit": mean},
            "clouds": [{"name": c, "workers": 1} for c in GENERIC_CLOUDS],
        },
    )


SLOWPAIR_MBIT = {(0, 1): 20, (0, 2): 40, (0, 3): 60, (1, 2): 80, (1, 3): 100, (2, 3): 30}


def make_bench_slowpair(_: dict[str, Any]) -> Generated:
    # p = n = 4 with one slow pair: a direct-only plan must push shares across the 20 Mbit/s
    # pair, while routes through relays avoid it (issue 10's first case).
    clouds = GENERIC_CLOUDS[:4]
    return Generated(
        "bench-slowpair.yaml",
        _banner("bench-slowpair.yaml")
        + "Benchmark topology: 4 workers in 4 clouds, symmetric pair rates 20, 40, 60, 80, 100\n"
        + "and 30 Mbit/s; the 20 Mbit/s pair is the one a direct-only plan cannot avoid.",
        {
            "name": "bench-slowpair",
            "description": "benchmark: 4 clouds, one slow pair (20-100 Mbit/s, symmetric)",
            "intra_cloud_mbit": 1000,
            "clouds": [{"name": c, "workers": 1} for c in clouds],
            "links": [
                {"between": [clouds[a], clouds[b]], "mbit": m}
                for (a, b), m in SLOWPAIR_MBIT.items()
            ],
        },
    )


def make_bench_uniform4(_: dict[str, Any]) -> Generated:
    return Generated(
        "bench-uniform4.yaml",
        _banner("bench-uniform4.yaml")
        + "Benchmark topology: 4 workers in 4 clouds, every directed link 50 Mbit/s (p = n = 4:\n"
        + "every directed link carries half the vector whatever the plan).",
        {
            "name": "bench-uniform4",
            "description": "benchmark: 4 clouds, every pair 50 Mbit/s both ways",
            "intra_cloud_mbit": 1000,
            "defaults": {"mbit": 50},
            "clouds": [{"name": c, "workers": 1} for c in GENERIC_CLOUDS[:4]],
        },
    )


def _make_fast(n: int) -> Generated:
    name = f"bench-fast{n}.yaml"
    return Generated(
        name,
        _banner(name)
        + f"Benchmark topology: {n} workers in {n} clouds, every directed link 1 Gbit/s:\n"
        + "where the data path's CPU per byte, not the links, can bound an op.",
        {
            "name": f"bench-fast{n}",
            "description": f"benchmark: {n} clouds, every pair 1 Gbit/s both ways",
            "intra_cloud_mbit": 1000,
            "defaults": {"mbit": 1000},
            "clouds": [{"name": c, "workers": 1} for c in GENERIC_CLOUDS[:n]],
        },
    )


def make_bench_fast2(_: dict[str, Any]) -> Generated:
    return _make_fast(2)


def make_bench_fast4(_: dict[str, Any]) -> Generated:
    return _make_fast(4)


def _draw_with_replacement(values: Sequence[float], k: int, seed: int) -> list[float]:
    """k values drawn with replacement, each index from one Random.random() call."""
    rng = random.Random(seed)
    return [values[int(rng.random() * len(values))] for _ in range(k)]


def _make_paper(n: int, data: dict[str, Any]) -> Generated:
    """The CREW paper's bwd = 2 setting at n clouds of one worker, scaled for one host."""
    samples = data["inter-cloud-bandwidth-samples"]["values"]
    names = [f"c{k:02d}" for k in range(n)]
    pairs = _pairs(names)
    scale = PAPER_SCALE[n]
    raw = _draw_with_replacement(samples, 2 * len(pairs), SEED_PAPER + n)
    drawn = [round(max(PAPER_RATE_MIN, x * scale), 1) for x in raw]
    floored = sum(x * scale < PAPER_RATE_MIN for x in raw)
    filename = f"paper-{n}.yaml"
    header = (
        _banner(filename)
        + f"The CREW paper's bandwidth-diversity setting bwd = 2 at n = {n}: {n} clouds of one\n"
        + "worker, every directed link its own rate, drawn with replacement (seed"
        + f" {SEED_PAPER + n}) from the 110\nsamples in"
        + " crew/data/inter-cloud-bandwidth-samples.json (HotCloud 2018, 20-398 Mbit/s),\n"
        + f"multiplied by the scale factor {scale} (chosen in topologies/generate.py so that"
        + f" {n * (n - 1)}\nshaped links and {n} workers fit two cores where they can; lab.run"
        + f" reports the CPU share),\nat least {PAPER_RATE_MIN:g} Mbit/s ({floored} links raised"
        + f" to it), rounded to 0.1; {sum(drawn):.0f} Mbit/s in all.\n"
        + "Draw order: cloud pairs in file order, forward then reverse. Stragglers as the\n"
        + "simulator's 'mixed' profile: worker i takes the i-th (mod 6) of "
        + ", ".join(PAPER_STRAGGLERS)
        + "."
    )
    return Generated(
        filename,
        header,
        {
            "name": f"paper-{n}",
            "description": f"{n} clouds, the paper's bwd = 2 x{scale}, mixed stragglers",
            "intra_cloud_mbit": 1000,
            "clouds": [
                {"name": c, "straggler": PAPER_STRAGGLERS[k % len(PAPER_STRAGGLERS)]}
                for k, c in enumerate(names)
            ],
            "links": [
                {"between": [a, b], "mbit": _rate(drawn[2 * k], drawn[2 * k + 1])}
                for k, (a, b) in enumerate(pairs)
            ],
        },
    )


def make_paper_20(data: dict[str, Any]) -> Generated:
    return _make_paper(20, data)


def make_paper_32(data: dict[str, Any]) -> Generated:
    return _make_paper(32, data)


MAKERS: tuple[Callable[[dict[str, Any]], Generated], ...] = (
    make_default,
    make_default_slow,
    make_default_heavy,
    make_default_drift,
    make_aws,
    make_uniform,
    make_small,
    make_clouds_4x2,
    make_bench_hetero,
    make_bench_uniform,
    make_bench_slowpair,
    make_bench_uniform4,
    make_bench_fast2,
    make_bench_fast4,
    make_paper_20,
    make_paper_32,
)


def load_data(data_dir: Path) -> dict[str, Any]:
    names = ("inter-cloud-bandwidth-samples", "aws-10-regions")
    return {n: json.loads((data_dir / f"{n}.json").read_text(encoding="utf-8")) for n in names}


def render(data: dict[str, Any]) -> dict[str, str]:
    """File name → YAML text for every shipped topology, each validated by the lab's parser."""
    out: dict[str, str] = {}
    for make in MAKERS:
        g = make(data)
        text = format_topology_yaml(g.data, header=g.header)
        parse_topology(yaml.safe_load(text))  # raises TopologyError if we generated nonsense
        out[g.filename] = text
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out-dir", type=Path, default=HERE, help="where to write (default: %(default)s)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help="directory holding the measurement JSON files (default: %(default)s)",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file in --out-dir differs"
    )
    args = parser.parse_args(argv)
    files = render(load_data(args.data_dir))
    stale = []
    for filename, text in files.items():
        target = args.out_dir / filename
        if args.check:
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                stale.append(filename)
            continue
        args.out_dir.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}")
    if stale:
        print(
            f"out of date: {', '.join(stale)} (run python topologies/generate.py)", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
