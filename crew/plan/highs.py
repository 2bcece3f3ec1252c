"""The planners' LP solver: a silent, single-threaded HiGHS instance. Pure, no I/O.

Both the star LPs (:mod:`crew.plan.stars`) and the route LP (:mod:`crew.plan.routelp`) build
their models in HiGHS directly rather than through ``scipy.optimize.linprog``: the same solver,
without scipy's per-call model checks and conversions, and (for the route LP) one model kept
alive so that every re-solve after adding columns or rows warm-starts from the last basis.
"""

from __future__ import annotations

from typing import Any

from highspy import HighsModelStatus, kHighsInf

# The one private name used from highspy. Its public subclass ``highspy.Highs`` adds nothing the
# planners use (keyboard-interrupt handling and Python callbacks) but prints a licence banner to
# file descriptor 1 when the first instance of a process is made, before any option can turn
# output off: it would corrupt the JSON that ``lab.studies.planbench --json`` writes to stdout.
# The base class is the same solver with the same methods, silent, and as fast
# (docs/decisions/2026-12-04-highspy-core-solver.md).
from highspy._core import _Highs as Solver

INF = kHighsInf
"""HiGHS's infinity, for unbounded rows and columns."""

OPTIMAL = HighsModelStatus.kOptimal

__all__ = ["INF", "OPTIMAL", "Solver", "new_solver", "status_text"]


def new_solver(**options: Any) -> Solver:
    """An empty HiGHS model with output off and one thread, then ``options`` in order.

    One thread because HiGHS keeps one global scheduler per process, and a solve asking for
    another thread count than the first one fails ("Not Set")."""
    h = Solver()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    for name, value in options.items():
        h.setOptionValue(name, value)
    return h


def status_text(h: Solver) -> str:
    """The model status of the last run, as HiGHS names it."""
    return h.modelStatusToString(h.getModelStatus())
