"""Scripted fault scenarios: a YAML timeline of lab commands.

A scenario is a list of steps; each step fires one command of the lab's vocabulary
(``lab.orchestrate.commands``) at a time since the run started (``at``) or once a number of groups
have completed (``after_groups``). A due step becomes a ``pending`` row of the run database's
``commands`` table through ``lab.orchestrate.commands.submit``, exactly as a dashboard button does,
and the lab's fault injector applies it. Scenarios therefore have no fault path of their own.

Format reference: ``scenarios/README.md``. In short::

    name: link-cut-during-scatter
    description: ...
    seed: 7                    # required when a step is random (a macro)
    steps:
      - at: 20                 # seconds since the run started ...
        do: cut_link           # ... or `after_groups: 10` instead of `at`
        args: {src: 0, dst: 1}

Besides the ten command kinds, ``do`` accepts three scenario-only macros, expanded at load time
into plain steps (so ``Scenario.steps`` holds only (trigger, command) pairs and the printed
timeline is exactly what will be submitted):

``scale_link`` ``{src, dst, fraction, both=false}``
    ``set_link`` to ``fraction`` × the link's configured rate (``fraction: 1`` restores it).
    Needs the topology's rates (``rates=``).
``fail_random_links`` ``{k, until}``
    ``k`` distinct directed links, chosen with the scenario's seed, cut for good at seeded
    random times in ``[at, until]``. A cut is only chosen if afterwards every ordered worker
    pair is still joined by a live direct link or a live two-hop relay, because CREW's failover
    re-routes a block through one backup aggregator or relay and no further; if fewer than
    ``k`` links can be cut under that rule, loading fails.
``chaos`` ``{until, every, kinds?, slow_factor?, rate_fraction?, contention_mbit?, max_dead?}``
    From ``at`` to ``until``, one fault starts every ``every`` seconds: a kind drawn from
    ``kinds`` (``kill``, ``slow``, ``cut``, ``rate``, ``contention``; default all) on a random
    free target, undone after a random hold of ``every/2 .. 2·every`` seconds and at the latest
    at ``until``. A worker or directed link carries at most one chaos fault at a time, and at
    most ``max_dead`` (default 1) workers are down at once, so every undo is meaningful
    (never a restart of a running worker, never a restore of a link another fault still holds).
    ``rate`` needs the topology's rates.

Validation happens in full at load time: every step's arguments go through
``lab.orchestrate.commands.parse_command`` with the lab's ``LabLimits``, and problems raise
``ScenarioError`` naming the file, the field (``steps[3].args.dst``) and the problem.

Ordering: time steps fire in time order and ``after_groups`` steps in count order; ties keep
file order. Steps of both kinds that fall due in the same poll are submitted time steps
first, so do not make a step of one kind depend on a simultaneous step of the other.

Run ``python -m lab.scenario PATH --n 8`` to validate a file and print its expanded timeline;
rates come from ``--topology FILE``, by default ``topologies/default.yaml`` when its worker
count matches.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import random
import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crew.runtime import rundb
from lab.orchestrate import commands as cmds
from lab.orchestrate.commands import Command, CommandError, CommandKind, LabLimits
from lab.spec.fields import FieldError, FieldReader, describe, read_yaml, suggest

log = logging.getLogger(__name__)

MAX_SCENARIO_S = 7 * 24 * 3600.0  # a week: catches a typo'd extra digit, not a real limit
MAX_AFTER_GROUPS = 10_000_000
MAX_SEED = 2**63 - 1
MAX_SCALE_FRACTION = 100.0
MAX_CHAOS_FAULTS = 10_000  # upper bound on chaos slots, so a tiny `every` cannot blow up
TIME_DECIMALS = 1  # expanded macro times are rounded to 0.1 s, for a readable timeline

_DOC = "(document)"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")
_TOP_KEYS = ("name", "description", "seed", "steps")
_STEP_KEYS = ("at", "after_groups", "do", "args")


class Macro(enum.Enum):
    """Scenario-only step kinds, expanded into plain commands at load time."""

    SCALE_LINK = "scale_link"
    FAIL_RANDOM_LINKS = "fail_random_links"
    CHAOS = "chaos"


class ChaosFault(enum.Enum):
    """What ``chaos`` may inject; each is undone after a while."""

    KILL = "kill"  # kill_worker, then restart_worker
    SLOW = "slow"  # slow_worker ×slow_factor, then ×1
    CUT = "cut"  # cut_link, then restore_link (one direction)
    RATE = "rate"  # set_link to rate_fraction × rate, then back to the configured rate
    CONTENTION = "contention"  # start_contention, then stop_contention


_RANDOM_MACROS = frozenset({Macro.FAIL_RANDOM_LINKS, Macro.CHAOS})
_DO_NAMES = tuple(k.value for k in CommandKind) + tuple(m.value for m in Macro)


class ScenarioError(FieldError):
    """A scenario file or mapping is invalid; ``field`` is a dotted path into the document
    (``steps[3].args.dst``), or ``(document)`` for problems with the file as a whole."""


class TriggerKind(enum.Enum):
    AT = "at"  # seconds since the run started
    AFTER_GROUPS = "after_groups"  # completed groups


@dataclasses.dataclass(frozen=True)
class Trigger:
    """When a step fires: ``value`` seconds after the start, or after ``value`` groups."""

    kind: TriggerKind
    value: float

    def due(self, elapsed_s: float, completed_groups: int) -> bool:
        if self.kind is TriggerKind.AT:
            return elapsed_s >= self.value
        return completed_groups >= self.value

    def describe(self) -> str:
        if self.kind is TriggerKind.AT:
            return f"t={self.value:7.1f}s"
        return f"after {int(self.value)} groups"


@dataclasses.dataclass(frozen=True)
class Step:
    """One plain step; ``origin`` names the file step it came from (``steps[2] (chaos)``)."""

    trigger: Trigger
    command: Command
    origin: str


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    seed: int | None
    n: int
    steps: tuple[Step, ...]
    source: Path | None = None

    def scaled(self, factor: float) -> Scenario:
        """The same steps with every ``at`` time multiplied by ``factor``.

        Order, ties and targets are unchanged (scaling is monotone), and ``after_groups``
        triggers are left alone: a count is no clock. Used to replay a shipped timeline, written
        for minutes-long runs, in a CI-sized run; a fault then lasts ``factor`` times as long,
        while the system's own reaction times (stall and heartbeat timeouts, a restart's torch
        import) do not scale, so a shortened fault may end before it is noticed.
        """
        if isinstance(factor, bool) or not isinstance(factor, int | float):
            raise TypeError(f"factor: must be a number, got {describe(factor)}")
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"factor: must be finite and > 0, got {factor}")
        steps = tuple(
            dataclasses.replace(s, trigger=Trigger(TriggerKind.AT, s.trigger.value * factor))
            if s.trigger.kind is TriggerKind.AT
            else s
            for s in self.steps
        )
        return dataclasses.replace(self, steps=steps)

    def timeline(self) -> str:
        """The expanded timeline, one step a line, in firing order within each trigger kind."""
        lines = [f"scenario {self.name!r} for n={self.n}: {len(self.steps)} steps"]
        if self.description:
            lines.extend(
                textwrap.wrap(self.description, 96, initial_indent="  ", subsequent_indent="  ")
            )
        width = max((len(s.trigger.describe()) for s in self.steps), default=0)
        for s in self.steps:
            lines.append(
                f"  {s.trigger.describe():>{width}}  {cmds.describe(s.command):<36} {s.origin}"
            )
        return "\n".join(lines)


# -- reading -----------------------------------------------------------------------------------


class _Reader(FieldReader):
    """Typed field readers that raise ScenarioError with the document path attached."""

    def __init__(self, source: Path | None) -> None:
        super().__init__(source, ScenarioError)

    def mapping(
        self, value: object, field: str, allowed: Sequence[str], required: Sequence[str] = ()
    ) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(field, f"must be a mapping, got {describe(value)}")
        for key in value:
            if not isinstance(key, str) or key not in allowed:
                raise self.fail(
                    f"{field}.{key}" if field != _DOC else str(key),
                    f"unknown key {key!r}{suggest(str(key), allowed)} "
                    f"(valid keys: {', '.join(allowed)})",
                )
        for key in required:
            if key not in value:
                raise self.fail(
                    f"{field}.{key}" if field != _DOC else key, "required key is missing"
                )
        return value

    def command(
        self, kind: CommandKind, args: Mapping[str, Any], field: str, limits: LabLimits
    ) -> Command:
        """Validate through the lab's own parser; its field names become ``<field>.args.<x>``."""
        try:
            return cmds.parse_command(kind, args, limits)
        except CommandError as e:
            sub = "args" if e.field == "args" else f"args.{e.field}"
            raise self.fail(f"{field}.{sub}", e.problem) from None


