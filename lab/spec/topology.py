"""Topology spec: which workers sit in which clouds, and the directed links between them.

A topology is read from YAML (format reference: ``topologies/README.md``), validated in full,
and turned into a frozen :class:`TopologySpec` with exactly one :class:`LinkSpec` per ordered
worker pair. Everything downstream (Mininet mesh, shaping, planner capacity matrix, run DB)
works from that resolved form, so the YAML conveniences (cloud-level links, defaults,
forward/reverse values) never leak past this module.

Model and assumptions:

* Workers are numbered cloud by cloud in file order and named ``w0`` .. ``w{n-1}``.
* Two workers in different clouds A, B get the A–B link's values (``forward`` is the direction
  first-listed → second-listed cloud). With ``uplinks: private`` (the default) each worker pair
  has its own point-to-point link in the lab, so workers of one cloud do *not* share the
  cloud-pair rate: the capacity is per pair. With ``uplinks: shared`` the A→B rate is one
  capacity that all pairs (a in A, b in B) share (:meth:`TopologySpec.shared_uplinks`); each
  such pair alone may use all of it, so the per-pair rate stays the A→B rate.
* Two workers in the same cloud get ``intra_cloud_mbit`` and no impairments.
* ``delay_ms`` is one-way; ``jitter_ms`` may not exceed it (the delay would go negative).
* Rates are what HTB is configured to; expect ~95% of it as goodput (docs/architecture.md §6;
  lab.check measures it).

Run ``python -m lab.topology PATH...`` to validate files and print a summary.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib.resources
import json
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from crew.train.heavytail import GENERATED_PROFILE_IDS
from crew.train.stragglers import StragglerError, get_profile
from lab.spec.fields import FieldError, FieldReader, describe, read_yaml, suggest

if TYPE_CHECKING:
    from crew.plan.planner import SharedLink

log = logging.getLogger(__name__)

MAX_WORKERS = 64
MAX_RATE_MBIT = 10_000.0
MAX_DELAY_MS = 10_000.0
MAX_STRAGGLER_SHIFT_S = 60.0
DEFAULT_INTRA_CLOUD_MBIT = 1000.0

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
_WORKER_NAME_RE = re.compile(r"w(0|[1-9][0-9]*)")
_DOC = "(document)"

_TOP_KEYS = (
    "name",
    "description",
    "intra_cloud_mbit",
    "uplinks",
    "defaults",
    "clouds",
    "links",
    "workers",
    "rate_trace",  # read by lab.spec.ratetraces
)
_CLOUD_KEYS = ("name", "workers", "straggler")
_LINK_VALUE_KEYS = ("mbit", "delay_ms", "jitter_ms", "loss_pct")
_LINK_KEYS = ("between", *_LINK_VALUE_KEYS, "rate_trace")  # rate_trace: lab.spec.ratetraces
_DIRECTION_KEYS = ("forward", "reverse")
_WORKER_KEYS = ("straggler",)


class Impairment(enum.Enum):
    """Impairments beyond rate limiting; each needs kernel support (netem or a fallback)."""

    DELAY = "delay"
    JITTER = "jitter"
    LOSS = "loss"


class Uplinks(enum.Enum):
    """How workers in different clouds reach each other."""

    PRIVATE = "private"  # one shaped link per worker pair: capacity per pair
    SHARED = "shared"  # behind the cloud's gateway: one shaped WAN link per cloud pair


class TopologyError(FieldError):
    """A topology file or mapping is invalid; ``field`` is a dotted path into the document
    (``links[3].mbit.forward``), or ``(document)`` for problems with the file as a whole."""


@dataclasses.dataclass(frozen=True)
class CloudSpec:
    name: str
    workers: int
    straggler: str | None = None


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    index: int
    name: str  # "w0".."w63": also used in Mininet host/interface names, so keep it short
    cloud: str
    straggler: str | None


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """The directed connection src → dst (worker indices)."""

    src: int
    dst: int
    rate_mbit: float
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    def __post_init__(self) -> None:
        if self.src == self.dst:
            raise ValueError(f"LinkSpec {self.src}->{self.dst}: a link needs two workers")
        if not 0.0 < self.rate_mbit <= MAX_RATE_MBIT:
            raise ValueError(f"LinkSpec {self.src}->{self.dst}: rate {self.rate_mbit} Mbit/s")
        if not (0.0 <= self.jitter_ms <= self.delay_ms <= MAX_DELAY_MS):
            raise ValueError(
                f"LinkSpec {self.src}->{self.dst}: need 0 <= jitter_ms <= delay_ms <= "
                f"{MAX_DELAY_MS:g}, got jitter {self.jitter_ms}, delay {self.delay_ms}"
            )
        if not 0.0 <= self.loss_pct < 100.0:
            raise ValueError(f"LinkSpec {self.src}->{self.dst}: loss {self.loss_pct}%")


@dataclasses.dataclass(frozen=True)
class SharedUplink:
    """The WAN capacity src_cloud → dst_cloud, shared by ``pairs`` (every worker pair that
    crosses it) in ``uplinks: shared`` mode. Values are those of the cloud pair's link."""

    src_cloud: str
    dst_cloud: str
    pairs: tuple[tuple[int, int], ...]
    rate_mbit: float
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0


