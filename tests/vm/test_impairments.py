"""Impairments measured in lab.vm's guest (a kernel with sch_netem): delay per direction,
jitter, loss and rate with delay, as built and after a run-time change. Bounds: lab.net.probe."""

from __future__ import annotations

import pytest

from lab.studies.impairments import Sizes, render, run_cases

pytestmark = [pytest.mark.vm, pytest.mark.root]


def test_every_impairment_is_within_its_bound_as_built_and_after_a_change() -> None:
    rows = run_cases(Sizes(rtt_probes=200, loss_probes=4000, interval_s=0.005, bulk_s=3.0))
    print(render(rows))
    kinds = {(r.when, r.quantity) for r in rows}
    for when in ("built", "changed at run time"):
        for q in ("RTT median", "RTT p90", "jitter (RTT sd)", "loss", "goodput"):
            assert (when, q) in kinds, f"no {q} row {when}"
    bad = [r for r in rows if not r.ok]
    assert not bad, "out of bounds:\n" + render(bad)
