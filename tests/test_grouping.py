"""Tests for crew.control.grouping: FIFO partial-reduce group formation against a fake clock."""

from __future__ import annotations

import math

import numpy as np
import pytest

from crew.control.grouping import (
    Group,
    GroupFormer,
    GroupingError,
    GroupOutcome,
    WorkerState,
    staleness,
    staleness_weights,
)


class FakeClock:
    """Time only moves when the test says so."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


def make(n: int, p: int, clock: FakeClock | None = None, **kw) -> GroupFormer:
    """A former with every worker joined at the clock's time."""
    g = GroupFormer(n, p, **kw)
    for w in range(n):
        g.join(w, clock() if clock else 0.0)
    return g


def window_connected(groups: list[Group], workers: set[int]) -> bool:
    """Whether the union of ``groups`` connects all of ``workers``."""
    comp = {w: {w} for w in workers}
    for g in groups:
        merged = set().union(*(comp[m] for m in g.members if m in comp))
        for w in merged:
            comp[w] = merged
    return len({frozenset(c) for c in comp.values()}) == 1


# ---- staleness weights ------------------------------------------------------------------


def test_staleness_weights_hand_checked():
    # iterations 10, 9, 7 -> s = 1, 2, 4 -> 0.9, 0.81, 0.6561; sum 2.3661
    w = staleness_weights([10, 9, 7])
    assert staleness([10, 9, 7]) == (1, 2, 4)
    assert w == pytest.approx((0.9 / 2.3661, 0.81 / 2.3661, 0.6561 / 2.3661), rel=1e-12)
    assert w == pytest.approx((0.380372765, 0.342335489, 0.277291746), abs=1e-9)
    assert math.fsum(w) == pytest.approx(1.0, abs=1e-12)
    assert w[0] > w[1] > w[2]


def test_staleness_weights_equal_when_disabled_or_same_iteration():
    assert staleness_weights([10, 9, 7], enabled=False) == pytest.approx((1 / 3,) * 3)
    assert staleness_weights([5, 5, 5, 5]) == pytest.approx((0.25,) * 4)
    assert staleness_weights([3]) == (1.0,)


def test_staleness_weights_other_decay_and_large_gap():
    assert staleness_weights([2, 0], decay=0.5) == pytest.approx((0.8, 0.2))
    w = staleness_weights([100_000, 0])  # 0.9**100001 underflows; the newest keeps it finite
    assert w == pytest.approx((1.0, 0.0))
    assert all(math.isfinite(x) for x in w)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (([],), "iterations"),
        (([1, -1],), "iterations"),
        (([1.5],), "iterations"),
        (([1, 2], 0.0), "decay"),
        (([1, 2], 1.5), "decay"),
    ],
)
def test_staleness_weights_rejects(args, field):
    with pytest.raises(GroupingError) as e:
        staleness_weights(*args)
    assert e.value.field == field


# ---- formation --------------------------------------------------------------------------


def test_fifo_order_and_exactly_p_members():
    g = make(6, 3)
    assert g.ready(4, 1, 1.0) == []
    assert g.ready(1, 1, 2.0) == []
    assert g.ready_queue() == [4, 1]
    (grp,) = g.ready(5, 1, 3.0)
    assert grp.members == (4, 1, 5)
    assert grp.formed_at == 3.0
    assert not grp.reduced
    assert g.ready_queue() == []
    assert g.ready(0, 2, 4.0) == [] and g.ready(3, 2, 4.0) == []
    (grp2,) = g.ready(2, 2, 5.0)
    assert grp2.members == (0, 3, 2)
    assert grp2.id != grp.id
    for w in (4, 1, 5, 0, 3, 2):
        assert g.state(w) is WorkerState.GROUPED


def test_group_records_iterations_and_equal_weights_by_default():
    g = make(3, 3)
    g.ready(0, 7, 0.0)
    g.ready(1, 5, 0.0)
    (grp,) = g.ready(2, 6, 0.0)
    assert grp.iterations == (7, 5, 6)
    assert grp.weights == pytest.approx((1 / 3,) * 3)
    assert grp.staleness == (1, 3, 2)


def test_staleness_enabled_in_former():
    g = make(3, 3, staleness=True)
    g.ready(0, 10, 0.0)
    g.ready(1, 9, 0.0)
    (grp,) = g.ready(2, 7, 0.0)
    assert grp.weights == pytest.approx(staleness_weights([10, 9, 7]))
    assert grp.weight_of(2) == pytest.approx(0.6561 / 2.3661)