def load_scenario(
    path: str | Path,
    n: int,
    *,
    limits: LabLimits | None = None,
    rates: np.ndarray | Sequence[Sequence[float]] | None = None,
    time_scale: float = 1.0,
) -> Scenario:
    """Read, validate and expand a scenario file for a lab of ``n`` workers.

    ``limits`` (default ``LabLimits(n=n)``: rate changes only, the default schemes) is what the
    lab can do; ``rates`` is the topology's n×n capacity matrix in Mbit/s
    (``TopologySpec.bw_matrix()``), needed only by ``scale_link`` and chaos ``rate`` faults.
    ``time_scale`` multiplies every ``at`` time after expansion (``Scenario.scaled``), so
    macros draw exactly the timeline of the file and only the clock is compressed.
    Raises ScenarioError.
    """
    p = Path(path)
    data = read_yaml(p, ScenarioError, _DOC)
    scenario = parse_scenario(data, n, limits=limits, rates=rates, source=p)
    return scenario if time_scale == 1.0 else scenario.scaled(time_scale)


def parse_scenario(
    data: object,
    n: int,
    *,
    limits: LabLimits | None = None,
    rates: np.ndarray | Sequence[Sequence[float]] | None = None,
    source: Path | None = None,
) -> Scenario:
    """Validate and expand an already-parsed scenario document; see ``load_scenario``."""
    if limits is None:
        limits = LabLimits(n=n)
    if limits.n != n:
        raise ValueError(f"limits are for n={limits.n}, the scenario is loaded for n={n}")
    bw = None if rates is None else np.asarray(rates, dtype=float)
    if bw is not None and bw.shape != (n, n):
        raise ValueError(f"rates must be an {n}x{n} matrix, got shape {bw.shape}")
    r = _Reader(source)
    doc = r.mapping(data, _DOC, _TOP_KEYS, required=("name", "steps"))
    name = doc["name"]
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise r.fail(
            "name",
            f"{describe(name)} is not a valid name (letters, digits, '_', '.', '-'; "
            "starting with a letter or digit; at most 80 characters)",
        )
    description = doc.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise r.fail("description", f"must be a string, got {describe(description)}")
    seed = None if doc.get("seed") is None else r.integer(doc["seed"], "seed", 0, MAX_SEED)
    raw_steps = doc["steps"]
    if not isinstance(raw_steps, list) or not raw_steps:
        raise r.fail("steps", f"must be a non-empty list of steps, got {describe(raw_steps)}")

    ctx = _Context(r, limits, bw, seed)
    keyed: list[tuple[tuple[int, float, int, int], Step]] = []
    for i, raw in enumerate(raw_steps):
        field = f"steps[{i}]"
        for j, step in enumerate(ctx.step(raw, field)):
            order = 0 if step.trigger.kind is TriggerKind.AT else 1
            keyed.append(((order, step.trigger.value, i, j), step))
    keyed.sort(key=lambda kv: kv[0])
    return Scenario(
        name=name,
        description=description.strip(),
        seed=seed,
        n=n,
        steps=tuple(s for _, s in keyed),
        source=source,
    )


