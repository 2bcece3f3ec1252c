"""A connection's outbox: frames queue here and one thread sends them, so the sender's caller
never waits for the network.

The coordinator answers every worker from one event loop. A send that blocks on a peer that
stopped reading (its receive window full) would stall the loop for every other worker, up to
the stream's stall timeout. With an outbox per connection the loop only enqueues: ``put`` never
blocks. The queue is bounded (``max_frames``): a peer that lets it fill is not keeping up with
a few hundred control messages, so its connection is shut down (its reader sees the end and
the owner handles it as a lost connection) instead of growing memory without limit.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from crew.wire.frames import Frame
from crew.wire.transport import FrameStream

log = logging.getLogger(__name__)

OUTBOX_FRAMES = 512
FLUSH_TIMEOUT_S = 2.0

_CLOSE = object()


class Outbox:
    """Frames for ``stream``, sent in order by a daemon thread named ``name``."""

    def __init__(self, stream: FrameStream, name: str, max_frames: int = OUTBOX_FRAMES) -> None:
        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        self.stream = stream
        self.name = name
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_frames)
        self.overflowed = False
        self.failed: OSError | None = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"outbox-{name}", daemon=True)
        self._thread.start()

    def put(self, frame: Frame) -> bool:
        """Queue ``frame``; never blocks. False when the outbox is closed, its connection
        failed, or it is full (then the connection is shut down: the peer is dropped)."""
        if self._closed.is_set() or self.failed is not None:
            return False
        try:
            self._queue.put_nowait(frame)
        except queue.Full:
            self.overflowed = True
            log.warning("%s: outbox full (%d frames); dropping the peer", self.name, self.size)
            self._closed.set()
            self.stream.shutdown()
            return False
        return True

    @property
    def size(self) -> int:
        return self._queue.qsize()

    def _run(self) -> None:
        # Bounded by the close marker (close() puts it) or a failed send.
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                return
            assert isinstance(item, Frame)
            try:
                self.stream.send(item)
            except OSError as exc:
                self.failed = exc
                log.info("%s: send failed, outbox stops: %s", self.name, exc)
                return
            finally:
                self._queue.task_done()

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait until every queued frame is sent (or the outbox failed), at most ``timeout``
        seconds; True if it emptied."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and self.failed is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, wait_s: float = 0.0) -> None:
        """Stop the sender after what is queued, waiting for it at most ``wait_s`` (the event
        loop passes 0: it never waits). A sender stuck on a full peer is woken with an error."""
        self._closed.set()
        try:
            self._queue.put_nowait(_CLOSE)
        except queue.Full:
            self.stream.shutdown()
            self.failed = self.failed or ConnectionAbortedError("outbox closed while full")
        if wait_s > 0:
            self._thread.join(timeout=wait_s)
