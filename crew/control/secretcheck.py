"""The secret check: a group's result verified on a check vector nobody knew while data moved.

Why. The public check (``crew.control.verify``) projects on ``r = check_vector(run)``, which
every worker knows. A worker that relays or aggregates a group's data (CREW routes groups'
data through non-members too) can add a tamper ``delta`` with ``r . delta = 0`` to the partial
sums it forwards: every projection still matches and the poisoned average is applied. Under
fp16/int8 it can even cancel ``r . delta`` through the ``err`` header members subtract
(``crew.train.partcodec``).

How (``check = "secret"``). Once every member's ``HaveAll`` is in and the public check passed,
the coordinator draws a fresh 64-bit nonce for the group revision (``secrets.randbits``) and
sends ``Reveal(group, rev, nonce)`` to the members. Each member draws ``r_g`` from (run number,
nonce) (:func:`secret_projections`), and answers ``Proof`` with ``r_g . offered`` and ``r_g .
result``: it still holds both, since the engine keeps a member's vector and result until the
group's ``Commit``/``Abandon``. The coordinator compares them as the public check does
(``relative_error``), and only then sends ``Commit``. A failed check, or a member whose Proof
is not in by the revision's deadline, abandons the group: nobody applies anything, and an ERROR
event names the group. Every byte of the group had moved before anyone knew ``r_g``, so a
tamper could not be made orthogonal to it: ``r_g . delta`` is normal with standard deviation
``||delta||_2`` whatever ``delta`` the tamperer chose.

Tolerance. The check passes when every member's ``|r_g . result - sum_m w_m r_g . v_m| <= T``:

* float32 payloads: ``T = CHECK_TOLERANCE * S`` with ``S = sum_m |w_m r_g . v_m|``, exactly the
  public check's relative rule (float32 summation only);
* fp16/int8: the ``err`` accounting is made for the public ``r`` and cannot be redone for
  ``r_g`` (whoever would redo it is whoever may have tampered), so the codec's rounding is
  bounded statistically: ``T += 2 * reduce_tolerance(codec, B, w, h, n)``
  (``crew.train.compress``: ``Z = 6`` standard deviations of ``r_g . e``, ``e`` the result's
  rounding, bounded by ``sum_m w_m (h_m + 1) B_m`` with ``B_m = error_norm(codec, v_m)``,
  which each member reports in its Proof). ``h_m`` is taken as the deepest reduce tree of the
  plan (:func:`plan_hops`). The factor 2 is error feedback: each encode also sends the
  residual its node's previous encode of those elements rounded away, at most as large as that
  encode's own bound, and the models a node encodes round after round are of one scale.

How large a tamper can hide. ``r_g`` is independent of ``delta``, so ``P(pass) <=
P(|N(0,1)| <= T / ||delta||) <= 0.8 T / ||delta||``. With ``S`` about ``0.8 ||v||`` (members'
models of one scale, weights summing to one), float32 payloads give ``T`` about ``8e-4 ||v||``:
a tamper that wants even odds of passing once must stay under about ``1.3e-3 ||v||``, and one of
1% of the model's norm passes 6% of the time, each failure abandoning the group with an ERROR.
Under codecs ``T`` grows with the rounding the codec itself adds to every average: ``B`` is
about ``4.9e-4 ||v||`` for fp16 (``T`` about 1.2% of the model's norm with one hop) and about
``1.1e-2 ||v||`` for int8 (``T`` about 26%): under int8 the secret check only catches tampers
larger than the worst-case rounding of the whole group; the public check, exact under every
codec, still catches every tamper that is not orthogonal to the public ``r``.

Cost. Per member and group revision: one pass over the offered vector and the result, drawing
``r_g`` in chunks (:data:`CHUNK`) so nothing model-sized is allocated: about 35 ns per element
on the lab's host (70 ms for 2 M elements; measured with the machine busy), plus, under a codec,
``error_norm`` of the offered vector (about 12 ns per element for fp16, 100 for int8). On the
critical path: one control round trip and that pass, before ``Commit``; so the lab keeps the
public check by default (its links are the emulated WAN's, its workers trusted) and launched
jobs (open networks) use the secret one. At the coordinator: ``O(members)`` per Proof.

Pure: the nonce source is a parameter (``secrets.randbits(64)`` by default); no clock, no I/O.
"""

from __future__ import annotations

