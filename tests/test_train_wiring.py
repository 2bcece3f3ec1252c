"""The training modes wired through: crew.Averager's outer hook (DiLoCo by hand, two ranks on
loopback) and the lab's options (bad combinations refused before anything is built)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import crew
from crew.train.outer import OuterConfig, OuterLoop, SyncMode
from lab.run import main as lab_run
from tests.test_averager import ARGS, env_for, free_port


def test_averager_applies_the_diloco_outer_step_two_ranks_by_hand(tmp_path) -> None:
    """theta = 0 on both ranks, local models x_r = r (first tensor) and 1 (second).
    g_r = -x_r, b'_r = g_r, y_r = -lr (g_r + mu b'_r) = lr (1 + mu) x_r; the average of y."""
    lr, mu = 0.7, 0.9
    port = free_port()
    out: dict[int, object] = {}

    def one(rank: int) -> None:
        tensors = [torch.full((3, 4), float(rank)), torch.ones(5)]
        loop = OuterLoop(OuterConfig(SyncMode.DILOCO, 1, lr, mu), np.zeros(17, np.float32))
        try:
            env = env_for(rank, 2, port)
            with crew.Averager(tensors, env=env, outer=loop, run_dir=tmp_path, **ARGS) as avg:
                rnd = avg.step()
                out[rank] = (rnd, [t.clone() for t in tensors], loop.theta, loop.momentum)
        except Exception as exc:  # noqa: BLE001 - inspected below
            out[rank] = exc

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    k = np.float32(lr) * (np.float32(1) + np.float32(mu))
    for rank in (0, 1):
        assert not isinstance(out[rank], Exception), out[rank]
        rnd, tensors, theta, momentum = out[rank]
        assert rnd.averaged
        np.testing.assert_allclose(tensors[0].numpy(), np.full((3, 4), k * 0.5), rtol=1e-6)
        np.testing.assert_allclose(tensors[1].numpy(), np.full(5, k), rtol=1e-6)
        # theta is the group's result; the momentum is this rank's own b' = -x_r
        np.testing.assert_allclose(theta[:12], k * 0.5, rtol=1e-6)
        np.testing.assert_array_equal(momentum[:12], np.full(12, -float(rank), np.float32))


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--local-steps", "8", "--sync", "every-step"], "--local-steps"),
        (["--compress", "int8", "--nonblocking"], "--compress"),
        (["--compress", "fp16", "--scheme", "gloo"], "--compress"),
        (["--sync", "diloco", "--local-steps", "8", "--outer-momentum", "1.5"], "--outer-momentum"),
        (["--lr", "-1"], "--lr"),
        (["--overlap", "--scheme", "gloo"], "--overlap"),
        (["--overlap", "--workload", "synthetic"], "--overlap"),
        (["--quorum-min", "9"], "--quorum-min"),
        (["--quorum-min", "3", "--quorum-max", "2"], "--quorum-min"),
        (["--capacity", "oracle"], "--capacity"),  # the default topology has no rate traces
        (["--helpers", "-2"], "--helpers"),
        (["--helpers", "4", "--host-cpu", "12"], "--helpers"),
        (
            ["--helpers", "4", "--topology", "clouds-4x2"],
            "--helpers",
        ),  # shared uplinks  # the default topology has no rate traces
        (["--min-iteration-s", "-1"], "--min-iteration-s"),
        (["--min-iteration-s", "nan"], "--min-iteration-s"),
    ],
)
def test_lab_run_refuses_bad_training_options_before_building(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lab_run(argv) == 2
    assert named in capsys.readouterr().err


def test_bench_times_the_lm_to_its_target_loss(tmp_path) -> None:
    """lm evaluation rows carry the held-out loss; the clock stops when their mean <= target."""
    from crew.runtime.rundb import RunDB
    from lab.bench import train as bench_train

    db = RunDB(tmp_path / "lab.db")
    rows = [
        (100.0, 0, 1, 3.0, None),  # training loss, no evaluation
        (101.0, 0, 1, 2.5, 0.3),
        (102.0, 1, 1, 2.1, 0.35),  # mean 2.3
        (103.0, 0, 2, 1.8, 0.4),  # mean 1.95 <= 2.0: 3 s after the first row
    ]
    db.executemany(
        "INSERT INTO iterations (t, worker, iteration, loss, accuracy) VALUES (?,?,?,?,?)", rows
    )
    db.executemany(
        "INSERT INTO link_samples (t, src, dst, tx_bytes, mbit) VALUES (?,?,?,?,?)",
        [(100.0, 0, 1, 1000, 0.0), (103.0, 0, 1, 5000, 0.0)],
    )
    db.set_meta({"ended_at": "110.0"})
    db.close()
    r = bench_train.train_results(tmp_path / "lab.db", n=2, target=0.85, target_loss=2.0)
    assert r.time_to_target_s == 3.0
    assert r.final_heldout_loss == pytest.approx((1.8 + 2.1) / 2)
    assert r.link_bytes == 4000
    mlp = bench_train.train_results(tmp_path / "lab.db", n=2, target=0.85)
    assert mlp.final_heldout_loss is None and mlp.time_to_target_s is None


def test_dashboard_shows_the_lm_held_out_loss_and_perplexity(tmp_path) -> None:
    import json
    import math

    import pandas as pd

    from crew.runtime.rundb import RunDB, connect
    from dashboard import figures, queries

    iters = pd.DataFrame(
        {
            "t": [1.0, 2.0, 3.0, 4.0],
            "worker": [0, 0, 1, 0],
            "iteration": [1, 2, 2, 3],
            "loss": [3.1, 2.6, 2.4, 2.9],  # rows 2 and 3 are evaluations (held-out loss)
            "accuracy": [None, 0.3, 0.32, None],
        }
    )
    workers = pd.DataFrame({"id": [0, 1], "name": ["a", "b"], "cloud": ["x", "y"]})
    loss, ppl = figures.lm_quality(iters)
    assert loss == pytest.approx(2.5) and ppl == pytest.approx(math.exp(2.5))
    fig = figures.training_curves(iters, workers, 0.0, workload="lm")
    assert "held-out loss" in fig.layout.annotations[1].text
    bottom = [tr for tr in fig.data if tr.yaxis == "y2" and tr.name == "a"]
    assert list(bottom[0].y) == [2.6]  # worker a's held-out loss, not its accuracy
    assert figures.lm_quality(iters.assign(accuracy=None)) is None
    db = RunDB(tmp_path / "lab.db")
    db.set_meta({"options": json.dumps({"workload": "lm"})})
    db.close()
    conn = connect(tmp_path / "lab.db", readonly=True)
    assert queries.workload(conn) == "lm"
    conn.close()