def test_several_groups_in_flight_are_disjoint():
    g = make(6, 2)
    formed = []
    for t, w in enumerate([0, 1, 2, 3, 4, 5]):
        formed += g.ready(w, 0, float(t))
    assert [x.members for x in formed] == [(0, 1), (2, 3), (4, 5)]
    assert [x.id for x in g.open_groups()] == [x.id for x in formed]
    seen: set[int] = set()
    for grp in g.open_groups():
        assert not seen & set(grp.members)
        seen |= set(grp.members)
    assert g.open_group_of(3) == formed[1]
    # Completing the middle group leaves the others open.
    g.complete(formed[1].id, 10.0)
    assert [x.id for x in g.open_groups()] == [formed[0].id, formed[2].id]
    assert g.open_group_of(3) is None
    assert g.state(3) is WorkerState.TRAINING


def test_one_ready_call_can_form_several_groups():
    g = make(6, 3)
    for w in range(5):
        g.ready(w, 0, 0.0)
    # 0..2 formed at the third ready; 3, 4 wait. Lowering p lets form() release them.
    assert g.ready_queue() == [3, 4]
    g.set_p(1)
    formed = g.form(1.0)
    assert [x.members for x in formed] == [(3,), (4,)]


def test_ready_while_grouped_or_ready_raises():
    g = make(4, 2)
    g.ready(0, 0, 0.0)
    with pytest.raises(GroupingError) as e:
        g.ready(0, 1, 0.0)
    assert e.value.field == "worker"
    g.ready(1, 0, 0.0)
    with pytest.raises(GroupingError, match="open group") as e:
        g.ready(1, 1, 0.0)
    assert e.value.field == "worker"
    assert g.ready_queue() == []


def test_ready_by_absent_or_dead_worker_raises():
    g = GroupFormer(3, 2)
    with pytest.raises(GroupingError, match="ABSENT"):
        g.ready(0, 0, 0.0)
    g.join(0, 0.0)
    g.mark_dead(0, 1.0)
    with pytest.raises(GroupingError, match="DEAD"):
        g.ready(0, 0, 1.0)
    with pytest.raises(GroupingError, match="DEAD"):
        g.heartbeat(0, 1.0)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda g: g.ready(9, 0, 0.0), "worker"),
        (lambda g: g.ready(True, 0, 0.0), "worker"),
        (lambda g: g.ready(0, -1, 0.0), "iteration"),
        (lambda g: g.join(0, math.nan), "now"),
        (lambda g: g.complete(99, 0.0), "group_id"),
        (lambda g: g.abandon(99, 0.0), "group_id"),
        (lambda g: g.drop_member(99, 0), "group_id"),
        (lambda g: g.set_p(0), "p"),
        (lambda g: g.set_p(5), "p"),
        (lambda g: g.group(42), "group_id"),
    ],
)
def test_bad_arguments_name_the_field(call, field):
    g = make(4, 2)
    with pytest.raises(GroupingError) as e:
        call(g)
    assert e.value.field == field


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(n=0, p=1), "n"),
        (dict(n=3, p=4), "p"),
        (dict(n=3, p=2, heartbeat_timeout=0), "heartbeat_timeout"),
        (dict(n=3, p=2, isolation_window=-1), "isolation_window"),
        (dict(n=3, p=2, isolation_max_wait=-1.0), "isolation_max_wait"),
        (dict(n=3, p=2, staleness_decay=2.0), "decay"),
    ],
)
def test_constructor_validates(kw, field):
    with pytest.raises(GroupingError) as e:
        GroupFormer(**kw)
    assert e.value.field == field


def test_time_must_not_go_backwards():
    g = make(3, 2)
    g.heartbeat(0, 5.0)
    with pytest.raises(GroupingError) as e:
        g.heartbeat(0, 4.0)
    assert e.value.field == "now"


# ---- liveness ---------------------------------------------------------------------------


