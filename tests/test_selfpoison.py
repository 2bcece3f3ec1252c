"""The lab's self-poisoning worker (lab.orchestrate.selfpoison): every vector its Node offers
is scaled, consistently, so its Ready projection is of the scaled vector too."""

from __future__ import annotations

import numpy as np

from crew.runtime import node as node_mod
from lab.orchestrate import selfpoison


def test_offers_are_scaled_in_this_process(monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(node_mod.Node, "offer", lambda self, v, it, **kw: seen.append((v, it, kw)))
    selfpoison.poison_offers(100.0)
    v = np.arange(4, dtype=np.float32)
    node_mod.Node.offer(object(), v, 7, blocking=False)  # type: ignore[arg-type]
    ((got, iteration, kw),) = seen
    np.testing.assert_array_equal(got, v * 100)
    assert got.dtype == np.float32 and iteration == 7 and kw == {"blocking": False}
    np.testing.assert_array_equal(v, np.arange(4))  # its own model is left as it trained
