"""Boot a disk image as ``lab.vm`` boots its guest, and reach it over SSH as Vagrant does.

The kernel is the one ``lab.vm`` uses (Debian's stock kernel, unpacked by ``lab/setup.sh``),
started by QEMU with ``-kernel`` and a busybox initramfs built by ``lab.vm.build_initramfs``;
its ``/init`` loads the virtio block and ext4 modules (in the order ``modules.dep`` gives),
mounts the image's ext4 root from ``/dev/vda`` and hands over to the image's own ``/sbin/init``
(systemd). The image's network is QEMU's user mode (the host is 10.0.2.2 from inside) with
two ports forwarded from the host's loopback: SSH, and the Vagrantfile's forwarded port.

Commands run over SSH as the ``vagrant`` user with the key put in the image, with no host
SSH configuration (``-F /dev/null``: nothing of this host's environment is sent).
"""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from lab.vm import Accel, GuestKernel, build_initramfs, qemu_machine_argv

# What the initramfs loads to mount the root: virtio over PCI, its block device, ext4 (and
# crc32c, which ext4 asks the crypto API for).
ROOT_MODULES = ("virtio_pci", "virtio_blk", "crc32c_generic", "ext4")
SSH_POLL_S = 2.0


class GuestError(RuntimeError):
    """The guest did not boot, or a command could not be run in it."""


def module_load_order(modules_dep: str, wanted: Iterable[str]) -> list[str]:
    """Paths (under ``kernel/``, without ``.ko``) of ``wanted`` modules and their dependencies,
    each after everything it depends on, from the text of ``modules.dep``."""
    deps: dict[str, tuple[str, list[str]]] = {}
    for row in modules_dep.splitlines():
        if ":" not in row:
            continue
        head, _, tail = row.partition(":")
        name = Path(head).name.removesuffix(".ko").replace("-", "_")
        deps[name] = (
            head,
            [Path(d).name.removesuffix(".ko").replace("-", "_") for d in tail.split()],
        )
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in seen:
            return
        if name not in deps:
            raise GuestError(f"module {name} is not in modules.dep")
        if name in path:
            raise GuestError(f"modules.dep has a cycle: {' -> '.join((*path, name))}")
        for d in deps[name][1]:
            visit(d, (*path, name))
        seen.add(name)
        order.append(deps[name][0].removeprefix("kernel/").removesuffix(".ko"))

    for w in wanted:
        visit(w.replace("-", "_"), ())
    return order


def init_script(modules: Sequence[str]) -> str:
    names = " ".join(Path(m).name for m in modules)
    return f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs dev /dev