import enum
import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from crew.config import RunConfig
from crew.control import clipcheck
from crew.control.clipradius import DEFAULT_FACTOR, ClipRadius
from crew.control.verify import CHECK_TOLERANCE, CHUNK, check_chunks
from crew.plan.routes import Route
from crew.plan.schemes import GroupPlan
from crew.wire import protocol as proto

__all__ = [
    "CHUNK",
    "CodecTolerance",
    "FEEDBACK_FACTOR",
    "CheckMode",
    "SecretChecks",
    "Verdict",
    "plan_hops",
    "secret_projections",
    "secret_tolerance",
]

FEEDBACK_FACTOR = 2.0
"""Error feedback at most doubles one encode's error (see the module docstring)."""


CodecTolerance = Callable[[Sequence[float], Sequence[float], Sequence[int], int], float]
"""``(error_norms, weights, hops, size) ->`` the absolute tolerance a codec's rounding needs:
``crew.train.compress.reduce_tolerance`` for the run's codec, which the runtime binds (the
control layer does not reach into ``crew.train``); None: float32 payloads, no codec term."""


class CheckMode(enum.StrEnum):
    """How a group's result is checked before Commit (``RunConfig.check``)."""

    PUBLIC = "public"  # on the run's check vector, known to every worker
    SECRET = "secret"  # and then on one drawn after all data moved (this module)


def draw_nonce() -> int:
    return secrets.randbits(64)


def secret_projections(
    run_num: int, nonce: int, offered: np.ndarray, result: np.ndarray
) -> tuple[float, float]:
    """``(r_g . offered, r_g . result)`` in float64, ``r_g`` from ``verify.check_chunks``."""
    if offered.shape != result.shape or offered.ndim != 1:
        raise ValueError(f"offered {offered.shape} and result {result.shape} differ")
    a = np.empty(min(CHUNK, offered.size))
    b = np.empty_like(a)
    pa = pb = 0.0
    for start, r in check_chunks(run_num, nonce, offered.size):
        m = r.size
        np.copyto(a[:m], offered[start : start + m])
        np.copyto(b[:m], result[start : start + m])
        pa += float(np.dot(r, a[:m]))
        pb += float(np.dot(r, b[:m]))
    return pa, pb


def plan_hops(routes: Sequence[Route]) -> int:
    """Encodes a member's values pass before a root's sum, at most: the deepest reduce tree."""
    deepest = 0
    for route in routes:
        for node in route.nodes():
            depth, at = 0, node
            while at != route.root and depth <= len(route.up):
                parent = route.parent(at)
                if parent is None:
                    break
                at, depth = parent, depth + 1
            deepest = max(deepest, depth)
    return deepest


def secret_tolerance(
    codec: CodecTolerance | None,
    weights: Sequence[float],
    offered: Sequence[float],
    error_norms: Sequence[float],
    hops: int,
    size: int,
) -> float:
    """``T``, the absolute tolerance on ``|r_g . result - sum_m w_m r_g . v_m|`` (module doc)."""
    scale = math.fsum(abs(w * p) for w, p in zip(weights, offered, strict=True)) + 1e-9
    codec_term = 0.0
    if codec is not None:
        codec_term = codec(error_norms, weights, [hops] * len(weights), size)
    return CHECK_TOLERANCE * scale + FEEDBACK_FACTOR * codec_term


@dataclass(frozen=True)
class Verdict:
    """The secret check of one group revision: ``passed`` or not, with the worst deviation
    over the tolerance (``ratio``, NaN for a non-finite projection) and why."""

    group: int
    rev: int
    passed: bool
    ratio: float
    reason: str


@dataclass(frozen=True)
class _Waiting:
    rev: int
    nonce: int
    members: tuple[int, ...]
    weights: tuple[float, ...]
    hops: int
    size: int
    rho: float  # the revision's clip radius (0 in mean mode)


