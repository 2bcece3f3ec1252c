"""Stand-ins for the system commands lab/setup.sh calls, for tests/test_setup_script.py.

Run as ``setup_stub.py NAME ARGS...`` through a two-line shell script named NAME on PATH (or in
the fake system root for the Python interpreters). Every call is appended to the JSON-lines log
named by ``SETUP_STUB_LOG``; the answers come from the scenario, a JSON file named by
``SETUP_STUB_SCENARIO``, which says what the fake apt archive holds:

- ``installable``: packages ``apt-get install`` can install; ``installed``: packages
  ``dpkg-query`` reports as installed;
- ``depends``: meta package -> the packages ``apt-cache depends`` lists;
- ``debs``: package -> the files its .deb holds, each a path (whose content is then the path)
  or a [path, content] pair (``apt-get download`` writes the .deb, and ``dpkg-deb -x`` unpacks
  those files); ``download_fails``: packages whose download fails;
- ``host_netem`` (``modprobe sch_netem`` succeeds), ``uname_r``, ``site`` (the fake venv's
  site-packages) and ``real_python`` (the interpreter that runs any other Python code, such as
  the script's check of the unpacked guest kernel with lab.vm).

The fake venv's interpreter is this stub too: pip calls succeed without installing anything,
torch is absent and mininet imports.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

DEB_SUFFIX = "_1.0-1_amd64.deb"


def _scenario() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(os.environ["SETUP_STUB_SCENARIO"]).read_text())
    return data


def _known(sc: dict[str, Any], pkg: str) -> bool:
    return pkg in sc["installable"] or pkg in sc["debs"] or pkg in sc["depends"]


def apt_get(sc: dict[str, Any], args: list[str]) -> int:
    sub, rest = args[0], [a for a in args[1:] if not a.startswith("-")]
    if sub == "update":
        return 0
    if sub == "install":
        unknown = [p for p in rest if p not in sc["installable"]]
        for p in unknown:
            print(f"E: Unable to locate package {p}", file=sys.stderr)
        return 100 if unknown else 0
    if sub == "download":
        print("W: Download is performed unsandboxed as root", file=sys.stderr)
        for p in rest:
            if p not in sc["debs"] or p in sc["download_fails"]:
                print(f"E: Can't select candidate version from package {p}", file=sys.stderr)
                return 100
            Path(p + DEB_SUFFIX).write_text(json.dumps(sc["debs"][p]))
        return 0
    return 1


def apt_cache(sc: dict[str, Any], args: list[str]) -> int:
    sub, pkg = args[0], args[-1]
    if not _known(sc, pkg):
        print(f"E: No packages found for {pkg}", file=sys.stderr)
        return 100
    if sub == "depends":
        print(pkg)
        for dep in sc["depends"].get(pkg, []):
            print(f"  Depends: {dep}")
    elif sub == "show":
        print(f"Package: {pkg}")
    return 0


def dpkg_query(sc: dict[str, Any], args: list[str]) -> int:
    if args[-1] in sc["installed"]:
        print("install ok installed", end="")
        return 0
    print(f"dpkg-query: no packages found matching {args[-1]}", file=sys.stderr)
    return 1


def dpkg_deb(sc: dict[str, Any], args: list[str]) -> int:
    assert args[0] == "-x", args
    deb, dest = Path(args[1]), Path(args[2])
    for entry in json.loads(deb.read_text()):
        rel, text = (entry, f"{entry}\n") if isinstance(entry, str) else entry
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


def depmod(sc: dict[str, Any], args: list[str]) -> int:
    assert args[0] == "-b", args
    modules = Path(args[1]) / "lib" / "modules" / args[2]
    if not modules.is_dir():
        print(f"depmod: ERROR: could not open directory {modules}", file=sys.stderr)
        return 1
    kos = sorted(str(p.relative_to(modules)) for p in modules.rglob("*.ko*"))
    (modules / "modules.dep").write_text("".join(f"{k}:\n" for k in kos))
    return 0


def decompress(suffix: str, args: list[str]) -> int:
    for name in (a for a in args if not a.startswith("-")):
        path = Path(name)
        if not name.endswith(suffix):
            return 1
        path.with_suffix("").write_text(path.read_text())
        path.unlink()
    return 0


def python(sc: dict[str, Any], name: str, args: list[str]) -> int:
    if args[:2] == ["-m", "venv"]:
        bindir = Path(args[2]) / "bin"
        bindir.mkdir(parents=True)
        _write_wrapper(bindir / "python", "venv-python")
        return 0
    if args[:2] == ["-m", "pip"]:
        return 0
    code = args[1] if args[:1] == ["-c"] else ""
    if "import torch" in code:
        return 1
    if "sysconfig" in code:
        Path(sc["site"]).mkdir(parents=True, exist_ok=True)
        print(sc["site"])
        return 0
    if "import mininet" in code:
        return 0
    real = sc["real_python"]
    os.execv(real, [real, *args])


def _write_wrapper(path: Path, name: str) -> None:
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} {name} "$@"\n')
    path.chmod(0o755)


def install(bindir: Path, names: list[str]) -> None:
    """Write a NAME wrapper that runs this stub, for each name, into bindir."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name in names:
        _write_wrapper(bindir / name, name)


def main(argv: list[str]) -> int:
    name, args = argv[0], argv[1:]
    with open(os.environ["SETUP_STUB_LOG"], "a") as log:
        log.write(json.dumps({"cmd": name, "args": args, "cwd": os.getcwd()}) + "\n")
    sc = _scenario()
    if name == "apt-get":
        return apt_get(sc, args)
    if name == "apt-cache":
        return apt_cache(sc, args)
    if name == "dpkg-query":
        return dpkg_query(sc, args)
    if name == "dpkg-deb":
        return dpkg_deb(sc, args)
    if name == "depmod":
        return depmod(sc, args)
    if name == "modprobe":
        return 0 if sc["host_netem"] else 1
    if name == "uname":
        print(sc["uname_r"])
        return 0
    if name == "zstd":
        return decompress(".zst", args)
    if name == "xz":
        return decompress(".xz", args)
    if name.startswith("python") or name == "venv-python":
        return python(sc, name, args)
    print(f"setup_stub: no stand-in for {name}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
