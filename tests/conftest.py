"""Shared pytest configuration.

Tests marked ``root`` build real labs (network namespaces, tc, iptables): they run only as root
on a machine with Mininet's ``mnexec``, and are skipped elsewhere.

Tests marked ``vm`` need a kernel with sch_netem: they run only inside lab.vm's guest, where
``tests/test_vm.py`` runs them (``-m vm tests/vm``); on the host they are skipped.
"""

from __future__ import annotations

import os
import shutil

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
