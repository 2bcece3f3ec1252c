"""The secret check of a clipped result (crew.control.clipcheck): honest groups pass, a result a
root changed fails, a member that poisons its own vector passes with bounded influence, and a
member's proof cannot claim more than a clipped vector can."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from reduce_kit import assign_routes, near_vectors

from crew.control.clipcheck import clip_parts, clip_proof, judge_clip
from crew.control.clipping import DEFAULT_RHO, centered_clip
from crew.control.secretcheck import CheckMode, SecretChecks, secret_projections
from crew.plan.routes import Route, star_routes
from crew.wire import protocol as proto

RUN, N, RHO = 17, 6, DEFAULT_RHO
MEMBERS, WEIGHTS, TOTAL = (0, 1, 2, 3), (0.25, 0.25, 0.25, 0.25), 5000
ASSIGN = assign_routes(
    star_routes([(4, 0, 2100), (1, 2100, TOTAL)], MEMBERS),
    TOTAL,
    9,
    MEMBERS,
    WEIGHTS,
    part_elems=700,
)
PARTS = clip_parts(ASSIGN, N)


def _vectors(poison: float = 1.0, seed: int = 0) -> dict[int, np.ndarray]:
    return near_vectors(MEMBERS, TOTAL, seed=seed, poisoned=3, scale=poison)


def _clipped(vectors: dict[int, np.ndarray]) -> np.ndarray:
    """The result the roots compute, part by part."""
    x = np.empty(TOTAL, dtype=np.float32)
    for start, stop in PARTS:
        copies = np.stack([vectors[m][start:stop] for m in MEMBERS])
        x[start:stop] = centered_clip(copies, WEIGHTS, RHO)[0]
    return x


def _proofs(
    vectors: dict[int, np.ndarray], results: dict[int, np.ndarray], nonce: int
) -> list[proto.Proof]:
    out = []
    for m in MEMBERS:
        c = clip_proof(RUN, nonce, vectors[m], results[m], PARTS, RHO)
        p = proto.Proof(m, 9, 0, c.offered_proj, c.result_proj, 0.0)
        out.append(replace(p, clip_residual=c.residual, clip_scale=c.scale, clip_norm=c.norm))
    return out


def _judge(vectors, result, nonce: int) -> tuple[float, str]:
    return judge_clip(WEIGHTS, _proofs(vectors, dict.fromkeys(MEMBERS, result), nonce), RHO)


def test_parts_are_the_routes_cut_as_the_engine_cuts_them() -> None:
    assert PARTS[0] == (0, 700) and PARTS[-1][1] == TOTAL
    assert all(a[1] == b[0] for a, b in zip(PARTS, PARTS[1:], strict=False))
    assert (2100, 2800) in PARTS  # the second route starts a part of its own


def test_proof_projections_are_the_mean_modes() -> None:
    v = _vectors()
    x = _clipped(v)
    c = clip_proof(RUN, 5, v[0], x, PARTS, RHO)
    assert (c.offered_proj, c.result_proj) == pytest.approx(secret_projections(RUN, 5, v[0], x))
    assert c.norm == pytest.approx(np.linalg.norm(x.astype(np.float64)))


@pytest.mark.parametrize("nonce", range(5))
def test_an_honest_group_passes(nonce: int) -> None:
    v = _vectors()
    ratio, reason = _judge(v, _clipped(v), nonce)
    assert ratio <= 1.0 and reason == ""


@pytest.mark.parametrize("nonce", range(5))
def test_a_poisoned_member_passes_with_bounded_influence(nonce: int) -> None:
    v = _vectors(poison=100.0)
    x = _clipped(v)
    ratio, _ = _judge(v, x, nonce)
    assert ratio <= 1.0
    honest = np.mean([v[m].astype(np.float64) for m in (0, 1, 2)], axis=0)
    assert np.linalg.norm(x - honest) <= 0.25 / 0.75 * RHO * np.linalg.norm(x) * 1.01


@pytest.mark.parametrize("nonce", range(5))
def test_a_result_the_root_changed_fails(nonce: int) -> None:
    v = _vectors(poison=100.0)
    x = _clipped(v)
    # 0.2% of the model's norm: far below the mean-mode check's reach (about 0.13%), here
    # hundreds of times the tolerance.
    delta = np.full(TOTAL, 0.002, dtype=np.float32)
    ratio, reason = _judge(v, x + delta, nonce)
    assert ratio > 1.0 and "a root changed the clipped result" in reason
    mean = np.mean([v[m] for m in MEMBERS], axis=0, dtype=np.float64).astype(np.float32)
    ratio, _ = _judge(v, mean, nonce)  # the linear mean is no clipped result either
    assert ratio > 1.0


def test_members_holding_different_results_fail() -> None:
    v = _vectors()
    x = _clipped(v)
    other = x.copy()
    other[:10] += 0.01
    results = {0: x, 1: x, 2: other, 3: x}
    ratio, reason = judge_clip(WEIGHTS, _proofs(v, results, 3), RHO)
    assert ratio == math.inf and "different results" in reason


def test_a_proof_cannot_claim_more_than_a_clipped_vector() -> None:
    v = _vectors()
    proofs = _proofs(v, dict.fromkeys(MEMBERS, _clipped(v)), 4)
    b = proofs[0].clip_norm
    too_far = replace(proofs[1], clip_scale=2 * RHO * b)
    assert judge_clip(WEIGHTS, [proofs[0], too_far, *proofs[2:]], RHO)[0] == math.inf
    cancel = replace(proofs[1], clip_residual=100 * proofs[1].clip_scale + 1.0)
    ratio, reason = judge_clip(WEIGHTS, [proofs[0], cancel, *proofs[2:]], RHO)
    assert ratio == math.inf and "claims more" in reason


def test_non_finite_proofs_fail() -> None:
    v = _vectors()
    proofs = _proofs(v, dict.fromkeys(MEMBERS, _clipped(v)), 4)
    nan = replace(proofs[2], clip_residual=math.nan)
    assert not judge_clip(WEIGHTS, [*proofs[:2], nan, proofs[3]], RHO)[0] <= 1.0


def test_secret_checks_judge_clip_mode_proofs_by_the_fixed_point() -> None:
    v = _vectors(poison=100.0)
    x = _clipped(v)

    class _Plan:
        routes = tuple(Route.from_list(r) for r in ASSIGN.routes)
        total = TOTAL

    for result, passed in ((x, True), (x + np.float32(0.002), False)):
        checks = SecretChecks(CheckMode.SECRET, nonce=lambda: 11, clip_rho=RHO)
        assert checks.start(9, 0, MEMBERS, WEIGHTS, _Plan()) == proto.Reveal(9, 0, 11)
        verdicts = [checks.proof(p) for p in _proofs(v, dict.fromkeys(MEMBERS, result), 11)]
        assert verdicts[-1] is not None and verdicts[-1].passed is passed
        # The mean-mode rule would refuse even the honest clipped result.
        mean_mode = SecretChecks(CheckMode.SECRET, nonce=lambda: 11)
        mean_mode.start(9, 0, MEMBERS, WEIGHTS, _Plan())
        judged = [mean_mode.proof(p) for p in _proofs(v, dict.fromkeys(MEMBERS, result), 11)]
        assert judged[-1] is not None and not judged[-1].passed


def test_proofs_without_clip_fields_still_decode() -> None:
    old = {"type": "proof", "worker": 1, "group": 2, "rev": 0}
    old |= {"offered_proj": 1.0, "result_proj": 2.0, "error_norm": 0.0}
    msg = proto.decode(old)
    assert isinstance(msg, proto.Proof) and msg.clip_scale == 0.0 and msg.clip_norm == 0.0
    with pytest.raises(proto.ProtocolError, match="clip_scale"):
        proto.decode(old | {"clip_scale": -1.0})
