"""The training matrix of ``lab.bench --train --configs``: which runs it makes, the table's
rows, bytes until the target, and the plots. No lab needed."""

from __future__ import annotations

import pytest

from crew.runtime.rundb import RunDB
from lab.bench import cli as bench_cli
from lab.bench import report as bench_report
from lab.bench import spec as bench_spec
from lab.bench import train as bench_train


def _args(*argv: str):
    return bench_cli.build_parser().parse_args(
        ["--topology", "topologies/default.yaml", "--out", "/tmp/x", "--train", *argv]
    )


def test_configs_expand_to_every_combination_in_order() -> None:
    args = _args("--local-steps", "8")
    runs = bench_spec.parse_train_configs(
        ["crew,preduce:every-step,diloco:none,int8", "gloo:every-step:none"], args
    )
    names = [r.name for r in runs]
    assert names == [
        "crew-every-step-fp32",
        "crew-every-step-int8",
        "crew-diloco8-fp32",
        "crew-diloco8-int8",
        "preduce-every-step-fp32",
        "preduce-every-step-int8",
        "preduce-diloco8-fp32",
        "preduce-diloco8-int8",
        "gloo-every-step-fp32",
    ]
    by = {r.name: r for r in runs}
    assert by["crew-every-step-int8"].training["local_steps"] == 1
    assert by["crew-diloco8-int8"].training["local_steps"] == 8
    assert by["crew-diloco8-int8"].training["compress"] == "int8"
    assert by["crew-diloco8-int8"].label == ("crew", "diloco H=8", "int8")
    assert by["gloo-every-step-fp32"].label == ("gloo", "every-step", "fp32")


def test_modes_run_each_combination_blocking_and_overlapped() -> None:
    runs = bench_spec.parse_train_configs(
        ["crew:diloco:int8:blocking,overlap"], _args("--local-steps", "8")
    )
    assert [r.name for r in runs] == ["crew-diloco8-int8", "crew-diloco8-int8-overlap"]
    assert [r.training["overlap"] for r in runs] == [False, True]
    assert runs[1].label == ("crew", "diloco H=8 overlapped", "int8")
    # Without a MODES field, --overlap chooses.
    (one,) = bench_spec.parse_train_configs(["preduce:every-step:none"], _args("--overlap"))
    assert one.name == "preduce-every-step-fp32-overlap" and one.training["overlap"]


def test_every_run_takes_the_iteration_floor_to_its_workers_config(tmp_path) -> None:
    from crew.config import ConfigError, RunConfig
    from lab.orchestrate.runner import RunOptions
    from tests.lifecycle_kit import make_cfg

    runs = bench_spec.parse_train_configs(
        ["crew:diloco:none:blocking,overlap"],
        _args("--local-steps", "8", "--min-iteration-s", "2.5"),
    )
    assert [r.training["min_iteration_s"] for r in runs] == [2.5, 2.5]
    assert RunOptions(**runs[1].training).min_iteration_s == 2.5
    saved = make_cfg(min_iteration_s=2.5)
    saved.save(tmp_path / "run.json")
    assert RunConfig.load(tmp_path / "run.json").min_iteration_s == 2.5  # what workers read
    with pytest.raises(ConfigError, match="min_iteration_s"):
        make_cfg(min_iteration_s=-1.0)
    assert (
        bench_spec.parse_train_configs(["crew:every-step:none"], _args())[0].training[
            "min_iteration_s"
        ]
        == 0.0
    )


@pytest.mark.parametrize(
    ("item", "named"),
    [
        ("crew:every-step:none:sometimes", "mode 'sometimes'"),
        ("gloo:every-step:none:overlap", "gloo all-reduces in lockstep"),
        ("gloo:every-step:int8", "gloo all-reduces float32"),
        ("crew:every-step", "SCHEMES:SYNCS:COMPRESS"),
        ("crew:every-step:none:overlap:x", "SCHEMES:SYNCS:COMPRESS"),
        ("crew:sometimes:none", "sync"),
        ("crew:every-step:int4", "compress"),
        ("nosuch:every-step:none", "nosuch"),
    ],
)
def test_bad_configs_are_refused_by_name(item: str, named: str) -> None:
    with pytest.raises(bench_spec.BenchError, match=named):
        bench_spec.parse_train_configs([item], _args("--local-steps", "8"))


def test_a_config_listed_twice_is_refused() -> None:
    with pytest.raises(bench_spec.BenchError, match="twice"):
        bench_spec.parse_train_configs(["crew:diloco:int8", "crew:diloco:int8"], _args())


