"""The capacity view with a fake clock: failures, retries with backoff, drift, committed load."""

from __future__ import annotations

import numpy as np
import pytest

from crew.control.capacity import (
    DRIFT,
    EWMA,
    RETRY_LINK_S,
    TCP_GOODPUT,
    CapacityView,
    InFlight,
    LinkChange,
    poorly_reached,
)

N = 3


def view(measured: bool = False) -> CapacityView:
    return CapacityView(
        [[0.0 if i == j else 100.0 for j in range(N)] for i in range(N)], measured=measured
    )


def sample(src: int, mbit: float) -> list[float]:
    """One second of payload that the estimate turns into ``mbit`` on the wire."""
    return [float(src), mbit * 1e6 / 8 * TCP_GOODPUT, 1.0]


def test_diagonal_is_infinite_and_the_shape_is_checked() -> None:
    assert np.isinf(np.diag(view().planning)).all()
    with pytest.raises(ValueError, match="square"):
        CapacityView([[1.0, 2.0]], measured=False)


def test_failed_link_returns_only_after_probes_pass_with_doubling_backoff() -> None:
    cap = view()
    (u,) = [cap.fail(0, 1, 10.0)]
    assert u is not None and u.kind is LinkChange.FAILED and u.was == 100.0
    assert cap.planning[0, 1] == 0.0 and cap.fail(0, 1, 11.0) is None  # already down
    # No probe report since the failure: never retried blind, however long it waits.
    assert cap.retry_due(10.0 + 100 * RETRY_LINK_S) == []
    assert cap.probe_report(1, [], 10.5) == []  # probes pass: confirmed, but it waits
    assert cap.retry_due(10.0 + RETRY_LINK_S - 0.1) == []
    (r,) = cap.retry_due(10.0 + RETRY_LINK_S)
    assert r.kind is LinkChange.RETRIED and cap.planning[0, 1] == 100.0
    assert cap.retry_due(10.0 + RETRY_LINK_S + 1) == []  # back in plans: nothing more to retry
    cap.fail(0, 1, 50.0)  # second failure: twice the wait
    cap.probe_report(1, [], 50.1)
    assert cap.retry_due(50.0 + RETRY_LINK_S) == []
    assert len(cap.retry_due(50.0 + 2 * RETRY_LINK_S)) == 1
    assert cap.failed[(0, 1)].tries == 2


def test_a_probed_dead_link_takes_both_directions_out_until_probes_pass() -> None:
    cap = view()
    dead = cap.probe_report(1, [0], 5.0)  # receiver 1 hears no probes from 0
    assert {(u.src, u.dst, u.kind) for u in dead} == {
        (0, 1, LinkChange.DEAD),
        (1, 0, LinkChange.DEAD),  # TCP on 1 -> 0 needs its ACKs on 0 -> 1
    }
    assert cap.planning[0, 1] == cap.planning[1, 0] == 0.0 and cap.planning[0, 2] == 100.0
    assert cap.probe_report(1, [0], 6.0) == []  # no news
    assert cap.probe_report(0, [], 6.0) == []  # 1 -> 0 alive, but 0 -> 1 is still dead
    cap.set_link(0, 1, 100.0)  # the operator's restore does not override the probes
    assert cap.planning[0, 1] == 0.0
    alive = cap.probe_report(1, [], 7.0)
    assert {(u.src, u.dst, u.kind) for u in alive} == {
        (0, 1, LinkChange.ALIVE),
        (1, 0, LinkChange.ALIVE),
    }
    assert cap.planning[0, 1] == cap.planning[1, 0] == 100.0


def test_a_restarted_receiver_reports_afresh() -> None:
    cap = view()
    cap.probe_report(2, [0, 1], 1.0)
    cap.forget_worker(2)
    assert cap.planning[0, 2] == cap.planning[2, 0] == cap.planning[1, 2] == 100.0


def test_forget_worker_and_set_link_clear_failures() -> None:
    cap = view()
    cap.fail(0, 1, 1.0)
    cap.fail(2, 0, 1.0)
    cap.forget_worker(1)
    assert (0, 1) not in cap.failed and cap.planning[0, 1] == 100.0
    assert cap.planning[2, 0] == 0.0
    cap.set_link(2, 0, 30.0)
    assert cap.planning[2, 0] == cap.configured[2, 0] == cap.estimated[2, 0] == 30.0
    assert not cap.failed
    cap.set_link(2, 0, -5.0)
    assert cap.planning[2, 0] == 0.0


