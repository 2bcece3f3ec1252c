"""Python packages for a guest that should not depend on this host's package indexes being
reachable from it: a wheelhouse made with ``pip download`` here (so it resolves through this
host's own pip configuration: its indexes, local wheel folders and constraints), served over
HTTP on the host's loopback, which QEMU's user network shows the guest as 10.0.2.2.

The guest then gets an ``/etc/pip.conf`` with ``no-index`` and the served folder as
``find-links``: every ``pip install`` the provisioning runs takes its packages from there,
whatever index options it passes (``no-index`` overrides them), and a package missing from the
wheelhouse fails the provisioning with pip's own "no matching distribution" message.
"""

from __future__ import annotations

import functools
import http.server
import sys
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

from lab.fresh.rootfs import run_logged

# The address QEMU's user-mode network gives the host, as seen from the guest.
GUEST_HOST_ADDR = "10.0.2.2"
# pip, setuptools and wheel: lab/setup.sh upgrades them in its venv before anything else.
BOOTSTRAP = ("pip", "setuptools", "wheel")


class WheelhouseError(RuntimeError):
    """pip could not download what the project needs (its output's tail in the message)."""


def requirements(project: Path, extras: str = "test") -> list[str]:
    """What to download for ``project``: itself with ``extras`` (its dependencies), its build
    backend's requirements (an editable install builds it in an isolated environment) and
    pip's own bootstrap set."""
    try:
        meta = tomllib.loads((project / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise WheelhouseError(f"{project}/pyproject.toml: {e}") from e
    build = list(meta.get("build-system", {}).get("requires", []))
    target = f"{project}[{extras}]" if extras else str(project)
    return [target, *build, *BOOTSTRAP]


def download(
    project: Path, dest: Path, log: Path, extra: tuple[str, ...] = (), timeout_s: float = 1800
) -> int:
    """``pip download`` into ``dest`` (kept between runs: files already there are not fetched
    again); returns how many files the wheelhouse holds."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest)]
    argv += [*requirements(project), *extra]
    run_logged(argv, log, timeout_s, "pip download", WheelhouseError)
    return sum(1 for p in dest.iterdir() if p.is_file())


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib's name)
        pass


@dataclass
class WheelServer:
    """An HTTP server for ``root`` on 127.0.0.1 (a free port), in a thread of this process."""

    root: Path
    server: http.server.ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None

    def __enter__(self) -> WheelServer:
        handler = functools.partial(_QuietHandler, directory=str(self.root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.server_address[1]

    def guest_url(self) -> str:
        return f"http://{GUEST_HOST_ADDR}:{self.port}/"

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.thread is not None:
            self.thread.join(timeout=10)


def guest_pip_conf(url: str) -> str:
    """The guest's ``/etc/pip.conf``: packages from the served wheelhouse only."""
    return (
        "# Written by lab.freshcheck: packages come from the host's wheelhouse.\n"
        "[global]\n"
        "no-index = true\n"
        f"find-links = {url}\n"
        f"trusted-host = {GUEST_HOST_ADDR}\n"
    )
