"""Stop signals (SIGTERM, SIGINT) handled off the main thread.

A Python signal handler runs in the main thread between two bytecodes, possibly while that
thread holds a lock. ``threading.Event.wait`` holds its event's lock for a few bytecodes after
every timed wake, and ``Event.set`` takes the same lock, so a handler that sets an event the main
thread waits on can wait for itself forever: the process then ignores every later SIGTERM while
its other threads run on. A worker whose straggler padding waits on its stop event many times a
second meets that window.

Here the Python-level handler does nothing. The interpreter writes each signal's number to a
pipe (:func:`signal.set_wakeup_fd`, from C, taking no lock), and a daemon thread reading the
pipe calls the callback, which may then take any lock the main thread holds for a moment.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignalError(RuntimeError):
    """The stop signals could not be routed to a thread (not called from the main thread)."""


def call_on_signals(
    callback: Callable[[signal.Signals], None],
    signums: Iterable[signal.Signals] = STOP_SIGNALS,
) -> threading.Thread:
    """From now on, each of ``signums`` calls ``callback(signum)`` on a daemon thread of its own
    (the returned one), never inside the main thread's handler. Call from the main thread, once
    per process: the wakeup pipe is the process's one."""
    if threading.current_thread() is not threading.main_thread():
        raise StopSignalError("stop signals can only be routed from the main thread")
    wanted = frozenset(signal.Signals(s) for s in signums)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # set_wakeup_fd requires it; a full pipe drops a byte
    os.set_blocking(read_fd, True)

    def relay() -> None:
        while True:
            data = os.read(read_fd, 64)
            if not data:  # the write end closed: the process is ending
                return
            for number in data:
                if number not in wanted:
                    continue
                try:
                    callback(signal.Signals(number))
                except Exception:  # a failing callback must not end the relay
                    log.exception("handling signal %d failed", number)

    thread = threading.Thread(target=relay, name="stop-signals", daemon=True)
    thread.start()
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for signum in wanted:
        signal.signal(signum, _ignore_in_main_thread)
    return thread


def _ignore_in_main_thread(signum: int, frame: object) -> None:
    """The Python-level handler: nothing, so the default action (ending, KeyboardInterrupt) is
    replaced and the relay thread alone acts."""
