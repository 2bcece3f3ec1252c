#!/usr/bin/env bash
# One-command, idempotent set-up of CREW Lab, for a plain Debian/Ubuntu host and the Vagrant VM.
# Run as root from anywhere:  sudo lab/setup.sh
# Supported: Debian 12, Ubuntu 22.04 and Ubuntu 24.04 (read from /etc/os-release).
#
# Installs the distribution packages the lab calls, fetches the guest kernel for lab.vm, creates
# .venv in the repo root with the project and its test extras, makes the distribution's mininet
# module (only that one) importable from .venv, and writes /usr/local/bin/python, a wrapper of
# .venv's interpreter, so that `sudo python -m lab.run` works as written (Ubuntu 24.04 has no
# `python` command at all).
#
# Environment:
#   LAB_TORCH_INDEX   extra pip index for torch (searched besides pip's configured sources)
#   LAB_TORCH_CPU_INDEX  where the CPU build (torch==2.13.0+cpu) comes from when pip's sources
#                     lack it (default: PyTorch's CPU wheel index)
#   LAB_TORCH_CUDA    set to 1 to install the default torch==2.13.0 build (CUDA on Linux,
#                     several GB) instead of the CPU build the lab needs
#   LAB_LINK_PYTHON   set to 0 to leave /usr/local/bin/python alone (default 1)
#   LAB_DASHBOARD_HOST  default address the dashboard binds when started through that link
#                     (the Vagrant VM sets 0.0.0.0 so its port forward, bound to the host's
#                     127.0.0.1 only, reaches it)
#   CREW_VM_CACHE     where the guest kernel is unpacked (default /var/cache/crew-lab/vm)
#   LAB_SETUP_SYSROOT for the script's own tests: a directory standing in for / wherever the
#                     script reads or writes system files (etc/os-release, usr/bin/python3*,
#                     usr/local/bin/python, var/cache/crew-lab/vm); the tests put stub apt,
#                     dpkg and kernel commands first on PATH. Set, it also skips the root check.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
SYSROOT="${LAB_SETUP_SYSROOT:-}"
log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

if [[ -z "$SYSROOT" && $EUID -ne 0 ]]; then
    echo "lab/setup.sh must run as root (it installs distribution packages): sudo $0" >&2
    exit 1
fi

# -- the distribution ----------------------------------------------------------------------------
# os-release is shell syntax (KEY=value); it is read in a subshell so that its names stay there.
OS_ID="" OS_LIKE="" OS_VERSION="" OS_NAME="an unknown distribution"
if [[ -r "$SYSROOT/etc/os-release" ]]; then
    eval "$(
        # shellcheck disable=SC1091
        . "$SYSROOT/etc/os-release"
        printf 'OS_ID=%q OS_LIKE=%q OS_VERSION=%q OS_NAME=%q\n' \
            "${ID:-}" "${ID_LIKE:-}" "${VERSION_ID:-}" "${PRETTY_NAME:-${ID:-unknown}}"
    )"
fi
is_ubuntu() { [[ "$OS_ID" == ubuntu || " $OS_LIKE " == *" ubuntu "* ]]; }
log "distribution: $OS_NAME"
case "$OS_ID $OS_VERSION" in
    "debian 12" | "ubuntu 22.04" | "ubuntu 24.04") ;;
    *) log "untested distribution (tested: Debian 12, Ubuntu 22.04 and 24.04); trying anyway" ;;
esac

# The project needs Python 3.11 or newer. Ubuntu 22.04's python3 is 3.10: there the venv is made
# from the python3.11 package (universe), which reads the same dist-packages mininet module.
PY_NAME=python3
if is_ubuntu && [[ "$OS_VERSION" == 22.04 ]]; then
    PY_NAME=python3.11
fi
PY="$SYSROOT/usr/bin/$PY_NAME"

