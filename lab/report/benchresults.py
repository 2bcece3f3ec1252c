"""The shape of ``results.json``, the file ``python -m lab.bench`` writes into ``--out``.

``lab.bench`` writes it; ``lab.report.benchrounds`` pools its rounds, ``lab.report.simagree``
replays it in the simulator, and the saved files under ``docs/`` are read by the README's
figures. Each key's meaning and how it is measured: docs/bench.md.

Keys marked ``NotRequired`` are absent from files written before the option that adds them
existed; readers take the default named in the comment.
"""

# No "from __future__ import annotations": TypedDict reads NotRequired from evaluated annotations.
from typing import NotRequired, TypedDict


class SchemeResults(TypedDict):
    """One scheme's ops: ``results.json`` ``schemes.<name>`` and ``rounds[k].<name>``."""

    op_times_s: list[float]  # seconds per completed op, in trace order
    bound_s: list[float | None]  # the fluid lower bound of each completed op
    median_s: float | None
    p90_s: float | None
    median_over_bound: float | None  # median over ops of op time / bound
    predicted_s: list[float | None]  # each op's planned time (None: no plan, e.g. gloo)
    planned_s: float | None  # median of predicted_s
    median_over_planned: float | None  # median over ops of op time / planned time
    correct: bool  # every op completed, none abandoned, every result checked exact
    completed: int
    abandoned: int
    revisions: int  # plan revisions of the scheme's groups, summed
    max_verify_err: float | None  # the largest projection-check error of a completed op
    link_bytes: dict[str, int]  # "i->j": bytes the link counters saw during the ops
    planned_link_bytes: dict[str, int]  # "i->j": payload bytes the plans put on the link
    startup_s: float | None  # lab entered -> first op started
    wall_s: float | None  # lab entered -> lab left
    worker_cpu_s: float | None  # CPU seconds of all workers over the ops
    cpu_s_per_gb: float | None  # worker_cpu_s per GB of planned_link_bytes
    plan_ms: NotRequired[list[float | None]]  # per op: planning its Assign waited for ([])
    plan_ms_median: NotRequired[float | None]  # (None)
    planned_ahead: NotRequired[int]  # ops planned while the op before ran (0)
    raw_s: NotRequired[float | None]  # --raw-tcp: one op's planned bytes over plain TCP, s
    raw_cpu_s_per_gb: NotRequired[float | None]  # --raw-tcp: that move's CPU s per GB
    error: str | None  # why the scheme is not correct; None when it is


class Spread(TypedDict):
    """Median, min and max over rounds (None when no round had a value)."""

    median: float | None
    min: float | None
    max: float | None


class RoundsSummary(TypedDict):
    """One scheme over the rounds: ``results.json`` ``repeat.<name>``."""

    rounds: int  # rounds the scheme ran in
    correct: int  # rounds it was correct in
    fastest: int  # rounds its median was the lowest of the correct schemes' (ties: each)
    per_round: dict[str, list[float | None]]  # each round's value of the four figures below
    median_s: Spread
    median_over_planned: Spread
    median_over_bound: Spread
    cpu_s_per_gb: Spread


class BenchResults(TypedDict):
    """The whole of ``results.json``."""

    topology: str  # the topology's name
    n: int  # workers
    p: int  # group size of the trace's groups
    size_bytes: int  # bytes of the vector each worker offers
    ops: int  # ops per scheme and round
    seed: int
    trace: list[list[int]]  # each op's members, sorted
    started_at: float  # Unix time
    wall_s: float | None  # the whole benchmark so far
    lab_tag: str  # the lab's interface-name tag
    other_labs_seen: list[str]  # tags of labs that ran on the machine meanwhile
    schemes: dict[str, SchemeResults]  # one round's, or every round's ops pooled
    warmup: NotRequired[int]  # untimed groups before each scheme's trace (0)
    round_count: NotRequired[int]  # rounds of the scheme list (1)
    pace: NotRequired[float]  # data connections paced at this share of the link rate (0)
    host_cpu_s_per_gb: NotRequired[float]  # the host CPU capacity crew planned with (0: none)
    host_cores: NotRequired[float]  # the cores of that capacity (0: none)
    hop_backlog_bytes: NotRequired[int]  # bytes crew's route LP counts per hop (0)
    rounds: NotRequired[list[dict[str, SchemeResults]]]  # with round_count > 1: each round
    repeat: NotRequired[dict[str, RoundsSummary]]  # with round_count > 1: the summary