def test_heartbeat_expiry_at_the_right_time():
    clock = FakeClock()
    g = make(3, 2, clock, heartbeat_timeout=10.0)  # all joined at t=0
    g.heartbeat(0, clock.advance(5.0))  # worker 0 last seen at 5
    assert g.expire(clock.advance(5.0)) == []  # t=10: 1 and 2 silent exactly 10 s, not longer
    assert g.expire(clock.advance(0.001)) == [1, 2]
    assert g.state(1) is WorkerState.DEAD and g.state(0) is WorkerState.TRAINING
    assert g.expire(15.0) == []  # worker 0 silent exactly 10 s
    assert g.expire(15.001) == [0]
    assert g.alive() == set()
    assert g.expire(100.0) == []  # the dead are not reported again


def test_excused_time_is_not_silence_but_what_follows_is():
    g = make(3, 2, heartbeat_timeout=10.0)  # all joined at t=0
    g.heartbeat(0, 4.0)
    g.mark_dead(2, 4.0)
    g.excuse(20.0, 21.0)  # the observer was away from t=1 to t=21
    assert g.expire(21.0) == []  # 0 seen at min(21, 24) = 21, 1 at 20
    assert g.expire(30.0) == []
    assert g.expire(30.001) == [1]  # silent 10 s since its excused sighting at 20
    assert g.expire(31.001) == [0]
    assert g.state(2) is WorkerState.DEAD  # the dead stay dead


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_excuse_refuses_a_bad_gap(bad: float) -> None:
    g = make(3, 2)
    with pytest.raises(GroupingError, match="seconds"):
        g.excuse(bad, 1.0)


def test_ready_counts_as_a_sign_of_life():
    g = make(3, 3, heartbeat_timeout=10.0)
    g.ready(0, 1, 8.0)
    assert g.expire(12.0) == [1, 2]


def test_absent_workers_do_not_expire_and_hold_p():
    g = GroupFormer(3, 3, heartbeat_timeout=1.0)
    g.join(0, 0.0)
    g.join(1, 0.0)
    assert g.expire(50.0) == [0, 1]  # joined then silent
    assert g.state(2) is WorkerState.ABSENT
    assert g.alive() == set()


def test_dead_worker_is_removed_from_ready_queue():
    clock = FakeClock()
    g = make(4, 3, clock, heartbeat_timeout=10.0)
    g.ready(0, 0, clock.advance(1.0))
    g.ready(1, 0, clock.advance(5.0))
    assert g.ready_queue() == [0, 1]
    assert g.expire(clock.advance(5.5)) == [0, 2, 3]  # t=11.5: 1 was seen at 6
    assert g.ready_queue() == [1]
    g.mark_dead(1, clock())
    assert g.ready_queue() == []
    assert g.state(1) is WorkerState.DEAD
    g.mark_dead(1, clock())  # idempotent


def test_expire_leaves_open_group_open_and_drop_member():
    g = make(4, 3, heartbeat_timeout=10.0, staleness=True)
    g.ready(0, 10, 0.0)
    g.ready(1, 9, 0.0)
    (grp,) = g.ready(2, 7, 4.0)
    for w in (1, 2, 3):
        g.heartbeat(w, 8.0)  # worker 0 was last seen at t=0
    assert g.expire(10.0) == []
    assert g.expire(10.5) == [0]
    assert g.open_group_of(0) == grp  # still listed: the coordinator decides
    assert g.state(0) is WorkerState.DEAD
    with pytest.raises(GroupingError, match="drop_member or abandon"):
        g.join(0, 11.0)
    survivors = g.drop_member(grp.id, 0)
    assert survivors.members == (1, 2)
    assert survivors.dropped == (0,)
    assert survivors.iterations == (9, 7)
    # Renormalised over survivors: equals the old weights rescaled, and s recomputed (1, 3).
    old = np.array(grp.weights[1:])
    assert survivors.weights == pytest.approx(tuple(old / old.sum()))
    assert survivors.weights == pytest.approx((0.9 / 1.629, 0.729 / 1.629))
    assert math.fsum(survivors.weights) == pytest.approx(1.0)
    assert g.open_group_of(0) is None
    assert g.open_group_of(1) == survivors
    assert g.state(0) is WorkerState.DEAD
    g.join(0, 12.0)  # rejoins from the current model
    assert g.state(0) is WorkerState.TRAINING


def test_drop_member_of_live_worker_and_limits():
    g = make(4, 2)
    g.ready(0, 0, 0.0)
    (grp,) = g.ready(1, 0, 0.0)
    with pytest.raises(GroupingError) as e:
        g.drop_member(grp.id, 3)
    assert e.value.field == "worker"
    one = g.drop_member(grp.id, 1)
    assert one.members == (0,) and one.weights == (1.0,)
    assert g.state(1) is WorkerState.TRAINING  # may become ready again at once
    with pytest.raises(GroupingError, match="abandon"):
        g.drop_member(grp.id, 0)
    g.complete(grp.id, 1.0)
    assert g.rounds(0) == 1 and g.rounds(1) == 0


