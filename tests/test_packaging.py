"""The distribution: `pip install crew-lab` is the library alone, the extras carry the rest.

The fast tests read pyproject.toml against the source tree (every package listed, every import
of crew/ a core dependency). The slow one builds the wheel, installs it without extras into a
fresh venv (torch from pip's configured sources, as lab/setup.sh takes it) and trains the
example there under torchrun on loopback, away from the checkout.
"""

from __future__ import annotations

import ast
import contextlib
import json
import random
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import crew

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
# What crew/ imports, by import name, and the distribution that provides it.
CREW_IMPORTS = {
    "numpy": "numpy",
    "scipy": "scipy",
    "highspy": "highspy",
    "blake3": "blake3",
    "cryptography": "cryptography",
    "torch": "torch",
    "sklearn": "scikit-learn",
}


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


def _third_party_imports(package: Path) -> set[str]:
    """Top-level modules imported anywhere under ``package`` (lazy imports too), less the
    standard library and the project's own packages."""
    found: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"crew", "lab", "dashboard", "__future__"}


def test_every_package_in_the_tree_is_listed():
    in_tree = {
        ".".join(p.parent.relative_to(REPO).parts)
        for top in ("crew", "lab", "dashboard")
        for p in (REPO / top).rglob("__init__.py")
    }
    mapped = SETUPTOOLS["package-dir"]
    assert set(SETUPTOOLS["packages"]) == in_tree | set(mapped)
    for package, folder in mapped.items():  # the shipped data, kept in its top-level folders
        assert (REPO / folder).is_dir(), package
        assert any((REPO / folder).glob("*.yaml")), package


def test_the_core_dependencies_are_what_crew_imports():
    core = {_name(r) for r in PROJECT["dependencies"]}
    imported = _third_party_imports(REPO / "crew")
    assert imported == set(CREW_IMPORTS), f"crew imports {sorted(imported)}: update CREW_IMPORTS"
    assert core == set(CREW_IMPORTS.values())
    torch = next(r for r in PROJECT["dependencies"] if _name(r) == "torch")
    assert ">=" in torch and "<" in torch.replace("<=", ""), torch  # a range, never a pin


def test_the_extras_carry_what_the_lab_and_the_dashboard_import():
    extras = {k: {_name(r) for r in v} for k, v in PROJECT["optional-dependencies"].items()}
    import_names = {"yaml": "pyyaml"}
    for extra, package in (("lab", "lab"), ("dashboard", "dashboard")):
        have = extras[extra] | set(CREW_IMPORTS.values())
        if extra == "lab":
            have |= extras["dashboard"] | extras["test"]  # browser studies use playwright
        needed = {import_names.get(m, m) for m in _third_party_imports(REPO / package)}
        needed -= {"mininet"}  # Debian's package (lab/setup.sh), not PyPI's
        assert needed <= have, f"[{extra}] misses {sorted(needed - have)}"
    assert "crew-lab" in extras["lab"]  # a lab run starts the dashboard: [lab] takes [dashboard]


def test_the_version_has_one_source():
    assert SETUPTOOLS["dynamic"]["version"] == {"attr": "crew.__version__"}
    assert "version" in PROJECT["dynamic"] and "version" not in PROJECT
    assert re.fullmatch(r"\d+\.\d+\.\d+", crew.__version__)
    assert PROJECT["scripts"]["crew-lab"] == "lab.cli:main"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in (REPO / "LICENSE").read_text(encoding="utf-8")[:200]


# -- the wheel, installed alone ------------------------------------------------------------------

SOURCES = ("pyproject.toml", "README.md", "LICENSE", "crew", "lab", "dashboard", "topologies",
           "scenarios")  # fmt: skip
CACHES = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache")


