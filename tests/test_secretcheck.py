"""The secret check's pure parts: its messages (bad values refused), the projections on the
revealed vector, the verdicts of crew.control.secretcheck, and the life cycle that sends Commit
only once the Proofs agree."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from lifecycle_kit import make_cfg, report_all, started

from crew.config import CHECK_MODES
from crew.control import lifecycle as lc
from crew.control.secretcheck import (
    CHUNK,
    CheckMode,
    SecretChecks,
    plan_hops,
    secret_projections,
    secret_tolerance,
)
from crew.plan.routes import Route
from crew.train.compress import Codec, error_norm, reduce_tolerance
from crew.wire import protocol as proto

NONCE = 0xDEADBEEF_12345678


def test_check_modes_match_the_config_vocabulary() -> None:
    assert tuple(m.value for m in CheckMode) == CHECK_MODES


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"type": "reveal", "group": 1, "rev": 0, "nonce": 1 << 64}, "reveal.nonce"),
        ({"type": "reveal", "group": 1, "rev": 0, "nonce": -1}, "reveal.nonce"),
        ({"type": "reveal", "group": 1, "rev": 0, "nonce": True}, "reveal.nonce"),
        ({"type": "reveal", "group": 1, "rev": 0, "nonce": 1.5}, "reveal.nonce"),
        ({"type": "reveal", "group": -1, "rev": 0, "nonce": 1}, "reveal.group"),
        ({"type": "reveal", "group": 1, "rev": -2, "nonce": 1}, "reveal.rev"),
        (
            {"type": "proof", "worker": 0, "group": 1, "rev": 0, "offered_proj": 1.0,
             "result_proj": float("nan"), "error_norm": 0.0},
            "proof.result_proj",
        ),
        (
            {"type": "proof", "worker": 0, "group": 1, "rev": 0, "offered_proj": float("inf"),
             "result_proj": 1.0, "error_norm": 0.0},
            "proof.offered_proj",
        ),
        (
            {"type": "proof", "worker": 0, "group": 1, "rev": 0, "offered_proj": 1.0,
             "result_proj": 1.0, "error_norm": -1.0},
            "proof.error_norm",
        ),
    ],
)  # fmt: skip
def test_bad_reveal_and_proof_values_are_refused_naming_the_field(obj, field) -> None:
    with pytest.raises(proto.ProtocolError, match=field):
        proto.decode(obj)


def test_reveal_and_proof_round_trip() -> None:
    for msg in (
        proto.Reveal(3, 1, (1 << 64) - 1),
        proto.Proof(2, 3, 1, -1.5, 2.25, 0.0),
    ):
        assert proto.decode(msg.to_dict()) == msg


def test_projections_are_on_the_vector_drawn_from_run_and_nonce() -> None:
    size = CHUNK * 2 + 17  # chunked: the stream must match one draw of the whole vector
    rng = np.random.default_rng(1)
    a = rng.standard_normal(size).astype(np.float32)
    b = rng.standard_normal(size).astype(np.float32)
    r = np.random.default_rng([9, NONCE]).standard_normal(size)
    pa, pb = secret_projections(9, NONCE, a, b)
    assert pa == pytest.approx(float(r @ a.astype(np.float64)), rel=1e-9)
    assert pb == pytest.approx(float(r @ b.astype(np.float64)), rel=1e-9)
    # Another nonce, another vector: a tamper cannot be made orthogonal to all of them.
    assert secret_projections(9, NONCE + 1, a, b)[0] != pytest.approx(pa, rel=1e-3)


def test_plan_hops_is_the_deepest_reduce_tree() -> None:
    star = Route(0, 10, 3, up=((0, 3), (1, 3)), down=((3, 0), (3, 1)))
    relay = Route(10, 20, 0, up=((1, 2), (2, 0)), down=((0, 1),))
    assert plan_hops([star]) == 1
    assert plan_hops([star, relay]) == 2


def _proofs(offered, results, norms=None):
    norms = norms or [0.0] * len(offered)
    return [
        proto.Proof(m, 5, 0, o, r, b)
        for m, (o, r, b) in enumerate(zip(offered, results, norms, strict=True))
    ]


def _checks(mode=CheckMode.SECRET) -> SecretChecks:
    return SecretChecks(mode, nonce=lambda: NONCE)


class _Plan:  # the two fields SecretChecks reads of a GroupPlan
    routes = (Route(0, 100, 2, up=((0, 2), (1, 2)), down=((2, 0), (2, 1))),)
    total = 100


def test_public_mode_reveals_nothing() -> None:
    assert _checks(CheckMode.PUBLIC).start(5, 0, (0, 1), (0.5, 0.5), _Plan()) is None


def test_matching_proofs_pass_and_a_tamper_fails() -> None:
    checks = _checks()
    assert checks.start(5, 0, (0, 1), (0.5, 0.5), _Plan()) == proto.Reveal(5, 0, NONCE)
    first, second = _proofs([2.0, 4.0], [3.0, 3.0])
    assert checks.proof(first) is None
    assert checks.missing(5) == (1,)
    verdict = checks.proof(second)
    assert verdict is not None and verdict.passed and verdict.ratio < 1
    assert not checks.waiting(5, 0)
    # A relay added delta with r_g . delta = 0.5 to what member 1 received.
    checks.start(5, 0, (0, 1), (0.5, 0.5), _Plan())
    verdicts = [checks.proof(p) for p in _proofs([2.0, 4.0], [3.0, 3.5])]
    assert verdicts[-1] is not None and not verdicts[-1].passed
    assert "secret check failed" in verdicts[-1].reason


def test_stale_repeated_and_foreign_proofs() -> None:
    checks = _checks()
    checks.start(5, 1, (0, 1), (0.5, 0.5), _Plan())
    assert checks.proof(proto.Proof(0, 5, 0, 2.0, 9.0, 0.0)) is None  # revision 0: superseded
    assert checks.missing(5) == (0, 1)
    with pytest.raises(proto.ProtocolError, match="no member"):
        checks.proof(proto.Proof(7, 5, 1, 2.0, 3.0, 0.0))
    assert checks.proof(proto.Proof(0, 5, 1, 2.0, 3.0, 0.0)) is None
    assert checks.proof(proto.Proof(0, 5, 1, 2.0, 99.0, 0.0)) is None  # a repeat: first counts
    verdict = checks.proof(proto.Proof(1, 5, 1, 4.0, 3.0, 0.0))
    assert verdict is not None and verdict.passed
    assert "member(s) 0, 1" in _overdue()


def _overdue() -> str:
    checks = _checks()
    checks.start(8, 0, (0, 1), (0.5, 0.5), _Plan())
    return checks.overdue(8)


def test_codec_tolerance_covers_rounding_and_not_a_tamper_of_the_model_scale() -> None:
    rng = np.random.default_rng(2)
    v = rng.standard_normal(4096).astype(np.float32)
    weights, offered = [0.5, 0.5], [10.0, -10.0]
    plain = secret_tolerance(None, weights, offered, [0.0, 0.0], 1, v.size)
    assert plain == pytest.approx(1e-3 * 10.0, rel=1e-6)
    norms = [error_norm(Codec.FP16, v)] * 2
    fp16_term = partial(reduce_tolerance, Codec.FP16)
    fp16 = secret_tolerance(fp16_term, weights, offered, norms, 1, v.size)
    assert plain < fp16 < 0.05 * float(np.linalg.norm(v))


# -- the life cycle ------------------------------------------------------------------------------


def _group(mode: str, nonce: int = NONCE) -> tuple[lc.GroupLifecycle, int]:
    life = started(make_cfg(n=4, p=2, check=mode), nonce=lambda: nonce)
    life.handle(proto.Ready(0, 0, 2.0, -1), 0.1)
    life.handle(proto.Ready(1, 0, 4.0, -1), 0.2)
    (gid,) = life.open
    return life, gid


def _sent(outs: list[lc.Output], kind: type) -> list[lc.SendTo]:
    return [o for o in outs if isinstance(o, lc.SendTo) and isinstance(o.msg, kind)]


def test_public_mode_commits_at_the_last_have_all() -> None:
    life, gid = _group("public")
    outs = report_all(life, gid, 1.0)
    assert len(_sent(outs, proto.Commit)) >= 2 and not _sent(outs, proto.Reveal)


def test_secret_mode_commits_only_after_matching_proofs() -> None:
    life, gid = _group("secret")
    outs = report_all(life, gid, 1.0)
    assert not _sent(outs, proto.Commit)
    reveals = _sent(outs, proto.Reveal)
    assert sorted(s.worker for s in reveals) == [0, 1]
    assert reveals[0].msg == proto.Reveal(gid, 0, NONCE)
    og = life.open[gid]
    # The secret projections: offered 2 and 4, weights from the group, exact average.
    expected = sum(w * p for w, p in zip(og.weights, (7.0, -3.0), strict=True))
    outs = life.handle(proto.Proof(0, gid, 0, 7.0, expected, 0.0), 1.5)
    assert not _sent(outs, proto.Commit)
    outs = life.handle(proto.Proof(1, gid, 0, -3.0, expected, 0.0), 1.6)
    assert len(_sent(outs, proto.Commit)) >= 2
    assert gid not in life.open


def test_secret_mode_abandons_on_a_failed_proof_with_an_error() -> None:
    life, gid = _group("secret")
    report_all(life, gid, 1.0)
    life.handle(proto.Proof(0, gid, 0, 7.0, 2.0, 0.0), 1.5)
    outs = life.handle(proto.Proof(1, gid, 0, -3.0, 2.9, 0.0), 1.6)
    assert not _sent(outs, proto.Commit)
    assert {s.worker for s in _sent(outs, proto.Abandon)} >= {0, 1}
    errors = [o for o in outs if isinstance(o, lc.EventRecord) and o.level is lc.Level.ERROR]
    assert errors and f"group {gid}" in errors[0].message
    closed = [o for o in outs if isinstance(o, lc.GroupClosedRecord)]
    assert closed and closed[0].outcome.value == "abandoned"


def test_secret_mode_abandons_when_a_proof_misses_the_deadline() -> None:
    life, gid = _group("secret")
    life.handle(proto.LinkHealth(0, [], []), 0.5)  # progress is reported: stalls are judged
    report_all(life, gid, 1.0)
    life.handle(proto.Proof(0, gid, 0, 7.0, 2.0, 0.0), 1.5)
    deadline = life.open[gid].deadline
    # Heartbeats keep the workers alive; no stall revision while the proofs are awaited.
    outs: list[lc.Output] = []
    t = 2.0
    while t <= deadline + 1:
        for w in range(4):
            life.handle(proto.Heartbeat(w, 0), t)
        outs += life.tick(t)
        t += 1.0
    assert not _sent(outs, proto.Commit) and not _sent(outs, proto.Assign)
    errors = [o for o in outs if isinstance(o, lc.EventRecord) and o.level is lc.Level.ERROR]
    assert errors and "no proof from member(s) 1" in errors[0].message
    assert gid not in life.open