die() {{ echo "freshcheck init: $*" > /dev/ttyS0; echo o > /proc/sysrq-trigger; sleep 60; }}
for m in {names}; do insmod /modules/$m.ko || die "insmod $m"; done
n=0
while [ ! -b /dev/vda ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
mount -t ext4 -o rw /dev/vda /newroot || die "mount /dev/vda"
umount /sys /proc
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
"""


@dataclass(frozen=True)
class Forward:
    host_port: int
    guest_port: int


@dataclass(frozen=True)
class MachineSpec:
    kernel: GuestKernel
    initrd: Path
    image: Path
    console_log: Path
    memory_mb: int
    cpus: int
    accel: Accel
    forwards: tuple[Forward, ...]


def qemu_argv(spec: MachineSpec) -> list[str]:
    """QEMU's command line: lab.vm's machine (``-kernel``, serial console to a file, no
    display), the image as a virtio disk, user networking with the forwards, an entropy
    source (sshd and Python ask for randomness early)."""
    fwd = ",".join(f"hostfwd=tcp:127.0.0.1:{f.host_port}-:{f.guest_port}" for f in spec.forwards)
    return [
        *qemu_machine_argv(
            spec.accel,
            smp=spec.cpus,
            mem_mb=spec.memory_mb,
            kernel=spec.kernel.vmlinuz,
            initrd=spec.initrd,
            append="console=ttyS0 root=/dev/vda rw net.ifnames=0 panic=-1 mitigations=off"
            " tsc=reliable",
            console_log=spec.console_log,
        ),
        "-drive",
        f"file={spec.image},format=raw,if=virtio,cache=unsafe",
        "-netdev",
        f"user,id=net0{',' if fwd else ''}{fwd}",
        "-device",
        "virtio-net-pci,netdev=net0",
        "-object",
        "rng-random,filename=/dev/urandom,id=rng0",
        "-device",
        "virtio-rng-pci,rng=rng0",
    ]


def write_initrd(kernel: GuestKernel, busybox: Path, dest: Path) -> None:
    dep = (kernel.modules / "modules.dep").read_text()
    modules = module_load_order(dep, ROOT_MODULES)
    dest.write_bytes(build_initramfs(kernel, init_script(modules), busybox, modules))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (QEMU binds it moments later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Guest:
    """A running QEMU with the image; ``close()`` powers it off (or kills the QEMU it started)."""

    spec: MachineSpec
    key: Path
    ssh_port: int
    nice: int = 10
    proc: subprocess.Popen | None = None
    _children: list[subprocess.Popen] = field(default_factory=list)

    def start(self) -> None:
        argv = ["nice", "-n", str(self.nice), *qemu_argv(self.spec)]
        self.qemu_log = self.spec.console_log.with_name("qemu.log")
        with self.qemu_log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ssh_argv(self, command: str, user: str = "vagrant") -> list[str]:
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.key),
            "-p",
            str(self.ssh_port),
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "ServerAliveInterval=30",
            "-o",
            "ServerAliveCountMax=10",
            f"{user}@127.0.0.1",
            command,
        ]

    def wait_for_ssh(self, timeout_s: float) -> None:
        """Until ``true`` runs over SSH; GuestError with the console's tail if it never does."""
        deadline = time.monotonic() + timeout_s
        for _ in range(int(timeout_s / SSH_POLL_S) + 2):
            if not self.alive():
                raise GuestError(f"QEMU exited during boot\n{self.console_tail()}")
            try:
                rc = subprocess.run(
                    self.ssh_argv("true"), capture_output=True, timeout=30, check=False
                ).returncode
            except subprocess.TimeoutExpired:
                rc = -1
            if rc == 0:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(SSH_POLL_S)
        raise GuestError(f"no SSH after {timeout_s:.0f} s\n{self.console_tail()}")

    def console_tail(self, chars: int = 3000) -> str:
        try:
            text = self.spec.console_log.read_text(errors="replace")
        except OSError:
            return "(no console log)"
        return "console:\n" + text[-chars:]

    def popen(
        self, command: str, log: Path, stdin: bytes | None = None, echo: IO[bytes] | None = None
    ) -> tuple[subprocess.Popen, threading.Thread]:
        """Start ``command`` over SSH; its output goes to ``log`` (and ``echo``) as it comes."""
        proc = subprocess.Popen(
            self.ssh_argv(command),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._children.append(proc)
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.close()

        stdout = proc.stdout
        assert isinstance(stdout, io.BufferedReader)

        def pump() -> None:
            with log.open("ab") as out:
                for chunk in iter(lambda: stdout.read1(65536), b""):
                    out.write(chunk)
                    out.flush()
                    if echo is not None:
                        echo.write(chunk)
                        echo.flush()

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        return proc, t

    def run(
        self,
        command: str,
        log: Path,
        timeout_s: float,
        stdin: bytes | None = None,
        echo: IO[bytes] | None = None,
    ) -> int:
        """Run ``command`` over SSH; its exit status (GuestError past ``timeout_s``)."""
        with log.open("ab") as out:
            out.write(f"\n$ {command}\n".encode())
        proc, pump = self.popen(command, log, stdin, echo)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            self._end(proc)
            raise GuestError(f"{command!r} did not finish in {timeout_s:.0f} s (log: {log})") from e
        pump.join(timeout=10)
        return rc

    def output(self, command: str, timeout_s: float = 60) -> tuple[int, str]:
        try:
            res = subprocess.run(
                self.ssh_argv(command), capture_output=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as e:
            raise GuestError(f"{command!r} did not finish in {timeout_s:.0f} s") from e
        return res.returncode, res.stdout.decode(errors="replace")

    def _end(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def close(self, poweroff_s: float = 30) -> None:
        """Power the guest off (kill QEMU after ``poweroff_s``) and end the SSH clients started."""
        for child in self._children:
            self._end(child)
        if self.proc is None:
            return
        if self.alive():
            try:
                subprocess.run(
                    self.ssh_argv("sudo systemctl poweroff"),
                    capture_output=True,
                    timeout=20,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                pass
            try:
                self.proc.wait(timeout=poweroff_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
