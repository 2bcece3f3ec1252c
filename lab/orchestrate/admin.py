"""The lab's channel to its coordinator for Admin requests (stop, set p, a link's rate).

The channel speaks as the lab (sender ``COORDINATOR``) under the lab's own key, a file in the
run directory that only the lab and the coordinator read; the coordinator accepts Admin under
that key alone (``crew.runtime.coordinator``), so a worker, which holds only the run's key,
cannot stop or steer the run. The connection opens with the session handshake
(``crew.wire.session``) and is kept open between requests; a request on a broken connection
is retried once on a new one.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from crew.wire import protocol as proto
from crew.wire.frames import COORDINATOR, FrameCodec, FrameError, control_frame
from crew.wire.listener import Address
from crew.wire.session import open_session
from crew.wire.transport import FrameStream

HANDSHAKE_S = 5.0


class AdminChannel:
    """Admin requests to one coordinator; thread-safe (the command applier and the drift
    applier share it)."""

    def __init__(
        self, address: Address, secret_path: Path, run_num: int, *, encrypt: bool = False
    ) -> None:
        self.address = address
        self.encrypt = encrypt
        self.secret_path = secret_path
        self.run_num = run_num
        self._stream: FrameStream | None = None
        self._lock = threading.Lock()

    def _connect(self) -> FrameStream:
        codec = FrameCodec(self.secret_path.read_bytes(), self.run_num, encrypt=self.encrypt)
        stream = FrameStream.connect(self.address, codec, timeout=5.0)
        try:
            open_session(stream, COORDINATOR, HANDSHAKE_S)
        except FrameError as exc:
            stream.close()
            raise ConnectionError(f"the coordinator refused the lab's handshake: {exc}") from exc
        except OSError:
            stream.close()
            raise
        return stream

    def send(self, op: str, args: dict[str, Any]) -> None:
        """Send one request. Raises OSError if it could not be sent on two connections."""
        frame = control_frame(COORDINATOR, self.run_num, proto.Admin(op=op, args=args).to_dict())
        with self._lock:
            for attempt in range(2):
                try:
                    if self._stream is None:
                        self._stream = self._connect()
                    self._stream.send(frame)
                    return
                except OSError:
                    if self._stream is not None:
                        self._stream.close()
                        self._stream = None
                    if attempt:
                        raise

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()
                self._stream = None