DEB_PACKAGES=(
    mininet          # mnexec and the pure-Python mininet module
    iproute2         # ip, tc
    iputils-ping     # RTT and loss probes (lab.studies.impairments, lab.check)
    iptables         # loss emulation without netem (statistic match)
    ethtool          # offload settings on the emulated links
    kmod             # modprobe, to load sch_htb / sch_netem where they are modules
    procps
    "$PY_NAME" "$PY_NAME-venv" "$PY_NAME-dev"
    ca-certificates
    qemu-system-x86  # lab.vm: a throwaway VM with the distribution's kernel, for the VM tests
    busybox-static   # lab.vm's initramfs
)
if is_ubuntu; then
    # Ubuntu's kernel modules are zstd-compressed; lab.vm's initramfs loads plain .ko files.
    DEB_PACKAGES+=(zstd)
    # The dashboard's end-to-end test drives Debian's chromium. Ubuntu ships it only as a snap,
    # which a provisioning script should not pull in.
    log "not installing chromium: Ubuntu ships it only as a snap; the dashboard's browser test" \
        "will skip"
else
    DEB_PACKAGES+=(chromium)
fi
log "installing packages: ${DEB_PACKAGES[*]}"
export DEBIAN_FRONTEND=noninteractive
missing=()
for pkg in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
if ((${#missing[@]})); then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" || {
        is_ubuntu && echo "lab/setup.sh: on Ubuntu, mininet (and python3.11 on 22.04) come from" \
            "the universe component: add-apt-repository universe, then run lab/setup.sh again" >&2
        exit 1
    }
fi
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "lab/setup.sh: $PY is older than Python 3.11, which the project needs" >&2; exit 1; }

# Ubuntu ships sch_netem in linux-modules-extra; try it where the module is missing.
if ! modprobe -q sch_netem 2>/dev/null; then
    extra="linux-modules-extra-$(uname -r)"
    if apt-cache show "$extra" >/dev/null 2>&1; then
        log "sch_netem not loadable; installing $extra"
        apt-get install -y -qq "$extra" && modprobe -q sch_netem || true
    fi
fi
if modprobe -q sch_netem 2>/dev/null || [[ -d /sys/module/sch_netem ]]; then
    log "kernel has sch_netem: delay, jitter and loss will use netem"
else
    log "kernel has no sch_netem: delay and jitter are unavailable; the lab says so at start-up"
fi

# -- lab.vm's guest kernel -------------------------------------------------------------------------
# The distribution's stock kernel package, downloaded and unpacked (never installed, so this
# host's own kernel and boot loader are untouched), with its modules packages where the
# distribution splits them off (Ubuntu: linux-modules-VER, and linux-modules-extra-VER, which
# holds sch_netem). Compressed modules are unpacked to plain .ko files (lab.vm's busybox initramfs
# insmods them) and depmod gives the tree the index that modprobe needs inside the guest. The
# result is kept only if lab.vm can build its initramfs from it and it has sch_netem.
#
# Runs as an `if` condition, where errexit is off: every step checks its own status and sets
# GUEST_KERNEL_PROBLEM. Nothing here stops the set-up: without a guest kernel only the VM tests
# are disabled.
GUEST_KERNEL_PROBLEM=""
fetch_guest_kernel() {
    local cache="$1" meta="$2"
    local kpkg ver pkg deb why
    local pkgs=()
    apt-cache show "$meta" >/dev/null 2>&1 || apt-get update -qq || true
    kpkg="$(apt-cache depends "$meta" 2>/dev/null \
        | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
    if [[ -z "$kpkg" ]]; then
        GUEST_KERNEL_PROBLEM="cannot resolve the kernel package of $meta (apt-cache depends $meta)"
        return 1
    fi
    ver="${kpkg#linux-image-}"
    pkgs=("$kpkg")
    for pkg in "linux-modules-$ver" "linux-modules-extra-$ver"; do
        if apt-cache show "$pkg" >/dev/null 2>&1; then
            pkgs+=("$pkg")
        fi
    done
    rm -rf "$cache/debs" "$cache/root.tmp"
    mkdir -p "$cache/debs" "$cache/root.tmp" || {
        GUEST_KERNEL_PROBLEM="cannot create $cache"
        return 1
    }
    for pkg in "${pkgs[@]}"; do
        (cd "$cache/debs" && apt-get download -q "$pkg" 2>&1 \
            | grep -v '^W: Download is performed unsandboxed') || true
        deb="$(compgen -G "$cache/debs/${pkg}_*.deb" | head -n 1)"
        if [[ -z "$deb" ]]; then
            GUEST_KERNEL_PROBLEM="apt-get download $pkg failed"
            return 1
        fi
        if ! dpkg-deb -x "$deb" "$cache/root.tmp"; then
            GUEST_KERNEL_PROBLEM="dpkg-deb -x $deb failed"
            return 1
        fi
    done
    if [[ ! -f "$cache/root.tmp/boot/vmlinuz-$ver" ]]; then
        GUEST_KERNEL_PROBLEM="${pkgs[*]} hold no boot/vmlinuz-$ver"
        return 1
    fi
    if [[ -n "$(find "$cache/root.tmp/lib/modules" -name '*.ko.zst' -print -quit 2>/dev/null)" ]] \
        && ! find "$cache/root.tmp/lib/modules" -name '*.ko.zst' -exec zstd -q -d --rm {} +; then
        GUEST_KERNEL_PROBLEM="cannot decompress the zstd-compressed modules (package zstd)"
        return 1
    fi
    if [[ -n "$(find "$cache/root.tmp/lib/modules" -name '*.ko.xz' -print -quit 2>/dev/null)" ]] \
        && ! find "$cache/root.tmp/lib/modules" -name '*.ko.xz' -exec xz -q -d {} +; then
        GUEST_KERNEL_PROBLEM="cannot decompress the xz-compressed modules (package xz-utils)"
        return 1
    fi
    if ! depmod -b "$cache/root.tmp" "$ver"; then
        GUEST_KERNEL_PROBLEM="depmod -b $cache/root.tmp $ver failed"
        return 1
    fi
    # lab.vm's own code judges the tree (stdlib only, so the distribution's Python runs it before
    # the venv exists). The initramfs is built in memory and thrown away; busybox is found at
    # boot, so an empty stand-in does here.
    if ! why="$(PYTHONPATH="$REPO" "$PY" - "$cache/root.tmp" "$ver" 2>&1 <<'CHECK'
import sys
from pathlib import Path

from lab.vm import GuestKernel, VmError, build_initramfs

kernel = GuestKernel(Path(sys.argv[1]), sys.argv[2])
try:
    build_initramfs(kernel, "", Path("/dev/null"))
except VmError as e:
    sys.exit(f"lab.vm cannot boot it: {e}")
if not (kernel.modules / "kernel/net/sched/sch_netem.ko").is_file():
    builtin = kernel.modules / "modules.builtin"
    if "sch_netem.ko" not in (builtin.read_text() if builtin.is_file() else ""):
        sys.exit(f"it has no sch_netem (neither kernel/net/sched/sch_netem.ko nor built in)")
CHECK
    )"; then
        GUEST_KERNEL_PROBLEM="kernel $ver: ${why:-the check failed}"
        return 1
    fi
    rm -rf "$cache/root" && mv "$cache/root.tmp" "$cache/root" || {
        GUEST_KERNEL_PROBLEM="cannot move $cache/root.tmp to $cache/root"
        return 1
    }
    rm -rf "$cache/debs"
    log "guest kernel $ver ready in $cache/root (${pkgs[*]})"
}