def test_estimate_is_an_ewma_and_drift_replans_only_when_measured() -> None:
    cap = view(measured=False)
    assert cap.measure(1, [sample(0, 50.0)]) == []
    assert cap.estimated[0, 1] == pytest.approx((1 - EWMA) * 100 + EWMA * 50)
    assert cap.planning[0, 1] == 100.0  # configured mode: the planner keeps the topology's rate

    cap = view(measured=True)
    updates = []
    for _ in range(10):
        updates += cap.measure(1, [sample(0, 50.0)])
    assert updates and all(u.kind is LinkChange.DRIFTED for u in updates)
    assert updates[0].was == 100.0
    assert all(abs(u.mbit - u.was) > DRIFT * u.was for u in updates)  # only beyond the drift
    assert len(updates) < 10 and cap.planning[0, 1] == pytest.approx(updates[-1].mbit)
    assert 50.0 <= cap.planning[0, 1] < 100.0 * (1 - DRIFT)


def test_bad_samples_and_failed_links_are_not_folded_into_plans() -> None:
    cap = view(measured=True)
    bad = [[5.0, 1e6, 1.0], [1.0, 1e6, 1.0], [0.0, 0.0, 1.0], [0.0, 1e6, 0.0], [-1.0, 1e6, 1.0]]
    assert cap.measure(1, bad) == []
    assert (cap.estimated[np.isfinite(cap.estimated)] == 100.0).all()
    cap.fail(0, 1, 1.0)
    assert cap.measure(1, [sample(0, 5.0)] * 5) == [] and cap.planning[0, 1] == 0.0


def test_residual_deducts_what_groups_in_flight_still_send() -> None:
    cap = view()
    load = np.zeros((N, N))
    load[0, 1] = 100e6 / 8  # one second of the whole link
    fresh = cap.residual([InFlight(load, 1.0, 0.0)], now=0.0)
    assert fresh[0, 1] < 100.0 and fresh[1, 0] == 100.0
    half = cap.residual([InFlight(load, 1.0, 0.0)], now=0.5)
    assert fresh[0, 1] <= half[0, 1] < 100.0
    done = cap.residual([InFlight(load, 1.0, 0.0)], now=2.0)
    assert np.array_equal(done, cap.planning)
    assert cap.residual([], now=0.0) is cap.planning


# -- reach: who would gate every group it joins -------------------------------------------------


def overlapping_view() -> tuple[CapacityView, list[int]]:
    """issue 16's overlapping faults at 62 s on an 8-worker mesh of uneven rates: worker 4 dead,
    0<->1 and 2<->3 cut, and five of the six live links into 7 dead (probes), 6->7 left."""
    rng = np.random.default_rng(2018)
    bw = rng.uniform(12.0, 120.0, size=(8, 8))
    cap = CapacityView(bw, measured=False)
    cap.probe_report(1, [0], 1.0)
    cap.probe_report(0, [1], 1.0)
    cap.probe_report(3, [2], 1.0)
    cap.probe_report(2, [3], 1.0)
    cap.probe_report(7, [0, 1, 2, 3, 5], 1.0)
    return cap, [0, 1, 2, 3, 5, 6, 7]


def test_reach_is_the_smaller_of_live_in_and_out_capacity_among_the_alive() -> None:
    cap = view()
    assert cap.reach_mbit([0, 1, 2]) == {0: 200.0, 1: 200.0, 2: 200.0}
    assert cap.reach_mbit([0, 2]) == {0: 100.0, 2: 100.0}  # 1 is not alive
    cap.probe_report(2, [0], 1.0)  # 0->2 dead, and 2->0 (its ACKs)
    assert cap.reach_mbit([0, 1, 2]) == {0: 100.0, 1: 200.0, 2: 100.0}
    assert poorly_reached(cap.reach_mbit([0, 1, 2])) == frozenset()


def test_a_worker_left_with_one_link_is_poorly_reached_and_contention_counts() -> None:
    cap, alive = overlapping_view()
    reach = cap.reach_mbit(alive)
    assert reach[7] == pytest.approx(min(cap.configured[6, 7], cap.configured[7, 6]))
    assert poorly_reached(reach) == {7}
    # Before the cuts into 7: a single contended link into it does not make it poorly reached.
    fresh = CapacityView(cap.configured, measured=False)
    fresh.measure(7, [sample(6, 1.0)] * 20)  # 6->7 measured at ~1 Mbit/s (contention)
    assert fresh.planning[6, 7] == cap.configured[6, 7]  # configured mode plans on the rate
    assert poorly_reached(fresh.reach_mbit(alive)) == frozenset()
    # ... but with the cuts, what the last link really delivers is what counts.
    cap.measure(7, [sample(6, 1.0)] * 20)
    assert cap.reach_mbit(alive)[7] < 2.0


def test_poorly_reached_needs_three_workers_and_a_share_below_one() -> None:
    assert poorly_reached({0: 1.0, 1: 100.0}) == frozenset()
    assert poorly_reached({0: 24.0, 1: 100.0, 2: 100.0}) == {0}
    assert poorly_reached({0: 26.0, 1: 100.0, 2: 100.0}) == frozenset()
    with pytest.raises(ValueError, match="share"):
        poorly_reached({0: 1.0, 1: 2.0, 2: 3.0}, share=1.0)