@dataclasses.dataclass(frozen=True)
class TopologySpec:
    """A resolved topology. ``links`` holds one entry per ordered pair, sorted by (src, dst)."""

    name: str
    description: str
    source: Path | None
    clouds: tuple[CloudSpec, ...]
    workers: tuple[WorkerSpec, ...]
    links: tuple[LinkSpec, ...]
    intra_cloud_mbit: float
    uplinks: Uplinks = Uplinks.PRIVATE

    def __post_init__(self) -> None:
        # Direct construction (tests, dataclasses.replace) must keep the invariants link() and
        # bw_matrix() rely on; parse_topology() has already reported user errors by field.
        n = len(self.workers)
        if not 1 <= n <= MAX_WORKERS:
            raise ValueError(f"topology {self.name!r}: {n} workers, need 1..{MAX_WORKERS}")
        cloud_names = [c.name for c in self.clouds]
        if len(set(cloud_names)) != len(cloud_names):
            raise ValueError(f"topology {self.name!r}: duplicate cloud names {cloud_names}")
        clouds_in_order = [c.name for c in self.clouds for _ in range(c.workers)]
        if [w.cloud for w in self.workers] != clouds_in_order:
            raise ValueError(
                f"topology {self.name!r}: workers must be numbered cloud by cloud, in cloud order"
            )
        for i, w in enumerate(self.workers):
            if w.index != i or w.name != f"w{i}":
                raise ValueError(f"topology {self.name!r}: worker {i} is {w}")
        expected = [(i, j) for i in range(n) for j in range(n) if i != j]
        if [(lk.src, lk.dst) for lk in self.links] != expected:
            raise ValueError(
                f"topology {self.name!r}: links must be one per ordered pair, sorted by (src, dst)"
            )

    @property
    def n(self) -> int:
        return len(self.workers)

    def link(self, i: int, j: int) -> LinkSpec:
        """The directed link i → j, O(1) from the sorted layout."""
        n = self.n
        if not (0 <= i < n and 0 <= j < n) or i == j:
            raise KeyError(f"no link {i}->{j} in topology {self.name!r} (n = {n})")
        return self.links[i * (n - 1) + (j if j < i else j - 1)]

    def worker(self, name: str) -> WorkerSpec:
        for w in self.workers:
            if w.name == name:
                return w
        raise KeyError(f"no worker {name!r} in topology {self.name!r}")

    def bw_matrix(self) -> np.ndarray:
        """n×n capacities in Mbit/s: entry [i, j] is the rate of i → j; the diagonal is inf."""
        bw = np.full((self.n, self.n), np.inf)
        for lk in self.links:
            bw[lk.src, lk.dst] = lk.rate_mbit
        return bw

    def delay_matrix(self) -> np.ndarray:
        """n×n one-way delays in ms: entry [i, j] is the delay of i → j; the diagonal is 0."""
        d = np.zeros((self.n, self.n))
        for lk in self.links:
            d[lk.src, lk.dst] = lk.delay_ms
        return d

    def cloud_members(self, cloud: str) -> tuple[int, ...]:
        return tuple(w.index for w in self.workers if w.cloud == cloud)

    def shared_uplinks(self) -> tuple[SharedUplink, ...]:
        """One entry per ordered pair of clouds (file order) when ``uplinks`` is shared, with
        its values taken from the link between the clouds' first workers (all pairs of a cloud
        pair have the same values, see ``to_dict``); empty in private mode."""
        if self.uplinks is not Uplinks.SHARED:
            return ()
        out: list[SharedUplink] = []
        for a in self.clouds:
            for b in self.clouds:
                if a.name == b.name:
                    continue
                src, dst = self.cloud_members(a.name), self.cloud_members(b.name)
                lk = self.link(src[0], dst[0])
                pairs = tuple((i, j) for i in src for j in dst)
                out.append(
                    SharedUplink(
                        a.name, b.name, pairs, lk.rate_mbit, lk.delay_ms, lk.jitter_ms, lk.loss_pct
                    )
                )
        return tuple(out)

    def impairments_requested(self) -> frozenset[Impairment]:
        wanted: set[Impairment] = set()
        for lk in self.links:
            if lk.delay_ms > 0:
                wanted.add(Impairment.DELAY)
            if lk.jitter_ms > 0:
                wanted.add(Impairment.JITTER)
            if lk.loss_pct > 0:
                wanted.add(Impairment.LOSS)
        return frozenset(wanted)

    def to_dict(self) -> dict[str, Any]:
        """The spec in the YAML input format, fully explicit (no ``defaults``).

        ``parse_topology(spec.to_dict())`` gives back an equal spec (apart from ``source``).
        Raises ValueError if links between the same two clouds differ, which only a spec
        built by hand can have: the cloud-level format cannot express that.
        """
        first: dict[str, int] = {}
        for w in self.workers:
            first.setdefault(w.cloud, w.index)
        links: list[dict[str, Any]] = []
        for ai, a in enumerate(self.clouds):
            for b in self.clouds[ai + 1 :]:
                fwd = self.link(first[a.name], first[b.name])
                rev = self.link(first[b.name], first[a.name])
                entry: dict[str, Any] = {"between": [a.name, b.name]}
                for key, attr in zip(_LINK_VALUE_KEYS, _LINK_ATTRS, strict=True):
                    f, r = getattr(fwd, attr), getattr(rev, attr)
                    if key == "mbit" or f or r:
                        entry[key] = f if f == r else {"forward": f, "reverse": r}
                links.append(entry)
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "intra_cloud_mbit": self.intra_cloud_mbit,
            **({"uplinks": self.uplinks.value} if self.uplinks is not Uplinks.PRIVATE else {}),
            "clouds": [
                {"name": c.name, "workers": c.workers}
                | ({"straggler": c.straggler} if c.straggler is not None else {})
                for c in self.clouds
            ],
            "links": links,
        }
        cloud_straggler = {c.name: c.straggler for c in self.clouds}
        overrides = {
            w.name: {"straggler": w.straggler}
            for w in self.workers
            if w.straggler != cloud_straggler[w.cloud]
        }
        if overrides:
            out["workers"] = overrides
        if parse_topology(out) != dataclasses.replace(self, source=None):
            raise ValueError(
                f"topology {self.name!r}: links differ between workers of the same cloud pair, "
                "or intra-cloud links are not uniform; the YAML format cannot express that"
            )
        return out

    def to_yaml(self, header: str | None = None) -> str:
        """YAML text of :meth:`to_dict` (what the run DB stores), optionally with a comment."""
        return format_topology_yaml(self.to_dict(), header=header)