class _Context:
    """Per-document state for expanding steps: limits, rates and the seed."""

    def __init__(self, r: _Reader, limits: LabLimits, bw: np.ndarray | None, seed: int | None):
        self.r = r
        self.limits = limits
        self.bw = bw
        self.seed = seed

    def step(self, raw: object, field: str) -> list[Step]:
        r = self.r
        m = r.mapping(raw, field, _STEP_KEYS, required=("do",))
        has_at, has_groups = "at" in m, "after_groups" in m
        if has_at == has_groups:
            raise r.fail(field, "give exactly one of `at` (seconds) and `after_groups` (count)")
        if has_at:
            trigger = Trigger(
                TriggerKind.AT, r.number(m["at"], f"{field}.at", 0.0, MAX_SCENARIO_S, lo_open=False)
            )
        else:
            count = r.integer(m["after_groups"], f"{field}.after_groups", 0, MAX_AFTER_GROUPS)
            trigger = Trigger(TriggerKind.AFTER_GROUPS, float(count))
        do = m["do"]
        if not isinstance(do, str) or do not in _DO_NAMES:
            raise r.fail(
                f"{field}.do",
                f"unknown step {do!r}{suggest(str(do), _DO_NAMES)} "
                f"(commands: {', '.join(k.value for k in CommandKind)}; "
                f"macros: {', '.join(mc.value for mc in Macro)})",
            )
        args = m.get("args", {})
        if args is None:
            args = {}
        if not isinstance(args, Mapping):
            raise r.fail(f"{field}.args", f"must be a mapping, got {describe(args)}")
        if do in CommandKind._value2member_map_:
            command = r.command(CommandKind(do), args, field, self.limits)
            return [Step(trigger, command, field)]
        macro = Macro(do)
        if macro in _RANDOM_MACROS and self.seed is None:
            raise r.fail("seed", f"required: {field} uses the random macro {do}")
        origin = f"{field} ({do})"
        if macro is Macro.SCALE_LINK:
            return [Step(trigger, c, origin) for c in self.scale_link(args, field)]
        if trigger.kind is not TriggerKind.AT:
            raise r.fail(f"{field}.after_groups", f"{do} spreads over time: use `at`, not a count")
        assert self.seed is not None
        # One stream per step, so adding a step elsewhere does not reshuffle this one.
        rng = random.Random(f"{self.seed}:{field}")
        if macro is Macro.FAIL_RANDOM_LINKS:
            timed = self.fail_random_links(args, field, trigger.value, rng)
        else:
            timed = self.chaos(args, field, trigger.value, rng)
        return [Step(Trigger(TriggerKind.AT, t), c, origin) for t, c in timed]

    # -- macros --------------------------------------------------------------------------------

    def _rate(self, field: str, do: str, src: int, dst: int) -> float:
        if self.bw is None:
            raise self.r.fail(
                field,
                f"{do} needs the topology's link rates (load with rates=..., or the CLI's "
                "--topology)",
            )
        return float(self.bw[src, dst])

    def scale_link(self, args: Mapping[str, Any], field: str) -> list[Command]:
        r = self.r
        a = r.mapping(
            args,
            f"{field}.args",
            ("src", "dst", "fraction", "both"),
            required=("src", "dst", "fraction"),
        )
        frac = r.number(
            a["fraction"], f"{field}.args.fraction", 0.0, MAX_SCALE_FRACTION, lo_open=True
        )
        both = r.boolean(a.get("both", False), f"{field}.args.both")
        probe = r.command(
            CommandKind.CUT_LINK, {"src": a["src"], "dst": a["dst"]}, field, self.limits
        )
        assert isinstance(probe, cmds.CutLink)
        pairs = [(probe.src, probe.dst)] + ([(probe.dst, probe.src)] if both else [])
        out: list[Command] = []
        for s, d in pairs:
            rate = round(frac * self._rate(f"{field}.do", "scale_link", s, d), 3)
            out.append(
                r.command(
                    CommandKind.SET_LINK,
                    {"src": s, "dst": d, "rate_mbit": rate},
                    field,
                    self.limits,
                )
            )
        return out

    def _until(self, a: Mapping[str, Any], field: str, at: float) -> float:
        until = self.r.number(a["until"], f"{field}.args.until", 0.0, MAX_SCENARIO_S, lo_open=False)
        if until <= at:
            raise self.r.fail(f"{field}.args.until", f"{until:g} must be later than at={at:g}")
        return until

    def fail_random_links(
        self, args: Mapping[str, Any], field: str, at: float, rng: random.Random
    ) -> list[tuple[float, Command]]:
        r = self.r
        n = self.limits.n
        a = r.mapping(args, f"{field}.args", ("k", "until"), required=("k", "until"))
        total = n * (n - 1)
        k = r.integer(a["k"], f"{field}.args.k", 1, MAX_AFTER_GROUPS)
        if k > total:
            raise r.fail(
                f"{field}.args.k", f"{k} is more than the {total} directed links of {n} workers"
            )
        until = self._until(a, field, at)
        up = np.ones((n, n), dtype=bool)
        np.fill_diagonal(up, False)
        candidates = [(i, j) for i in range(n) for j in range(n) if i != j]
        rng.shuffle(candidates)
        chosen: list[tuple[int, int]] = []
        for i, j in candidates:
            if len(chosen) == k:
                break
            up[i, j] = False
            if _two_hop_connected(up):
                chosen.append((i, j))
            else:
                up[i, j] = True
        if len(chosen) < k:
            raise r.fail(
                f"{field}.args.k",
                f"cannot cut {k} of the {total} directed links of {n} workers and keep every "
                f"pair joined directly or through one relay; at most {len(chosen)} with this seed",
            )
        times = sorted(round(rng.uniform(at, until), TIME_DECIMALS) for _ in chosen)
        return [(t, cmds.CutLink(i, j)) for t, (i, j) in zip(times, chosen, strict=True)]

    def chaos(
        self, args: Mapping[str, Any], field: str, at: float, rng: random.Random
    ) -> list[tuple[float, Command]]:
        r = self.r
        n = self.limits.n
        af = f"{field}.args"
        keys = (
            "until",
            "every",
            "kinds",
            "slow_factor",
            "rate_fraction",
            "contention_mbit",
            "max_dead",
        )
        a = r.mapping(args, af, keys, required=("until", "every"))
        until = self._until(a, field, at)
        every = r.number(a["every"], f"{af}.every", 0.0, MAX_SCENARIO_S, lo_open=True)
        if (until - at) / every > MAX_CHAOS_FAULTS:
            raise r.fail(f"{af}.every", f"{every:g} s gives more than {MAX_CHAOS_FAULTS} faults")
        kinds = self._chaos_kinds(a.get("kinds"), f"{af}.kinds")
        slow = r.number(
            a.get("slow_factor", 4.0), f"{af}.slow_factor", 1.0, cmds.MAX_SLOW_FACTOR, lo_open=True
        )
        frac = r.number(a.get("rate_fraction", 0.1), f"{af}.rate_fraction", 0.0, 1.0, lo_open=True)
        flow = r.number(
            a.get("contention_mbit", 200.0),
            f"{af}.contention_mbit",
            0.0,
            cmds.MAX_RATE_MBIT,
            lo_open=True,
        )
        max_dead = r.integer(a.get("max_dead", 1), f"{af}.max_dead", 0, max(n - 1, 0))
        if ChaosFault.RATE in kinds and self.bw is None:
            self._rate(f"{af}.kinds", "chaos fault 'rate'", 0, 1)  # raises with the reason
        if n < 2 and kinds & {ChaosFault.CUT, ChaosFault.RATE, ChaosFault.CONTENTION}:
            raise r.fail(f"{af}.kinds", "link faults need at least 2 workers")

        busy_until: dict[object, float] = {}  # worker int or (src, dst) link -> free again at
        dead_until: list[float] = []
        out: list[tuple[float, int, Command]] = []  # (time, 0 = undo first at a tie, command)
        links = [(i, j) for i in range(n) for j in range(n) if i != j]
        order = sorted(kinds, key=lambda f: f.value)
        t = at
        for _ in range(MAX_CHAOS_FAULTS):
            if t >= until:
                break
            start = round(t, TIME_DECIMALS)
            t += every
            hold = rng.uniform(every / 2, 2 * every)
            end = round(min(start + hold, until), TIME_DECIMALS)
            first = rng.choice(order)
            # Try the drawn kind first, then the rest, so a busy kind does not waste the slot.
            tries = [first] + [f for f in order if f is not first]
            for fault in tries:
                if fault is ChaosFault.KILL or fault is ChaosFault.SLOW:
                    free = [w for w in range(n) if busy_until.get(w, -1.0) <= start]
                    if fault is ChaosFault.KILL and sum(e > start for e in dead_until) >= max_dead:
                        free = []
                    if not free:
                        continue
                    w = rng.choice(free)
                    if fault is ChaosFault.KILL:
                        pair = (cmds.KillWorker(w), cmds.RestartWorker(w))
                        dead_until.append(end)
                        # A restarted worker needs time to import torch and rejoin.
                        busy_until[w] = end + every
                    else:
                        pair = (cmds.SlowWorker(w, slow), cmds.SlowWorker(w, 1.0))
                        busy_until[w] = end
                else:
                    free_links = [lk for lk in links if busy_until.get(lk, -1.0) <= start]
                    if not free_links:
                        continue
                    s, d = rng.choice(free_links)
                    busy_until[(s, d)] = end
                    if fault is ChaosFault.CUT:
                        pair = (cmds.CutLink(s, d), cmds.RestoreLink(s, d))
                    elif fault is ChaosFault.RATE:
                        rate = self._rate(f"{af}.kinds", "chaos fault 'rate'", s, d)
                        pair = (
                            cmds.SetLink(s, d, rate_mbit=round(rate * frac, 3)),
                            cmds.SetLink(s, d, rate_mbit=rate),
                        )
                    else:
                        pair = (cmds.StartContention(s, d, flow), cmds.StopContention(s, d))
                out.append((start, 1, pair[0]))
                out.append((end, 0, pair[1]))
                break
        out.sort(key=lambda x: (x[0], x[1]))
        result: list[tuple[float, Command]] = []
        for when, _, c in out:
            # Re-parse so the expansion is held to the same rules as hand-written steps.
            result.append((when, r.command(c.KIND, cmds.to_args(c), field, self.limits)))
        return result

    def _chaos_kinds(self, value: object, field: str) -> frozenset[ChaosFault]:
        if value is None:
            return frozenset(ChaosFault)
        names = [f.value for f in ChaosFault]
        if not isinstance(value, list) or not value:
            raise self.r.fail(field, f"must be a non-empty list of {names}, got {describe(value)}")
        out = set()
        for i, v in enumerate(value):
            if not isinstance(v, str) or v not in names:
                raise self.r.fail(
                    f"{field}[{i}]",
                    f"unknown chaos fault {v!r}{suggest(str(v), names)} "
                    f"(known: {', '.join(names)})",
                )
            out.add(ChaosFault(v))
        return frozenset(out)


