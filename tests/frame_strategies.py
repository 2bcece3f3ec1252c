"""Hypothesis strategies shared by the frame and fuzz tests (not a test module)."""

from __future__ import annotations

from hypothesis import strategies as st

from crew.wire.frames import Frame, FrameKind

U16 = 0xFFFF
U32 = 0xFFFF_FFFF
U64 = (1 << 64) - 1


def frames(run: int, payload: st.SearchStrategy[bytes]) -> st.SearchStrategy[Frame]:
    """Frames of run ``run``: every kind, every header field over its whole wire range (u16
    sender, u32 group/rev/block/part, u64 offset), payloads from ``payload``."""
    return st.builds(
        Frame,
        kind=st.sampled_from(list(FrameKind)),
        sender=st.integers(0, U16),
        run=st.just(run),
        group=st.integers(0, U32),
        rev=st.integers(0, U32),
        block=st.integers(0, U32),
        part=st.integers(0, U32),
        offset=st.integers(0, U64),
        payload=payload,
    )
