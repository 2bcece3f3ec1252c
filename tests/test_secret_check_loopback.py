"""A tampering aggregator on loopback: a real coordinator and four Nodes with real sockets, no
root. Workers 0-2 form a group; the links among them are slow and those to worker 3 fast, so
crew's plan makes non-member 3 the group's aggregator. Worker 3 runs the lab's poisoner
(``lab.orchestrate.poisoner``): a tamper orthogonal to the public check vector on every part it
forwards.

* public check: the poisoned average is committed and applied (the hole this documents);
* secret check: the group is abandoned, no member applies anything, an ERROR names the group;
* secret check, honest aggregator: the exact average is committed;
* clipped aggregation (``aggregate clip``, PS through worker 3): a member that offers 100
  times its vector is committed with bounded influence, and a tampering aggregator is caught
  by the clip-mode secret check.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reduce_kit import near_vectors

from crew.config import RunConfig
from crew.control.worker_control import Settlement
from crew.runtime import node as node_mod
from crew.runtime import rundb
from crew.runtime.coordinator import Coordinator
from crew.runtime.node import Node, Settled
from crew.runtime.reduce import ReduceEngine
from crew.runtime.rundb import RunDB
from lab.orchestrate.poison_phase import tampered_from_log
from lab.orchestrate.poisoner import PoisonEngine
from lab.studies.workerstart import free_ports

SECRET = b"secret-check-loopback-0123456789"
N, MEMBERS, POISONER = 4, (0, 1, 2), 3
SIZE = 6000
SETTLE_S = 60.0  # a bound on a hung run, not a timing assertion


def _cfg(check: str, coordinator_port: int, **settings: Any) -> RunConfig:
    bw = tuple(
        tuple(0.0 if i == j else (400.0 if POISONER in (i, j) else 2.0) for j in range(N))
        for i in range(N)
    )
    return RunConfig(
        run_id="secret-loopback",
        run_num=9,
        run_dir="/nonexistent",
        secret_path="/nonexistent",
        n=N,
        p=len(MEMBERS),
        coordinator_host="127.0.0.1",
        coordinator_port=coordinator_port,
        data_port=0,
        data_ports=tuple(free_ports(N)),
        identities=("127.0.0.1",) * N,
        bw_mbit=bw,
        check=check,
        **({"scheme": "crew"} | settings),
    )


def _run(
    tmp_path: Path,
    check: str,
    poison: bool,
    monkeypatch: pytest.MonkeyPatch,
    vectors: dict[int, np.ndarray] | None = None,
    **settings: Any,
) -> tuple[dict[int, Settled | None], dict[int, np.ndarray], list[tuple[str, str]], int]:
    """One group of MEMBERS carried by POISONER: each member's settlement, the vectors offered
    (``vectors``, or independent draws), the run's (level, message) events, and the poisoner's
    tampered part count. ``settings``: more RunConfig fields."""

    def engine(me: int, *args, **kwargs) -> ReduceEngine:  # noqa: ANN002, ANN003
        cls = PoisonEngine if poison and me == POISONER else ReduceEngine
        return cls(me, *args, **kwargs)

    monkeypatch.setattr(node_mod, "ReduceEngine", engine)
    probe = _cfg(check, 0, **settings)
    db = RunDB(tmp_path / "run.db")
    coord = Coordinator(probe, db, "127.0.0.1", 0, secret=SECRET)
    cfg = _cfg(check, coord.port, **settings)
    loop = threading.Thread(target=coord.run, daemon=True)
    loop.start()
    nodes = [Node(cfg, i, SIZE, secret=SECRET) for i in range(N)]
    if vectors is None:
        rng = np.random.default_rng(5)
        vectors = {m: rng.standard_normal(SIZE).astype(np.float32) for m in MEMBERS}
    settled: dict[int, Settled | None] = {}
    try:
        for node in nodes:
            assert node.start()

        def member(m: int) -> None:
            nodes[m].offer(vectors[m], 0)
            settled[m] = nodes[m].settle(timeout=SETTLE_S)

        threads = [threading.Thread(target=member, args=(m,)) for m in MEMBERS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(SETTLE_S + 10)
        engine3 = nodes[POISONER].engine
        tampered = getattr(engine3, "tampered_parts", 0)
    finally:
        for node in nodes:
            node.close()
        coord.stop_event.set()
        loop.join(10)
    with rundb.connect(tmp_path / "run.db", readonly=True) as conn:
        events = [(r[0], r[1]) for r in conn.execute("SELECT level, message FROM events")]
    return settled, vectors, events, tampered


def _average(vectors: dict[int, np.ndarray], weights: tuple[float, ...]) -> np.ndarray:
    return sum(w * vectors[m].astype(np.float64) for m, w in zip(MEMBERS, weights, strict=True))


def _assert_every_member_applied_the_exact_average(
    settled: dict[int, Settled | None], vectors: dict[int, np.ndarray]
) -> None:
    exact = _average(vectors, (1 / 3, 1 / 3, 1 / 3))
    for m in MEMBERS:
        s = settled[m]
        assert s is not None and s.settlement is Settlement.APPLY_AVERAGE, (m, s)
        assert s.result is not None
        np.testing.assert_allclose(s.result, exact, rtol=0, atol=1e-5)


def test_public_check_commits_a_poisoned_average(tmp_path, monkeypatch) -> None:
    settled, vectors, _, tampered = _run(tmp_path, "public", True, monkeypatch)
    assert tampered > 0, "the plan did not route the group through the poisoner"
    for m in MEMBERS:
        s = settled[m]
        assert s is not None and s.settlement is Settlement.APPLY_AVERAGE, (m, s)
        assert s.result is not None
        exact = _average(vectors, (1 / 3, 1 / 3, 1 / 3))
        # The tamper (0.5 a element, less its public projection) is in what was applied.
        assert np.abs(s.result - exact).mean() > 0.1


def test_secret_check_abandons_the_poisoned_group_and_nothing_is_applied(
    tmp_path, monkeypatch, caplog
) -> None:
    with caplog.at_level(logging.WARNING, logger="lab.orchestrate.poisoner"):
        settled, vectors, events, tampered = _run(tmp_path, "secret", True, monkeypatch)
    assert tampered > 0, "the plan did not route the group through the poisoner"
    # The poisoner's log says so, in the lines lab.hostile's poison phase counts.
    groups, parts = tampered_from_log(caplog.text, POISONER)
    assert len(groups) == 1 and parts >= tampered
    with rundb.connect(tmp_path / "run.db", readonly=True) as conn:
        [(status, revisions)] = conn.execute("SELECT status, revisions FROM groups").fetchall()
    if status == rundb.GroupStatus.COMPLETED.value:
        # On a loaded host a link of the group can stall past its timeout: a later revision,
        # planned without that link, carries the data again. Only such a revision may commit,
        # and only the exact average, untouched by what the first one tampered with.
        assert revisions >= 1, "a tampered revision was committed"
        _assert_every_member_applied_the_exact_average(settled, vectors)
        return
    for m in MEMBERS:
        s = settled[m]
        assert s is not None and s.settlement is Settlement.KEEP_OWN_ABANDONED, (m, s)
        assert s.result is None
        assert "secret check failed" in s.outcome.reason
    errors = [msg for level, msg in events if level == "error"]
    assert any(msg.startswith("group ") and "secret check failed" in msg for msg in errors)


def test_secret_check_commits_an_honest_group(tmp_path, monkeypatch) -> None:
    settled, vectors, events, _ = _run(tmp_path, "secret", False, monkeypatch)
    _assert_every_member_applied_the_exact_average(settled, vectors)
    assert not [msg for level, msg in events if level == "error"]


CLIP = {"aggregate": "clip", "scheme": "ps"}  # PS serves from fast worker 3, a non-member


def _near() -> dict[int, np.ndarray]:
    """Members' models 1% apart; member 2 offers 100 times its own."""
    return near_vectors(MEMBERS, SIZE, seed=6, poisoned=2)


