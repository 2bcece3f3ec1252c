"""The tests marked ``vm`` run inside lab.vm's guest (Debian's stock kernel, with sch_netem),
booted once here: the README's test command thus runs them on every machine lab/setup.sh set
up, whatever the host's kernel lacks."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lab.vm import (
    REPO,
    VM_ENV_FLAG,
    GuestKernel,
    VmError,
    _stage2_script,
    build_initramfs,
    find_busybox,
    find_kernel,
    run_in_vm,
)

# Boot (~12 s under TCG) plus the tests in tests/vm, with room for a loaded machine.
VM_SUITE_TIMEOUT_S = 900.0


def _require_guest_kernel() -> None:
    """Where lab/setup.sh could not fetch a guest kernel (it says why), the VM tests skip."""
    try:
        find_kernel()
    except VmError as e:
        pytest.skip(f"no guest kernel for lab.vm: {e}")


# The guest's exit status for the command below: the host must see this, not the tests' own.
GUEST_STATUS = 7


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get(VM_ENV_FLAG)), reason="already inside the VM")
def test_vm_runs_the_vm_marked_tests_and_leaves_nothing() -> None:
    """One boot: the guest runs Debian's kernel with sch_netem, writes back through the shared
    repository, hands its exit status out, and passes the tests marked ``vm``; afterwards no
    QEMU process and no scratch directory of it is left."""
    _require_guest_kernel()
    before = set(Path(tempfile.gettempdir()).glob("crew-vm-*"))
    qemus_before = _qemu_pids()
    marker = REPO / "runs" / f"vm-test-{os.getpid()}"
    marker.parent.mkdir(exist_ok=True)
    py = shlex.quote(sys.executable)
    tests = f"{py} -m pytest -q -p no:cacheprovider --durations=5 -m vm tests/vm"
    try:
        res = run_in_vm(
            f"uname -r; modprobe sch_netem && echo netem-loaded; echo back > {marker};"
            f" {tests}; echo pytest-exit=$?; exit {GUEST_STATUS}",
            cwd=REPO,
            timeout_s=VM_SUITE_TIMEOUT_S,
        )
        print(f"VM ({res.accel.value}): boot {res.boot_s:.1f} s, {res.wall_s:.1f} s in all")
        print(res.output)
        assert res.returncode == GUEST_STATUS, res.output[-6000:]
        guest_kernel = res.output.splitlines()[0]
        assert guest_kernel == find_kernel().version != os.uname().release
        assert "netem-loaded" in res.output
        assert marker.read_text() == "back\n"  # the repository is shared read-write
        assert "pytest-exit=0" in res.output, res.output[-6000:]
        summary = next((ln for ln in reversed(res.output.splitlines()) if " passed" in ln), "")
        assert summary and "skipped" not in summary, res.output[-6000:]
    finally:
        marker.unlink(missing_ok=True)
    assert set(Path(tempfile.gettempdir()).glob("crew-vm-*")) == before
    assert _qemu_pids() <= qemus_before, "a QEMU process outlived run_in_vm"


def _qemu_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "qemu-system-x86_64 -nodefaults"], capture_output=True)
    return {int(x) for x in out.stdout.split()}


def test_initramfs_is_a_newc_archive_with_busybox_init_and_modules_in_order() -> None:
    try:
        kernel, busybox = find_kernel(), find_busybox()
    except VmError as e:
        pytest.skip(f"lab/setup.sh has not fetched the guest kernel here: {e}")
    data = build_initramfs(kernel, "#!/bin/busybox sh\n", busybox)
    names, pos = [], 0
    while True:
        assert data[pos : pos + 6] == b"070701", f"bad magic at {pos}"
        size, namesize = int(data[pos + 54 : pos + 62], 16), int(data[pos + 94 : pos + 102], 16)
        name = data[pos + 110 : pos + 110 + namesize - 1].decode()
        pos = pos + 110 + namesize
        pos += -pos % 4
        pos += size + (-(pos + size) % 4)
        if name == "TRAILER!!!":
            break
        names.append(name)
    assert pos == len(data)
    assert {"init", "bin/busybox"} <= set(names)
    mods = [n.removeprefix("modules/").removesuffix(".ko") for n in names if n.endswith(".ko")]
    assert mods[:5] == [
        "virtio_ring",
        "virtio",
        "virtio_pci_modern_dev",
        "virtio_pci_legacy_dev",
        "virtio_pci",
    ]
    assert mods[-1] == "overlay" and mods.index("9pnet") < mods.index("9p")


@pytest.mark.parametrize(
    ("repo", "scratch"),
    [("/work/main", ["/run", "/tmp"]), ("/tmp/ci/clone", ["/run"]), ("/run/x/repo", ["/tmp"])],
)
def test_stage2_never_mounts_a_tmpfs_over_the_repository(repo: str, scratch: list[str]) -> None:
    """A clone under /tmp once vanished under the guest's fresh /tmp (python: not found)."""
    kernel = GuestKernel(root=Path("/k"), version="6.1.0-test")
    script = _stage2_script(kernel, Path(repo), Path(repo), "true", 10.0, {})
    mounted = [ln.split()[-1] for ln in script.splitlines() if ln.startswith("mount -t tmpfs")]
    assert [d for d in mounted if d in ("/run", "/tmp")] == scratch
