"""lab.orchestrate.faults: what a SetLink passes on to the coordinator (no root: the network
side is a recording stand-in, since only the dispatch is under test)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lab.net.mesh import LinkState
from lab.orchestrate import commands as cmds
from lab.orchestrate.faults import FaultInjector


class _Net:
    def __init__(self) -> None:
        self.links: dict[tuple[int, int], LinkState] = {}

    def set_link(self, i: int, j: int, **kw: Any) -> LinkState:
        old = self.links.get((i, j), LinkState(i, j, 100.0, delay_ms=5.0))
        new = replace(old, **{k: v for k, v in kw.items() if v is not None})
        self.links[(i, j)] = new
        return new


class _Db:
    def __init__(self) -> None:
        self.rows: list[Any] = []

    def add_link_states(self, rows: list[Any]) -> None:
        self.rows.extend(rows)


class _Lab:
    def __init__(self) -> None:
        self.net = _Net()
        self.db = _Db()
        self.admins: list[tuple[str, dict[str, Any]]] = []

    def admin(self, op: str, **args: Any) -> None:
        self.admins.append((op, args))


def test_set_link_delay_reaches_the_coordinator() -> None:
    lab = _Lab()
    FaultInjector(lab).apply(cmds.SetLink(0, 1, delay_ms=40.0))  # type: ignore[arg-type]
    assert lab.admins == [("set_link", {"src": 0, "dst": 1, "rate_mbit": 100.0, "delay_ms": 40.0})]


def test_set_link_rate_only_sends_no_delay() -> None:
    lab = _Lab()
    FaultInjector(lab).apply(cmds.SetLink(2, 3, rate_mbit=25.0))  # type: ignore[arg-type]
    assert lab.admins == [("set_link", {"src": 2, "dst": 3, "rate_mbit": 25.0})]


def test_set_link_loss_only_tells_the_coordinator_nothing() -> None:
    lab = _Lab()
    FaultInjector(lab).apply(cmds.SetLink(2, 3, loss_pct=1.0))  # type: ignore[arg-type]
    assert lab.admins == []
