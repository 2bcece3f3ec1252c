"""A throwaway VM with Debian's stock kernel, for what this host's kernel cannot emulate.

``python -m lab.vm -- COMMAND`` boots Debian's ``linux-image-amd64`` kernel (fetched and
unpacked, never installed, by ``lab/setup.sh``) under QEMU, runs COMMAND once in it with
``sh -c``, streams its output and exits with its status. The guest sees this machine's own
files: the host's ``/`` over 9p, read-only, under a tmpfs overlay (so the guest has the host's
Python, iproute2 and the project's venv, and whatever it writes outside the repository is
thrown away), and the repository over a second, writable 9p share, so results (``runs/``)
come back. Nothing is left behind: QEMU is ended, its temporary directory removed.

Boot, in the guest:
1. a busybox initramfs (built here, per run, in Python: no cpio tool needed) loads the
   virtio, 9p and overlay modules from the unpacked package, in dependency order;
2. mounts the host root (``multidevs=remap``: it spans several file systems, whose inode
   numbers would otherwise collide), a tmpfs, the overlay of both, the repository and an
   exchange directory, then ``switch_root``s into the overlay;
3. a second stage (the host's ``/bin/sh``) mounts proc/sys/dev/run/tmp, binds the package's
   ``/lib/modules/<guest version>`` (so the host's ``modprobe`` loads guest modules: the
   host's kernel is a different version), runs COMMAND under a time limit, writes its status
   to the exchange directory, syncs and powers off.

Acceleration: KVM where it works, TCG otherwise. ``/dev/kvm`` can exist while KVM guests hang
at boot (it does on the development machine), so ``auto`` boots a trivial guest with KVM once
(``KVM_PROBE_TIMEOUT_S``) and remembers the verdict per host kernel in the cache.

Cost: under TCG a boot takes ~10 s and guest code runs several times slower than on the host
(``python -m lab.vm --speed`` measures both); keep in-VM work small.
"""

from __future__ import annotations

import argparse
import enum
import os
import platform
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE_DIR = Path(os.environ.get("CREW_VM_CACHE", "/var/cache/crew-lab/vm"))
BUSYBOX_CANDIDATES = (Path("/bin/busybox"), Path("/usr/bin/busybox"))
QEMU = "qemu-system-x86_64"
TCG_CPU = "max,avx=off,avx2=off,fma=off,f16c=off"
# In dependency order: insmod (busybox) does not resolve dependencies.
INITRD_MODULES = (
    "drivers/virtio/virtio_ring",
    "drivers/virtio/virtio",
    "drivers/virtio/virtio_pci_modern_dev",
    "drivers/virtio/virtio_pci_legacy_dev",
    "drivers/virtio/virtio_pci",
    "net/9p/9pnet",
    "net/9p/9pnet_virtio",
    "fs/netfs/netfs",
    "fs/fscache/fscache",
    "fs/9p/9p",
    "fs/overlayfs/overlay",
)
GUEST_XCHG = "/crew-vm"
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MEM_MB = 3072
# After the command's own limit: boot and power-off, generous for TCG on a loaded machine.
BOOT_ALLOWANCE_S = 120.0
KVM_PROBE_TIMEOUT_S = 25.0
MSIZE = 512 * 1024
# Environment passed into the guest (the command line of a test run needs these).
PASS_ENV = ("PYTHONPATH", "PYTHONHASHSEED", "CI", "TERM")
VM_ENV_FLAG = "CREW_IN_VM"


class VmError(Exception):
    """The VM could not be prepared or booted, or the command's status never came back."""


class Accel(enum.Enum):
    AUTO = "auto"
    KVM = "kvm"
    TCG = "tcg"


@dataclass(frozen=True)
class GuestKernel:
    """The unpacked kernel package: ``root`` is where ``dpkg-deb -x`` put it."""

    root: Path
    version: str

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.version}"

    @property
    def modules(self) -> Path:
        return self.root / "lib" / "modules" / self.version


@dataclass(frozen=True)
class VmResult:
    returncode: int
    output: str
    boot_s: float  # from QEMU's start to the command's start
    wall_s: float
    accel: Accel


def find_kernel(cache: Path = CACHE_DIR) -> GuestKernel:
    root = cache / "root"
    found = sorted((root / "boot").glob("vmlinuz-*")) if root.is_dir() else []
    if not found:
        raise VmError(
            f"no guest kernel under {root}/boot: run lab/setup.sh (it downloads "
            "linux-image-amd64 with apt-get download and unpacks it there)"
        )
    kernel = GuestKernel(root, found[-1].name.removeprefix("vmlinuz-"))
    if not (kernel.modules / "modules.dep").is_file():
        raise VmError(f"{kernel.modules}/modules.dep missing: run lab/setup.sh (depmod)")
    return kernel


