"""lab.studies.datapath: the data-path CPU benchmark runs the real engine and reports sane
figures."""

from __future__ import annotations

import json

import pytest

from lab.studies import datapath


@pytest.mark.parametrize("processes", [True, False], ids=["process-each", "one-process"])
def test_end_to_end_moves_the_planned_bytes_and_counts_cpu(processes: bool) -> None:
    e2e = datapath.end_to_end(workers=3, mb=1.2, ops=2, processes=processes)
    # Stars of 3 members: every member sends 2 thirds up and gets 2 thirds back, per op.
    assert e2e.link_gb == pytest.approx(2 * 3 * 2 * (2 / 3) * 1.2e-3, rel=1e-3)
    assert e2e.user_s + e2e.sys_s > 0
    assert e2e.cpu_s_per_gb > 0


def test_stages_cover_the_per_byte_work() -> None:
    stages = datapath.stages(part_elems=4096, min_s=0.02)
    names = {s.name for s in stages}
    assert {"frame MAC", "finite check", "add", "copy to result", "recv buffer"} <= names
    assert all(s.s_per_gb > 0 for s in stages)


def test_main_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert datapath.main(["--workers", "2", "--mb", "0.5", "--ops", "1", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["end_to_end"]["workers"] == 2
    assert out["end_to_end"]["cpu_s_per_gb"] > 0
    assert out["stages"] and out["unexplained_s_per_gb"] is not None