def test_rejoin_of_ready_worker_leaves_queue():
    g = make(3, 3)
    g.ready(0, 3, 0.0)
    g.ready(1, 3, 0.0)
    g.join(0, 1.0)  # restarted process
    assert g.ready_queue() == [1]
    assert g.state(0) is WorkerState.TRAINING


# ---- p and deaths -----------------------------------------------------------------------


def test_set_p_applies_to_later_groups_only():
    g = make(6, 3)
    for w in (0, 1):
        g.ready(w, 0, 0.0)
    (first,) = g.ready(2, 0, 0.0)
    g.set_p(2)
    assert g.open_group_of(0) == first and first.size == 3
    g.ready(3, 0, 1.0)
    (second,) = g.ready(4, 0, 1.0)
    assert second.members == (3, 4)
    assert first.size == 3 and g.group(first.id).size == 3


def test_set_p_up_waits_for_more():
    g = make(6, 2)
    g.set_p(4)
    for w in range(3):
        assert g.ready(w, 0, 0.0) == []
    (grp,) = g.ready(3, 0, 0.0)
    assert grp.size == 4


def test_deaths_shrink_groups_so_training_does_not_stall():
    g = make(4, 4)
    for w in range(3):
        g.ready(w, 0, 0.0)
    assert g.open_groups() == []
    g.mark_dead(3, 1.0)
    assert g.p_effective() == 3
    (grp,) = g.form(1.0)
    assert grp.members == (0, 1, 2)
    assert grp.reduced


def test_absent_workers_count_towards_p_until_marked_dead():
    g = GroupFormer(4, 4)
    for w in range(3):
        g.join(w, 0.0)
        g.ready(w, 0, 0.0)
    assert g.open_groups() == [] and g.p_effective() == 4
    g.mark_dead(3, 30.0)  # the coordinator gave up waiting for it
    (grp,) = g.form(30.0)
    assert grp.size == 3 and grp.reduced


# ---- closing groups ---------------------------------------------------------------------


def test_complete_abandon_history_and_rounds():
    g = make(4, 2)
    g.ready(0, 0, 0.0)
    (a,) = g.ready(1, 0, 0.0)
    g.ready(2, 0, 0.0)
    (b,) = g.ready(3, 0, 0.0)
    g.complete(a.id, 5.0)
    g.abandon(b.id, 6.0)
    assert [(r.group.id, r.outcome, r.closed_at) for r in g.history] == [
        (a.id, GroupOutcome.COMPLETED, 5.0),
        (b.id, GroupOutcome.ABANDONED, 6.0),
    ]
    assert [g.rounds(w) for w in range(4)] == [1, 1, 0, 0]
    assert all(g.state(w) is WorkerState.TRAINING for w in range(4))
    with pytest.raises(GroupingError, match="closed") as e:
        g.complete(a.id, 7.0)
    assert e.value.field == "group_id"


def test_dead_member_stays_dead_when_group_completes():
    g = make(2, 2)
    g.ready(0, 0, 0.0)
    (grp,) = g.ready(1, 0, 0.0)
    g.mark_dead(1, 1.0)
    g.complete(grp.id, 2.0)
    assert g.state(1) is WorkerState.DEAD
    assert g.state(0) is WorkerState.TRAINING


# ---- isolation guard --------------------------------------------------------------------


def run_two_cliques(g: GroupFormer, rounds: int) -> list[Group]:
    """Each round workers report ready in the order 0, 1, 2, 3, then every open group completes.

    Pure FIFO pairs {0, 1} and {2, 3} forever.
    """
    clock = FakeClock()
    formed: list[Group] = []
    for _ in range(rounds):
        for w in range(4):
            formed += g.ready(w, 0, clock.advance(1.0))
        formed += g.form(clock())
        for grp in g.open_groups():
            g.complete(grp.id, clock.advance(1.0))
    return formed


def test_pure_fifo_isolates_two_cliques():
    formed = run_two_cliques(make(4, 2, isolation_window=0), rounds=20)
    assert {grp.members for grp in formed} == {(0, 1), (2, 3)}
    assert len(formed) == 40
    assert not window_connected(formed, {0, 1, 2, 3})


