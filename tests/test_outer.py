"""Outer loops: every step, LocalSGD and DiLoCo, checked by hand and against literal DiLoCo."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from crew.train.outer import OuterConfig, OuterConfigError, OuterLoop, OuterStateError, SyncMode

F = np.float32
DILOCO = OuterConfig(SyncMode.DILOCO, local_steps=8, outer_lr=0.7, outer_momentum=0.9)


def _group(loops: list[OuterLoop], models: list[np.ndarray], w: list[float]) -> np.ndarray:
    """A committed group: every member offers, the weighted average comes back to all."""
    offers = [lp.before_reduce(m) for lp, m in zip(loops, models, strict=True)]
    avg = sum(F(wi) * o for wi, o in zip(w, offers, strict=True))
    results = [lp.after_reduce(avg) for lp in loops]
    assert all(np.array_equal(r, results[0]) for r in results)
    return results[0]


def test_diloco_outer_step_two_workers_by_hand() -> None:
    theta = F([1.0, 2.0])
    loops = [OuterLoop(DILOCO, theta), OuterLoop(DILOCO, theta)]
    # Round 1: pseudo-gradients (0.2, -0.2) and (0.4, 0.2), average (0.3, 0); b = (0.3, 0);
    # Nesterov step 0.7 * (0.3 + 0.9 * 0.3) = 0.399 on the first element.
    new = _group(loops, [F([0.8, 2.2]), F([0.6, 1.8])], [0.5, 0.5])
    np.testing.assert_allclose(new, [0.601, 2.0], rtol=1e-6)
    # Round 2: pseudo-gradients (0.1, 0.1) and (0.1, -0.1), average (0.1, 0);
    # b = 0.9 * 0.3 + 0.1 = 0.37; step 0.7 * (0.1 + 0.9 * 0.37) = 0.3031.
    new = _group(loops, [F([0.501, 1.9]), F([0.501, 2.1])], [0.5, 0.5])
    np.testing.assert_allclose(new, [0.2979, 2.0], rtol=1e-5)
    np.testing.assert_allclose(loops[0].theta, new)


def test_diloco_equals_literal_outer_nesterov_on_averaged_pseudo_gradients() -> None:
    """Full participation, unequal weights, several rounds: sending the member's own outer
    step gives exactly DiLoCo's update of the shared parameters."""
    rng = np.random.default_rng(0)
    n, members, w = 50, 3, [0.5, 0.3, 0.2]
    theta = rng.standard_normal(n).astype(F)
    loops = [OuterLoop(DILOCO, theta) for _ in range(members)]
    ref_theta, ref_b = theta.astype(np.float64), np.zeros(n)
    for _ in range(5):
        models = [(ref_theta - rng.standard_normal(n) * 0.1).astype(F) for _ in range(members)]
        g = sum(wi * (ref_theta - m) for wi, m in zip(w, models, strict=True))
        ref_b = 0.9 * ref_b + g
        ref_theta = ref_theta - 0.7 * (g + 0.9 * ref_b)
        got = _group(loops, models, w)
        np.testing.assert_allclose(got, ref_theta, atol=1e-5)


def test_abandoned_group_keeps_theta_and_momentum() -> None:
    theta = F([1.0, 2.0])
    lp = OuterLoop(DILOCO, theta)
    _group([lp], [F([0.5, 2.0])], [1.0])
    theta1, b1 = lp.theta, lp.momentum
    lp.before_reduce(F([0.0, 0.0]))
    lp.on_abandon()
    assert np.array_equal(lp.theta, theta1) and np.array_equal(lp.momentum, b1)
    with pytest.raises(OuterStateError, match="without a before_reduce"):
        lp.after_reduce(theta1)


def test_local_sgd_sends_the_model_and_loads_the_average() -> None:
    lp = OuterLoop(OuterConfig(SyncMode.LOCAL_SGD, local_steps=4), F([0, 0]))
    assert [lp.ready_to_reduce(s) for s in range(1, 9)] == [False] * 3 + [True] + [False] * 3 + [
        True
    ]
    assert np.array_equal(lp.before_reduce(F([1, 2])), [1, 2])
    assert np.array_equal(lp.after_reduce(F([3, 4])), [3, 4]) and lp.theta is None
    every = OuterLoop(OuterConfig(), F([0]))
    assert all(every.ready_to_reduce(s) for s in range(1, 5))


def test_diloco_with_unit_lr_and_no_momentum_is_model_averaging() -> None:
    cfg = OuterConfig(SyncMode.DILOCO, local_steps=2, outer_lr=1.0, outer_momentum=0.0)
    lp = OuterLoop(cfg, F([1.0, 1.0]))
    assert np.array_equal(lp.before_reduce(F([0.25, 3.0])), [0.25, 3.0])


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"mode": SyncMode.EVERY_STEP, "local_steps": 8}, "every-step"),
        ({"mode": "diloco"}, "mode"),
        ({"local_steps": 0}, "local_steps"),
        ({"outer_lr": 0.0}, "outer_lr"),
        ({"outer_lr": float("nan")}, "outer_lr"),
        ({"outer_momentum": 1.0}, "outer_momentum"),
    ],
)
def test_bad_config_is_refused(kwargs: dict, field: str) -> None:
    with pytest.raises(OuterConfigError, match=field):
        OuterConfig(**kwargs)


def test_bad_vectors_are_refused() -> None:
    lp = OuterLoop(DILOCO, F([1.0, 2.0]))
    with pytest.raises(OuterStateError, match="elements"):
        lp.before_reduce(F([1.0]))
    with pytest.raises(OuterStateError, match="non-finite"):
        lp.before_reduce(F([np.nan, 1.0]))
    with pytest.raises(OuterStateError, match="float32"):
        lp.before_reduce(np.array([1.0, 2.0]))


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    lp = OuterLoop(DILOCO, F([1.0, 2.0]))
    _group([lp], [F([0.5, 2.5])], [1.0])
    lp.save(tmp_path / "outer.npz")
    other = OuterLoop(DILOCO, F([0.0, 0.0]))
    other.load(tmp_path / "outer.npz")
    assert np.array_equal(other.theta, lp.theta) and np.array_equal(other.momentum, lp.momentum)
    assert other.reduces == 1
    with pytest.raises(OuterStateError, match="not for mode"):
        OuterLoop(OuterConfig(), F([0.0, 0.0])).load(tmp_path / "outer.npz")
    (tmp_path / "bad.npz").write_bytes(b"junk")
    with pytest.raises(OuterStateError, match="cannot read"):
        other.load(tmp_path / "bad.npz")
