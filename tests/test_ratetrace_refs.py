"""A topology's rate_trace references: per cloud pair, per direction, or generated for every
link; bad references name the topology file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lab.spec.ratetraces import TraceRefError, link_traces, load_link_traces
from lab.spec.topology import load_topology

REPO_SMALL = Path(__file__).resolve().parents[1] / "topologies" / "small.yaml"
TOPO = """
name: drift
clouds:
  - {name: a, workers: 2}
  - {name: b}
  - {name: c}
links:
  - {between: [a, b], mbit: 50}
  - {between: [a, c], mbit: {forward: 40, reverse: 80}}
  - {between: [b, c], mbit: 20}
"""


def _traces(tmp_path: Path, extra: dict) -> dict:
    data = yaml.safe_load(TOPO)
    for k, v in extra.items():
        if k == "top":
            data["rate_trace"] = v
        else:
            data["links"][k]["rate_trace"] = v
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(data))
    return link_traces(load_topology(path), data)


def test_a_link_entry_replays_its_file_on_both_directions(tmp_path: Path) -> None:
    (tmp_path / "ab.csv").write_text("t,mbit\n0,50\n10,30\n")
    traces = _traces(tmp_path, {0: "ab.csv"})
    # cloud a holds w0 and w1, b holds w2
    assert set(traces) == {(0, 2), (1, 2), (2, 0), (2, 1)}
    assert traces[(2, 1)].rate_at(12) == 30.0 and not traces[(2, 1)].generated


def test_forward_and_reverse_take_their_own_files(tmp_path: Path) -> None:
    (tmp_path / "f.csv").write_text("0,40\n")
    traces = _traces(tmp_path, {1: {"forward": "f.csv"}})
    assert set(traces) == {(0, 3), (1, 3)}  # a -> c only


def test_every_link_generates_around_its_rate_and_a_link_entry_wins(tmp_path: Path) -> None:
    (tmp_path / "bc.csv").write_text("0,7\n")
    traces = _traces(
        tmp_path, {"top": {"generate": {"spread": 0.2, "duration_s": 5000, "seed": 2}}, 2: "bc.csv"}
    )
    assert len(traces) == 10  # every ordered pair but the two inside cloud a
    assert (0, 1) not in traces
    assert traces[(2, 3)].mbit == (7.0,)
    gen = traces[(3, 0)]  # c -> a: 80 Mbit/s configured
    assert gen.generated
    assert sum(gen.mbit) / len(gen.mbit) == pytest.approx(80, rel=0.1)
    assert traces[(0, 2)].mbit != traces[(1, 2)].mbit  # each link its own draw


@pytest.mark.parametrize(
    ("ref", "problem"),
    [
        ("missing.csv", "missing.csv: cannot read"),
        ({"generate": {"tau": 3}}, "links[0].rate_trace.generate: a mapping of"),
        ({"generate": {"spread": 9}}, "spread"),
        (12, "a trace CSV path or"),
    ],
)
def test_bad_references_name_the_topology_and_field(
    tmp_path: Path, ref: object, problem: str
) -> None:
    with pytest.raises(TraceRefError) as err:
        _traces(tmp_path, {0: ref})
    assert str(tmp_path / "topo.yaml") in str(err.value)
    assert problem in str(err.value)


def test_a_bad_trace_file_names_its_line(tmp_path: Path) -> None:
    (tmp_path / "ab.csv").write_text("0,50\n5,-1\n")
    with pytest.raises(TraceRefError, match=r"links\[0\].rate_trace: .*ab.csv, line 2: "):
        _traces(tmp_path, {0: "ab.csv"})


def test_a_topology_file_loads_with_its_traces(tmp_path: Path) -> None:
    (tmp_path / "ab.csv").write_text("0,50\n")
    data = yaml.safe_load(TOPO)
    data["links"][0]["rate_trace"] = "ab.csv"
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(data))
    spec, traces = load_link_traces(path)
    assert spec.n == 4 and set(traces) == {(0, 2), (1, 2), (2, 0), (2, 1)}
    _, none = load_link_traces(REPO_SMALL)
    assert none == {}