_LINK_ATTRS = ("rate_mbit", "delay_ms", "jitter_ms", "loss_pct")


def planner_shared_links(spec: TopologySpec) -> tuple[SharedLink, ...]:
    """The shared uplinks as the planner's ``SharedLink`` capacities (delay in seconds)."""
    from crew.plan.planner import SharedLink  # late: scipy is not needed to read a topology

    return tuple(
        SharedLink(u.pairs, u.rate_mbit, u.delay_ms / 1000.0) for u in spec.shared_uplinks()
    )


# ---------------------------------------------------------------------------------------------
# Straggler profile ids


def _profiles_text() -> str:
    return (
        importlib.resources.files("crew")
        .joinpath("data", "straggler-profiles.json")
        .read_text(encoding="utf-8")
    )


@functools.cache
def straggler_profile_ids() -> frozenset[str]:
    """Profile ids in the bundled crew/data/straggler-profiles.json ("1", "2", ...) and the
    generated ones (``crew.train.heavytail``: "heavy")."""
    return frozenset(json.loads(_profiles_text())["profiles"]) | GENERATED_PROFILE_IDS


def split_straggler(value: str) -> tuple[str, float | None]:
    """Split a straggler reference: ``"2"`` → ("2", None); ``"2@0.4"`` → ("2", 0.4).

    The shift (seconds) moves the profile so its range starts there: the slower variants
    described in the profile file's ``source`` text. Raises ValueError if malformed.
    """
    profile, sep, shift_text = value.partition("@")
    if not sep:
        return profile, None
    try:
        shift = float(shift_text)
    except ValueError:
        raise ValueError(f"shift {shift_text!r} after '@' is not a number") from None
    return profile, shift


