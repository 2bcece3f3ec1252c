"""A flow-level simulator of whole CREW runs, driving the lab's own group former and planner.

``python -m crew.sim --n 60 --p 5 --bwd 2 --duration 50 --scheme crew --seed 1 --out D``
simulates 50 s of a 60-worker run and writes ``D/lab.db`` in the lab's run-database schema,
which ``python -m dashboard D`` replays.

Modules: :mod:`~crew.sim.topogen` (generated and given topologies), :mod:`~crew.sim.network`
(the fluid link model), :mod:`~crew.sim.lifecycle` (the seam to the group life cycle),
:mod:`~crew.sim.engine` (the event loop), :mod:`~crew.sim.record` (the run database).
The lab-side entry points are ``python -m lab.simrun`` (a lab topology YAML and a scenario)
and ``python -m lab.studies.simpaper`` (the paper's table, failures and scale figures).
"""