VM_CACHE="${CREW_VM_CACHE:-$SYSROOT/var/cache/crew-lab/vm}"
KERNEL_META=linux-image-amd64  # Debian's meta package: depends on the current kernel package
if is_ubuntu; then
    KERNEL_META=linux-image-generic  # Ubuntu's: the generic kernel and its modules-extra
fi
if ! compgen -G "$VM_CACHE/root/boot/vmlinuz-*" >/dev/null \
    || ! compgen -G "$VM_CACHE/root/lib/modules/*/modules.dep" >/dev/null; then
    log "fetching the guest kernel for lab.vm ($KERNEL_META) into $VM_CACHE"
    if ! fetch_guest_kernel "$VM_CACHE" "$KERNEL_META"; then
        rm -rf "$VM_CACHE/debs" "$VM_CACHE/root.tmp"
        log "NO GUEST KERNEL for lab.vm: $GUEST_KERNEL_PROBLEM."
        log "The VM tests (tests/test_vm.py, tests/vm) are disabled; everything else is set up," \
            "and lab/setup.sh tries again on its next run."
    fi
fi

# -- the venv --------------------------------------------------------------------------------------
# Made from the distribution's Python ($PY, above), which reads the distribution's mininet module.
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel

# torch: the lab runs on CPUs, and PyPI's plain torch==2.13.0 for Linux is the CUDA build
# (several GB). So, unless told otherwise, take the CPU build: first from the sources pip is
# already configured with (a local wheel directory or mirror may hold 2.13.0+cpu), else from
# PyTorch's CPU index. LAB_TORCH_CUDA=1 takes the default (CUDA) build instead.
torch_args=()
if [[ -n "${LAB_TORCH_INDEX:-}" ]]; then
    torch_args=(--extra-index-url "$LAB_TORCH_INDEX")