# ---------------------------------------------------------------------------------------------
# Parsing


class _Checker(FieldReader):
    """Typed field readers that raise TopologyError with the document path attached."""

    def __init__(self, source: Path | None) -> None:
        super().__init__(source, TopologyError)

    def mapping(
        self,
        value: object,
        field: str,
        allowed: Sequence[str],
        required: Sequence[str] = (),
    ) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(field, f"must be a mapping, got {describe(value)}")
        for key in value:
            if not isinstance(key, str):
                raise self.fail(field, f"key {key!r} is not a string")
            if key not in allowed:
                raise self.fail(
                    _join(field, key),
                    f"unknown key {key!r}{suggest(key, allowed, _ALIASES)} "
                    f"(valid keys: {', '.join(allowed)})",
                )
        for key in required:
            if key not in value:
                raise self.fail(_join(field, key), "required key is missing")
        return value

    def string(self, value: object, field: str, *, pattern: re.Pattern[str] | None = None) -> str:
        if not isinstance(value, str):
            raise self.fail(field, f"must be a string, got {describe(value)}")
        if pattern is not None and not pattern.fullmatch(value):
            raise self.fail(
                field,
                f"{value!r} is not a valid name (letters, digits, '_', '.', '-'; "
                "starting with a letter or digit; at most 40 characters)",
            )
        return value

    def straggler(self, value: object, field: str) -> str | None:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # `straggler: 2` is an obvious shorthand for "2"
        text = self.string(value, field)
        if ":" in text.partition("@")[2]:  # "2@0.4:0.6": the profile mapped onto a range
            try:
                high = max(get_profile(text).values)
            except StragglerError as e:
                raise self.fail(field, str(e)) from None
            if high > MAX_STRAGGLER_SHIFT_S:
                raise self.fail(
                    field, f"{text!r} reaches {high:g} s (at most {MAX_STRAGGLER_SHIFT_S:g})"
                )
            return text
        try:
            profile, shift = split_straggler(text)
        except ValueError as e:
            raise self.fail(field, f"{text!r}: {e}") from None
        known = straggler_profile_ids()
        if profile not in known:
            raise self.fail(
                field,
                f"unknown straggler profile {profile!r} "
                f"(known: {', '.join(sorted(known, key=_natural_key))}; "
                "optionally with '@SECONDS' to shift it, e.g. '2@0.4', or '@LOW:HIGH' to map"
                " it onto a range, e.g. '2@0.4:0.6')",
            )
        if shift is None:
            return profile
        if not (math.isfinite(shift) and 0.0 <= shift <= MAX_STRAGGLER_SHIFT_S):
            raise self.fail(
                field, f"shift {shift:g} s is out of range (0..{MAX_STRAGGLER_SHIFT_S:g})"
            )
        return f"{profile}@{_fmt_number(shift)}"

    def directional(
        self, value: object, field: str, read: Callable[[object, str], float]
    ) -> tuple[float, float]:
        """A scalar (both directions) or ``{forward: x, reverse: y}``."""
        if isinstance(value, Mapping):
            m = self.mapping(value, field, _DIRECTION_KEYS, required=_DIRECTION_KEYS)
            return read(m["forward"], f"{field}.forward"), read(m["reverse"], f"{field}.reverse")
        x = read(value, field)
        return x, x


