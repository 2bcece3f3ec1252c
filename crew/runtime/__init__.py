"""Processes: the coordinator's socket shell, the worker, the reduce engine, the run database,
and the start-up path of launched jobs (``launch``, ``rendezvous``, ``node``)."""