fi
have_torch="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
if [[ "$have_torch" == "2.13.0+cpu" || ( "$have_torch" == "2.13.0" && "${LAB_TORCH_CUDA:-0}" == 1 ) ]]; then
    log "torch $have_torch already installed"
elif [[ "${LAB_TORCH_CUDA:-0}" == 1 ]]; then
    log "installing torch==2.13.0 (default build, CUDA on Linux: LAB_TORCH_CUDA=1)"
    "$VENV/bin/python" -m pip install -q "${torch_args[@]}" "torch==2.13.0"
elif "$VENV/bin/python" -m pip install -q "${torch_args[@]}" "torch==2.13.0+cpu" 2>/dev/null; then
    log "installed torch==2.13.0+cpu"
else
    log "torch==2.13.0+cpu not in pip's sources; taking it from ${LAB_TORCH_CPU_INDEX:-the PyTorch CPU index}"
    "$VENV/bin/python" -m pip install -q \
        --extra-index-url "${LAB_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" "torch==2.13.0+cpu"
fi
log "installing the project and its test extras into $VENV"
"$VENV/bin/python" -m pip install -q "${torch_args[@]}" -e "$REPO[lab,dashboard,test]"

# Expose the distribution's mininet package alone, not the rest of dist-packages.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ ! -e "$SITE/mininet" ]]; then
    ln -s /usr/lib/python3/dist-packages/mininet "$SITE/mininet"
fi
"$VENV/bin/python" -c 'import mininet.net, mininet.node, mininet.link' \
    || { echo "mininet module is not importable from $VENV" >&2; exit 1; }

# `sudo python -m lab.run`: sudo's secure_path includes /usr/local/bin. A wrapper (not a bare
# symlink) so it also runs from outside the repo with the lab on the path.
WRAPPER="$SYSROOT/usr/local/bin/python"
if [[ "${LAB_LINK_PYTHON:-1}" == 1 ]]; then
    ours="$(head -c 200 "$WRAPPER" 2>/dev/null || true)"
    if [[ ! -e "$WRAPPER" || -L "$WRAPPER" || "$ours" == *"CREW Lab"* ]]; then
        dash_env=""
        if [[ -n "${LAB_DASHBOARD_HOST:-}" ]]; then
            dash_env="export CREW_LAB_DASHBOARD_HOST=${LAB_DASHBOARD_HOST}"
        fi
        mkdir -p "$(dirname "$WRAPPER")"
        rm -f "$WRAPPER"  # never write through a symlink: its target is not ours
        cat > "$WRAPPER" <<WRAP
#!/bin/sh
# CREW Lab: run the lab's interpreter ($VENV) so that 'sudo python -m lab.run' works.
$dash_env
exec "$VENV/bin/python" "\$@"
WRAP
        chmod 755 "$WRAPPER"
        log "$WRAPPER now runs $VENV/bin/python"
    else
        log "left $WRAPPER alone (it is not ours); use $VENV/bin/python"
    fi
fi

log "done. Try:  sudo python -m lab.run --help"
