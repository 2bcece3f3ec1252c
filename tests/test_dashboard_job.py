"""``python -m dashboard DIR`` on a crew.Averager job's run directory (its ``run.db``), headless
through ``streamlit.testing.v1.AppTest``: the page a job's user opens, no browser, no lab."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import __main__ as entry

try:
    from test_averager import ARGS, run_ranks
except ImportError:  # tests/ became a package
    from tests.test_averager import ARGS, run_ranks

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
STEPS = 4


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-rank job on loopback that reported its loss after every step."""
    run_dir = tmp_path_factory.mktemp("job")

    def body(rank, averager, tensors):
        for step in range(STEPS):
            rnd = averager.step()
            averager.report(1.0 / (step + 1), accuracy=0.5 + 0.1 * step)
            assert rnd.averaged
        return averager.iteration

    res = run_ranks(2, body, args={**ARGS, "run_dir": run_dir})
    assert res == {0: STEPS, 1: STEPS}, res
    assert (run_dir / "run.db").is_file() and not (run_dir / "lab.db").exists()
    return run_dir


def served_db(run: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """What ``python -m dashboard run`` hands Streamlit as ``--run``."""
    seen: list[list[str]] = []
    monkeypatch.setattr(entry.os, "execv", lambda exe, argv: seen.append(argv))
    entry.main([str(run), "--port", "8612"])
    (argv,) = seen
    assert argv[-3:-1] == ["--", "--run"]
    return argv[-1]


def test_the_entry_finds_a_jobs_run_db(job_dir, monkeypatch):
    assert served_db(job_dir, monkeypatch) == str((job_dir / "run.db").resolve())
    # A lab run's lab.db comes first when a directory holds both.
    (job_dir / "lab.db").write_bytes((job_dir / "run.db").read_bytes())
    try:
        assert served_db(job_dir, monkeypatch) == str((job_dir / "lab.db").resolve())
    finally:
        (job_dir / "lab.db").unlink()


def test_a_directory_without_a_database_names_both_files(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        entry.main([str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "lab.db") in err and str(tmp_path / "run.db") in err


def test_the_page_shows_a_jobs_ranks_links_plans_and_training(job_dir, monkeypatch):
    monkeypatch.setenv("CREW_LAB_RUN", served_db(job_dir, monkeypatch))
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Run"] == job_dir.name and metrics["Topology"] == "launched job"
    assert metrics["Scheme"] == "crew" and metrics["p"] == "2"
    assert metrics["State"] == "finished"  # replayed, with no lab controls
    assert metrics["measured"].endswith(" s")  # the newest plan's group completed
    tables = {tuple(t.value.columns): t.value for t in at.table}
    links = tables[("link", "Mbit/s", "rate Mbit/s", "util %", "state")]
    assert sorted(links["link"]) == ["0→1", "1→0"]  # the probed links, at their rates
    assert all(float(r) > 0 for r in links["rate Mbit/s"])
    ranks = tables[("worker", "state", "iteration", "group")]
    assert list(ranks["worker"]) == ["rank 0", "rank 1"]
    assert list(ranks["iteration"]) == [STEPS, STEPS]
    figs = [json.loads(e.proto.spec) for e in at.get("plotly_chart")]
    # The training curves: the loss each rank reported, one point per step.
    curves = [
        trace
        for fig in figs
        for trace in fig["data"]
        if trace.get("name") in ("rank 0", "rank 1") and trace.get("mode", "").startswith("lines")
    ]
    assert {trace["name"] for trace in curves} == {"rank 0", "rank 1"}
    for rank in ("rank 0", "rank 1"):
        assert max(len(_values(t["y"])) for t in curves if t["name"] == rank) == STEPS


def _values(y: list | dict) -> list:
    """A trace's values; plotly sends numeric arrays typed (dtype + base64 bytes)."""
    if isinstance(y, dict):
        return np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]).tolist()
    return list(y)
