"""Shared pytest configuration.

Tests marked ``root`` build real labs (network namespaces, tc, iptables): they run only as root
on a machine with Mininet's ``mnexec``, and are skipped elsewhere.

Tests marked ``vm`` need a kernel with sch_netem: they run only inside lab.vm's guest, where
``tests/test_vm.py`` runs them (``-m vm tests/vm``); on the host they are skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest


def _can_run_root_tests() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "needs root"
    if shutil.which("mnexec") is None:
        return False, "needs mnexec (Debian package mininet)"
    return True, ""


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
