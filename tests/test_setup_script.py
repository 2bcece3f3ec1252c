"""lab/setup.sh's distribution-specific steps, run for Debian 12, Ubuntu 22.04 and Ubuntu 24.04.

The real script runs, from a copy of the repository's ``lab/`` (so its venv lands in a temporary
directory), against a fake system root (``LAB_SETUP_SYSROOT``: ``/etc/os-release``, the Python
interpreters, ``/usr/local/bin``, the guest kernel cache) and stand-ins for apt, dpkg, depmod,
modprobe, uname, zstd and xz on PATH (tests/setup_stub.py), which answer as the scenario's apt
archive would and record every call. The script's check of the unpacked guest kernel runs the
real lab.vm code on the unpacked files. No root needed, nothing outside ``tmp_path`` is written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import setup_stub

from lab.vm import INITRD_MODULES

REPO = Path(__file__).resolve().parent.parent
STUB_COMMANDS = [
    "apt-get",
    "apt-cache",
    "dpkg-query",
    "dpkg-deb",
    "depmod",
    "modprobe",
    "uname",
    "zstd",
    "xz",
]
BASE = [
    "mininet",
    "iproute2",
    "iputils-ping",
    "iptables",
    "ethtool",
    "kmod",
    "procps",
    "ca-certificates",
    "qemu-system-x86",
    "busybox-static",
]
PY3 = ["python3", "python3-venv", "python3-dev"]
PY311 = ["python3.11", "python3.11-venv", "python3.11-dev"]
NETEM = "kernel/net/sched/sch_netem.ko"
RUN_TIMEOUT_S = 60.0

OS_RELEASE = {
    "debian-12": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n',
    "ubuntu-22.04": 'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nID=ubuntu\nID_LIKE=debian\n'
    'VERSION_ID="22.04"\n',
    "ubuntu-24.04": 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\nID_LIKE=debian\n'
    'VERSION_ID="24.04"\n',
}


def _modules(ver: str, names: list[str], suffix: str = "") -> list[str]:
    return [f"lib/modules/{ver}/{n}{suffix}" for n in names]


def _initrd(ver: str, suffix: str = "") -> list[str]:
    return _modules(ver, [f"kernel/{m}.ko" for m in INITRD_MODULES], suffix)


DEBIAN_KVER = "6.1.0-99-amd64"
DEBIAN_KPKG = f"linux-image-{DEBIAN_KVER}"
NOBLE_KVER = "6.8.0-99-generic"
JAMMY_KVER = "5.15.0-99-generic"


def debian_archive() -> dict[str, Any]:
    """Debian 12: linux-image-amd64 -> one package with the kernel and all its modules."""
    files = [f"boot/vmlinuz-{DEBIAN_KVER}", *_initrd(DEBIAN_KVER)]
    files += _modules(DEBIAN_KVER, [NETEM])
    return {
        "installable": [*BASE, *PY3, "chromium"],
        "depends": {"linux-image-amd64": [DEBIAN_KPKG]},
        "debs": {DEBIAN_KPKG: files},
    }


def noble_archive() -> dict[str, Any]:
    """Ubuntu 24.04: the image, linux-modules and linux-modules-extra, modules zstd-compressed."""
    ver = NOBLE_KVER
    return {
        "installable": [*BASE, *PY3, "zstd"],
        "depends": {"linux-image-generic": [f"linux-image-{ver}", "linux-firmware"]},
        "debs": {
            f"linux-image-{ver}": [f"boot/vmlinuz-{ver}"],
            f"linux-modules-{ver}": _initrd(ver, ".zst"),
            f"linux-modules-extra-{ver}": _modules(ver, [NETEM], ".zst"),
        },
    }


def jammy_archive() -> dict[str, Any]:
    """Ubuntu 22.04: python3 is 3.10; virtio is built into the kernel (modules.builtin)."""
    ver = JAMMY_KVER
    builtin = [f"kernel/{m}.ko" for m in INITRD_MODULES if "virtio" in m]
    loadable = [f"kernel/{m}.ko" for m in INITRD_MODULES if "virtio" not in m]
    return {
        "installable": [*BASE, *PY311, "python3", "zstd", "linux-modules-extra-5.15.0-1-generic"],
        "depends": {
            "linux-image-generic": [f"linux-image-{ver}", f"linux-modules-extra-{ver}"],
        },
        "debs": {
            f"linux-image-{ver}": [f"boot/vmlinuz-{ver}"],
            f"linux-modules-{ver}": [
                *_modules(ver, loadable),
                [f"lib/modules/{ver}/modules.builtin", "".join(f"{b}\n" for b in builtin)],
            ],
            f"linux-modules-extra-{ver}": _modules(ver, [NETEM]),
        },
    }


@dataclass
class SetupRun:
    returncode: int
    output: str
    calls: list[dict[str, Any]]
    root: Path
    repo: Path
    site: Path

    def cmd(self, name: str, first: str | None = None) -> list[list[str]]:
        """The argument lists of every call of NAME (whose first argument is FIRST)."""
        return [
            c["args"]
            for c in self.calls
            if c["cmd"] == name and (first is None or c["args"][:1] == [first])
        ]

    @property
    def installs(self) -> list[list[str]]:
        return self.cmd("apt-get", "install")

    @property
    def cache(self) -> Path:
        return self.root / "var/cache/crew-lab/vm"


def run_setup(tmp: Path, distro: str, archive: dict[str, Any], host_netem: bool = True) -> SetupRun:
    repo, root, stubs = tmp / "repo", tmp / "root", tmp / "stubs"
    (repo / "lab").mkdir(parents=True, exist_ok=True)
    for name in ("setup.sh", "__init__.py", "vm.py"):
        shutil.copy2(REPO / "lab" / name, repo / "lab" / name)
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/os-release").write_text(OS_RELEASE[distro])
    (root / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    setup_stub.install(root / "usr/bin", ["python3", "python3.11"])
    setup_stub.install(stubs, STUB_COMMANDS)
    site = tmp / "venv-site"
    scenario = {
        "installable": archive["installable"],
        "installed": [],
        "depends": archive["depends"],
        "debs": archive["debs"],
        "download_fails": archive.get("download_fails", []),
        "host_netem": host_netem,
        "uname_r": "5.15.0-1-generic",
        "site": str(site),
        "real_python": sys.executable,
    }
    (tmp / "scenario.json").write_text(json.dumps(scenario))
    log = tmp / "calls.jsonl"
    log.touch()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LAB_", "CREW_VM_CACHE", "PYTHONPATH"))
    }
    env |= {
        "PATH": f"{stubs}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
        "LAB_SETUP_SYSROOT": str(root),
        "LAB_DASHBOARD_HOST": "0.0.0.0",
        "SETUP_STUB_SCENARIO": str(tmp / "scenario.json"),
        "SETUP_STUB_LOG": str(log),
    }
    res = subprocess.run(
        ["bash", str(repo / "lab/setup.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return SetupRun(res.returncode, res.stdout + res.stderr, calls, root, repo, site)


def assert_reached_the_end(run: SetupRun, python: str) -> None:
    """Past the guest kernel: the venv made from PYTHON, the project installed, the wrapper."""
    assert run.returncode == 0, run.output
    assert "done. Try:  sudo python -m lab.run --help" in run.output
    venv = run.repo / ".venv"
    assert run.cmd(python, "-m") == [["-m", "venv", str(venv)]]
    pip = run.cmd("venv-python", "-m")
    assert ["-m", "pip", "install", "-q", "-e", f"{run.repo}[lab,dashboard,test]"] in pip
    assert (run.site / "mininet").is_symlink()
    wrapper = (run.root / "usr/local/bin/python").read_text()
    assert f'exec "{venv}/bin/python" "$@"' in wrapper
    assert "export CREW_LAB_DASHBOARD_HOST=0.0.0.0" in wrapper


def assert_guest_kernel(run: SetupRun, ver: str) -> None:
    root = run.cache / "root"
    assert (root / f"boot/vmlinuz-{ver}").is_file(), run.output
    modules = root / "lib/modules" / ver
    assert (modules / "modules.dep").is_file()
    assert (modules / NETEM).is_file()
    assert not list(modules.rglob("*.zst")), "compressed modules left in the guest tree"
    assert not (run.cache / "root.tmp").exists() and not (run.cache / "debs").exists()
    assert f"guest kernel {ver} ready" in run.output


def assert_no_guest_kernel(run: SetupRun, problem: str) -> None:
    assert "NO GUEST KERNEL for lab.vm" in run.output, run.output
    assert problem in run.output, run.output
    assert "The VM tests (tests/test_vm.py, tests/vm) are disabled" in run.output
    assert not (run.cache / "root").exists()
    assert not (run.cache / "root.tmp").exists() and not (run.cache / "debs").exists()


def test_debian_12(tmp_path: Path) -> None:
    run = run_setup(tmp_path, "debian-12", debian_archive())
    assert_reached_the_end(run, "python3")
    assert len(run.installs) == 1
    installed = set(run.installs[0])
    assert {*BASE, *PY3, "chromium"} <= installed
    assert "zstd" not in installed
    assert ["depends", "linux-image-amd64"] in run.cmd("apt-cache")
    # Debian's kernel package carries every module: no modules packages are fetched.
    assert run.cmd("apt-get", "download") == [["download", "-q", DEBIAN_KPKG]]
    assert run.cmd("depmod") == [["-b", str(run.cache / "root.tmp"), DEBIAN_KVER]]
    assert not run.cmd("zstd")
    assert_guest_kernel(run, DEBIAN_KVER)


def test_ubuntu_24_04(tmp_path: Path) -> None:
    run = run_setup(tmp_path, "ubuntu-24.04", noble_archive())
    assert_reached_the_end(run, "python3")
    installed = set(run.installs[0])
    assert {*BASE, *PY3, "zstd"} <= installed
    assert "chromium" not in installed
    assert "not installing chromium: Ubuntu ships it only as a snap" in run.output
    assert ["depends", "linux-image-generic"] in run.cmd("apt-cache")
    assert ["depends", "linux-image-amd64"] not in run.cmd("apt-cache")
    assert [a[-1] for a in run.cmd("apt-get", "download")] == [
        f"linux-image-{NOBLE_KVER}",
        f"linux-modules-{NOBLE_KVER}",
        f"linux-modules-extra-{NOBLE_KVER}",
    ]
    assert run.cmd("zstd"), "the zstd-compressed modules were not decompressed"
    assert_guest_kernel(run, NOBLE_KVER)


def test_ubuntu_22_04_takes_python_3_11_and_reports_a_kernel_lab_vm_cannot_boot(
    tmp_path: Path,
) -> None:
    run = run_setup(tmp_path, "ubuntu-22.04", jammy_archive(), host_netem=False)
    assert_reached_the_end(run, "python3.11")
    assert not run.cmd("python3", "-m"), "the venv must not come from 3.10's python3"
    installed = set(run.installs[0])
    assert {*BASE, *PY311} <= installed and "chromium" not in installed
    # The host kernel lacks sch_netem: its modules-extra package is installed.
    assert run.installs[1][-1] == "linux-modules-extra-5.15.0-1-generic"
    # virtio is built into this kernel, and lab.vm's initramfs insmods it from a .ko file.
    assert_no_guest_kernel(run, f"kernel {JAMMY_KVER}: lab.vm cannot boot it: guest module")


def test_unresolvable_kernel_package_disables_only_the_vm_tests(tmp_path: Path) -> None:
    archive = noble_archive() | {"depends": {}}
    run = run_setup(tmp_path, "ubuntu-24.04", archive)
    assert_reached_the_end(run, "python3")
    assert_no_guest_kernel(
        run, "cannot resolve the kernel package of linux-image-generic (apt-cache depends"
    )
    assert not run.cmd("apt-get", "download") and not run.cmd("dpkg-deb")


def test_failed_download_disables_only_the_vm_tests(tmp_path: Path) -> None:
    archive = debian_archive() | {"download_fails": [DEBIAN_KPKG]}
    run = run_setup(tmp_path, "debian-12", archive)
    assert_reached_the_end(run, "python3")
    assert_no_guest_kernel(run, f"apt-get download {DEBIAN_KPKG} failed")


def test_guest_kernel_without_sch_netem_is_not_kept(tmp_path: Path) -> None:
    archive = debian_archive()
    archive["debs"][DEBIAN_KPKG] = [f for f in archive["debs"][DEBIAN_KPKG] if "netem" not in f]
    run = run_setup(tmp_path, "debian-12", archive)
    assert_reached_the_end(run, "python3")
    assert_no_guest_kernel(run, "it has no sch_netem")


def test_a_kept_guest_kernel_is_not_fetched_again(tmp_path: Path) -> None:
    first = run_setup(tmp_path / "a", "debian-12", debian_archive())
    assert_guest_kernel(first, DEBIAN_KVER)
    again = tmp_path / "b"
    shutil.copytree(first.cache, again / "root/var/cache/crew-lab/vm")
    run = run_setup(again, "debian-12", debian_archive())
    assert_reached_the_end(run, "python3")
    assert not run.cmd("apt-get", "download") and "fetching the guest kernel" not in run.output


def test_ubuntu_without_universe_stops_and_says_so(tmp_path: Path) -> None:
    archive = noble_archive()
    archive["installable"] = [p for p in archive["installable"] if p != "mininet"]
    run = run_setup(tmp_path, "ubuntu-24.04", archive)
    assert run.returncode == 1
    assert "add-apt-repository universe" in run.output
    assert not run.cmd("python3", "-m")


def test_a_symlink_at_usr_local_bin_python_is_replaced_not_written_through(
    tmp_path: Path,
) -> None:
    target = tmp_path / "someone-elses-python"
    target.write_text("#!/bin/sh\n")
    (tmp_path / "root/usr/local/bin").mkdir(parents=True)
    (tmp_path / "root/usr/local/bin/python").symlink_to(target)
    run = run_setup(tmp_path, "debian-12", debian_archive())
    assert_reached_the_end(run, "python3")
    assert target.read_text() == "#!/bin/sh\n"
    assert not (run.root / "usr/local/bin/python").is_symlink()


@pytest.mark.skipif(os.geteuid() == 0, reason="checks the refusal a non-root user gets")
def test_refuses_to_run_without_root() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LAB_SETUP_SYSROOT"}
    res = subprocess.run(
        ["bash", str(REPO / "lab/setup.sh")], env=env, capture_output=True, text=True
    )
    assert res.returncode == 1
    assert "must run as root" in res.stderr


def test_lab_vm_imports_with_the_standard_library_alone() -> None:
    """lab/setup.sh judges the guest kernel with lab.vm under the distribution's Python, before
    the venv exists: an import of numpy or any other package there disables the VM tests."""
    only_stdlib = f"""
import sys

class OnlyStdlib:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top in ("lab", "crew"):
            return None
        raise ImportError(f"{{name}} is not in the standard library")

sys.path.insert(0, {str(REPO)!r})
sys.meta_path.insert(0, OnlyStdlib())
from lab.vm import GuestKernel, VmError, build_initramfs
"""
    run = subprocess.run(
        [sys.executable, "-I", "-c", only_stdlib], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