def test_isolation_guard_merges_cliques_within_the_window():
    g = make(4, 2)
    window = g.isolation_window
    assert window == 4  # 2 * ceil(4 / 2)
    formed = run_two_cliques(g, rounds=20)
    assert len(formed) == 40
    # The first `window` formations are pure FIFO; the next one bridges the cliques.
    assert [grp.members for grp in formed[:window]] == [(0, 1), (2, 3)] * (window // 2)
    bridge = formed[window]
    assert {0, 1} & set(bridge.members) and {2, 3} & set(bridge.members)
    assert bridge.members == (0, 2) and bridge.swapped_in == 2
    # The displaced worker kept its place at the head of the queue.
    assert formed[window + 1].members == (1, 3)
    # From then on, the cliques are never left apart for more than `window` formations:
    # every `window + 1` consecutive groups connect all four workers (pure FIFO never does).
    span = window + 1
    for end in range(span, len(formed) + 1):
        assert window_connected(formed[end - span : end], {0, 1, 2, 3}), end
    # Deterministic: one bridge per W + 2 groups (bridge, its partner, then W FIFO groups).
    assert [i for i, grp in enumerate(formed) if grp.swapped_in is not None] == list(
        range(window, len(formed), window + 2)
    )


def test_isolation_guard_holds_then_releases_after_max_wait():
    g = make(4, 2, isolation_window=2, isolation_max_wait=5.0)
    for w in range(4):
        g.ready(w, 0, 0.0)  # groups {0,1} and {2,3}: the window is full and disconnected
    a, b = g.open_groups()
    g.complete(a.id, 1.0)
    assert g.ready(0, 1, 1.0) == []
    assert g.ready(1, 1, 1.0) == []  # {0,1} again would keep them isolated: held
    assert g.holding
    assert g.form(5.9) == []
    (grp,) = g.form(6.0)  # nobody from {2,3} became ready within 5 s
    assert grp.members == (0, 1) and grp.swapped_in is None
    assert not g.holding


def test_isolation_guard_swap_only_never_holds():
    g = make(4, 2, isolation_window=2, isolation_max_wait=0.0)
    for w in range(4):
        g.ready(w, 0, 0.0)
    a, _ = g.open_groups()
    g.complete(a.id, 1.0)
    g.ready(0, 1, 1.0)
    (grp,) = g.ready(1, 1, 1.0)
    assert grp.members == (0, 1) and not g.holding


def test_isolation_guard_ignores_slow_and_dead_workers():
    # Workers 2 and 3 are never ready: they are slow, not isolated, so 0 and 1 pair freely.
    g = make(4, 2, isolation_window=2)
    t = 0.0
    for _ in range(10):
        g.ready(0, 0, t)
        (grp,) = g.ready(1, 0, t)
        assert grp.members == (0, 1)
        g.complete(grp.id, t)
        t += 1.0
    # Once {2,3} have been grouped, they form another component; if they die, no hold.
    g.ready(2, 0, t)
    (other,) = g.ready(3, 0, t)
    g.complete(other.id, t)
    g.mark_dead(2, t)
    g.mark_dead(3, t)
    g.ready(0, 0, t)
    g.ready(1, 0, t)
    assert not g.holding
    assert g.open_group_of(0) is not None


def test_default_window_follows_p():
    g = GroupFormer(10, 2)
    assert g.isolation_window == 10
    g.set_p(4)
    assert g.isolation_window == 6
    assert GroupFormer(10, 2, isolation_window=3).isolation_window == 3


# ---- randomised invariants --------------------------------------------------------------


def check_invariants(g: GroupFormer) -> None:
    queue = g.ready_queue()
    assert len(set(queue)) == len(queue)
    ready = {w for w in range(g.n) if g.state(w) is WorkerState.READY}
    assert ready == set(queue)
    in_open: set[int] = set()
    for grp in g.open_groups():
        assert not in_open & set(grp.members), "worker in two open groups"
        in_open |= set(grp.members)
        assert math.fsum(grp.weights) == pytest.approx(1.0)
        for w in grp.members:
            assert g.state(w) in (WorkerState.GROUPED, WorkerState.DEAD)
            assert g.open_group_of(w) == grp
    grouped = {w for w in range(g.n) if g.state(w) is WorkerState.GROUPED}
    assert grouped <= in_open
    assert g.alive() == {
        w for w in range(g.n) if g.state(w) not in (WorkerState.DEAD, WorkerState.ABSENT)
    }


def check_formed(g: GroupFormer, before: list[int], formed: list[Group], now: float) -> None:
    """Groups formed by one call: distinct live members from the queue, size p_eff, FIFO."""
    k = g.p_effective()  # deaths and p do not change inside ready()/form()
    queue = list(before)
    for grp in formed:
        assert len(set(grp.members)) == len(grp.members) == k
        assert grp.formed_at == now
        assert grp.reduced == (k < g.p)
        assert all(w in g.alive() for w in grp.members)
        if grp.swapped_in is None:
            assert list(grp.members) == queue[:k]
        else:
            assert grp.swapped_in in grp.members
            assert set(grp.members) - {grp.swapped_in} < set(queue[:k])
        assert list(grp.members) == [w for w in queue if w in grp.members]  # ready order
        queue = [w for w in queue if w not in grp.members]
    assert queue == g.ready_queue()
    if not g.holding:
        assert len(queue) < k


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("window", [None, 0])
def test_random_simulation_keeps_invariants(seed, window):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 10))
    g = GroupFormer(
        n,
        int(rng.integers(1, n + 1)),
        heartbeat_timeout=5.0,
        staleness=bool(seed % 2),
        isolation_window=window,
        isolation_max_wait=2.0,
    )
    t = 0.0
    iters = [0] * n
    counts = dict.fromkeys(
        ["formed", "dead", "dropped", "completed", "held", "swapped", "reduced"], 0
    )
    for _ in range(3000):
        t += float(rng.exponential(0.3))
        w = int(rng.integers(n))
        r = rng.random()
        st = g.state(w)
        before: list[int] | None = None  # queue just before a call that may form groups
        formed: list[Group] = []
        if st in (WorkerState.ABSENT, WorkerState.DEAD):
            if g.open_group_of(w) is None and r < 0.5:
                g.join(w, t)
        elif r < 0.45:
            if st is WorkerState.TRAINING:
                iters[w] += int(rng.integers(1, 4))
                before = [*g.ready_queue(), w]
                formed = g.ready(w, iters[w], t)
            else:
                g.heartbeat(w, t)
        elif r < 0.6 and g.open_groups():
            grp = g.open_groups()[int(rng.integers(len(g.open_groups())))]
            g.complete(grp.id, t)
            counts["completed"] += 1
        elif r < 0.65 and g.open_groups():
            g.abandon(g.open_groups()[0].id, t)
        elif r < 0.7 and g.open_group_of(w) is not None and g.open_group_of(w).size > 1:
            grp = g.open_group_of(w)
            new = g.drop_member(grp.id, w)
            assert new.members == tuple(m for m in grp.members if m != w)
            counts["dropped"] += 1
        elif r < 0.72:
            g.mark_dead(w, t)
            counts["dead"] += 1
        elif r < 0.74:
            g.set_p(int(rng.integers(1, n + 1)))
            before = g.ready_queue()
            formed = g.form(t)
        elif r < 0.8:
            counts["dead"] += len(g.expire(t))
            before = g.ready_queue()
            formed = g.form(t)
        else:
            # Live workers heartbeat most of the time, so deaths stay occasional.
            for x in g.alive():
                if rng.random() < 0.9:
                    g.heartbeat(x, t)
        if before is not None:
            check_formed(g, before, formed, t)
        counts["formed"] += len(formed)
        counts["swapped"] += sum(grp.swapped_in is not None for grp in formed)
        counts["reduced"] += sum(grp.reduced for grp in formed)
        counts["held"] += g.holding
        check_invariants(g)
    # The run exercised what it claims to.
    assert counts["formed"] > 100 and counts["completed"] > 50
    assert counts["dead"] > 0 and counts["dropped"] > 0
    assert counts["reduced"] > 0
    if window == 0:
        assert counts["held"] == counts["swapped"] == 0
    else:
        assert counts["swapped"] > 0
    assert sum(g.rounds(w) for w in range(n)) == sum(
        r.group.size for r in g.history if r.outcome is GroupOutcome.COMPLETED
    )


