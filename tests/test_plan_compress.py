"""With --compress fp16|int8 the coordinator plans, reserves and records the bytes the codec
really sends (crew.plan.wiresize), not 4 per element. No root needed."""

from __future__ import annotations

import pytest
from lifecycle_kit import make_cfg

from crew.control import lifecycle as lc
from crew.plan.wiresize import elem_bytes
from crew.wire import protocol as proto

SIZE_ELEMS = 1_000_000


def first_group(compress: str, **kw: int) -> lc.OpenGroup:
    cfg = make_cfg(n=4, p=4, compress=compress, **kw)
    life = lc.GroupLifecycle(cfg)
    for w in range(cfg.n):
        life.handle(proto.Register(w, 100 + w, 0, SIZE_ELEMS), 0.0)
    for m in range(cfg.n):
        life.handle(proto.Ready(m, 1, float(m + 1), -1), 1.0)
    (og,) = life.open.values()
    return og


@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_compressed_groups_count_the_codec_bytes(codec: str) -> None:
    plain, packed = first_group("none"), first_group(codec)
    cfg = make_cfg(n=4, p=4)
    wire = elem_bytes(codec, cfg.part_elems_for(SIZE_ELEMS))
    assert plain.plan.elem_bytes == 4.0 and packed.plan.elem_bytes == wire
    # the same routes (rates scaled uniformly), the codec's bytes on them
    assert [r.to_list() for r in packed.plan.routes] == [r.to_list() for r in plain.plan.routes]
    assert packed.plan.link_bytes().sum() == pytest.approx(
        plain.plan.link_bytes().sum() * wire / 4, rel=1e-9
    )
    assert packed.bytes_moved == pytest.approx(plain.bytes_moved * wire / 4, abs=1)
    # The predicted time is that of the real payload. Counting parts alone, it all scales with
    # the codec's bytes (no delays, and each hop's part fill scales with the rate).
    plain0, packed0 = (
        first_group("none", hop_backlog_bytes=0),
        first_group(codec, hop_backlog_bytes=0),
    )
    assert packed0.plan.predicted_s == pytest.approx(plain0.plan.predicted_s * wire / 4, rel=1e-6)
    # The socket backlog a part waits behind at each hop is a fixed number of wire bytes, so its
    # time does not shrink with the codec: it is the same in both plans.
    backlog_s = plain.plan.predicted_s - plain0.plan.predicted_s
    assert backlog_s > 0
    assert packed.plan.predicted_s == pytest.approx(
        plain0.plan.predicted_s * wire / 4 + backlog_s, rel=1e-6
    )