# Names people reach for that spelling distance alone would not map to the right key.
_ALIASES = {
    "mbps": "mbit",
    "rate": "mbit",
    "rate_mbit": "mbit",
    "bandwidth": "mbit",
    "bw": "mbit",
    "delay": "delay_ms",
    "latency": "delay_ms",
    "jitter": "jitter_ms",
    "loss": "loss_pct",
    "count": "workers",
    "n": "workers",
}


def _join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


def _natural_key(s: str) -> tuple[int, str]:
    return (int(s), s) if s.isdigit() else (1 << 30, s)


@dataclasses.dataclass(frozen=True)
class _LinkValues:
    """Per-direction values of one cloud pair, before expansion to worker pairs."""

    mbit: tuple[float, float]
    delay_ms: tuple[float, float]
    jitter_ms: tuple[float, float]
    loss_pct: tuple[float, float]

    def direction(self, k: int) -> tuple[float, float, float, float]:
        return self.mbit[k], self.delay_ms[k], self.jitter_ms[k], self.loss_pct[k]


def _value_readers(c: _Checker) -> dict[str, Callable[[object, str], float]]:
    return {
        "mbit": lambda v, f: c.number(v, f, 0.0, MAX_RATE_MBIT, lo_open=True),
        "delay_ms": lambda v, f: c.number(v, f, 0.0, MAX_DELAY_MS, lo_open=False),
        "jitter_ms": lambda v, f: c.number(v, f, 0.0, MAX_DELAY_MS, lo_open=False),
        "loss_pct": lambda v, f: _loss(c, v, f),
    }


def _loss(c: _Checker, value: object, field: str) -> float:
    x = c.number(value, field, 0.0, 100.0, lo_open=False)
    if x >= 100.0:
        raise c.fail(field, f"{value} is out of range (must be >= 0 and < 100: a percentage)")
    return x


def _check_jitter(c: _Checker, field: str, values: _LinkValues) -> None:
    for k, direction in enumerate(_DIRECTION_KEYS):
        if values.jitter_ms[k] > values.delay_ms[k]:
            raise c.fail(
                _join(field, "jitter_ms"),
                f"{direction} jitter {values.jitter_ms[k]:g} ms exceeds its delay "
                f"{values.delay_ms[k]:g} ms (the delay would go negative)",
            )


