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


def test_averager_applies_the_diloco_outer_step_two_ranks_by_hand() -> None:
    """theta = 0 on both ranks, local models x_r = r (first tensor) and 1 (second).
    g_r = -x_r, b'_r = g_r, y_r = -lr (g_r + mu b'_r) = lr (1 + mu) x_r; the average of y."""
    lr, mu = 0.7, 0.9
    port = free_port()
    out: dict[int, object] = {}

    def one(rank: int) -> None:
        tensors = [torch.full((3, 4), float(rank)), torch.ones(5)]
        loop = OuterLoop(OuterConfig(SyncMode.DILOCO, 1, lr, mu), np.zeros(17, np.float32))
        try:
            with crew.Averager(tensors, env=env_for(rank, 2, port), outer=loop, **ARGS) as avg:
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
    ],
)
def test_lab_run_refuses_bad_training_options_before_building(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lab_run(argv) == 2
    assert named in capsys.readouterr().err
