"""The simulator's modelling choices other simulators make differently: symmetric pair rates,
links private to each group, and the study that compares them (lab.studies.simgaps)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from sim_kit import uniform

from crew.config import Scheme
from crew.sim.__main__ import main as sim_main
from crew.sim.engine import SimConfig, Simulation
from crew.sim.network import LinkQueues
from crew.sim.topogen import generate
from lab.studies import simgaps

MB = 1_000_000


def test_symmetric_rates_mirror_the_directed_draws() -> None:
    directed = generate(8, 2, 3).rate_mbit
    sym = generate(8, 2, 3, symmetric=True)
    assert not np.array_equal(directed, directed.T)
    assert np.array_equal(sym.rate_mbit, sym.rate_mbit.T)
    up = np.triu_indices(8, 1)
    assert np.array_equal(sym.rate_mbit[up], directed[up])
    assert np.all(np.diag(sym.rate_mbit) == 0)
    assert sym.name.endswith("-sym") and "symmetric pairs" in sym.description


def test_private_queues_do_not_wait_for_each_other_but_are_counted() -> None:
    rate = np.array([[0.0, 8.0], [8.0, 0.0]])  # 1 MB/s each way
    shared = LinkQueues(rate)
    assert [shared.queue(0, 1, MB, 0.0), shared.queue(0, 1, MB, 0.0)] == [1.0, 2.0]
    parent = LinkQueues(rate)
    ends = [parent.private().queue(0, 1, MB, 0.0) for _ in range(2)]
    assert ends == [1.0, 1.0]
    assert parent.sent_by(1.0)[1] == 2 * MB  # both jobs on link 0 -> 1, above its rate
    assert parent.jobs == 2
    parent.cut(0, 1, 1.5)
    assert parent.private().rate(0, 1) == 0.0  # a new private copy sees the cut


def test_private_links_let_concurrent_groups_run_at_full_capacity() -> None:
    # Four workers, 1 MB/s links, a 4 MB model; all ready at t = 1: two crew-paper groups of
    # two at once. Alone, each p2a group splits the vector over all four workers: 1 MB each,
    # scatter 1 s then broadcast 1 s. With private links both end at t = 3; sharing the
    # links, the second group waits for the first.
    def ends(shared: bool) -> list[float]:
        cfg = SimConfig(
            scheme=Scheme.CREW_PAPER,
            p=2,
            size_bytes=4 * MB,
            duration_s=3.5,
            goodput=1.0,
            seed=1,
            shared_links=shared,
        )
        return sorted(round(e, 9) for _, _, e in Simulation(uniform(4), cfg).run().group_times)

    assert ends(False) == [3.0, 3.0]
    shared = ends(True)
    assert shared and max(shared) > 3.0


def test_sim_command_takes_symmetric_pairs_and_private_links(capsys) -> None:  # noqa: ANN001
    sim_main(
        ["--n", "4", "--p", "2", "--duration", "2", "--scheme", "preduce"]
        + ["--symmetric", "--private-links", "--size-mb", "1"]
    )
    out = capsys.readouterr().out
    assert "links private to each group" in out


def test_gaps_variants_set_what_they_name() -> None:
    by_name = {v.name: v for v in simgaps.VARIANTS}
    assert by_name["ours"] == simgaps.Variant("ours")
    cfg = simgaps.sim_config(by_name["45 MB, all of the above"], 20, 5, Scheme.CREW_PAPER, 1, 50)
    assert (cfg.size_bytes, cfg.shared_links, cfg.goodput) == (45 * MB, False, 1.0)
    ours = simgaps.sim_config(by_name["ours"], 20, 5, Scheme.CREW_PAPER, 1, 50)
    assert (ours.size_bytes, ours.shared_links) == (180 * MB, True)
    assert ours.goodput == SimConfig().goodput
    assert by_name["symmetric pairs"].symmetric and by_name["no stragglers"].stragglers == "none"
    steps = by_name["45 MB, private links, 0.3 s steps"]
    assert simgaps.sim_config(steps, 20, 5, Scheme.PREDUCE, 1, 50).compute_s == 0.3
    assert ours.compute_s == 0.0


def test_gaps_study_writes_every_variant(tmp_path: Path) -> None:
    argv = ["--n", "4", "--ps", "2", "--duration", "3", "--schemes", "preduce"]
    assert simgaps.main([*argv, "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "sim-gaps.json").read_text())
    assert [r["variant"] for r in result["rows"]] == [v.name for v in simgaps.VARIANTS]
    assert all("preduce / authors" not in r for r in result["rows"])  # theirs is at n = 20
    text = simgaps.row_text(
        {"variant": "ours", "p": 5, "preduce": 3.75, "preduce / authors": 0.5},
        [Scheme.PREDUCE],
    )
    assert "preduce   3.75 (0.50x authors')" in text