def find_busybox() -> Path:
    for p in BUSYBOX_CANDIDATES:
        if p.is_file() and _is_static(p):
            return p
    raise VmError("no static busybox (Debian package busybox-static): run lab/setup.sh")


def _is_static(path: Path) -> bool:
    # A dynamic ELF has a PT_INTERP segment naming its loader; that string appears in it.
    with path.open("rb") as f:
        head = f.read(4096)
    return head[:4] == b"\x7fELF" and b"ld-linux" not in head


# -- initramfs ---------------------------------------------------------------------------------


def _cpio_entry(name: str, mode: int, data: bytes = b"", ino: int = 0) -> bytes:
    """One entry of a ``newc`` cpio archive (the format the kernel unpacks as initramfs)."""
    encoded = name.encode() + b"\0"
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0]
    header = b"070701" + b"".join(f"{v:08x}".encode() for v in fields)
    out = header + encoded
    out += b"\0" * (-len(out) % 4)
    out += data
    out += b"\0" * (-len(out) % 4)
    return out


def build_initramfs(
    kernel: GuestKernel,
    init_script: str,
    busybox: Path,
    modules: Sequence[str] = INITRD_MODULES,
) -> bytes:
    """The initramfs: busybox, ``init_script`` as /init, and ``modules`` (paths under the
    kernel's ``kernel/`` folder, without ``.ko``, in load order) under /modules."""
    entries: list[tuple[str, int, bytes]] = [
        ("bin", stat.S_IFDIR | 0o755, b""),
        ("modules", stat.S_IFDIR | 0o755, b""),
        ("bin/busybox", stat.S_IFREG | 0o755, busybox.read_bytes()),
        ("init", stat.S_IFREG | 0o755, init_script.encode()),
    ]
    for mod in modules:
        path = kernel.modules / "kernel" / f"{mod}.ko"
        if not path.is_file():
            raise VmError(f"guest module {path} missing (kernel package {kernel.version})")
        entries.append((f"modules/{Path(mod).name}.ko", stat.S_IFREG | 0o644, path.read_bytes()))
    out = b"".join(_cpio_entry(n, m, d, ino=k + 1) for k, (n, m, d) in enumerate(entries))
    return out + _cpio_entry("TRAILER!!!", 0)


def _init_script(repo: Path) -> str:
    mods = " ".join(Path(m).name for m in INITRD_MODULES)
    opts = f"trans=virtio,version=9p2000.L,msize={MSIZE}"
    r = shlex.quote(str(repo))
    return f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /lower /upper /newroot
mount -t proc proc /proc
mount -t devtmpfs dev /dev
die() {{ echo "crew-vm init: $*" > /dev/ttyS0; echo o > /proc/sysrq-trigger; sleep 60; }}
for m in {mods}; do insmod /modules/$m.ko || die "insmod $m"; done
mount -t 9p -o {opts},ro,cache=loose hostroot /lower || die "mount hostroot"
mount -t tmpfs -o mode=0755 upper /upper || die "mount tmpfs"
mkdir -p /upper/data /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /newroot \\
    || die "mount overlay"
