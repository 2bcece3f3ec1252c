"""Children that end with the lab: a parent-death signal for every process the lab starts.

A lab killed with -9 cannot stop what it started. Without help its coordinator, workers and
dashboard would train on against a network nobody tears down. Each child therefore asks the
kernel, between fork and exec, for ``SIGTERM`` when its parent dies (``prctl(PR_SET_PDEATHSIG)``,
kept across ``execve``), and ends by its own SIGTERM handling: workers save their checkpoint,
the coordinator closes its run database. What the dead lab leaves in the kernel (interfaces,
rules, its state file) is still removed by the next lab's clean-up (``lab.net.cleanup``).

The kernel sends the signal when the *thread* that started the child ends, so the lab starts
its children from threads that live as long as it does (its main loop).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def lifeline(then: Callable[[], None] | None = None) -> Callable[[], None]:
    """A ``preexec_fn`` that sets the parent-death signal, then runs ``then`` (if any).

    Made in the parent, so the child can tell whether the parent already died before the
    signal was set (then it ends at once instead of running orphaned)."""
    parent = os.getpid()

    def preexec() -> None:
        if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
        if then is not None:
            then()

    return preexec