def _free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports free on every address now, below Linux's
    ephemeral range (so the kernel's own choices rarely take them meanwhile)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - count)
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + count):
                    stack.enter_context(socket.create_server(("0.0.0.0", port)))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports")


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_the_wheel_alone_imports_crew_and_trains_the_example(tmp_path):
    import torch

    times: dict[str, float] = {}

    def step(name: str, argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        proc = _run(argv, **kw)
        times[name] = time.monotonic() - started
        return proc

    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout.
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, src / name, ignore=CACHES)
        else:
            shutil.copy2(source, src / name)
    # The build backend (setuptools) is the one this interpreter has: no download.
    dist = tmp_path / "dist"
    pip_wheel = ["pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist)]
    step("build wheel", [sys.executable, "-m", *pip_wheel, str(src)])
    (wheel,) = dist.glob("crew_lab-*.whl")
    assert wheel.name.startswith(f"crew_lab-{crew.__version__}-")

    venv = tmp_path / "venv"
    step("create venv", [sys.executable, "-m", "venv", str(venv)])
    py, bin_dir = venv / "bin" / "python", venv / "bin"
    # The torch this suite runs with, from the sources pip is configured with (the lab's CPU
    # build), so the venv does not fetch another build; then the wheel, without extras.
    step("install torch", [str(py), "-m", "pip", "install", "-q", f"torch=={torch.__version__}"])
    step("install wheel", [str(py), "-m", "pip", "install", "-q", str(wheel)])

    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    work = tmp_path / "work"  # away from the checkout: crew must come from the venv
    work.mkdir()
    probe = _run(
        [str(py), "-c",
         "import crew, json, importlib.metadata as m, lab.spec.shipped as s\n"
         "print(crew.__file__)\n"
         "print(crew.__version__, m.version('crew-lab'))\n"
         "print(s.shipped_dir(s.Shipped.TOPOLOGIES))\n"
         "print(s.shipped_file(s.Shipped.SCENARIOS, 'chaos').is_file())\n"
         "print(json.dumps([d.metadata['Name'] for d in m.distributions()]))"],
        cwd=work, env=env,
    ).stdout.splitlines()  # fmt: skip
    site = str(venv / "lib")
    assert probe[0].startswith(site), probe[0]
    assert probe[1] == f"{crew.__version__} {crew.__version__}"
    assert probe[2].startswith(site) and probe[2].endswith("lab/spec/shipped/topologies")
    assert sorted(p.name for p in Path(probe[2]).glob("*.yaml")) == sorted(
        p.name for p in (REPO / "topologies").glob("*.yaml")
    )
    assert probe[3] == "True"
    installed = {_name(d) for d in json.loads(probe[4])}
    extras = PROJECT["optional-dependencies"]
    # setuptools: a venv seeds it and torch requires it; crew-lab: [lab]'s own [dashboard].
    lab_only = {_name(r) for r in extras["lab"] + extras["dashboard"]} - {"setuptools", "crew-lab"}
    assert not installed & lab_only, f"extras installed without being asked: {installed & lab_only}"
    assert {_name(r) for r in PROJECT["dependencies"]} <= installed

    version = _run([str(bin_dir / "crew-lab"), "--version"], cwd=work, env=env).stdout
    assert version.strip() == f"crew-lab {crew.__version__}"
    bare = subprocess.run(
        [str(bin_dir / "crew-lab"), "topology", "small"],
        cwd=work, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert bare.returncode == 2 and "pip install 'crew-lab[lab]'" in bare.stderr, bare.stderr

    # The example, as a user runs it: torchrun from the venv, 4 ranks on loopback only, with
    # every port set as a firewalled job sets them: torchrun's, CREW's rendezvous (+1), the
    # coordinator's control port and a data-plane range the 4 ranks of this host share.
    shutil.copy2(REPO / "examples" / "train_digits.py", work / "train_digits.py")
    port = _free_ports(7)
    data = range(port + 3, port + 7)
    job_env = {
        **env,
        "CREW_SECRET": "wheel-test-secret-0123456789",
        "CREW_RUN_DIR": str(tmp_path / "run"),
        "TMPDIR": str(tmp_path),  # torchrun's torchelastic_* logs, which it leaves behind
        "CREW_DATA_HOST": "127.0.0.1",
        "CREW_CONTROL_PORT": str(port + 2),
        "CREW_DATA_PORT": f"{data[0]}-{data[-1]}",
    }
    proc = step(
        "torchrun example",
        [str(bin_dir / "torchrun"), "--nnodes", "1", "--nproc-per-node", "4",
         "--rdzv-backend", "static", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--master-addr", "127.0.0.1", "--master-port", str(port), "--node-rank", "0",
         "train_digits.py", "--group-size", "2", "--steps", "40"],
        cwd=work, env=job_env, timeout=300,
    )  # fmt: skip
    lines = re.findall(r"rank (\d): averaged (\d+)/40 rounds, accuracy ([\d.]+)", proc.stdout)
    assert sorted(int(r) for r, _, _ in lines) == [0, 1, 2, 3], proc.stdout
    for _, averaged, accuracy in lines:
        assert int(averaged) >= 30 and float(accuracy) > 0.8
    with contextlib.closing(sqlite3.connect(tmp_path / "run" / "run.db")) as db:
        addresses = [a for (a,) in db.execute("SELECT address FROM workers ORDER BY id")]
        events = [m for (m,) in db.execute("SELECT message FROM events")]
    assert sorted(int(a.rpartition(":")[2]) for a in addresses) == list(data), addresses
    assert all(a.startswith("127.0.0.1:") for a in addresses), addresses
    assert f"coordinator listening on port {port + 2}" in events, events
    print("wheel test steps (s): " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
