"""State machines, pure: time and events in, decisions out.

``lifecycle`` (a group from formation to its record) with what it is made of: ``former`` (which
former a run gets) with ``grouping`` (the FIFO group former) and ``traceformer`` (a benchmark's
fixed trace), ``groupplanning`` (its planner calls), ``linkhealth`` (failed links and suspects),
``opengroup`` (an open group's state) and ``records`` (its events and outputs). Beside it:
``capacity`` (configured, estimated and failed links), ``assignment`` (what a revision keeps),
``rejections``, ``worker_control`` (the worker's side of the protocol) and ``verify``
(exactness checks without shipping models)."""
