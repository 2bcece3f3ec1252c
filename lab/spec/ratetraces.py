"""Which links of a topology follow a rate trace (``crew.ratetrace``), from its YAML.

A topology may give ``rate_trace`` at the top level (every link between two different clouds)
or in a ``links`` entry (that cloud pair, both directions; ``forward``/``reverse`` for one
each). Its value is either the path of a trace CSV (relative to the topology file's folder):
every worker pair the entry covers replays that file; or ``{generate: {spread, tau_s,
dt_s, duration_s, seed}}`` (all optional, ``crew.ratetrace.DriftParams``' defaults): each
directed link draws its own trace around its configured rate. A link entry's trace wins over
the top-level one.

:func:`load_link_traces` reads a topology file and its traces; :func:`link_traces` resolves
them to one :class:`crew.ratetrace.RateTrace` per directed worker link that has one. A bad
reference raises :class:`TraceRefError` naming the topology file, the field and the problem
(a trace file's own errors name its file and line).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crew.ratetrace import DriftParams, RateTrace, TraceError, generate, load_trace
from lab.spec.fields import describe, read_yaml
from lab.spec.topology import TopologyError, TopologySpec, parse_topology

GENERATE_KEYS = ("spread", "tau_s", "dt_s", "duration_s", "seed")


class TraceRefError(ValueError):
    """A topology's ``rate_trace`` is unusable; the message names file, field and problem."""


def _resolver(spec: TopologySpec, where: str):  # noqa: ANN202 - a local closure factory
    base = spec.source.parent if spec.source is not None else Path.cwd()

    def resolve(value: object, field: str, link: tuple[int, int]) -> RateTrace:
        if isinstance(value, str):
            try:
                return load_trace(base / value)
            except TraceError as exc:
                raise TraceRefError(f"{where}: {field}: {exc}") from None
        if isinstance(value, Mapping) and set(value) == {"generate"}:
            params = value["generate"] or {}
            if not isinstance(params, Mapping) or set(params) - set(GENERATE_KEYS):
                raise TraceRefError(
                    f"{where}: {field}.generate: a mapping of {', '.join(GENERATE_KEYS)},"
                    f" got {describe(params)}"
                )
            try:
                drift = DriftParams(mean_mbit=spec.link(*link).rate_mbit, **params)
            except (TraceError, TypeError) as exc:
                raise TraceRefError(f"{where}: {field}.generate: {exc}") from None
            return generate(drift, link)
        raise TraceRefError(
            f"{where}: {field}: a trace CSV path or {{generate: {{...}}}}, got {describe(value)}"
        )

    return resolve


def link_traces(spec: TopologySpec, data: Mapping[str, Any]) -> dict[tuple[int, int], RateTrace]:
    """The trace of every directed link ``(src, dst)`` that has one, from the topology's YAML
    mapping ``data`` (already checked by ``parse_topology`` into ``spec``)."""
    where = str(spec.source) if spec.source is not None else "topology"
    resolve = _resolver(spec, where)
    cloud_of = [w.cloud for w in spec.workers]
    out: dict[tuple[int, int], RateTrace] = {}
    every = data.get("rate_trace")
    if every is not None:
        for lk in spec.links:
            if cloud_of[lk.src] != cloud_of[lk.dst]:
                out[(lk.src, lk.dst)] = resolve(every, "rate_trace", (lk.src, lk.dst))
    for k, entry in enumerate(data.get("links") or ()):
        ref = entry.get("rate_trace") if isinstance(entry, Mapping) else None
        if ref is None:
            continue
        a, b = entry["between"]
        field = f"links[{k}].rate_trace"
        if isinstance(ref, Mapping) and set(ref) <= {"forward", "reverse"} and ref:
            sides = {(a, b): ref.get("forward"), (b, a): ref.get("reverse")}
        else:
            sides = {(a, b): ref, (b, a): ref}
        for (src_cloud, dst_cloud), value in sides.items():
            if value is None:
                continue
            for i in spec.cloud_members(src_cloud):
                for j in spec.cloud_members(dst_cloud):
                    out[(i, j)] = resolve(value, field, (i, j))
    return out


def load_link_traces(path: str | Path) -> tuple[TopologySpec, dict[tuple[int, int], RateTrace]]:
    """The topology in ``path`` and its links' traces (TopologyError or TraceRefError)."""
    p = Path(path)
    data = read_yaml(p, TopologyError, "(document)")
    if not isinstance(data, Mapping):
        raise TopologyError(p, "(document)", f"top level must be a mapping, got {describe(data)}")
    spec = parse_topology(data, source=p)
    return spec, link_traces(spec, data)
