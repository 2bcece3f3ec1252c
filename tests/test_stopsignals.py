"""Stop signals reach a thread of their own, so a process whose main thread spins on its stop
event still ends on SIGTERM (crew.runtime.stopsignals). Each case runs in a child process: the
wakeup pipe and the handlers are the process's own."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from crew.runtime.stopsignals import StopSignalError, call_on_signals
from lab.studies.workerstart import free_ports

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


def test_a_launched_jobs_coordinator_ends_on_sigterm_while_ranks_are_missing(
    tmp_path: Path,
) -> None:
    """Before its ranks have joined, the coordinator of a launched job waits up to its join
    timeout (60 s here); SIGTERM ends it at once, with the reason in its log."""
    (port,) = free_ports(1)
    env = {**os.environ, "CREW_SECRET": "0123456789abcdef0123456789abcdef"}
    argv = [sys.executable, "-m", "crew.runtime.coordinator", "--world", "2",
            "--port", str(port), "--advertise", "127.0.0.1",
            "--run-dir", str(tmp_path), "--run-id", "t"]  # fmt: skip
    child = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    assert child.stderr is not None
    reader = threading.Thread(target=lambda: [lines.put(x) for x in child.stderr], daemon=True)
    reader.start()
    try:
        seen: list[str] = []
        deadline = time.monotonic() + ENDS_S
        while time.monotonic() < deadline and not any("waiting for" in x for x in seen):
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                continue
        assert child.poll() is None, f"the coordinator ended before it was signalled: {seen}"
        child.send_signal(signal.SIGTERM)  # now routed: it logged that it is waiting
        child.wait(ENDS_S)
        reader.join(ENDS_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(ENDS_S)
    err = "".join(seen) + "".join(lines.queue)
    assert "the coordinator was stopped during start-up" in err, err
    assert child.returncode == 1, err
