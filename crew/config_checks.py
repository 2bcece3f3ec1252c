"""The checks of a run's training and aggregation fields, shared by ``RunConfig`` and the lab,
which checks its options with them before it builds anything."""

from __future__ import annotations

import math

from crew.config import (
    AGGREGATES,
    CHECK_MODES,
    CLIP_SCHEMES,
    COMPRESS,
    SYNC_MODES,
    WORKLOADS,
    ConfigError,
    Scheme,
)

__all__ = ["check_aggregate", "check_helpers", "check_training"]


MAX_ITERATION_S = 3600.0  # an hour per local iteration: beyond it, a typo rather than a setting


def check_training(
    *,
    compress: str,
    nonblocking: bool,
    scheme: str,
    sync: str,
    workload: str,
    local_steps: int,
    outer_lr: float,
    outer_momentum: float,
    model_mb: float = 4.0,
    overlap: bool = False,
    min_iteration_s: float = 0.0,
) -> None:
    """The training-mode and compression fields (crew.train.outer, crew.train.compress);
    ConfigError names the first one that is wrong. The lab checks its options with this before
    it builds anything."""
    if compress not in COMPRESS:
        raise ConfigError(f"compress: one of {', '.join(COMPRESS)}, got {compress!r}")
    if compress != "none" and nonblocking:
        raise ConfigError("compress: non-blocking pre-scatter sends float32 only; drop one")
    if compress != "none" and scheme == Scheme.GLOO.value:
        raise ConfigError("compress: gloo all-reduces float32; use compress none")
    if sync not in SYNC_MODES:
        raise ConfigError(f"sync: one of {', '.join(SYNC_MODES)}, got {sync!r}")
    if workload not in WORKLOADS:
        raise ConfigError(f"workload: one of {', '.join(WORKLOADS)}, got {workload!r}")
    if isinstance(model_mb, bool) or not (
        isinstance(model_mb, int | float) and math.isfinite(model_mb) and model_mb > 0
    ):
        raise ConfigError(f"model_mb: a finite number of MB > 0, got {model_mb!r}")
    if overlap and scheme == Scheme.GLOO.value:
        raise ConfigError("overlap: gloo all-reduces in lockstep; use a partial-reduce scheme")
    if overlap and workload == "synthetic":
        raise ConfigError(
            "overlap: the synthetic workload checks each average against the offered vectors,"
            " which training on would change; use mlp or lm"
        )
    if workload == "synthetic" and sync != "every-step":
        raise ConfigError(
            f"sync: the synthetic workload averages every step (its checks need the offered"
            f" vectors unchanged), got {sync!r}"
        )
    if not isinstance(local_steps, int) or isinstance(local_steps, bool) or local_steps < 1:
        raise ConfigError(f"local_steps: an int >= 1, got {local_steps!r}")
    if sync == "every-step" and local_steps != 1:
        raise ConfigError(
            f"local_steps: {local_steps} needs sync local-sgd or diloco (every-step is 1)"
        )
    if not 0 < outer_lr <= 2:
        raise ConfigError(f"outer_lr: must be in (0, 2], got {outer_lr}")
    if not 0 <= outer_momentum < 1:
        raise ConfigError(f"outer_momentum: must be in [0, 1), got {outer_momentum}")
    if isinstance(min_iteration_s, bool) or not (
        isinstance(min_iteration_s, int | float)
        and math.isfinite(min_iteration_s)
        and 0 <= min_iteration_s <= MAX_ITERATION_S
    ):
        raise ConfigError(
            f"min_iteration_s: seconds between 0 and {MAX_ITERATION_S:g}, got {min_iteration_s!r}"
        )


def clip_number_problem(name: str, value: object) -> str | None:
    """What is wrong with a ``clip_radius`` (finite, > 0) or ``clip_factor`` (finite, >= 0)
    value, None if nothing: one rule for the run's config and a launched job's environment."""
    strict = name == "clip_radius"  # a radius of 0 would let no member move the result
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"a number, got {value!r}"
    if not math.isfinite(value) or value < 0 or (strict and value == 0):
        return f"a finite number {'>' if strict else '>='} 0, got {value!r}"
    return None


def check_aggregate(
    aggregate: str,
    clip_radius: float,
    clip_factor: float,
    check: str,
    compress: str,
    scheme: str,
    nonblocking: bool,
) -> None:
    """``aggregate``, ``clip_radius`` and ``clip_factor`` against the fields clipping depends
    on; ConfigError names the first one that is wrong."""
    if aggregate not in AGGREGATES:
        raise ConfigError(f"aggregate: one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    for name, value in (("clip_radius", clip_radius), ("clip_factor", clip_factor)):
        problem = clip_number_problem(name, value)
        if problem is not None:
            raise ConfigError(f"{name}: {problem}")
    if aggregate == AGGREGATES[0]:
        return
    # The public check and the mean-mode secret check test the linear mean, which a clipped
    # result is not: only the clip-mode secret check (crew.control.clipcheck) can verify it.
    if check != CHECK_MODES[1]:
        raise ConfigError("aggregate: clip is verified by the secret check only; add check secret")
    if compress != COMPRESS[0]:
        raise ConfigError("aggregate: clip needs float32 copies at the root; use compress none")
    if scheme not in CLIP_SCHEMES:
        raise ConfigError(
            "aggregate: clip needs roots that hold each member's own copy, which only"
            f" {', '.join(CLIP_SCHEMES)} plan; got scheme {str(scheme)!r}"
        )
    if nonblocking:
        raise ConfigError("aggregate: clip weighs copies at the root; drop nonblocking")


def check_helpers(helpers: int, *, shared: bool) -> None:
    """``helpers`` (-1: every worker, K >= 0: a group's members and K others) against a run
    with ``shared`` capacities (cloud uplinks, the host's CPU) that span every worker, which a
    candidate set cannot plan; ConfigError says what is wrong."""
    if helpers < -1:
        raise ConfigError(f"helpers: need -1 (every worker) or K >= 0, got {helpers}")
    if helpers >= 0 and shared:
        raise ConfigError(
            "helpers: a candidate set cannot plan shared capacities (cloud uplinks, the"
            " host's CPU), which span every worker; plan over every worker (-1)"
        )
