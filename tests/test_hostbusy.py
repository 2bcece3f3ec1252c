"""lab.orchestrate.hostbusy: the host's busy CPU over the training window, and per link GB."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crew.runtime import rundb
from lab.orchestrate.hostbusy import (
    HostBusy,
    HostBusyError,
    HostMark,
    host_busy_s,
    training_load,
)
from lab.orchestrate.summary import summarize

START = 1_000.0


def test_busy_seconds_leave_out_idle_and_iowait(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    hz = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(f"cpu  {hz} {hz} {hz} {50 * hz} {7 * hz} {hz} {2 * hz} {hz} 0 0\ncpu0 1 2\n")
    assert host_busy_s(stat) == 7.0  # 1+1+1 user/nice/system, 1 irq, 2 softirq, 1 steal


def test_the_hosts_busy_seconds_grow_with_work() -> None:
    a = host_busy_s()
    deadline = os.times().elapsed + 0.3
    while os.times().elapsed < deadline:  # bounded busy loop: 0.3 s of this process's CPU
        sum(range(1000))
    assert host_busy_s() - a >= 0.2


def test_a_not_cpu_first_line_is_refused(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("intr 1 2 3\n")
    with pytest.raises(HostBusyError, match="'cpu' total"):
        host_busy_s(stat)


def test_share_is_busy_over_window_times_cores() -> None:
    busy = HostBusy.between(HostMark(10.0, 100.0), HostMark(60.0, 180.0), cores=2)
    assert busy.busy_s == 80.0
    assert busy.share == 0.8  # 80 CPU s over 50 s on 2 cores


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"started": 1, "ended": 2, "busy_s": 1}',  # no cores
        '{"started": 2, "ended": 1, "busy_s": 1, "cores": 2}',  # backwards
        '{"started": 1, "ended": 2, "busy_s": -1, "cores": 2}',
    ],
)
def test_a_bad_record_is_refused_with_its_text(text: str) -> None:
    with pytest.raises(HostBusyError, match="host_busy record"):
        HostBusy.from_json(text)


def _run(path: Path, busy: HostBusy | None) -> None:
    db = rundb.RunDB(path)
    try:
        db.set_meta({"n": "2", "started_at": str(START), "ended_at": str(START + 100)})
        if busy is not None:
            db.set_meta({"host_busy": busy.to_json()})
        # Link 0->1 carries 1 GB inside the window [START+10, START+60], and 5 GB outside it
        # (the build before, the teardown after); link 1->0 carries 0.5 GB inside.
        db.add_link_samples(
            [
                rundb.LinkSampleRow(START + 5, 0, 1, 0, 10.0),
                rundb.LinkSampleRow(START + 10, 0, 1, 2_000_000_000, 10.0),
                rundb.LinkSampleRow(START + 60, 0, 1, 3_000_000_000, 10.0),
                rundb.LinkSampleRow(START + 70, 0, 1, 7_000_000_000, 10.0),
                rundb.LinkSampleRow(START + 11, 1, 0, 100, 10.0),
                rundb.LinkSampleRow(START + 59, 1, 0, 500_000_100, 10.0),
            ]
        )
    finally:
        db.close()


def test_cpu_per_link_gb_counts_only_the_windows_bytes(tmp_path: Path) -> None:
    path = tmp_path / "lab.db"
    _run(path, HostBusy(START + 10, START + 60, busy_s=60.0, cores=2))
    with rundb.reading(path) as conn:
        load = training_load(conn)
    assert load is not None
    assert load.link_bytes == 1_500_000_000
    assert load.cpu_s_per_link_gb == pytest.approx(40.0)  # 60 CPU s over 1.5 GB
    summary = summarize(path)
    assert summary["host_busy_share"] == 0.6
    assert summary["host_cpu_s_per_link_gb"] == 40.0


def test_a_run_without_the_window_has_no_training_load(tmp_path: Path) -> None:
    path = tmp_path / "lab.db"
    _run(path, None)
    with rundb.reading(path) as conn:
        assert training_load(conn) is None
    summary = summarize(path)
    assert summary["host_busy_share"] is None
    assert summary["host_cpu_s_per_link_gb"] is None
