"""Topology spec: shipped files, validation messages, resolution rules, CLI and generator."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.spec.topology import (
    Impairment,
    LinkSpec,
    TopologyError,
    TopologySpec,
    load_topology,
    parse_topology,
    split_straggler,
)

REPO = Path(__file__).resolve().parents[1]
TOPOLOGIES = REPO / "topologies"
BAD = Path(__file__).resolve().parent / "data" / "bad_topologies"

SHIPPED = {
    # file: (n, symmetric, impairments)
    "default.yaml": (8, False, frozenset()),
    "default-slow.yaml": (8, False, frozenset()),
    "default-heavy.yaml": (8, False, frozenset()),
    "default-drift.yaml": (8, False, frozenset()),
    "aws-8-regions.yaml": (8, True, frozenset({Impairment.DELAY})),
    "uniform.yaml": (8, True, frozenset()),
    "small.yaml": (3, False, frozenset()),
    "bench-hetero.yaml": (8, False, frozenset()),
    "bench-uniform.yaml": (8, True, frozenset()),
    "bench-slowpair.yaml": (4, True, frozenset()),
    "bench-uniform4.yaml": (4, True, frozenset()),
    "bench-fast2.yaml": (2, True, frozenset()),
    "bench-fast4.yaml": (4, True, frozenset()),
    "clouds-4x2.yaml": (8, False, frozenset()),
    "paper-20.yaml": (20, False, frozenset()),
    "paper-32.yaml": (32, False, frozenset()),
}


# --------------------------------------------------------------------------- shipped topologies


@pytest.mark.parametrize("filename", sorted(SHIPPED))
def test_shipped_topology_loads(filename: str) -> None:
    n, symmetric, impairments = SHIPPED[filename]
    spec = load_topology(TOPOLOGIES / filename)
    assert spec.n == n
    assert len(spec.links) == n * (n - 1)
    assert [(lk.src, lk.dst) for lk in spec.links] == sorted(
        (i, j) for i in range(n) for j in range(n) if i != j
    )
    bw = spec.bw_matrix()
    assert bw.shape == (n, n)
    assert np.all(np.isinf(np.diag(bw)))
    off = bw[~np.eye(n, dtype=bool)]
    assert np.all(np.isfinite(off)) and np.all(off > 0)
    assert np.array_equal(bw, bw.T) == symmetric
    assert spec.impairments_requested() == impairments
    assert [w.name for w in spec.workers] == [f"w{i}" for i in range(n)]
    assert all(len(w.name) <= 4 for w in spec.workers)
    for lk in spec.links:
        assert spec.link(lk.src, lk.dst) is lk
        assert bw[lk.src, lk.dst] == lk.rate_mbit


def test_shipped_directory_has_exactly_the_expected_files() -> None:
    assert sorted(p.name for p in TOPOLOGIES.glob("*.yaml")) == sorted(SHIPPED)


@pytest.mark.parametrize("filename", ["default.yaml", "bench-hetero.yaml"])
def test_hetero_rates_are_scaled_into_lab_range(filename: str) -> None:
    spec = load_topology(TOPOLOGIES / filename)
    rates = [lk.rate_mbit for lk in spec.links]
    assert min(rates) >= 10 and max(rates) <= 120
    assert len(set(rates)) > 20  # drawn, not constant


def test_paper_20_links_all_busy_take_about_one_core_of_the_host() -> None:
    # The rule topologies/generate.py scales paper-20 by: every link busy at once, at the
    # workers' measured CPU per link byte, leaves the second core to everything else.
    from lab.report.simagree import LAB_CPU_S_PER_GB

    spec = load_topology(TOPOLOGIES / "paper-20.yaml")
    rates = [lk.rate_mbit for lk in spec.links]
    cores = sum(rates) * 1e6 / 8 * LAB_CPU_S_PER_GB / 1e9
    assert 0.9 <= cores <= 1.05  # one core, to the 0.1 Mbit/s rounding and the floor
    assert min(rates) >= 1.0  # a full 64-frame leaf queue drains within half a dead-after


def test_the_slow_default_is_the_default_ten_times_slower() -> None:
    fast, slow = (load_topology(TOPOLOGIES / f) for f in ("default.yaml", "default-slow.yaml"))
    assert [c.straggler for c in slow.clouds] == [c.straggler for c in fast.clouds]
    ratios = [f.rate_mbit / s.rate_mbit for f, s in zip(fast.links, slow.links, strict=True)]
    assert ratios and all(abs(r - 10) < 0.1 for r in ratios)


def test_default_has_one_or_two_straggling_clouds_and_distinct_names() -> None:
    spec = load_topology(TOPOLOGIES / "default.yaml")
    assert 1 <= sum(c.straggler is not None for c in spec.clouds) <= 2
    assert len({c.name for c in spec.clouds}) == 8
    assert all(lk.delay_ms == lk.jitter_ms == lk.loss_pct == 0 for lk in spec.links)


def test_small_directions_follow_forward_reverse() -> None:
    spec = load_topology(TOPOLOGIES / "small.yaml")
    assert (spec.link(0, 1).rate_mbit, spec.link(1, 0).rate_mbit) == (60, 40)
    assert (spec.link(0, 2).rate_mbit, spec.link(2, 0).rate_mbit) == (20, 30)
    off = spec.bw_matrix()[~np.eye(3, dtype=bool)]
    assert off.min() >= 20 and off.max() <= 60


def test_aws_delay_is_half_the_published_rtt() -> None:
    spec = load_topology(TOPOLOGIES / "aws-8-regions.yaml")
    oregon, virginia = (spec.worker(f"w{i}") for i in (0, 1))
    assert (oregon.cloud, virginia.cloud) == ("aws-oregon", "aws-virginia")
    lk = spec.link(0, 1)
    assert lk.delay_ms == 67 / 2 and lk.rate_mbit == pytest.approx(79.0)


def test_bench_uniform_matches_bench_hetero_total_capacity() -> None:
    hetero = load_topology(TOPOLOGIES / "bench-hetero.yaml").bw_matrix()
    uniform = load_topology(TOPOLOGIES / "bench-uniform.yaml").bw_matrix()
    mask = ~np.eye(8, dtype=bool)
    assert len(set(uniform[mask])) == 1
    assert uniform[mask].sum() == pytest.approx(hetero[mask].sum(), rel=0.01)


@pytest.mark.parametrize("filename", sorted(SHIPPED))
def test_to_dict_and_to_yaml_round_trip(filename: str, tmp_path: Path) -> None:
    spec = load_topology(TOPOLOGIES / filename)
    again = parse_topology(spec.to_dict())
    assert dataclasses.replace(again, source=spec.source) == spec
    path = tmp_path / "t.yaml"
    path.write_text(spec.to_yaml(header="from the run DB"), encoding="utf-8")
    assert load_topology(path).links == spec.links


# --------------------------------------------------------------------------- broken files

# Each broken file and the substrings its error must contain: the field, then the problem.
BAD_CASES: dict[str, tuple[str, ...]] = {
    "empty.yaml": ("(document)", "empty"),
    "syntax_error.yaml": ("(document)", "YAML syntax error", "line 4"),
    "top_level_list.yaml": ("(document)", "top level must be a mapping"),
    "unknown_top_key.yaml": ("clods:", "unknown key 'clods'", "did you mean 'clouds'"),
    "unknown_link_key.yaml": ("links[0].mbps:", "did you mean 'mbit'"),
    "rate_zero.yaml": ("links[0].mbit:", "out of range", "> 0"),
    "rate_too_high.yaml": ("links[0].mbit:", "out of range", "<= 10000"),
    "rate_not_number.yaml": ("links[0].mbit:", "must be a number", "'fast'"),
    "rate_bool.yaml": ("links[0].mbit:", "must be a number"),
    "reverse_negative.yaml": ("links[0].mbit.reverse:", "-5 is out of range"),
    "direction_typo.yaml": ("links[0].mbit.revers:", "did you mean 'reverse'"),
    "negative_delay.yaml": ("links[0].delay_ms:", "-3 is out of range"),
    "jitter_over_delay.yaml": ("links[0].jitter_ms:", "reverse jitter 8 ms exceeds"),
    "loss_100.yaml": ("links[0].loss_pct:", "< 100"),
    "duplicate_cloud.yaml": ("clouds[1].name:", "duplicate cloud name 'a'"),
    "unknown_cloud_in_link.yaml": (
        "links[0].between[1]:",
        "unknown cloud 'gcp-belguim'",
        "did you mean 'gcp-belgium'",
    ),
    "pair_twice.yaml": ("links[1].between:", "already given by links[0]"),
    "self_pair.yaml": ("links[0].between:", "paired with itself"),
    "missing_pair.yaml": ("links:", "a–c", "no link given"),
    "zero_workers.yaml": ("clouds[0].workers:", "0 is out of range"),
    "too_many_workers.yaml": ("clouds[2].workers:", "too many workers", "64"),
    "workers_not_integer.yaml": ("clouds[0].workers:", "must be an integer"),
    "no_clouds.yaml": ("clouds:", "at least one cloud"),
    "unknown_straggler.yaml": ("clouds[0].straggler:", "unknown straggler profile '9'"),
    "straggler_bad_shift.yaml": ("clouds[0].straggler:", "'soon'", "not a number"),
    "worker_override_unknown.yaml": ("workers.w2:", "no such worker", "w0..w1"),
    "worker_override_typo.yaml": ("workers.w1.stragler:", "did you mean 'straggler'"),
    "duplicate_yaml_key.yaml": ("(document)", "duplicate key 'name'", "line 3"),
    "missing_name.yaml": ("name:", "required key is missing"),
    "bad_cloud_name.yaml": ("clouds[0].name:", "not a valid name"),
    "intra_negative.yaml": ("intra_cloud_mbit:", "out of range"),
    "defaults_without_mbit.yaml": ("defaults.mbit:", "required key is missing"),
    "defaults_directional.yaml": ("defaults.mbit:", "must be a number", "dict"),
    "between_three.yaml": ("links[0].between:", "two cloud names"),
    "link_without_rate.yaml": ("links[0].mbit:", "required key is missing"),
}


def test_every_bad_file_has_an_expectation() -> None:
    assert sorted(p.name for p in BAD.iterdir()) == sorted(BAD_CASES)
    assert len(BAD_CASES) >= 15


@pytest.mark.parametrize("filename", sorted(BAD_CASES))
def test_bad_topology_is_rejected_with_field_and_reason(filename: str) -> None:
    path = BAD / filename
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    err = info.value
    message = str(err)
    assert message.startswith(f"{path}: {err.field}: ")
    assert err.path == path
    for needle in BAD_CASES[filename]:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_missing_file_is_a_topology_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read file"):
        load_topology(tmp_path / "nope.yaml")


def test_parse_topology_rejects_non_mapping_without_source() -> None:
    with pytest.raises(TopologyError) as info:
        parse_topology(["not", "a", "mapping"])  # type: ignore[arg-type]
    assert str(info.value).startswith("<data>: (document): ")


# --------------------------------------------------------------------------- resolution rules

MULTI = """
name: multi
intra_cloud_mbit: 900
defaults: {mbit: 15, delay_ms: 4, jitter_ms: 1}
clouds:
  - {name: east, workers: 2, straggler: 2}
  - {name: west, workers: 1}
  - {name: south, workers: 1, straggler: "2@0.40"}
