"""Giving a long-running worker's freed heap back to the operating system.

A worker's threads (one or two per connection, the reduce engine's, the trainer's) allocate
and free frames of up to a route part (64 KiB) and buffers of whole vectors all the time. glibc
serves allocations below its mmap threshold from per-thread arenas and frees them into those
arenas' free lists; a free page in the middle of an arena stays resident until something
returns it. Sampled from ``/proc/PID/smaps`` in an hour's soak, a worker's thread arenas grew
from 132 KiB to about 1 MiB each and its main heap swung by ±7 MiB around a slowly rising
line, 0.1-0.2 MB a minute. ``malloc_trim(0)`` walks every arena and returns
each whole free page with ``madvise(MADV_DONTNEED)``: what stays resident is what is in use.

Cost model: one call walks each arena's free chunks once, so it is linear in the free chunks
of about 15 arenas (a worker's threads), well under a millisecond per call for a worker's
~200 MiB heap; made once a minute it costs nothing measurable. The pages it returns are
faulted in again (zeroed by the kernel) only if the heap grows into them again.

Other C libraries (musl, macOS) return memory their own way and have no ``malloc_trim``:
:func:`trim` is then a no-op that says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

TRIM_EVERY_S = 60.0
"""How often a worker trims: a minute lets at most a minute's fragmentation build up (a few
MiB at most, from the soak's rate), and the call is far too cheap to matter at that rate."""


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def trim() -> bool | None:
    """Return every whole free page of every malloc arena to the OS. True if some memory was
    released, False if none could be, None where the C library has no ``malloc_trim``."""
    fn = _malloc_trim()
    if fn is None:
        return None
    return bool(fn(0))


@dataclass
class Trimmer:
    """Calls :func:`trim` at most once every ``every_s`` seconds of ``clock``: a periodic
    thread calls :meth:`maybe` on each of its ticks."""

    every_s: float = TRIM_EVERY_S
    clock: Callable[[], float] = field(default=time.monotonic)
    last: float | None = None
    calls: int = 0

    def maybe(self) -> bool:
        """Trim if ``every_s`` has passed since the last trim (or none was made); True if it
        trimmed."""
        now = self.clock()
        if self.last is not None and now - self.last < self.every_s:
            return False
        self.last = now
        self.calls += 1
        if trim() is None and self.calls == 1:
            log.info("this C library has no malloc_trim: freed heap stays with the process")
        return True
