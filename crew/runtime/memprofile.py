"""Where a long-running process's Python memory goes: periodic ``tracemalloc`` snapshots.

``CREW_TRACEMALLOC=DIR`` (optionally ``DIR,SECONDS``) makes a worker or coordinator start
``tracemalloc`` with 16 frames per trace and dump a snapshot to ``DIR/<name>-<k>.snap`` every
``SECONDS`` (300 by default) and when it stops. ``python -m crew.runtime.memprofile A B``
prints the tracebacks whose memory grew most from snapshot A to snapshot B.

What it sees: every allocation made through Python's allocators, numpy's array data included
(numpy reports it to ``tracemalloc``); not what C libraries allocate on their own (torch's
tensors, glibc's free lists). Set against the process's RSS, the difference says which side a
growth is on.

Cost: ``tracemalloc`` slows allocation-heavy Python code by about 2x and holds a few dozen
bytes per live allocation; each dump takes a fraction of a second and a few MB on disk. A
diagnostic, off unless asked for.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "CREW_TRACEMALLOC"
FRAMES = 16
DEFAULT_EVERY_S = 300.0


class ProfileError(ValueError):
    """A malformed ``CREW_TRACEMALLOC``."""


@dataclass(frozen=True)
class ProfileSpec:
    directory: Path
    every_s: float


def parse(value: str) -> ProfileSpec:
    """``DIR`` or ``DIR,SECONDS``."""
    directory, _, every = value.partition(",")
    if not directory:
        raise ProfileError(f"{ENV}={value!r}: expected DIR or DIR,SECONDS")
    try:
        every_s = float(every) if every else DEFAULT_EVERY_S
    except ValueError:
        raise ProfileError(f"{ENV}={value!r}: SECONDS must be a number") from None
    if not every_s > 0:
        raise ProfileError(f"{ENV}={value!r}: SECONDS must be positive")
    return ProfileSpec(Path(directory), every_s)


class Profiler:
    """Dumps a snapshot every ``spec.every_s`` from a daemon thread until :meth:`stop`."""

    def __init__(self, spec: ProfileSpec, name: str) -> None:
        self.spec = spec
        self.name = name
        self.dumped: list[Path] = []
        self._stop = threading.Event()
        spec.directory.mkdir(parents=True, exist_ok=True)
        tracemalloc.start(FRAMES)
        self._thread = threading.Thread(target=self._loop, name="memprofile", daemon=True)
        self._thread.start()

    def dump(self) -> Path:
        path = self.spec.directory / f"{self.name}-{len(self.dumped)}.snap"
        tracemalloc.take_snapshot().dump(str(path))
        self.dumped.append(path)
        return path

    def _loop(self) -> None:
        while not self._stop.wait(self.spec.every_s):
            self.dump()

    def stop(self) -> None:
        """A last snapshot, then tracing ends."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.dump()
        tracemalloc.stop()


def from_env(name: str, env: dict[str, str] | None = None) -> Profiler | None:
    """A running :class:`Profiler` if ``CREW_TRACEMALLOC`` asks for one, else None."""
    value = (os.environ if env is None else env).get(ENV, "")
    if not value:
        return None
    profiler = Profiler(parse(value), name)
    log.info(
        "%s: tracemalloc snapshots every %.0f s in %s",
        name,
        profiler.spec.every_s,
        profiler.spec.directory,
    )
    return profiler


def growth(before: Path, after: Path, top: int = 20) -> list[str]:
    """The ``top`` tracebacks whose memory grew most from ``before`` to ``after``."""
    a = tracemalloc.Snapshot.load(str(before))
    b = tracemalloc.Snapshot.load(str(after))
    stats = b.compare_to(a, "traceback")
    lines = []
    total = sum(s.size_diff for s in stats)
    lines.append(f"total {total / 1e6:+.2f} MB in {sum(s.count_diff for s in stats):+d} blocks")
    for s in stats[:top]:
        lines.append(f"{s.size_diff / 1e3:+10.1f} kB {s.count_diff:+7d} blocks")
        lines.extend(f"      {line}" for line in s.traceback.format(limit=FRAMES)[-8:])
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crew.runtime.memprofile",
        description="Print where Python memory grew between two snapshots that a process "
        f"wrote under {ENV}=DIR[,SECONDS].",
    )
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--top", type=int, default=20, help="tracebacks to show (20)")
    args = parser.parse_args(argv)
    for path in (args.before, args.after):
        if not path.is_file():
            parser.error(f"{path}: no such snapshot")
    print("\n".join(growth(args.before, args.after, args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