# ---- deferral -----------------------------------------------------------------------------


def test_a_deferred_worker_waits_while_others_can_form_and_joins_after_its_wait():
    # p=5 of 7 live workers (issue 16's overlapping faults): 6 must not gate every group.
    g = make(7, 5, isolation_window=0, defer_max_wait=10.0)
    g.set_deferred([6])
    assert g.deferred == {6}
    assert g.ready(6, 1, 0.0) == []
    for w in (0, 1, 2):
        assert g.ready(w, 1, 0.1) == []
    # 6 and four others are ready, but a fifth non-deferred worker is alive: wait for it.
    assert g.ready(3, 1, 0.2) == [] and g.ready_queue() == [6, 0, 1, 2, 3]
    (grp,) = g.ready(4, 1, 0.3)
    assert grp.members == (0, 1, 2, 3, 4) and g.ready_queue() == [6]
    g.complete(grp.id, 0.8)
    for w in (0, 1, 2, 3):
        assert g.ready(w, 2, 1.0) == []
    # Its wait is over: grouped FIFO again, at the head of the queue.
    (grp,) = g.form(10.0)
    assert grp.members == (6, 0, 1, 2, 3)


def test_a_deferred_worker_is_grouped_fifo_when_too_few_others_are_alive():
    g = make(4, 3, isolation_window=0)
    g.set_deferred([3])
    g.mark_dead(2, 0.0)
    g.ready(3, 1, 0.0)
    g.ready(0, 1, 0.1)
    (grp,) = g.ready(1, 1, 0.2)  # p_eff = 3 and only 0 and 1 are not deferred
    assert grp.members == (3, 0, 1)


