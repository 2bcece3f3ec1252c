"""CREW: cross-region partial reduce for training across clouds.

The public API (docs/api.md)::

    crew.Averager      average a model's parameters with the other ranks, p at a time
    crew.Round         what one Averager.step did
    crew.CrewError     base of the errors below
    crew.LaunchError   the job could not start: SecretError, CoordinatorUnreachable, JoinRefused,
                       PortError
    crew.CoordinatorLost  the coordinator went away during training: the job cannot go on
    crew.__version__   this release's version (the one the package metadata carries)

``crew.Averager`` imports torch; it is loaded on first use, so the coordinator and the lab's
tools import ``crew`` without it.
"""

from __future__ import annotations

from typing import Any

from crew.control.utilisation import TimeSplit
from crew.errors import (
    CoordinatorLost,
    CoordinatorUnreachable,
    CrewError,
    JoinRefused,
    LaunchError,
    PortError,
    SecretError,
)

# The one place the version is written: pyproject.toml reads it from here (setuptools' dynamic
# version, parsed without importing crew), so the wheel's metadata and this string agree.
__version__ = "0.1.0"

__all__ = [
    "Averager",
    "CoordinatorLost",
    "CoordinatorUnreachable",
    "CrewError",
    "JoinRefused",
    "LaunchError",
    "OverlapError",
    "PendingRound",
    "PortError",
    "Round",
    "SecretError",
    "TimeSplit",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in ("Averager", "PendingRound", "Round"):
        from crew import averager

        return getattr(averager, name)
    if name == "OverlapError":
        from crew.train.overlap import OverlapError

        return OverlapError
    raise AttributeError(f"module 'crew' has no attribute {name!r}")
