"""A fresh Debian 12 machine's disk, built from Debian's packages with ``mmdebstrap``: about
what a Vagrant box of Debian 12 holds (systemd, udev, sudo, OpenSSH, ifupdown with DHCP,
ca-certificates, a ``vagrant`` user with password-less sudo and an SSH key), plus the kernel
modules of the guest kernel ``lab.vm`` boots (copied from its unpacked package), and nothing of
the lab: no Python, no Mininet, nothing ``lab/setup.sh`` installs.

Cost: mmdebstrap about 20-30 s (its downloads are kept in a cache folder between runs), the
modules copy and ``mkfs.ext4 -d`` (an ext4 image populated from the folder) a few seconds.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SUITE = "bookworm"
# The sources a Debian 12 machine has (what lab/setup.sh's apt-get install reads).
SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# Beyond mmdebstrap's minbase variant (essential packages and apt).
PACKAGES = (
    "systemd-sysv",
    "udev",
    "dbus",
    "sudo",
    "openssh-server",
    "ca-certificates",
    "kmod",
    "iproute2",
    "netbase",
    "ifupdown",
    "isc-dhcp-client",
    "procps",
)
USER = "vagrant"
MOUNT_POINT = "/vagrant"


class RootfsError(RuntimeError):
    """The root file system or its image could not be built (the tool's output in the message)."""


@dataclass(frozen=True)
class MachineIdentity:
    hostname: str
    ssh_public_key: str


def mmdebstrap_argv(target: Path, debs: Path) -> list[str]:
    """The mmdebstrap command: minbase plus ``PACKAGES`` into ``target``; downloaded packages are
    kept in ``debs`` and reused (its manual's recipe for a package cache)."""
    q = shlex.quote(str(debs))
    return [
        "mmdebstrap",
        "--mode=root",
        "--variant=minbase",
        "--include=" + ",".join(PACKAGES),
        "--skip=essential/unlink",
        f'--setup-hook=mkdir -p {q} "$1"/var/cache/apt/archives/',
        f"--setup-hook=sync-in {q} /var/cache/apt/archives/",
        f"--customize-hook=sync-out /var/cache/apt/archives {q}",
        SUITE,
        str(target),
        *SOURCES,
    ]


def run_logged(
    argv: list[str], log: Path, timeout_s: float, what: str, error: type[Exception] = RootfsError
) -> None:
    """Run ``argv`` with its output appended to ``log`` (after the command line), bounded by
    ``timeout_s``; a timeout or a non-zero exit raises ``error`` naming ``what``, the log and
    the log's tail."""
    with log.open("ab") as out:
        out.write(("$ " + shlex.join(argv) + "\n").encode())
        out.flush()
        try:
            rc = subprocess.run(
                argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            ).returncode
        except subprocess.TimeoutExpired as e:
            raise error(f"{what} took more than {timeout_s:.0f} s (log: {log})") from e
    if rc != 0:
        tail = log.read_text(errors="replace")[-2500:]
        raise error(f"{what} exited {rc} (log: {log}):\n{tail}")


def build_root(target: Path, debs: Path, log: Path, timeout_s: float = 900) -> None:
    """Debian 12 from its packages into the (new) folder ``target``."""
    if target.exists():
        raise RootfsError(f"{target} exists; the root is built into a new folder")
    run_logged(mmdebstrap_argv(target, debs), log, timeout_s, "mmdebstrap")


def _write(path: Path, text: str, mode: int = 0o644, owner: tuple[int, int] = (0, 0)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    os.chown(path, *owner)


def customize_root(
    root: Path, modules: Path, kernel_version: str, ident: MachineIdentity, log: Path
) -> None:
    """Make the bare root a bootable machine: fstab, network, hostname, the ``vagrant`` user
    with its key and sudo, the project's mount point, and the guest kernel's modules."""
    _write(root / "etc/fstab", "/dev/vda / ext4 errors=remount-ro 0 0\n")
    _write(
        root / "etc/network/interfaces",
        "auto lo\niface lo inet loopback\n\nallow-hotplug eth0\niface eth0 inet dhcp\n",
    )
    _write(root / "etc/hostname", ident.hostname + "\n")
    _write(
        root / "etc/hosts",
        f"127.0.0.1\tlocalhost\n127.0.1.1\t{ident.hostname}\n::1\tlocalhost ip6-localhost\n",
    )
    run_logged(
        ["chroot", str(root), "useradd", "--create-home", "--shell", "/bin/bash", USER],
        log,
        60,
        "useradd",
    )
    uid, gid = _ids(root, USER)
    _write(root / "etc/sudoers.d/vagrant", f"{USER} ALL=(ALL) NOPASSWD: ALL\n", 0o440)
    ssh_dir = root / "home" / USER / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    os.chown(ssh_dir, uid, gid)
    _write(ssh_dir / "authorized_keys", ident.ssh_public_key.strip() + "\n", 0o600, (uid, gid))
    mount = root / MOUNT_POINT.lstrip("/")
    mount.mkdir()
    os.chown(mount, uid, gid)
    dest = root / "lib/modules" / kernel_version
    if dest.exists():
        raise RootfsError(f"{dest} exists already in the new root")
    shutil.copytree(modules, dest, symlinks=True)


def _ids(root: Path, user: str) -> tuple[int, int]:
    for row in (root / "etc/passwd").read_text().splitlines():
        f = row.split(":")
        if f[0] == user:
            return int(f[2]), int(f[3])
    raise RootfsError(f"user {user} missing from {root}/etc/passwd after useradd")


def make_image(root: Path, image: Path, size_gb: int, log: Path, timeout_s: float = 600) -> None:
    """A sparse raw ext4 image of ``size_gb`` GiB holding ``root`` (``mkfs.ext4 -d``)."""
    with image.open("wb") as f:
        f.truncate(size_gb * 1024**3)
    run_logged(
        ["mkfs.ext4", "-q", "-F", "-L", "freshcheck", "-d", str(root), str(image)],
        log,
        timeout_s,
        "mkfs.ext4",
    )