def parse_topology(data: Mapping[str, Any], source: Path | None = None) -> TopologySpec:
    """Validate a topology mapping (as loaded from YAML) and resolve it to a TopologySpec.

    Raises TopologyError naming the first bad field.
    """
    c = _Checker(source)
    if not isinstance(data, Mapping):
        raise c.fail(_DOC, f"top level must be a mapping, got {describe(data)}")
    top = c.mapping(data, "", _TOP_KEYS, required=("name", "clouds"))
    readers = _value_readers(c)

    name = c.string(top["name"], "name", pattern=_NAME_RE)
    description = c.string(top.get("description", ""), "description")
    intra = readers["mbit"](
        top.get("intra_cloud_mbit", DEFAULT_INTRA_CLOUD_MBIT), "intra_cloud_mbit"
    )

    uplinks_text = c.string(top.get("uplinks", Uplinks.PRIVATE.value), "uplinks")
    try:
        uplinks = Uplinks(uplinks_text)
    except ValueError:
        known = ", ".join(u.value for u in Uplinks)
        raise c.fail("uplinks", f"unknown mode {uplinks_text!r} (known: {known})") from None

    clouds = _parse_clouds(c, top["clouds"])
    names = [cl.name for cl in clouds]

    defaults: _LinkValues | None = None
    if top.get("defaults") is not None:
        d = c.mapping(top["defaults"], "defaults", _LINK_VALUE_KEYS, required=("mbit",))
        # Scalars only: "forward" has no meaning for pairs nobody listed.
        scalars = [readers[k](d.get(k, 0.0), f"defaults.{k}") for k in _LINK_VALUE_KEYS]
        defaults = _LinkValues(*((x, x) for x in scalars))
        _check_jitter(c, "defaults", defaults)

    pair_values = _parse_links(c, top.get("links"), names, defaults, readers)
    missing = [
        (a, b)
        for ai, a in enumerate(names)
        for b in names[ai + 1 :]
        if (a, b) not in pair_values and (b, a) not in pair_values
    ]
    if missing and defaults is None:
        shown = ", ".join(f"{a}–{b}" for a, b in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise c.fail(
            "links",
            f"no link given for {len(missing)} cloud pair(s): {shown}{more}; "
            "list them or add a 'defaults' entry",
        )

    workers = _parse_workers(c, top.get("workers"), clouds)
    cloud_of = [w.cloud for w in workers]

    def values(src: int, dst: int) -> tuple[float, float, float, float]:
        a, b = cloud_of[src], cloud_of[dst]
        if a == b:
            return intra, 0.0, 0.0, 0.0
        if (a, b) in pair_values:
            return pair_values[(a, b)].direction(0)
        if (b, a) in pair_values:
            return pair_values[(b, a)].direction(1)
        assert defaults is not None  # guaranteed by the missing-pair check above
        return defaults.direction(0)

    n = len(workers)
    links = tuple(LinkSpec(i, j, *values(i, j)) for i in range(n) for j in range(n) if i != j)
    spec = TopologySpec(
        name=name,
        description=description,
        source=source,
        clouds=clouds,
        workers=workers,
        links=links,
        intra_cloud_mbit=intra,
        uplinks=uplinks,
    )
    log.debug("parsed topology %s: n=%d, %d clouds", name, n, len(clouds))
    return spec


def _parse_clouds(c: _Checker, value: object) -> tuple[CloudSpec, ...]:
    if not isinstance(value, list):
        raise c.fail("clouds", f"must be a list of clouds, got {describe(value)}")
    if not value:
        raise c.fail("clouds", "needs at least one cloud")
    clouds: list[CloudSpec] = []
    seen: dict[str, int] = {}
    total = 0
    for k, item in enumerate(value):
        field = f"clouds[{k}]"
        m = c.mapping(item, field, _CLOUD_KEYS, required=("name",))
        cname = c.string(m["name"], f"{field}.name", pattern=_NAME_RE)
        if cname in seen:
            raise c.fail(
                f"{field}.name", f"duplicate cloud name {cname!r} (also clouds[{seen[cname]}])"
            )
        seen[cname] = k
        count = c.integer(m.get("workers", 1), f"{field}.workers", 1, MAX_WORKERS)
        total += count
        if total > MAX_WORKERS:
            raise c.fail(
                f"{field}.workers",
                f"too many workers: {total} so far, at most {MAX_WORKERS} in a topology",
            )
        clouds.append(
            CloudSpec(cname, count, c.straggler(m.get("straggler"), f"{field}.straggler"))
        )
    return tuple(clouds)


def _parse_links(
    c: _Checker,
    value: object,
    names: Sequence[str],
    defaults: _LinkValues | None,
    readers: Mapping[str, Callable[[object, str], float]],
) -> dict[tuple[str, str], _LinkValues]:
    if value is None:
        return {}
    if not isinstance(value, list):
        raise c.fail("links", f"must be a list of links, got {describe(value)}")
    known = set(names)
    pairs: dict[tuple[str, str], _LinkValues] = {}
    where: dict[frozenset[str], int] = {}
    for k, item in enumerate(value):
        field = f"links[{k}]"
        m = c.mapping(item, field, _LINK_KEYS, required=("between",))
        between = m["between"]
        if not (isinstance(between, list) and len(between) == 2):
            raise c.fail(
                f"{field}.between", f"must be a list of two cloud names, got {describe(between)}"
            )
        a = c.string(between[0], f"{field}.between[0]")
        b = c.string(between[1], f"{field}.between[1]")
        for idx, cname in ((0, a), (1, b)):
            if cname not in known:
                raise c.fail(
                    f"{field}.between[{idx}]",
                    f"unknown cloud {cname!r}{suggest(cname, names, _ALIASES)}"
                    f" (clouds: {', '.join(names)})",
                )
        if a == b:
            raise c.fail(
                f"{field}.between",
                f"cloud {a!r} paired with itself (use intra_cloud_mbit for that)",
            )
        key = frozenset((a, b))
        if key in where:
            raise c.fail(
                f"{field}.between", f"pair {a}–{b} is already given by links[{where[key]}]"
            )
        where[key] = k
        if "mbit" not in m and defaults is None:
            raise c.fail(f"{field}.mbit", "required key is missing (there are no defaults)")
        got: list[tuple[float, float]] = []
        for vk in _LINK_VALUE_KEYS:
            if vk in m:
                got.append(c.directional(m[vk], f"{field}.{vk}", readers[vk]))
            elif defaults is not None:
                got.append(getattr(defaults, vk))
            else:
                got.append((0.0, 0.0))
        values = _LinkValues(*got)
        _check_jitter(c, field, values)
        pairs[(a, b)] = values
    return pairs


def _parse_workers(
    c: _Checker, value: object, clouds: Sequence[CloudSpec]
) -> tuple[WorkerSpec, ...]:
    base: list[WorkerSpec] = []
    for cl in clouds:
        for _ in range(cl.workers):
            i = len(base)
            base.append(WorkerSpec(i, f"w{i}", cl.name, cl.straggler))
    if value is None:
        return tuple(base)
    if not isinstance(value, Mapping):
        raise c.fail(
            "workers", f"must be a mapping of worker name to overrides, got {describe(value)}"
        )
    for wname, override in value.items():
        field = f"workers.{wname}"
        if not (
            isinstance(wname, str)
            and _WORKER_NAME_RE.fullmatch(wname)
            and int(wname[1:]) < len(base)
        ):
            raise c.fail(
                field,
                f"no such worker {wname!r} (workers are named w0..w{len(base) - 1}, "
                "numbered cloud by cloud in file order)",
            )
        o = c.mapping(override, field, _WORKER_KEYS)
        if "straggler" in o:
            w = base[int(wname[1:])]
            base[w.index] = WorkerSpec(
                w.index, w.name, w.cloud, c.straggler(o["straggler"], f"{field}.straggler")
            )
    return tuple(base)


# ---------------------------------------------------------------------------------------------
# Loading


def load_topology(path: str | Path) -> TopologySpec:
    """Read, validate and resolve a topology YAML file. Raises TopologyError."""
    p = Path(path)
    data = read_yaml(p, TopologyError, _DOC)
    if not isinstance(data, Mapping):
        raise TopologyError(p, _DOC, f"top level must be a mapping, got {describe(data)}")
    return parse_topology(data, source=p)


# ---------------------------------------------------------------------------------------------
# Writing


def _fmt_number(x: float) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _fmt_flow(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _fmt_number(value)
    if isinstance(value, str):
        # Plain only when YAML reads it back as the same string ("2", "yes", "a: b" are not).
        plain = bool(re.fullmatch(r"[A-Za-z0-9_.@-]+", value))
        if plain:
            try:
                plain = yaml.safe_load(value) == value
            except yaml.YAMLError:
                plain = False
        return value if plain else json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_fmt_flow(k)}: {_fmt_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_fmt_flow(v) for v in value) + "]"
    raise TypeError(f"cannot format {type(value).__name__} as topology YAML")


def format_topology_yaml(data: Mapping[str, Any], header: str | None = None) -> str:
    """Render a topology mapping as readable YAML: one line per cloud, link and worker.

    Deterministic for equal input (key order is kept), so generated files diff cleanly.
    """
    lines = [f"# {ln}".rstrip() for ln in header.splitlines()] if header else []
    for key, value in data.items():
        if isinstance(value, list) and value:
            lines.append(f"{key}:")
            lines.extend(f"  - {_fmt_flow(item)}" for item in value)
        elif isinstance(value, Mapping) and value:
            lines.append(f"{key}:")
            lines.extend(f"  {_fmt_flow(k)}: {_fmt_flow(v)}" for k, v in value.items())
        else:
            lines.append(f"{key}: {_fmt_flow(value)}")
    return "\n".join(lines) + "\n"