def _two_hop_connected(up: np.ndarray) -> bool:
    """Whether every ordered pair (i, j) has a live link i→j or a relay r with i→r→j."""
    a = up.astype(np.int64)
    reach = up | ((a @ a) > 0)
    np.fill_diagonal(reach, True)
    return bool(reach.all())


# -- playing -----------------------------------------------------------------------------------


class ScenarioPlayer:
    """Submits a scenario's steps to a run database as they fall due.

    The lab calls ``poll`` about twice a second with the wall-clock time and the number of
    completed groups; each due step is written once, via ``lab.orchestrate.commands.submit``, with
    the poll's ``now`` as its time. Construction re-checks every step against the run's own limits
    (``lab.orchestrate.commands.load_limits``), so a scenario written for another worker count or
    for impairments this kernel lacks fails before the run, not halfway through it."""

    def __init__(self, scenario: Scenario, db_path: str | Path, start_time: float):
        self.scenario = scenario
        self.db_path = Path(db_path)
        self.start_time = start_time
        if not self.db_path.is_file():
            raise FileNotFoundError(f"no run database at {self.db_path}")
        with rundb.reading(self.db_path) as conn:
            limits = cmds.load_limits(conn)
        r = _Reader(scenario.source)
        if limits.n != scenario.n:
            raise r.fail(_DOC, f"loaded for n={scenario.n}, but this run has {limits.n} workers")
        for step in scenario.steps:
            r.command(step.command.KIND, cmds.to_args(step.command), step.origin, limits)
        self._fired = [False] * len(scenario.steps)
        self.submitted: list[tuple[Step, int]] = []

    @property
    def done(self) -> bool:
        return all(self._fired)

    def poll(self, now: float, completed_groups: int) -> list[int]:
        """Submit every step that is due and not yet submitted; return the new command ids."""
        elapsed = now - self.start_time
        ids: list[int] = []
        for k, step in enumerate(self.scenario.steps):
            if self._fired[k] or not step.trigger.due(elapsed, completed_groups):
                continue
            cid = cmds.submit(self.db_path, step.command, t=now)
            self._fired[k] = True  # only after the row exists: a failed write is retried
            self.submitted.append((step, cid))
            ids.append(cid)
            log.info(
                "scenario %s: %s -> command #%d (%s)",
                self.scenario.name,
                step.trigger.describe().strip(),
                cid,
                cmds.describe(step.command),
            )
        return ids
