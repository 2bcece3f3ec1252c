"""The sender's view of a link's rate: the kernel's delivery samples, read and folded in."""

from __future__ import annotations

import numpy as np
import pytest
from lifecycle_kit import make_cfg, started

from crew.control import lifecycle as lc
from crew.control.capacity import EWMA, TCP_GOODPUT, CapacityView, LinkChange
from crew.wire import protocol as proto
from crew.wire.delivery import (
    APP_LIMITED_BYTE,
    DELIVERY_RATE_AT,
    INFO_BYTES,
    DeliveryMeter,
    delivery_rate,
)


def info(rate: int, app_limited: bool = False) -> bytes:
    raw = bytearray(INFO_BYTES)
    raw[APP_LIMITED_BYTE] = 0b101 if app_limited else 0b100  # other bits of that byte vary
    raw[DELIVERY_RATE_AT : DELIVERY_RATE_AT + 8] = rate.to_bytes(8, "little")
    return bytes(raw)


def test_a_tcp_info_record_gives_its_delivery_rate_unless_app_limited() -> None:
    assert delivery_rate(info(1_250_000)) == 1_250_000.0
    assert delivery_rate(info(1_250_000, app_limited=True)) is None
    assert delivery_rate(info(0)) is None
    assert delivery_rate(info(1_250_000)[: DELIVERY_RATE_AT + 4]) is None  # an older kernel


def test_the_meter_reads_at_most_every_gap_and_reports_the_median() -> None:
    m = DeliveryMeter(min_gap_s=0.05, max_samples=4)
    assert m.due(1.0) and not m.due(1.01) and m.due(1.06)
    for r in (10.0, 30.0, 20.0, None, 1000.0, 5.0):  # None: app-limited; the fifth is over the cap
        m.add(r)
    assert m.take() == pytest.approx(25.0)  # median of 10, 30, 20, 1000
    assert m.take() is None


def test_a_senders_rates_move_the_estimate_and_drift_the_plan() -> None:
    bw = np.full((3, 3), 40.0)
    np.fill_diagonal(bw, np.inf)
    view = CapacityView(bw, measured=True)
    payload = 10.0 * TCP_GOODPUT  # the link now carries 10 Mbit/s of frames
    assert view.measure_sent(0, [[1.0, payload], [0.0, 5.0], [7.0, 5.0], [2.0, 0.0]]) == []
    assert view.estimated[0, 1] == pytest.approx((1 - EWMA) * 40 + EWMA * 10)
    assert view.estimated[0, 2] == 40.0  # no rate, no change; self and unknown ids skipped
    updates = view.measure_sent(0, [[1.0, payload]])
    assert [(u.kind, u.src, u.dst) for u in updates] == [(LinkChange.DRIFTED, 0, 1)]
    assert view.planning[0, 1] == pytest.approx(view.estimated[0, 1])


def test_send_rates_are_decoded_strictly_and_reach_the_plan() -> None:
    msg = proto.decode({"type": "send_rates", "worker": 0, "samples": [[1, 9.5]]})
    assert msg == proto.SendRates(0, [[1.0, 9.5]])
    for bad in ([[1, 9.5, 3]], [[1, -2.0]], [[1, float("nan")]]):
        with pytest.raises(proto.ProtocolError, match="send_rates.samples"):
            proto.decode({"type": "send_rates", "worker": 0, "samples": bad})
    life = started(make_cfg(n=3, p=2, capacity="measured"))
    outs = []
    for k in range(4):
        outs += life.handle(proto.SendRates(0, [[1.0, 10.0 * TCP_GOODPUT]]), 1.0 + k)
    assert life.capacity.planning[0, 1] < 100.0 * 0.75
    assert any(isinstance(o, lc.EventRecord) and "0->1" in o.message for o in outs)
