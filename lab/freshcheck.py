"""Prove the lab's set-up on a fresh machine, as ``vagrant up`` would provision it.

``python -m lab.freshcheck`` (as root) builds a clean Debian 12 machine from Debian's packages,
boots it under QEMU as ``lab.vm`` boots its guest, copies the project in at ``/vagrant``, runs
the Vagrantfile's own shell provisioning unchanged (read from the Vagrantfile, so the two
cannot drift apart), then in the guest runs ``sudo python -m lab.run --duration 30`` with the
dashboard, checks the dashboard's health URL through the Vagrantfile's forwarded port, and runs
the README's quick test command. It prints each step's wall time and a verdict; the exit status
is 0 only when every step passed.

Steps (``--stop-after`` ends after any of them):
  project      the project's files: ``git archive`` of HEAD (``--source worktree``: the working
               tree's tracked files, uncommitted changes included); the Vagrantfile and README
               are read from this copy
  wheelhouse   ``pip download`` of the project's packages here, served to the guest over HTTP
               on the host's loopback (the guest's /etc/pip.conf points at it; see --pip)
  root         Debian 12 (bookworm) from Debian's archive with mmdebstrap: systemd, udev,
               sudo, OpenSSH, ifupdown/DHCP, ca-certificates, a ``vagrant`` user with
               password-less sudo and this run's SSH key, and the guest kernel's modules
  image        a sparse ext4 disk image of that root (``mkfs.ext4 -d``)
  boot         QEMU with lab.vm's kernel and a busybox initramfs that mounts the disk and starts
               its systemd; done when SSH answers
  copy         the project into /vagrant over SSH (as Vagrant's rsync folder sync does)
  provision    each shell provisioner of the Vagrantfile, as Vagrant 2.x runs it: the script
               uploaded to /tmp/vagrant-shell, run by ``sudo -E -H bash -l`` as root
  lab-run      ``cd /vagrant && sudo python -m lab.run --duration 30`` as the vagrant user;
               the dashboard's /_stcore/health must answer "ok" through the forwarded port
  quick-tests  the command in the README's fenced block after ``<!-- quick-tests -->``
               (until there is one: ``python -m pytest -q -m "not slow"``), as root in /vagrant

The guest reaches Debian's archive directly (apt); Python packages come from the wheelhouse.
Everything runs in a new work folder under --cache-dir/runs; the disk image and root are
removed at the end unless --keep, the logs are kept. Only processes this command started are
ended. Under TCG (software emulation) on two cores the steps up to the lab run take about
15 minutes, most of it the provisioning; the tests take what they take, several times their
time on the host.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from crew.cli_options import command_parser
from lab.fresh import rootfs, wheelhouse
from lab.fresh.guest import Forward, Guest, GuestError, MachineSpec, free_port, write_initrd
from lab.fresh.readme import FALLBACK_COMMAND, ReadmeError, load_quick_test_command
from lab.fresh.vagrantfile import (
    ShellProvisioner,
    Vagrantfile,
    VagrantfileError,
    describe,
    load_vagrantfile,
)
from lab.vm import Accel, VmError, choose_accel, find_busybox, find_kernel

REPO = Path(__file__).resolve().parent.parent
STEPS = (
    "project",
    "wheelhouse",
    "root",
    "image",
    "boot",
    "copy",
    "provision",
    "lab-run",
    "quick-tests",
)
RESUMABLE = ("copy", "provision", "lab-run", "quick-tests")
DEFAULT_CACHE = Path(os.environ.get("CREW_FRESH_CACHE", "/var/cache/crew-lab/fresh"))
DEFAULT_TIMEOUT_S = 7200.0
DEFAULT_DURATION_S = 30.0
DEFAULT_DISK_GB = 16
# When the Vagrantfile's libvirt provider does not say.
FALLBACK_MEMORY_MB = 4096
FALLBACK_CPUS = 2
FALLBACK_DASHBOARD_PORT = 8501
BOOT_TIMEOUT_S = 600.0
HEALTH_PATH = "/_stcore/health"
HEALTH_POLL_S = 1.0
SUMMARY_IN_GUEST = "/tmp/freshcheck-summary.json"
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class FreshError(RuntimeError):
    """A step failed; the message says which and why."""


@dataclass
class StepResult:
    name: str
    seconds: float
    ok: bool
    note: str = ""


@dataclass
class Report:
    steps: list[StepResult] = field(default_factory=list)

    def add(self, r: StepResult) -> None:
        self.steps.append(r)
        mark = "ok" if r.ok else "FAILED"
        note = f"  {r.note}" if r.note else ""
        print(f"[freshcheck] {r.name:<12} {r.seconds:8.1f} s  {mark}{note}", flush=True)

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.ok for s in self.steps)

    def table(self) -> str:
        rows = [f"{'step':<12} {'wall time':>10}  result"]
        for s in self.steps:
            rows.append(f"{s.name:<12} {s.seconds:>8.1f} s  {'ok' if s.ok else 'FAILED'}")
        total = sum(s.seconds for s in self.steps)
        rows.append(f"{'total':<12} {total:>8.1f} s")
        return "\n".join(rows)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap: float | None = None) -> float:
        left = max(1.0, self.end - time.monotonic())
        return min(left, cap) if cap is not None else left

    def passed(self) -> bool:
        return time.monotonic() >= self.end


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = command_parser("python -m lab.freshcheck", __doc__)
    ap.add_argument(
        "--source",
        choices=("head", "worktree"),
        default="head",
        help="what to copy in: git archive of HEAD (default), or the working tree's tracked "
        "files with their uncommitted changes",
    )
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE,
        help=f"kept between runs: Debian packages, the wheelhouse, each run's folder "
        f"(default {DEFAULT_CACHE}, or $CREW_FRESH_CACHE)",
    )
    ap.add_argument(
        "--memory",
        type=int,
        default=None,
        help="guest memory, MiB (default: the Vagrantfile's libvirt provider's, else "
        f"{FALLBACK_MEMORY_MB})",
    )
    ap.add_argument(
        "--cpus",
        type=int,
        default=None,
        help=f"guest CPUs (default: the Vagrantfile's libvirt provider's, else {FALLBACK_CPUS})",
    )
    ap.add_argument(
        "--accel",
        choices=[a.value for a in Accel],
        default=Accel.AUTO.value,
        help="QEMU acceleration; auto takes lab.vm's verdict (KVM only where a KVM guest boots)",
    )
    ap.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="limit for the whole check, s"
    )
    ap.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION_S,
        help="lab.run's --duration in the guest, s (default 30)",
    )
    ap.add_argument(
        "--disk-gb", type=int, default=DEFAULT_DISK_GB, help="guest disk size (sparse), GiB"
    )
    ap.add_argument(
        "--pip",
        choices=("wheelhouse", "direct"),
        default="wheelhouse",
        help="wheelhouse (default): the guest's pip takes packages only from a wheelhouse "
        "downloaded here; direct: the guest's pip uses the indexes the provisioning names",
    )
    ap.add_argument(
        "--stop-after", choices=STEPS, default=None, help="end (successfully) after this step"
    )
    ap.add_argument(
        "--image",
        type=Path,
        default=None,
        help="boot this image (one kept by --keep) instead of building one; never removed",
    )
    ap.add_argument(
        "--start-at",
        choices=RESUMABLE,
        default="copy",
        help="with --image: the first step to run after boot (default copy)",
    )
    ap.add_argument(
        "--keep", action="store_true", help="keep the disk image and root folder for debugging"
    )
    ap.add_argument(
        "--lock",
        type=Path,
        default=None,
        help="hold an exclusive flock on this file while the guest runs (waits for it before "
        "boot), so heavy jobs sharing a machine's CPUs take turns",
    )
    ap.add_argument(
        "--tests",
        default=None,
        metavar="COMMAND",
        help="run COMMAND (as root in /vagrant) instead of the README's quick test command",
    )
    ap.add_argument("--quiet", action="store_true", help="do not echo the guest's output")
    args = ap.parse_args(argv)
    for name in ("memory", "cpus", "disk_gb"):
        v = getattr(args, name)
        if v is not None and v < 1:
            ap.error(f"--{name.replace('_', '-')}: must be at least 1, got {v}")
    if args.timeout <= 0 or args.duration <= 0:
        ap.error("--timeout and --duration must be positive")
    if args.image is not None and not args.image.is_file():
        ap.error(f"--image: {args.image} is not a file")
    if args.image is None and "--start-at" in (argv if argv is not None else sys.argv):
        ap.error("--start-at needs --image")
    if args.image is not None and args.stop_after in STEPS[: STEPS.index("boot")]:
        ap.error(f"--stop-after {args.stop_after}: with --image the steps before boot are skipped")
    return args


def plan_steps(args: argparse.Namespace) -> list[str]:
    """The steps this invocation runs, in order."""
    if args.image is not None:
        first = STEPS.index(args.start_at)
        steps = ["project", "wheelhouse", "boot", *STEPS[first:]]
    else:
        steps = list(STEPS)
    if args.pip == "direct":
        steps.remove("wheelhouse")
    if args.stop_after is not None and args.stop_after in steps:
        steps = steps[: steps.index(args.stop_after) + 1]
    return steps


def guest_size(args: argparse.Namespace, vf: Vagrantfile) -> tuple[int, int]:
    memory, cpus = vf.size("libvirt")
    return (
        args.memory or memory or FALLBACK_MEMORY_MB,
        args.cpus or cpus or FALLBACK_CPUS,
    )


def dashboard_guest_port(vf: Vagrantfile) -> int:
    """The guest port the Vagrantfile forwards for the dashboard (the first forward)."""
    return vf.forwarded_ports[0].guest if vf.forwarded_ports else FALLBACK_DASHBOARD_PORT


@contextlib.contextmanager
def step(report: Report, name: str) -> Iterator[list[str]]:
    """Time a step; a FreshError (or any error) inside marks it failed and propagates."""
    notes: list[str] = []
    t0 = time.monotonic()
    try:
        yield notes
    except BaseException as e:
        report.add(StepResult(name, time.monotonic() - t0, False, str(e).splitlines()[0][:150]))
        raise
    report.add(StepResult(name, time.monotonic() - t0, True, "; ".join(notes)))


def export_project(source: str, dest: Path, log: Path) -> str:
    """The project's files into ``dest`` from git; returns the commit (or tree) exported."""
    git = ["git", "-C", str(REPO)]
    treeish = "HEAD"
    if source == "worktree":
        made = subprocess.run([*git, "stash", "create"], capture_output=True, text=True)
        treeish = made.stdout.strip() or "HEAD"
    rev = subprocess.run(
        [*git, "rev-parse", "--short", treeish], capture_output=True, text=True, check=False
    )
    if rev.returncode != 0:
        raise FreshError(f"git rev-parse {treeish}: {rev.stderr.strip()}")
    dest.mkdir(parents=True)
    with log.open("ab") as out:
        archive = subprocess.Popen(
            [*git, "archive", "--format=tar", treeish], stdout=subprocess.PIPE
        )
        untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, stderr=out)
        assert archive.stdout is not None
        archive.stdout.close()
        if archive.wait(timeout=120) != 0 or untar.returncode != 0:
            raise FreshError(f"git archive {treeish} | tar -x failed (log: {log})")
    return rev.stdout.strip()