def test_clip_commits_a_self_poisoned_group_with_bounded_influence(tmp_path, monkeypatch) -> None:
    settled, vectors, events, _ = _run(tmp_path, "secret", False, monkeypatch, _near(), **CLIP)
    honest = (vectors[0].astype(np.float64) + vectors[1]) / 2
    for m in MEMBERS:
        s = settled[m]
        assert s is not None and s.settlement is Settlement.APPLY_AVERAGE, (m, s)
        assert s.result is not None
        bound = (1 / 3) / (2 / 3) * 0.1 * np.linalg.norm(s.result) * 1.01  # w tau / (1 - w)
        assert np.linalg.norm(s.result - honest) <= bound
        mean = _average(vectors, (1 / 3, 1 / 3, 1 / 3))
        assert np.linalg.norm(mean - honest) > 100 * bound  # what the mean would have applied
    assert not [msg for level, msg in events if level == "error"]


def test_clip_abandons_a_group_whose_aggregator_tampered(tmp_path, monkeypatch) -> None:
    settled, _, events, tampered = _run(tmp_path, "secret", True, monkeypatch, _near(), **CLIP)
    assert tampered > 0, "the plan did not route the group through the poisoner"
    for m in MEMBERS:
        s = settled[m]
        assert s is not None and s.settlement is Settlement.KEEP_OWN_ABANDONED, (m, s)
        assert "secret check failed" in s.outcome.reason
    assert any("secret check failed" in msg for level, msg in events if level == "error")
