"""Overlapped reduce: the delayed update's arithmetic, by hand, without sockets."""

from __future__ import annotations

import numpy as np
import pytest

from crew.train.outer import OuterConfig, OuterLoop, SyncMode
from crew.train.overlap import DelayedUpdates, OverlapError


def f32(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=np.float32)


def test_two_workers_keep_their_progress_and_take_the_groups_correction():
    a, b = DelayedUpdates(), DelayedUpdates()
    ta, tb = a.offer(f32(1, 2)), b.offer(f32(3, 6))
    averaged = (f32(1, 2) + f32(3, 6)) / 2  # [2, 4], weights 1/2 each
    # While the group reduced, A stepped by [0.5, -1] and B by [0, 0.25].
    assert np.array_equal(a.resolve(ta, f32(1.5, 1.0), averaged), f32(2.5, 3.0))
    assert np.array_equal(b.resolve(tb, f32(3.0, 6.25), averaged), f32(2.0, 4.25))
    assert a.in_flight == b.in_flight == 0


def test_with_diloco_the_next_pseudo_gradient_is_exactly_the_steps_since_the_snapshot():
    cfg = OuterConfig(SyncMode.DILOCO, local_steps=1, outer_lr=0.5, outer_momentum=0.0)
    outer_a, outer_b = OuterLoop(cfg, f32(0, 0)), OuterLoop(cfg, f32(0, 0))
    delayed = DelayedUpdates()
    snapshot_a = f32(2, 4)
    ticket = delayed.offer(snapshot_a)
    y_a = outer_a.before_reduce(snapshot_a)  # theta - 0.5 (theta - x) = [1, 2]
    y_b = outer_b.before_reduce(f32(4, 0))  # [2, 0]
    assert np.array_equal(y_a, f32(1, 2)) and np.array_equal(y_b, f32(2, 0))
    synced = outer_a.after_reduce((y_a + y_b) / 2)  # the new base: [1.5, 1]
    model = delayed.resolve(ticket, f32(2, 5), synced)  # A stepped [0, 1] meanwhile
    assert np.array_equal(model, f32(1.5, 2.0))
    assert np.array_equal(outer_a.theta - model, f32(0, -1))  # minus the step since the offer


def test_an_abandoned_round_applies_nothing_and_cannot_be_applied_later():
    cfg = OuterConfig(SyncMode.DILOCO, local_steps=1, outer_lr=0.5, outer_momentum=0.5)
    outer = OuterLoop(cfg, f32(1, 1))
    delayed = DelayedUpdates()
    ticket = delayed.offer(f32(0, 2))
    outer.before_reduce(f32(0, 2))
    # The group is abandoned while the worker waits for it.
    outer.on_abandon()
    delayed.abandon(ticket)
    assert delayed.in_flight == 0
    assert np.array_equal(outer.theta, f32(1, 1)) and np.array_equal(outer.momentum, f32(0, 0))
    with pytest.raises(OverlapError, match="not in flight"):
        delayed.resolve(ticket, f32(0, 2), f32(5, 5))  # a late result is refused


def test_a_round_is_applied_once():
    delayed = DelayedUpdates()
    ticket = delayed.offer(f32(1))
    delayed.resolve(ticket, f32(1), f32(2))
    with pytest.raises(OverlapError, match="not in flight"):
        delayed.resolve(ticket, f32(1), f32(2))
    with pytest.raises(OverlapError, match="not in flight"):
        delayed.abandon(ticket)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_two_rounds_in_flight_resolve_to_the_same_model_in_either_order(order):
    delayed = DelayedUpdates(limit=2)
    tickets = [delayed.offer(f32(1, 1)), delayed.offer(f32(2, 3))]
    synced = [f32(1.5, 0.5), f32(2.5, 2.0)]
    model = f32(4, 4)
    for k in order:
        model = delayed.resolve(tickets[k], model, synced[k])
    # [4, 4] + ([0.5, -0.5]) + ([0.5, -1]), whichever lands first
    assert np.array_equal(model, f32(5.0, 2.5))
    assert delayed.in_flight == 0


def test_more_rounds_than_the_limit_are_refused_and_the_snapshot_is_a_copy():
    delayed = DelayedUpdates(limit=1)
    model = f32(1, 2)
    ticket = delayed.offer(model)
    model += 10  # training on must not move the snapshot
    with pytest.raises(OverlapError, match="already in flight"):
        delayed.offer(model)
    assert np.array_equal(delayed.resolve(ticket, model, f32(1, 2)), f32(11, 12))
    with pytest.raises(OverlapError, match="at least 1"):
        DelayedUpdates(limit=0)


def test_mismatched_shapes_are_named():
    delayed = DelayedUpdates()
    ticket = delayed.offer(f32(1, 2))
    with pytest.raises(OverlapError, match="do not match"):
        delayed.resolve(ticket, f32(1, 2, 3), f32(1, 2))
