"""Clipped aggregation in a launched job (no root, loopback): ``CREW_AGGREGATE=clip`` on the
coordinator's rank makes every group a CenteredClip star, so a rank offering 100 times its
model moves the others by a bounded step instead of to the linear mean; bad values are named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crew.errors import LaunchError
from crew.runtime.launch import Aggregation, aggregation

try:
    from test_averager import ARGS, env_for, free_port, run_ranks
except ImportError:  # tests/ became a package
    from tests.test_averager import ARGS, env_for, free_port, run_ranks


def test_the_aggregation_settings_parse_and_bad_ones_are_named() -> None:
    assert aggregation({}) == Aggregation()
    assert aggregation({}).scheme_for("crew") == "crew"
    clip = aggregation(
        {"CREW_AGGREGATE": " Clip ", "CREW_CLIP_FACTOR": "2", "CREW_CLIP_RADIUS": ""}
    )
    assert (clip.aggregate, clip.clip_factor) == ("clip", 2.0)
    assert clip.scheme_for("crew") == "crew-star" and clip.scheme_for("preduce") == "preduce"
    for env, says in (
        ({"CREW_AGGREGATE": "median"}, "CREW_AGGREGATE='median'"),
        ({"CREW_CLIP_RADIUS": "0"}, "CREW_CLIP_RADIUS='0': a finite number > 0"),
        ({"CREW_CLIP_RADIUS": "nan"}, "CREW_CLIP_RADIUS='nan'"),
        ({"CREW_CLIP_FACTOR": "-1"}, "CREW_CLIP_FACTOR='-1': a finite number >= 0"),
        ({"CREW_CLIP_FACTOR": "four"}, "CREW_CLIP_FACTOR='four': not a number"),
    ):
        with pytest.raises(LaunchError, match=says):
            aggregation(env)


def test_a_job_with_clip_bounds_a_rank_that_offers_100_times_its_model() -> None:
    size, world = 4096, 3
    base = np.random.default_rng(0).normal(size=size).astype("f4")

    def tensors(rank):
        noise = np.random.default_rng(rank + 1).normal(scale=1e-3, size=size).astype("f4")
        return [torch.from_numpy((100.0 if rank == 2 else 1.0) * base + noise)]

    def body(rank, averager, ts):
        rnd = averager.step()
        cfg = averager.config
        return rnd, ts[0].numpy().copy(), cfg.aggregate, cfg.scheme

    port = free_port()
    envs = [env_for(r, world, port) for r in range(world)]
    envs[0] |= {"CREW_AGGREGATE": "clip"}  # only the coordinator's setting counts
    res = run_ranks(world, body, envs=envs, tensors=tensors, args=ARGS | {"group_size": 3})
    assert not any(isinstance(r, Exception) for r in res.values()), res
    results = []
    for rank in range(world):
        rnd, after, aggregate, scheme = res[rank]
        assert rnd.averaged and (aggregate, scheme) == ("clip", "crew-star")
        results.append(after)
    assert all(np.array_equal(results[0], r) for r in results[1:])  # one result for all
    honest = float(np.linalg.norm(base))
    # The linear mean would be 34 x the model; clip moves it by w tau / (1 - w) at most, 0.05
    # of its norm at the ceiling radius of a job's first groups.
    drift = float(np.linalg.norm(results[0] - base)) / honest
    assert drift <= 0.06, drift