class SecretChecks:
    """The group revisions whose members were sent a ``Reveal`` and the Proofs that came back.

    The life cycle calls :meth:`start` when a revision's members all hold its result (a Reveal
    to send, or None in public mode), :meth:`proof` for each Proof (a :class:`Verdict` once the
    last member's is in; with ``clip_rho``, judged by ``crew.control.clipcheck`` at the group's
    radius, :meth:`clip_rho`, which the groups that pass teach), :meth:`waiting` and
    :meth:`missing` on its deadlines, and :meth:`end` when the group closes."""

    def __init__(
        self,
        mode: CheckMode,
        codec: CodecTolerance | None = None,
        nonce: Callable[[], int] = draw_nonce,
        clip_rho: float | None = None,
        clip_factor: float = DEFAULT_FACTOR,
    ):
        self.mode = mode
        self.codec = codec
        # clipped aggregation's radii under the ceiling clip_rho (crew.control.clipradius)
        self.clip = None if clip_rho is None else ClipRadius(clip_rho, clip_factor)
        self._nonce = nonce
        self._waiting: dict[int, _Waiting] = {}
        self._proofs: dict[int, dict[int, proto.Proof]] = {}

    @classmethod
    def for_run(
        cls, cfg: RunConfig, codec: CodecTolerance | None, nonce: Callable[[], int] = draw_nonce
    ) -> SecretChecks:
        """The checks ``cfg`` asks for (its check, aggregate, clip radius and clip factor)."""
        return cls(CheckMode(cfg.check), codec, nonce, cfg.clip_rho, cfg.clip_factor)

    def start(
        self,
        group: int,
        rev: int,
        members: Sequence[int],
        weights: Sequence[float],
        plan: GroupPlan,
    ) -> proto.Reveal | None:
        """The Reveal to send ``members`` of this revision of ``plan``, or None: public mode,
        commit now."""
        if self.mode is CheckMode.PUBLIC:
            return None
        nonce = self._nonce()
        hops = plan_hops(plan.routes)
        rho = self.clip_rho(group)
        w = _Waiting(rev, nonce, tuple(members), tuple(weights), hops, plan.total, rho)
        self._waiting[group] = w
        self._proofs[group] = {}
        return proto.Reveal(group, rev, nonce)

    def clip_rho(self, group: int) -> float:
        """``group``'s clip radius (fixed from its first Assign on), 0 in mean mode."""
        return 0.0 if self.clip is None else self.clip.for_group(group)

    def waiting(self, group: int, rev: int) -> bool:
        w = self._waiting.get(group)
        return w is not None and w.rev == rev

    def missing(self, group: int) -> tuple[int, ...]:
        """The members whose Proof is not in."""
        w = self._waiting.get(group)
        if w is None:
            return ()
        return tuple(m for m in w.members if m not in self._proofs[group])

    def overdue(self, group: int) -> str:
        """Why a revision whose deadline passed before every Proof came in is abandoned."""
        missing = ", ".join(map(str, self.missing(group)))
        return f"secret check failed: no proof from member(s) {missing} by the deadline"

    def proof(self, msg: proto.Proof) -> Verdict | None:
        """Take one Proof; the verdict once every member's is in. Proofs of a revision not
        waiting (superseded, or already judged) and repeated ones are ignored; one from a
        worker that is no member is refused with ``ProtocolError``."""
        w = self._waiting.get(msg.group)
        if w is None or w.rev != msg.rev:
            return None
        if msg.worker not in w.members:
            raise proto.ProtocolError(
                f"proof.worker: {msg.worker} is no member of group {msg.group} rev {msg.rev}"
            )
        proofs = self._proofs[msg.group]
        proofs.setdefault(msg.worker, msg)
        if len(proofs) < len(w.members):
            return None
        del self._waiting[msg.group], self._proofs[msg.group]  # judged once
        got = [proofs[m] for m in w.members]
        if self.clip is not None:
            ratio, reason = clipcheck.judge_clip(w.weights, got, w.rho)
            if ratio <= 1.0:
                self.clip.observe([p.offered_proj for p in got], got[0].clip_norm)
            return Verdict(msg.group, msg.rev, ratio <= 1.0, ratio, reason)
        offered = [p.offered_proj for p in got]
        expected = math.fsum(wt * p for wt, p in zip(w.weights, offered, strict=True))
        tol = secret_tolerance(
            self.codec, w.weights, offered, [p.error_norm for p in got], w.hops, w.size
        )
        worst = max(abs(p.result_proj - expected) for p in got)
        ratio = worst / tol
        passed = ratio <= 1.0  # also False for NaN
        reason = (
            ""
            if passed
            else f"secret check failed: deviation {worst:.3g} is {ratio:.3g}x the tolerance"
            f" {tol:.3g} (a relay or aggregator changed the data)"
        )
        return Verdict(msg.group, msg.rev, passed, ratio, reason)

    def end(self, group: int) -> None:
        """The group closed: forget it."""
        self._waiting.pop(group, None)
        self._proofs.pop(group, None)
        if self.clip is not None:
            self.clip.end(group)
