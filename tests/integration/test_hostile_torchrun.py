"""``python -m lab.hostile --target torchrun`` end to end at small counts: examples/train_digits.py
through one torchrun per host namespace of the small topology, a short flood of the job's
coordinator and every rank's data plane (found from the config the job records), the replays,
and the report. The job must keep going, and the command must say so with its counts."""

from __future__ import annotations

from pathlib import Path

import labkit
import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

TIMEOUT_S = 600.0
TRIES = 2


def test_a_small_hostile_run_keeps_a_torchrun_job_going(tmp_path: Path) -> None:
    proc, report = labkit.run_hostile(
        tmp_path,
        [
            "--target",
            "torchrun",
            "--topology",
            "small",
            "--connections",
            "40",
            "--duration",
            "10",
            "--baseline",
            "10",
            "--slowloris",
            "2",
            "--frames",
            "3",
            "--replays",
            str(TRIES),
            "--phases",
            "flood,replay",  # the poison phase: test_hostile_poison_torchrun.py
            "--out",
            str(tmp_path / "job"),
        ],
        TIMEOUT_S,
    )
    print(proc.stdout[-6000:])
    assert report["target"] == "torchrun" and report["error"] is None, proc.stderr[-3000:]
    # The flood reached the job's coordinator and its three ranks' data planes, from what the
    # job recorded: 40 idle connections, every one ended by its target, none answered.
    assert [f["target"] for f in report["flood"]] == ["coordinator", "w0", "w1", "w2"]
    assert [sum(f["idle"].values()) for f in report["flood"]] == [10, 10, 10, 10]
    verdicts = {v["check"]: v["met"] for v in report["verdicts"]}
    for check in (
        "no attacker failed",
        "idle connections ended by the target",
        "slowloris cut by the handshake deadline",
        "hostile frames dropped",
        "every worker in a completed group after the flood",
        "replays and impersonations refused",
        "Admin from a worker refused",
        "groups complete after the replays",
        "no worker crashed, no coordinator restart",
    ):
        assert verdicts[check], (check, report["verdicts"], proc.stderr[-3000:])
    # Every rank was back in a completed group after the flood.
    assert report["workers_back"] == 3 and report["groups_after_flood"] > 0
    # Replay and impersonation at each of the four listeners, and a HELLO naming the lab at
    # the coordinator; a launched job has no admin key, so no session of the lab to replay.
    attempts = report["replay"]["attempts"]
    assert sum(attempts.values()) == TRIES * (2 * 4 + 1)
    assert "replay-admin@coordinator" not in attempts and attempts["lab-hello@coordinator"] == 2
    assert report["replay"]["refused"] == attempts
    assert report["admin_sent"] == TRIES and report["p_after"] == report["p_before"]
    assert report["admin_identity"].startswith("none")
    assert report["groups_after_replay"] > 0 and report["crashed"] == {}
    # Every rank's trainer was watched (rank 0's also hosts the coordinator).
    assert sorted(report["rss_growth_mb"]) == ["w0", "w1", "w2"]
