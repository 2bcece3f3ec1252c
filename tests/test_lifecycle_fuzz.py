"""A stateful fuzzer of authenticated control messages: the coordinator's life cycle, driven by
Hypothesis through honest runs of groups and, in between, messages a member that holds the
secret could send: wrong workers, groups and revisions, out-of-range and non-finite numbers,
malformed lists, unknown admin requests. Every message goes through the coordinator's own
path: ``protocol.decode`` of the JSON object, then ``GroupLifecycle.handle``.

Checked after every step: nothing raises; every bad message is refused by a typed check
(a ``ProtocolError`` at decode, or a warning-level ``refused`` event), never by the catch-all
guard that names an unforeseen exception; the planning matrix stays finite and non-negative;
every open group's members are distinct workers of the run; and honest groups still complete.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Annotated, Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from lifecycle_kit import SIZE, make_cfg

from crew.control import lifecycle as lc
from crew.control.grouping import GroupOutcome
from crew.wire import protocol as proto

N = 4
TO_COORDINATOR = (
    "register",
    "heartbeat",
    "ready",
    "metrics",
    "utilisation",
    "have_all",
    "link_failed",
    "link_rates",
    "link_health",
    "rejected",
    "op_time",
    "admin",
    "commit",
    "assign",
)
# The catch-all guard's event ("refused msg (Type): exc"); a typed refusal reads "refused msg: ..."
UNFORESEEN = ("refused msg (", "refused closed (")
ADMIN_OPS = ("set_p", "set_scheme", "set_link", "slow_worker", "stop", "reboot")

ints = st.one_of(st.integers(-3, N + 3), st.integers(-(2**63), 2**63), st.just(2**70))
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-10, 1e4),
    st.sampled_from([0.0, -0.0, 1e308, -1e-300]),
)
scalars = st.one_of(ints, floats, st.text(max_size=8), st.booleans(), st.none())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=12)
admin_args = st.dictionaries(
    st.sampled_from(["p", "scheme", "src", "dst", "rate_mbit", "delay_ms", "worker", "factor"]),
    st.one_of(scalars, st.sampled_from(["crew", "preduce", "ring", "nope"])),
    max_size=5,
)


def plausible(hint: Any) -> st.SearchStrategy[Any]:
    """Values of a field's annotation, hostile within it: ids of this run and just outside
    it, non-finite and negative numbers, lists of any length."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return plausible(args[0])
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.one_of(st.integers(0, N - 1), ints)
    if hint is float:
        return floats
    if hint is str:
        return st.one_of(st.text(max_size=8), st.sampled_from(["crew", "bad mac", ""]))
    if origin is list:
        return st.lists(plausible(args[0]), max_size=4)
    if origin is dict:
        return admin_args
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(plausible(a) for a in args))
    return values


def hostile(kind: str, data: st.DataObject) -> dict[str, Any]:
    """A message of ``kind`` whose fields are mostly of their type and hostile within it, now
    and then of another type; now and then a field is left out or an unknown one added."""
    cls = proto.MESSAGE_TYPES[kind]
    hints = typing.get_type_hints(cls, include_extras=True)
    obj: dict[str, Any] = {"type": kind}
    for f in dataclasses.fields(cls):
        choice = data.draw(st.integers(0, 20))
        if choice == 0:
            continue  # missing
        if kind == "admin" and f.name == "op":
            obj[f.name] = data.draw(st.one_of(st.sampled_from(ADMIN_OPS), scalars))
        else:
            obj[f.name] = data.draw(values if choice == 1 else plausible(hints[f.name]))
    if data.draw(st.integers(0, 20)) == 0:
        obj["extra"] = 1
    return obj


class LifecycleFuzz(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.life = lc.GroupLifecycle(make_cfg(n=N, p=2))
        self.now = 0.0
        self.completed = 0
        self.unforeseen: list[str] = []
        for w in range(N):
            self._send(proto.Register(w, 100 + w, 0, SIZE).to_dict())

    def _send(self, obj: dict[str, Any]) -> list[lc.Output]:
        self.now += 0.01
        try:
            msg = proto.decode(obj)
        except proto.ProtocolError:
            return []  # refused at decode, naming the field: the coordinator drops it
        outs = self.life.handle(msg, self.now)
        for o in outs:
            if isinstance(o, lc.EventRecord) and o.message.startswith(
                ("refused msg (", "refused closed (")
            ):
                self.unforeseen.append(f"{obj!r}: {o.message}")
            if isinstance(o, lc.GroupClosedRecord) and o.outcome is GroupOutcome.COMPLETED:
                self.completed += 1
        return outs

    @rule(worker=st.integers(0, N - 1))
    def ready(self, worker: int) -> None:
        self._send(proto.Ready(worker, 1, 1.0 + worker, 0).to_dict())

    @precondition(lambda self: bool(self.life.open))
    @rule(data=st.data())
    def finish_a_group_honestly(self, data: st.DataObject) -> None:
        gid = data.draw(st.sampled_from(sorted(self.life.open)))
        og = self.life.open[gid]
        projs = [self.life.offered_proj.get(m, 0.0) for m in og.members]
        expected = sum(w * p for w, p in zip(og.weights, projs, strict=True))
        for m in og.members:
            self._send(proto.HaveAll(m, gid, og.rev, 0, expected).to_dict())

    @rule(kind=st.sampled_from(TO_COORDINATOR), data=st.data())
    def hostile_message(self, kind: str, data: st.DataObject) -> None:
        self._send(hostile(kind, data))

    @rule(worker=st.integers(0, N - 1))
    def re_register(self, worker: int) -> None:
        self._send(proto.Register(worker, 500 + worker, 0, SIZE).to_dict())

    @rule(dt=st.floats(0.0, 30.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        for o in self.life.tick(self.now):
            if isinstance(o, lc.EventRecord) and o.message.startswith("refused tick"):
                self.unforeseen.append(o.message)

    @invariant()
    def refusals_are_typed(self) -> None:
        assert not self.unforeseen, self.unforeseen[0]

    @invariant()
    def planning_stays_finite_and_non_negative(self) -> None:
        bw = self.life.capacity.planning.copy()
        np.fill_diagonal(bw, 0.0)
        assert np.all(np.isfinite(bw)) and np.all(bw >= 0)

    @invariant()
    def open_groups_hold_distinct_workers(self) -> None:
        for og in self.life.open.values():
            assert len(set(og.members)) == len(og.members)
            assert all(0 <= m < N for m in og.members)
            assert all(math.isfinite(w) and w > 0 for w in og.weights)


LifecycleFuzz.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_life_cycle_refuses_every_bad_message_with_a_typed_event = LifecycleFuzz.TestCase


def test_the_fuzzer_drives_honest_groups_to_completion() -> None:
    """The machine's honest rules complete groups (so the hostile ones run on live state)."""
    m = LifecycleFuzz()
    for w in range(N):
        m.ready(w)
    assert m.life.open
    for gid in sorted(m.life.open):
        og = m.life.open[gid]
        expected = sum(
            w * m.life.offered_proj[x] for x, w in zip(og.members, og.weights, strict=True)
        )
        for x in og.members:
            m._send(proto.HaveAll(x, gid, og.rev, 0, expected).to_dict())
    assert m.completed >= 1