links:
  - {between: [west, east], mbit: {forward: 30, reverse: 70}, loss_pct: 0.5}
workers:
  w1: {straggler: "1"}
  w3: {straggler: null}
"""


def _multi() -> TopologySpec:
    return parse_topology(yaml.safe_load(MULTI))


def test_workers_numbered_cloud_by_cloud_with_overrides() -> None:
    spec = _multi()
    assert [(w.name, w.cloud, w.straggler) for w in spec.workers] == [
        ("w0", "east", "2"),  # integer id accepted and normalised
        ("w1", "east", "1"),
        ("w2", "west", None),
        ("w3", "south", None),
    ]
    assert spec.clouds[2].straggler == "2@0.4"


def test_links_resolve_intra_listed_reversed_and_defaults() -> None:
    spec = _multi()
    # same cloud: intra rate, no impairments
    assert spec.link(0, 1) == LinkSpec(0, 1, 900.0)
    # pair listed as [west, east]: forward is west→east
    assert spec.link(2, 0).rate_mbit == 30 and spec.link(0, 2).rate_mbit == 70
    assert spec.link(2, 1).rate_mbit == 30 and spec.link(1, 2).rate_mbit == 70
    # values the entry leaves out come from defaults
    assert spec.link(2, 0).delay_ms == 4 and spec.link(2, 0).loss_pct == 0.5
    # unlisted pair: defaults
    assert spec.link(0, 3) == LinkSpec(0, 3, 15.0, 4.0, 1.0, 0.0)
    assert spec.impairments_requested() == frozenset(Impairment)


def test_multi_cloud_round_trips_through_to_dict() -> None:
    spec = _multi()
    assert parse_topology(spec.to_dict()) == spec


@st.composite
def _random_topology(draw: st.DrawFn) -> dict:
    counts = draw(st.lists(st.integers(1, 3), min_size=1, max_size=5))
    names = [f"c{k}" for k in range(len(counts))]
    rate = st.floats(0.5, 10_000, allow_nan=False).map(lambda x: round(x, 1))
    links = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if draw(st.booleans()):
                pair = [a, b] if draw(st.booleans()) else [b, a]
                links.append(
                    {"between": pair, "mbit": {"forward": draw(rate), "reverse": draw(rate)}}
                )
    return {
        "name": "random",
        "intra_cloud_mbit": draw(rate),
        "defaults": {"mbit": draw(rate)},
        "clouds": [{"name": c, "workers": k} for c, k in zip(names, counts, strict=True)],
        "links": links,
    }


@settings(max_examples=60, deadline=None)
@given(_random_topology())
def test_random_topologies_resolve_consistently(data: dict) -> None:
    spec = parse_topology(data)
    bw = spec.bw_matrix()
    listed = {tuple(lk["between"]): lk["mbit"] for lk in data["links"]}
    for i in range(spec.n):
        for j in range(spec.n):
            if i == j:
                continue
            a, b = spec.workers[i].cloud, spec.workers[j].cloud
            if a == b:
                want = data["intra_cloud_mbit"]
            elif (a, b) in listed:
                want = listed[(a, b)]["forward"]
            elif (b, a) in listed:
                want = listed[(b, a)]["reverse"]
            else:
                want = data["defaults"]["mbit"]
            assert spec.link(i, j).rate_mbit == bw[i, j] == want
    assert parse_topology(yaml.safe_load(spec.to_yaml())) == spec


def test_readme_example_is_valid() -> None:
    text = (TOPOLOGIES / "README.md").read_text(encoding="utf-8")
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = parse_topology(yaml.safe_load(example))
    assert [w.straggler for w in spec.workers] == ["2", None, None, "2@0.4"]
    assert spec.link(0, 2).rate_mbit == 80 and spec.link(2, 0).rate_mbit == 55


def test_link_rejects_diagonal_and_out_of_range() -> None:
    spec = _multi()
    for i, j in [(1, 1), (0, 4), (-1, 0)]:
        with pytest.raises(KeyError):
            spec.link(i, j)


def test_hand_built_spec_must_keep_link_layout() -> None:
    spec = _multi()
    with pytest.raises(ValueError, match="one per ordered pair"):
        dataclasses.replace(spec, links=spec.links[::-1])
    with pytest.raises(ValueError):
        LinkSpec(0, 1, rate_mbit=0.0)


def test_to_dict_refuses_a_spec_the_format_cannot_express() -> None:
    spec = _multi()
    links = list(spec.links)
    k = links.index(spec.link(0, 2))
    links[k] = dataclasses.replace(links[k], rate_mbit=1.0)  # w0→w2 differs from w1→w2
    odd = dataclasses.replace(spec, links=tuple(links))
    with pytest.raises(ValueError, match="cannot express"):
        odd.to_dict()


@pytest.mark.parametrize(
    ("spec", "named"),
    [("2@0.6:0.4", "below low"), ("2@0.4:x", "0.4:x"), ("2@1:90", "at most 60"), ("9@0:1", "9")],
)
def test_a_straggler_range_is_checked_by_the_profiles_own_rules(spec: str, named: str) -> None:
    ok = {
        "name": "t",
        "defaults": {"mbit": 10},
        "clouds": [{"name": "a", "straggler": "2@0.4:0.6"}, {"name": "b"}],
    }
    assert parse_topology(ok).workers[0].straggler == "2@0.4:0.6"
    bad = ok | {"clouds": [{"name": "a", "straggler": spec}, {"name": "b"}]}
    with pytest.raises(TopologyError, match=re.escape(named)):
        parse_topology(bad)


def test_split_straggler() -> None:
    assert split_straggler("3") == ("3", None)
    assert split_straggler("2@0.4") == ("2", 0.4)
    with pytest.raises(ValueError):
        split_straggler("2@x")


def test_error_fields_are_attributes() -> None:
    err = TopologyError("a.yaml", "links[3].mbit.forward", "must be a number")
    assert (err.path, err.field, err.message) == (
        Path("a.yaml"),
        "links[3].mbit.forward",
        "must be a number",
    )
    assert str(err) == "a.yaml: links[3].mbit.forward: must be a number"
    assert isinstance(err, ValueError)


# --------------------------------------------------------------------------- CLI and generator


def _run(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_accepts_good_file() -> None:
    res = _run("-m", "lab.topology", TOPOLOGIES / "small.yaml", TOPOLOGIES / "aws-8-regions.yaml")
    assert res.returncode == 0, res.stderr
    assert "n = 3" in res.stdout and "min 20 / median 35 / max 60" in res.stdout
    assert "impairments requested: delay" in res.stdout
    assert res.stderr == ""


def test_cli_rejects_bad_file_with_exit_2() -> None:
    bad = BAD / "pair_twice.yaml"
    res = _run("-m", "lab.topology", TOPOLOGIES / "small.yaml", bad)
    assert res.returncode == 2
    assert f"{bad}: links[1].between: " in res.stderr
    assert "n = 3" in res.stdout  # the good file is still summarised


def test_cli_help() -> None:
    res = _run("-m", "lab.topology", "--help")
    assert res.returncode == 0 and "impairments" in res.stdout


def test_generate_reproduces_committed_files(tmp_path: Path) -> None:
    # From another working directory, as from a clean clone.
    res = _run(TOPOLOGIES / "generate.py", "--out-dir", tmp_path, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    produced = sorted(p.name for p in tmp_path.glob("*.yaml"))
    assert produced == sorted(SHIPPED)
    for name in produced:
        assert (tmp_path / name).read_bytes() == (TOPOLOGIES / name).read_bytes(), name
    assert _run(TOPOLOGIES / "generate.py", "--check").returncode == 0


def test_generate_check_detects_stale_file(tmp_path: Path) -> None:
    assert _run(TOPOLOGIES / "generate.py", "--out-dir", tmp_path).returncode == 0
    (tmp_path / "small.yaml").write_text("name: edited\n", encoding="utf-8")
    res = _run(TOPOLOGIES / "generate.py", "--out-dir", tmp_path, "--check")
    assert res.returncode == 1 and "small.yaml" in res.stderr
