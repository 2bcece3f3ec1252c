"""Stop signals reach a thread of their own, so a process whose main thread spins on its stop
event still ends on SIGTERM (crew.runtime.stopsignals). Each case runs in a child process: the
wakeup pipe and the handlers are the process's own."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from crew.runtime.stopsignals import StopSignalError, call_on_signals

ENDS_S = 20.0  # a bound on a hung child, not a timing assertion

# The child waits on its stop event in short timed waits, as a worker's straggler padding does,
# and records which thread ran the callback and for which signal.
CHILD = textwrap.dedent(
    """
    import sys, threading, time
    from crew.runtime.stopsignals import call_on_signals
    stop = threading.Event()
    seen = []
    def on_signal(signum):
        seen.append((signum.name, threading.current_thread() is threading.main_thread()))
        stop.set()
    call_on_signals(on_signal)
    print("ready", flush=True)
    deadline = time.monotonic() + 15
    while not stop.wait(0.0005) and time.monotonic() < deadline:
        pass
    print(seen, flush=True)
    sys.exit(0 if seen == [(sys.argv[1], False)] else 3)
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_runs_the_callback_off_the_main_thread(signum: signal.Signals) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, signum.name],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signum)
        out, _ = child.communicate(timeout=ENDS_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(ENDS_S)
    # 3: the callback ran in the main thread, or for another signal, or not at all (the child's
    # own 15 s bound); a Python-level handler that raised would end the child with 1.
    assert child.returncode == 0, out


def test_routing_from_another_thread_is_refused() -> None:
    errors: list[BaseException] = []

    def route() -> None:
        try:
            call_on_signals(lambda _: None)
        except StopSignalError as exc:
            errors.append(exc)

    thread = threading.Thread(target=route)
    thread.start()
    thread.join(ENDS_S)
    assert len(errors) == 1 and "main thread" in str(errors[0])