mkdir -p /newroot{r} /newroot{GUEST_XCHG}
mount -t 9p -o {opts},cache=loose repo /newroot{r} || die "mount repo"
mount -t 9p -o {opts},cache=none xchg /newroot{GUEST_XCHG} || die "mount exchange"
umount /proc /dev
exec switch_root /newroot /bin/sh {GUEST_XCHG}/stage2.sh
"""


def _stage2_script(
    kernel: GuestKernel, repo: Path, cwd: Path, command: str, timeout_s: float, env: dict
) -> str:
    q = shlex.quote
    exports = "\n".join(f"export {k}={q(v)}" for k, v in sorted(env.items()))
    # A fresh tmpfs on /run and /tmp, except over the repository's share (a clone in /tmp would
    # vanish under it): there the overlay root's own tmpfs upper layer keeps writes in the guest.
    scratch = "\n".join(
        f"mount -t tmpfs tmpfs {d}"
        for d in ("/run", "/tmp")
        if not Path(repo).is_relative_to(d) and not Path(cwd).is_relative_to(d)
    )
    return f"""# crew-vm stage 2: PID 1 in the overlay root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
{scratch}
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mkdir -p /lib/modules/{kernel.version}
mount --bind {q(str(kernel.modules))} /lib/modules/{kernel.version}
echo 1 > /proc/sys/kernel/sysrq
ip link set lo up
hostname crew-vm
cat /proc/uptime > {GUEST_XCHG}/started
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 {VM_ENV_FLAG}=1
{exports}
cd {q(str(cwd))}
timeout -k 5 {int(timeout_s)} sh -c {q(command)} > {GUEST_XCHG}/out 2>&1 < /dev/null
echo $? > {GUEST_XCHG}/rc.tmp
sync
cd /
umount {q(str(repo))} 2>/dev/null
mv {GUEST_XCHG}/rc.tmp {GUEST_XCHG}/rc
echo o > /proc/sysrq-trigger
sleep 30
"""


# -- QEMU --------------------------------------------------------------------------------------


def qemu_machine_argv(
    accel: Accel,
    *,
    smp: int,
    mem_mb: int,
    kernel: Path,
    initrd: Path,
    append: str,
    console_log: Path,
) -> list[str]:
    """The machine every lab guest runs on: a PC with no display, devices or config files of
    QEMU's own, ``kernel`` and ``initrd`` booted directly with ``append``, the serial console
    written to ``console_log``, no monitor. Disks, shares and networks are the caller's."""
    if accel is Accel.KVM:
        accel_args = ["-accel", "kvm", "-cpu", "host"]
    else:
        # Software emulation's AVX and AVX2 are new in this QEMU (7.2) and not yet sound: a
        # guest's numpy sort crashed in them once in a few thousand tests. Without them the
        # guest's libraries take their SSE4 paths, which TCG has run for years.
        accel_args = ["-accel", "tcg,thread=multi", "-cpu", TCG_CPU]
    return [
        QEMU,
        "-nodefaults",
        "-no-user-config",
        "-nographic",
        "-no-reboot",
        "-machine",
        "pc",
        *accel_args,
        "-smp",
        str(smp),
        "-m",
        str(mem_mb),
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        append,
        "-serial",
        f"file:{console_log}",
        "-monitor",
        "none",
    ]


def _qemu_argv(
    kernel: GuestKernel, initrd: Path, xchg: Path, repo: Path, accel: Accel, mem_mb: int, smp: int
) -> list[str]:
    def share(tag: str, path: Path, *extra: str) -> list[str]:
        fsdev = ",".join(
            [f"local,id={tag},path={path}", "security_model=passthrough", "multidevs=remap", *extra]
        )
        return ["-fsdev", fsdev, "-device", f"virtio-9p-pci,fsdev={tag},mount_tag={tag}"]

    return [
        *qemu_machine_argv(
            accel,
            smp=smp,
            mem_mb=mem_mb,
            kernel=kernel.vmlinuz,
            initrd=initrd,
            append="console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off tsc=reliable",
            console_log=xchg / "console.log",
        ),
        *share("hostroot", Path("/"), "readonly=on"),
        *share("repo", repo),
        *share("xchg", xchg),
    ]


def _accel_cache_file(cache: Path) -> Path:
    return cache / f"accel-{platform.release()}"


def choose_accel(requested: Accel, cache: Path = CACHE_DIR) -> Accel:
    """KVM if asked, or if ``auto`` and a probe boot with KVM once finished; TCG otherwise."""
    if requested is not Accel.AUTO:
        return requested
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return Accel.TCG
    verdict = _accel_cache_file(cache)
    if verdict.is_file():
        return Accel(verdict.read_text().strip())
    try:
        res = run_in_vm("true", accel=Accel.KVM, timeout_s=5, boot_allowance_s=KVM_PROBE_TIMEOUT_S)
        chosen = Accel.KVM if res.returncode == 0 else Accel.TCG
    except VmError:
        chosen = Accel.TCG
    try:
        verdict.write_text(chosen.value + "\n")
    except OSError:
        pass
    return chosen


