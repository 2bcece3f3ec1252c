#!/usr/bin/env bash
# One-command, idempotent set-up of CREW Lab, for a plain Debian/Ubuntu host and the Vagrant VM.
# Run as root from anywhere:  sudo lab/setup.sh
#
# Installs the Debian packages the lab calls, creates .venv in the repo root with the project
# and its test extras, makes Debian's mininet module (only that one) importable from .venv, and
# links /usr/local/bin/python to .venv so that `sudo python -m lab.run` works as written.
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
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

if [[ $EUID -ne 0 ]]; then
    echo "lab/setup.sh must run as root (it installs Debian packages): sudo $0" >&2
    exit 1
fi

DEB_PACKAGES=(
    mininet          # mnexec and the pure-Python mininet module
    iproute2         # ip, tc
    iputils-ping     # RTT and loss probes (lab.studies.impairments, lab.check)
    iptables         # loss emulation without netem (statistic match)
    ethtool          # offload settings on the emulated links
    kmod             # modprobe, to load sch_htb / sch_netem where they are modules
    procps
    python3 python3-venv python3-dev
    ca-certificates
    qemu-system-x86  # lab.vm: a throwaway VM with Debian's stock kernel (netem) for the VM tests
    busybox-static   # lab.vm's initramfs
)
# The dashboard's end-to-end test drives Debian's chromium. Ubuntu ships it only as a snap,
# which a provisioning script should not pull in: there the browser test is skipped.
if ! grep -qi ubuntu /etc/os-release 2>/dev/null; then
    DEB_PACKAGES+=(chromium)
fi
log "installing Debian packages: ${DEB_PACKAGES[*]}"
export DEBIAN_FRONTEND=noninteractive
missing=()
for pkg in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

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

# lab.vm's guest kernel: Debian's stock kernel package, downloaded and unpacked (never installed,
# so this host's own kernel and boot loader are untouched). depmod gives the unpacked modules the
# index that modprobe needs inside the guest.
VM_CACHE="${CREW_VM_CACHE:-/var/cache/crew-lab/vm}"
if ! compgen -G "$VM_CACHE/root/boot/vmlinuz-*" >/dev/null \
    || ! compgen -G "$VM_CACHE/root/lib/modules/*/modules.dep" >/dev/null; then
    log "fetching the guest kernel for lab.vm into $VM_CACHE"
    apt-cache show linux-image-amd64 >/dev/null 2>&1 || apt-get update -qq
    kpkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
    [[ -n "$kpkg" ]] || { echo "cannot resolve linux-image-amd64's kernel package" >&2; exit 1; }
    rm -rf "$VM_CACHE/debs" "$VM_CACHE/root" "$VM_CACHE/root.tmp"
    mkdir -p "$VM_CACHE/debs"
    (cd "$VM_CACHE/debs" && apt-get download -q "$kpkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
    compgen -G "$VM_CACHE/debs/${kpkg}_*.deb" >/dev/null \
        || { echo "apt-get download $kpkg failed" >&2; exit 1; }
    dpkg-deb -x "$VM_CACHE/debs/${kpkg}"_*.deb "$VM_CACHE/root.tmp"
    depmod -b "$VM_CACHE/root.tmp" "${kpkg#linux-image-}"
    mv "$VM_CACHE/root.tmp" "$VM_CACHE/root"
    rm -rf "$VM_CACHE/debs"
fi

# The venv uses the distribution's Python, the one Debian's mininet module is built for.
PY=/usr/bin/python3
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
"$VENV/bin/python" -m pip install -q "${torch_args[@]}" -e "$REPO[test]"

# Expose Debian's mininet package alone, not the rest of dist-packages.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ ! -e "$SITE/mininet" ]]; then
    ln -s /usr/lib/python3/dist-packages/mininet "$SITE/mininet"
fi
"$VENV/bin/python" -c 'import mininet.net, mininet.node, mininet.link' \
    || { echo "mininet module is not importable from $VENV" >&2; exit 1; }

# `sudo python -m lab.run`: sudo's secure_path includes /usr/local/bin. A wrapper (not a bare
# symlink) so it also runs from outside the repo with the lab on the path.
if [[ "${LAB_LINK_PYTHON:-1}" == 1 ]]; then
    if [[ ! -e /usr/local/bin/python || -L /usr/local/bin/python || "$(head -c 200 /usr/local/bin/python 2>/dev/null)" == *"CREW Lab"* ]]; then
        dash_env=""
        if [[ -n "${LAB_DASHBOARD_HOST:-}" ]]; then
            dash_env="export CREW_LAB_DASHBOARD_HOST=${LAB_DASHBOARD_HOST}"
        fi
        cat > /usr/local/bin/python <<WRAP
#!/bin/sh
# CREW Lab: run the lab's interpreter ($VENV) so that 'sudo python -m lab.run' works.
$dash_env
exec "$VENV/bin/python" "\$@"
WRAP
        chmod 755 /usr/local/bin/python
        log "/usr/local/bin/python now runs $VENV/bin/python"
    else
        log "left /usr/local/bin/python alone (it is not ours); use $VENV/bin/python"
    fi
fi

log "done. Try:  sudo python -m lab.run --help"