def test_deferral_leaves_fifo_alone_when_enough_others_are_ready_and_validates():
    g = make(6, 2, isolation_window=0)
    g.set_deferred([0])
    g.ready(0, 1, 0.0)
    g.ready(1, 1, 0.1)
    (grp,) = g.ready(2, 1, 0.2)
    assert grp.members == (1, 2) and g.ready_queue() == [0]
    g.set_deferred([])
    (grp,) = g.ready(3, 1, 0.3)
    assert grp.members == (0, 3)
    with pytest.raises(GroupingError, match="worker"):
        g.set_deferred([6])
    with pytest.raises(GroupingError, match="defer_max_wait"):
        GroupFormer(3, 2, defer_max_wait=-1.0)


# ---- bounded memory ---------------------------------------------------------------------


def _churn(g: GroupFormer, groups: int, t0: float = 0.0) -> float:
    """Form and complete ``groups`` groups of two among four workers; returns the clock."""
    t = t0
    for _ in range(groups // 2):
        t += 1.0
        formed = [grp for w in range(4) for grp in g.ready(w, 0, t)]
        for grp in formed:
            g.complete(grp.id, t)
    return t


def test_history_keeps_the_newest_closed_groups_only():
    g = make(4, 2, history_limit=5, heartbeat_timeout=1e9)
    _churn(g, 40)
    assert [r.group.id for r in g.history] == [36, 37, 38, 39, 40]
    assert g.rounds(0) == 20  # counters still count every group
    with pytest.raises(GroupingError, match="forgotten"):
        g.group(1)
    with pytest.raises(GroupingError, match="unknown"):
        g.group(41)
    assert g.group(40).id == 40  # within the guard's window: still readable


def test_memory_stops_growing_with_the_number_of_groups():
    import tracemalloc

    tracemalloc.start()  # before the history fills, so what it holds is traced from the start
    g = make(4, 2, heartbeat_timeout=1e9)
    t = _churn(g, 6000)
    early = tracemalloc.get_traced_memory()[0]
    _churn(g, 20000, t)
    late = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert late - early < 20_000, f"the former grew by {late - early} bytes over 20,000 groups"


def test_an_open_group_older_than_the_window_stays_until_it_closes():
    g = make(4, 2, isolation_window=0, heartbeat_timeout=1e9)  # keeps 2 n = 8 formed
    g.ready(0, 0, 1.0)
    (old,) = g.ready(1, 0, 1.0)
    for k in range(2, 12):  # ten more groups among workers 2 and 3
        g.ready(2, 0, float(k))
        (grp,) = g.ready(3, 0, float(k))
        g.complete(grp.id, float(k))
    assert g.group(old.id).members == (0, 1)
    g.abandon(old.id, 20.0)
    with pytest.raises(GroupingError, match="forgotten"):
        g.group(old.id)
    assert g.history[-1].group.id == old.id