def run_in_vm(
    command: str,
    *,
    cwd: Path | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    accel: Accel = Accel.AUTO,
    mem_mb: int = DEFAULT_MEM_MB,
    smp: int | None = None,
    env: dict[str, str] | None = None,
    stream: bool = False,
    boot_allowance_s: float = BOOT_ALLOWANCE_S,
    repo: Path = REPO,
) -> VmResult:
    """Boot the VM, run ``command`` (``sh -c``) in ``cwd`` (default: the repo), return its
    status and output. ``stream`` copies the output to stdout as it comes. Raises VmError when
    the VM fails before the command's status is known (its console's tail in the message)."""
    if os.geteuid() != 0:
        raise VmError("lab.vm needs root (9p passthrough of the host's root file system)")
    if shutil.which(QEMU) is None:
        raise VmError(f"{QEMU} not found (Debian package qemu-system-x86): run lab/setup.sh")
    kernel = find_kernel()
    busybox = find_busybox()
    accel = choose_accel(accel)
    cwd = (cwd or repo).resolve()
    smp = smp or min(2, os.cpu_count() or 1)
    full_env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    full_env.update(env or {})
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="crew-vm-") as tmp:
        tmpdir = Path(tmp)
        xchg = tmpdir / "xchg"
        xchg.mkdir()
        initrd = tmpdir / "initrd.cpio"
        initrd.write_bytes(build_initramfs(kernel, _init_script(repo), busybox))
        (xchg / "stage2.sh").write_text(
            _stage2_script(kernel, repo, cwd, command, timeout_s, full_env)
        )
        argv = _qemu_argv(kernel, initrd, xchg, repo, accel, mem_mb, smp)
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = start + timeout_s + boot_allowance_s
        out_path, rc_path = xchg / "out", xchg / "rc"
        printed = 0
        boot_s = float("nan")
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                if boot_s != boot_s and (xchg / "started").exists():
                    boot_s = time.monotonic() - start
                if stream and out_path.exists():
                    printed = _copy_new(out_path, printed)
                if rc_path.exists():
                    # Power-off follows at once; give QEMU a moment to exit on its own.
                    _wait(proc, 10.0)
                    break
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            qemu_out = proc.communicate(timeout=10)[0].decode(errors="replace")
        if stream and out_path.exists():
            _copy_new(out_path, printed)
        output = out_path.read_text(errors="replace") if out_path.exists() else ""
        if not rc_path.exists():
            console = (xchg / "console.log").read_text(errors="replace")[-3000:]
            what = "timed out" if time.monotonic() >= deadline else "stopped"
            raise VmError(
                f"VM ({accel.value}) {what} after {time.monotonic() - start:.0f} s without the "
                f"command's status.\nQEMU: {qemu_out.strip()[-1000:]}\nconsole:\n{console}"
                f"\noutput:\n{output[-2000:]}"
            )
        rc = int(rc_path.read_text().strip() or 255)
    return VmResult(rc, output, boot_s, time.monotonic() - start, accel)


def _wait(proc: subprocess.Popen, timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass


def _copy_new(path: Path, offset: int) -> int:
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    if data:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return offset + len(data)


SPEED_SNIPPET = (
    "import time; t=time.perf_counter(); s=0\n"
    "for i in range(3_000_000): s += i * i\n"
    "print(f'{time.perf_counter() - t:.3f}')"
)


def cpu_seconds_here() -> float:
    out = subprocess.run(
        [sys.executable, "-c", SPEED_SNIPPET], capture_output=True, text=True, check=True
    ).stdout
    return float(out.strip())


def main(argv: Sequence[str] | None = None) -> int:
    # Imported here: lab/setup.sh judges the guest kernel with this module under the
    # distribution's Python, before the venv (and numpy, which crew.config needs) exists.
    from crew.cli_options import command_parser

    ap = command_parser(
        "python -m lab.vm",
        "Run one command in a throwaway VM with Debian's stock kernel "
        "(host root read-only under a tmpfs overlay, the repository writable).",
    )
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="command limit, s")
    ap.add_argument("--accel", choices=[a.value for a in Accel], default=Accel.AUTO.value)
    ap.add_argument("--mem", type=int, default=DEFAULT_MEM_MB, help="guest memory, MiB")
    ap.add_argument("--smp", type=int, default=None, help="guest CPUs (default: up to 2)")
    ap.add_argument(
        "--speed",
        action="store_true",
        help="measure boot time and the guest's CPU speed against the host's, then exit",
    )
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        if args.speed:
            host = cpu_seconds_here()
            py = shlex.quote(sys.executable)
            res = run_in_vm(
                f"{py} -c {shlex.quote(SPEED_SNIPPET)}", accel=Accel(args.accel), timeout_s=120
            )
            guest = float(res.output.strip().splitlines()[-1])
            print(
                f"accel {res.accel.value}: boot {res.boot_s:.1f} s, whole run {res.wall_s:.1f} s;"
                f" python loop {guest:.3f} s in the guest, {host:.3f} s on the host "
                f"({guest / host:.1f}x slower)"
            )
            return 0
        if not cmd:
            ap.error("no command: python -m lab.vm -- COMMAND")
        command = cmd[0] if len(cmd) == 1 else shlex.join(cmd)
        res = run_in_vm(
            command,
            cwd=Path.cwd() if Path.cwd().is_relative_to(REPO) else REPO,
            timeout_s=args.timeout,
            accel=Accel(args.accel),
            mem_mb=args.mem,
            smp=args.smp,
            stream=True,
        )
    except VmError as e:
        print(f"lab.vm: {e}", file=sys.stderr)
        return 3
    print(
        f"lab.vm: exit {res.returncode} ({res.accel.value}, boot {res.boot_s:.1f} s, "
        f"{res.wall_s:.1f} s in all)",
        file=sys.stderr,
    )
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
