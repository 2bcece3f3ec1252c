"""Shared pytest configuration.

Tests marked ``root`` build real labs (network namespaces, tc, iptables): they run only as root
on a machine with Mininet's ``mnexec``, and are skipped elsewhere.

Tests marked ``vm`` need a kernel with sch_netem: they run only inside lab.vm's guest, where
``tests/test_vm.py`` runs them (``-m vm tests/vm``); on the host they are skipped.

Tests marked ``slow`` (labs with torch workers, the VM, the long simulations) are left out by
the quick command, ``python -m pytest -q -m "not slow"``; the full suite runs them.

Hypothesis runs under one of two profiles, chosen by ``HYPOTHESIS_PROFILE``: ``ci``
(derandomised, so a CI run draws the same examples every time; the default when ``CI`` is set)
and ``dev`` (fewer examples, a new seed each run; the default otherwise). A test's own
``@settings`` still fix its example count under both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

HYPOTHESIS_PROFILES = ("ci", "dev")
# ci: Hypothesis' default example count, the same examples on every run (the seed comes from
# each test's code), and no deadline: a shared CI machine's pauses are not the code's slowness.
# Both start from Hypothesis' own defaults, whichever profile it chose for itself on import.
BASE = settings.get_profile("default")
settings.register_profile(
    "ci",
    BASE,
    derandomize=True,
    max_examples=100,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# dev: a fifth of the examples for a quick local run, still randomised, so repeated runs explore.
settings.register_profile("dev", BASE, max_examples=20, deadline=None)


def _hypothesis_profile() -> str:
    chosen = os.environ.get("HYPOTHESIS_PROFILE", "").strip()
    if chosen:
        if chosen not in HYPOTHESIS_PROFILES:
            raise pytest.UsageError(
                f"HYPOTHESIS_PROFILE={chosen!r}: unknown profile; use one of"
                f" {', '.join(HYPOTHESIS_PROFILES)}"
            )
        return chosen
    in_ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    return "ci" if in_ci else "dev"


# Loaded here, before pytest imports any test module: a test's ``@settings(...)`` takes the
# profile loaded when its decorator runs as the parent of what it does not set itself.
settings.load_profile(_hypothesis_profile())


def _can_run_root_tests() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "needs root"
    if shutil.which("mnexec") is None:
        return False, "needs mnexec (Debian package mininet)"
    return True, ""


def pytest_report_header(config: pytest.Config) -> str:
    return f"hypothesis profile: {settings.get_current_profile_name()}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("CREW_IN_VM"):
        vm_skip = pytest.mark.skip(reason="vm test: runs inside lab.vm (tests/test_vm.py)")
        for item in items:
            if item.get_closest_marker("vm") is not None:
                item.add_marker(vm_skip)
    ok, why = _can_run_root_tests()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"root test: {why}")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


NETNS_WAIT_S = 10.0  # for ``unshare`` to make the namespace: milliseconds, unless the host is busy
NETNS_POLL_S = 0.01


def _netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


@pytest.fixture
def fresh_netns() -> Iterator[int]:
    """The pid of a process alone in a new, empty network namespace, ended after the test.

    Commands run there through ``mnexec -a PID`` (``lab.net.shaping.in_ns``). The fixture
    yields only once the process's namespace differs from this one's: before ``unshare`` has
    made it, the pid is still in the root namespace, and what a test adds would land there."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    own = _netns(os.getpid())
    holder = subprocess.Popen(["unshare", "--net", "sleep", "120"])
    try:
        deadline = time.monotonic() + NETNS_WAIT_S
        for _ in range(int(NETNS_WAIT_S / NETNS_POLL_S) + 1):
            if holder.poll() is not None:
                pytest.fail(f"unshare --net exited with code {holder.returncode}")
            if _netns(holder.pid) != own:
                break
            if time.monotonic() >= deadline:
                pytest.fail(f"unshare --net made no namespace within {NETNS_WAIT_S:.0f} s")
            time.sleep(NETNS_POLL_S)
        else:
            pytest.fail(f"unshare --net made no namespace within {NETNS_WAIT_S:.0f} s")
        yield holder.pid
    finally:
        holder.kill()
        holder.wait(5)