@contextlib.contextmanager
def hold_lock(path: Path, deadline: Deadline) -> Iterator[None]:
    """An exclusive flock on ``path`` until the block ends. The wait blocks in the kernel (so
    this waiter is woken like any other) and is cut by an alarm at the deadline."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError

    with path.open("a") as f:
        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, deadline.left())
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except TimeoutError:
            raise FreshError(f"the lock {path} stayed taken until the deadline") from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def check_health(url: str, timeout_s: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 (loopback URL)
            return r.status == 200 and r.read(64).strip() == b"ok"
    except (urllib.error.URLError, OSError):
        return False


def lab_run(
    guest: Guest,
    dash_host_port: int,
    duration: float,
    log: Path,
    deadline: Deadline,
    echo: IO[bytes] | None,
) -> tuple[float, dict]:
    """lab.run in the guest while the host polls the dashboard's health through the forward.
    Returns (seconds until healthy, the run's summary)."""
    command = (
        f"cd /vagrant && sudo python -m lab.run --duration {duration:g} "
        f"--summary-json {SUMMARY_IN_GUEST}"
    )
    with log.open("ab") as out:
        out.write(f"\n$ {command}\n".encode())
    url = f"http://127.0.0.1:{dash_host_port}{HEALTH_PATH}"
    t0 = time.monotonic()
    proc, pump = guest.popen(command, log, echo=echo)
    healthy_at = None
    limit = deadline.left()
    for _ in range(int(limit / HEALTH_POLL_S) + 1):
        if proc.poll() is not None or time.monotonic() - t0 > limit:
            break
        if healthy_at is None and check_health(url):
            healthy_at = time.monotonic() - t0
        time.sleep(HEALTH_POLL_S)
    try:
        rc = proc.wait(timeout=max(1.0, limit - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired as e:
        raise FreshError(f"lab.run did not end within {limit:.0f} s (log: {log})") from e
    pump.join(timeout=10)
    if rc != 0:
        raise FreshError(f"lab.run exited {rc} (log: {log})")
    if healthy_at is None:
        raise FreshError(f"the dashboard never answered 'ok' on {HEALTH_PATH} during the run")
    status, text = guest.output(f"cat {SUMMARY_IN_GUEST}")
    if status != 0:
        raise FreshError(f"lab.run wrote no summary ({SUMMARY_IN_GUEST})")
    return healthy_at, json.loads(text)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("lab.freshcheck needs root (mmdebstrap, chroot, image ownership)", file=sys.stderr)
        return EXIT_BAD_INPUT
    missing = [
        t
        for t in ("mmdebstrap", "mkfs.ext4", "ssh", "ssh-keygen", "git", "tar", "nice")
        if shutil.which(t) is None
    ]
    if missing:
        print(
            f"lab.freshcheck: missing tools: {', '.join(missing)} (Debian packages mmdebstrap, "
            "e2fsprogs, openssh-client, git)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    try:
        kernel, busybox = find_kernel(), find_busybox()
        accel = choose_accel(Accel(args.accel))
    except VmError as e:
        print(f"lab.freshcheck: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    deadline = Deadline(args.timeout)
    runs = args.cache_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    work = runs / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir()
    logs = work / "logs"
    logs.mkdir()
    echo = None if args.quiet else sys.stdout.buffer
    steps = plan_steps(args)
    report = Report()
    created: list[Path] = []
    guest: Guest | None = None
    print(f"[freshcheck] work folder {work}; steps: {' '.join(steps)}; accel {accel.value}")
    try:
        project = work / "project"
        created.append(project)
        with step(report, "project") as notes:
            rev = export_project(args.source, project, logs / "project.log")
            vf = load_vagrantfile(project / "Vagrantfile")
            if not vf.provisioners:
                raise FreshError("the Vagrantfile has no shell provisioner to run")
            quick, from_readme = load_quick_test_command(project / "README.md")
            if args.tests is not None:
                quick, from_readme = args.tests, True
            notes.append(f"{args.source} {rev}, {len(vf.provisioners)} provisioner(s)")
        for p in vf.provisioners:
            print(f"[freshcheck] provisioner {describe(p)}")
        if not from_readme:
            print(
                "[freshcheck] the README has no <!-- quick-tests --> block yet; quick tests "
                f"fall back to: {FALLBACK_COMMAND}"
            )
        print(f"[freshcheck] quick tests: {quick}" + (" (--tests)" if args.tests else ""))
        if steps[-1] == "project":
            return _finish(report, work, created, args.keep, steps)
        memory, cpus = guest_size(args, vf)
        dash_guest = dashboard_guest_port(vf)
        pip_conf = None
        server = None
        stack = contextlib.ExitStack()
        if "wheelhouse" in steps:
            with step(report, "wheelhouse") as notes:
                n = wheelhouse.download(
                    project,
                    args.cache_dir / "wheelhouse",
                    logs / "wheelhouse.log",
                    timeout_s=deadline.left(1800),
                )
                server = stack.enter_context(wheelhouse.WheelServer(args.cache_dir / "wheelhouse"))
                pip_conf = wheelhouse.guest_pip_conf(server.guest_url())
                notes.append(f"{n} files, served at {server.guest_url()}")
            if steps[-1] == "wheelhouse":
                return _finish(report, work, created, args.keep, steps)
        with stack:
            if args.image is None:
                key = work / "id_ed25519"
                created += [key, key.with_suffix(".pub")]
                subprocess.run(
                    [
                        "ssh-keygen",
                        "-q",
                        "-t",
                        "ed25519",
                        "-N",
                        "",
                        "-C",
                        "freshcheck",
                        "-f",
                        str(key),
                    ],
                    check=True,
                )
            else:
                key = args.image.resolve().parent / "id_ed25519"
                if not key.is_file():
                    raise FreshError(
                        f"--image: no SSH key {key} beside the image (--keep keeps it)"
                    )
            if args.image is None:
                root = work / "root"
                image = work / "disk.img"
                created += [root, image]
                with step(report, "root") as notes:
                    rootfs.build_root(
                        root, args.cache_dir / "debs", logs / "root.log", deadline.left(1200)
                    )
                    ident = rootfs.MachineIdentity(
                        vf.hostname or "freshcheck", key.with_suffix(".pub").read_text()
                    )
                    rootfs.customize_root(
                        root, kernel.modules, kernel.version, ident, logs / "root.log"
                    )
                    notes.append(f"Debian {(root / 'etc/debian_version').read_text().strip()}")
                if "image" not in steps:
                    return _finish(report, work, created, args.keep, steps)
                with step(report, "image") as notes:
                    rootfs.make_image(root, image, args.disk_gb, logs / "image.log")
                    shutil.rmtree(root)
                    notes.append(f"{args.disk_gb} GiB sparse, {_used_mb(image)} MiB used")
            else:
                image = args.image.resolve()
            if "boot" not in steps:
                return _finish(report, work, created, args.keep, steps)
            initrd = work / "initrd.cpio"
            created.append(initrd)
            write_initrd(kernel, busybox, initrd)
            dash_host = free_port()
            ssh_port = free_port()
            spec = MachineSpec(
                kernel,
                initrd,
                image,
                logs / "console.log",
                memory,
                cpus,
                accel,
                (Forward(ssh_port, 22), Forward(dash_host, dash_guest)),
            )
            guest = Guest(spec, key, ssh_port)
            if args.lock is not None:
                print(f"[freshcheck] waiting for the lock {args.lock}", flush=True)
                stack.enter_context(hold_lock(args.lock, deadline))
            stack.callback(guest.close)  # before the lock is released (the stack unwinds LIFO)
            with step(report, "boot") as notes:
                guest.start()
                guest.wait_for_ssh(deadline.left(BOOT_TIMEOUT_S))
                if pip_conf is not None:
                    # The wheelhouse's address changes per run: written now, not in the image.
                    rc = guest.run(
                        "sudo tee /etc/pip.conf >/dev/null",
                        logs / "boot.log",
                        60,
                        stdin=pip_conf.encode(),
                    )
                    if rc != 0:
                        raise FreshError("cannot write the guest's /etc/pip.conf")
                notes.append(
                    f"{memory} MiB, {cpus} CPUs, {accel.value}; ssh 127.0.0.1:{ssh_port}, "
                    f"dashboard 127.0.0.1:{dash_host} -> {dash_guest}"
                )
            if "copy" in steps:
                with step(report, "copy") as notes:
                    tar = subprocess.run(
                        ["tar", "-C", str(project), "-cf", "-", "."],
                        capture_output=True,
                        check=True,
                    ).stdout
                    rc = guest.run(
                        "tar -x -C /vagrant", logs / "copy.log", deadline.left(600), stdin=tar
                    )
                    if rc != 0:
                        raise FreshError(f"copying the project in failed (exit {rc})")
                    notes.append(f"{len(tar) / 1e6:.1f} MB")
            if "provision" in steps:
                with step(report, "provision") as notes:
                    for p in vf.provisioners:
                        _provision(guest, p, logs / "provision.log", deadline, echo)
                    notes.append(f"{len(vf.provisioners)} provisioner(s), exit 0")
            if "lab-run" in steps:
                with step(report, "lab-run") as notes:
                    healthy, summary = lab_run(
                        guest, dash_host, args.duration, logs / "lab-run.log", deadline, echo
                    )
                    notes.append(
                        f"dashboard healthy after {healthy:.0f} s; "
                        f"{summary.get('groups_completed')} groups completed"
                    )
            if "quick-tests" in steps:
                with step(report, "quick-tests") as notes:
                    cmd = f"sudo -H bash -lc {shlex.quote('cd /vagrant && ' + quick)}"
                    rc = guest.run(cmd, logs / "quick-tests.log", deadline.left(), echo=echo)
                    if rc != 0:
                        raise FreshError(f"{quick!r} exited {rc} (log: {logs / 'quick-tests.log'})")
                    notes.append(_pytest_tail(logs / "quick-tests.log"))
            return _finish(report, work, created, args.keep, steps)
    except (
        FreshError,
        GuestError,
        VagrantfileError,
        ReadmeError,
        rootfs.RootfsError,
        wheelhouse.WheelhouseError,
        subprocess.CalledProcessError,
    ) as e:
        print(f"[freshcheck] FAILED: {e}", file=sys.stderr)
        _finish(report, work, created, args.keep, steps)
        return EXIT_FAILED
    except KeyboardInterrupt:
        # Ctrl-C: the guest and QEMU are ended below, the files removed as on failure.
        print("[freshcheck] interrupted", file=sys.stderr)
        _finish(report, work, created, args.keep, steps)
        return EXIT_FAILED
    finally:
        if guest is not None:
            guest.close()
        if not args.keep:
            for path in created:
                _remove(path)


def _provision(
    guest: Guest, p: ShellProvisioner, log: Path, deadline: Deadline, echo: IO[bytes] | None
) -> None:
    """One shell provisioner, as Vagrant runs it (see lab.fresh.vagrantfile)."""
    rc = guest.run(f"cat > {shlex.quote(p.upload_path)}", log, 60, stdin=p.script.encode())
    if rc != 0:
        raise FreshError(f"uploading the script to {p.upload_path} failed (exit {rc})")
    guest.run(f"sudo chown -R vagrant {shlex.quote(p.upload_path)}", log, 60)
    rc = guest.run(
        p.shell(), log, deadline.left(), stdin=f"{p.command()}\nexit\n".encode(), echo=echo
    )
    if rc != 0:
        raise FreshError(
            f"provisioner {p.name} (Vagrantfile line {p.line}) exited {rc} (log: {log})"
        )


def _used_mb(image: Path) -> int:
    return os.stat(image).st_blocks * 512 // 2**20


def _pytest_tail(log: Path) -> str:
    lines = [s for s in log.read_text(errors="replace").splitlines() if s.strip()]
    return lines[-1].strip("= ")[:120] if lines else ""


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists():
        p.unlink()


def _finish(report: Report, work: Path, created: list[Path], keep: bool, planned: list[str]) -> int:
    """Print the table and verdict: a pass needs every planned step to have run and passed."""
    print()
    print(report.table())
    passed = report.ok and [s.name for s in report.steps] == planned
    verdict = "PASS" if passed else "FAIL"
    kept = [str(p) for p in created if p.exists()] if keep else []
    print(
        f"[freshcheck] {verdict}; logs in {work / 'logs'}"
        + (f"; kept {', '.join(kept)}" if kept else "")
    )
    return 0 if passed else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
