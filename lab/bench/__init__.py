"""Benchmark every scheme on one emulated network: ``sudo python -m lab.bench ...``.

One seeded trace of groups is replayed by every partial-reduce scheme (and K all-reduces by
Gloo) on the same ``LabNetwork``; each op's time, its fluid lower bound and planned time, the
result check and the bytes on every link go to ``OUT/results.json`` (its fields:
:mod:`lab.report.benchresults`; the measurement: docs/bench.md). ``--train`` adds a training
run per scheme or configuration (``OUT/train.json``).

* :mod:`lab.bench.cli` -- the command line and the benchmark's run, start to written results;
* :mod:`lab.bench.spec` -- the validated options, scheme lists and training runs;
* :mod:`lab.bench.ops` -- the op trace of one scheme and its results from the run database;
* :mod:`lab.bench.train` -- one training run and its figures from the run database;
* :mod:`lab.bench.procs` -- the lab processes of one scheme's run: alive, CPU, reaped;
* :mod:`lab.bench.report` -- tables and figures.
"""