def test_without_configs_one_run_per_scheme_as_before() -> None:
    spec = bench_cli.spec_from_args(_args("--schemes", "crew,gloo", "--ops", "0"))
    assert [(r.name, r.scheme) for r in spec.train_runs] == [("crew", "crew"), ("gloo", "gloo")]
    spec = bench_cli.spec_from_args(
        _args("--ops", "0", "--configs", "crew:local-sgd:fp16", "--local-steps", "4")
    )
    assert [r.name for r in spec.train_runs] == ["crew-local-sgd4-fp16"]


def test_bytes_until_the_target_and_the_curve(tmp_path) -> None:
    db = RunDB(tmp_path / "lab.db")
    db.executemany(
        "INSERT INTO iterations (t, worker, iteration, loss, accuracy) VALUES (?,?,?,?,?)",
        [
            (100.0, 0, 1, 2.0, None),
            (101.0, 0, 1, 1.0, 0.5),
            (102.0, 1, 1, 1.0, 0.7),  # both reported: mean 0.6
            (104.0, 0, 2, 0.5, 0.9),  # mean 0.8
            (106.0, 1, 2, 0.5, 0.95),  # mean 0.925 >= 0.85: 6 s after the first row
        ],
    )
    db.executemany(
        "INSERT INTO link_samples (t, src, dst, tx_bytes, mbit) VALUES (?,?,?,?,?)",
        [
            (100.0, 0, 1, 1000, 0.0),
            (105.0, 0, 1, 3000, 0.0),
            (107.0, 0, 1, 6000, 0.0),  # first sample at or after 106
            (110.0, 0, 1, 9000, 0.0),
            (100.0, 1, 0, 0, 0.0),
            (108.0, 1, 0, 500, 0.0),
        ],
    )
    # 15 CPU s over the run's 10 s on 2 cores: the host was busy 75% of the run.
    db.set_meta({"started_at": "100.0", "ended_at": "110.0", "lab_cpu_s": "15", "cores": "2"})
    db.close()
    r = bench_train.train_results(tmp_path / "lab.db", n=2, target=0.85)
    assert r.cpu_share == 0.75
    assert r.time_to_target_s == 6.0
    assert r.link_bytes == 8000 + 500
    assert r.link_bytes_to_target == 5000 + 500
    assert r.curve == [(2.0, pytest.approx(0.6)), (4.0, 0.8), (6.0, 0.925)]
    assert (
        bench_train.train_results(tmp_path / "lab.db", n=2, target=0.99).link_bytes_to_target
        is None
    )


def _result(per_round: float, **config) -> dict:
    return bench_train.TrainResult(
        training_s=50.0,
        final_accuracy=0.9,
        time_to_target_s=20.0,
        rounds_per_worker={"0": 10, "1": 12},
        link_bytes=int(per_round * 22),
        link_bytes_per_round=per_round,
        link_bytes_to_target=int(per_round * 9),
        curve=[(1.0, 0.2), (20.0, 0.86)],
        cpu_share=0.4,
    ).to_dict() | {"config": config}


def test_the_table_shows_each_run_and_its_ratio_to_fp32() -> None:
    from rich.console import Console

    base = {"scheme": "crew", "sync": "diloco", "local_steps": 8, "sync_label": "diloco H=8"}
    runs = {
        "crew-diloco8-fp32": _result(7.5e6, **base, compress="none", codec="fp32"),
        "crew-diloco8-int8": _result(1.95e6, **base, compress="int8", codec="int8"),
    }
    console = Console(width=250, record=True)
    console.print(bench_report.train_table(runs, 0.85))
    text = console.export_text()
    rows = {line.split()[1]: line for line in text.splitlines() if "crew-diloco8" in line}
    assert "1.95" in rows["crew-diloco8-int8"]
    assert "0.260" in rows["crew-diloco8-int8"]  # per worker-round against the fp32 twin
    assert "7.50" in rows["crew-diloco8-fp32"] and "1.000" not in rows["crew-diloco8-fp32"]
    assert "11.0" in text  # rounds per worker: (10 + 12) / 2
    assert "CPU share" in text and "40%" in rows["crew-diloco8-int8"]
    figs = bench_report.train_figures(
        {"topology": "default", "p": 3, "seed": 1, "target_accuracy": 0.85, "schemes": runs}
    )
    assert set(figs) == {"train-curves", "train-bytes"}
    assert len(figs["train-curves"].data) == 2
    assert list(figs["train-bytes"].data[1].y) == pytest.approx([7.5e6 * 9 / 1e6, 1.95e6 * 9 / 1e6])
