"""lab.check in lab.vm's guest: it measures delay and loss where a topology configures them,
and fails a pair whose measured figure is out of bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import check

pytestmark = [pytest.mark.vm, pytest.mark.root]

TOPOLOGY = """\
name: check-wan
clouds: [{name: a}, {name: b}, {name: c}]
links:
  - {between: [a, b], mbit: 20, delay_ms: {forward: 20, reverse: 5}}
  - {between: [a, c], mbit: 20, loss_pct: {forward: 25, reverse: 0}}
  - {between: [b, c], mbit: 20}
"""


def test_check_measures_delay_and_loss_where_configured(tmp_path: Path) -> None:
    topo = tmp_path / "wan.yaml"
    topo.write_text(TOPOLOGY)
    out = tmp_path / "check.json"
    code = check.main(
        [
            "--topology", str(topo), "--seconds", "1.5", "--probes", "500", "--retries", "2",
            "--json", str(out),
        ]
    )  # fmt: skip
    report = json.loads(out.read_text())
    rows = {(p["link"], p["quantity"]): p for p in report["probes"]}
    assert set(rows) == {
        ("w0<->w1", "RTT median"),
        ("w0<->w1", "RTT p90"),
        ("w0<->w2", "loss"),
    }, rows
    assert rows[("w0<->w1", "RTT median")]["configured"] == pytest.approx(25.0)
    assert rows[("w0<->w2", "loss")]["configured"] == pytest.approx(25.0)
    assert all(p["ok"] for p in report["probes"]), report["probes"]
    # A figure out of bounds is measured again, here up to twice (--retries 2), before it fails
    # the check. Twice: under QEMU's software emulation a slow phase of the host put the delayed
    # pair's RTT p90 at 35.4 ms (bound 29.0) in two ping trains in a row (CI at 51a1110).
    assert report["retries"] == 2
    assert all(1 <= p["attempts"] <= 3 for p in report["probes"]), report["probes"]
    assert all(1 <= lk["attempts"] <= 3 for lk in report["links"]), report["links"]
    # The undelayed, lossless pair's goodput is judged as usual.
    judged = [lk for lk in report["links"] if {lk["src"], lk["dst"]} == {1, 2}]
    assert judged and all(lk["status"] == "ok" for lk in judged), judged
    assert code == 0, report
