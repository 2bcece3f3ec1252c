"""State machines, pure: time and events in, decisions out.

``grouping`` (the FIFO group former), ``lifecycle`` (a group from formation to its record),
``capacity`` (configured, estimated and failed links), ``rejections``, ``worker_control`` (the
worker's side of the protocol) and ``verify`` (exactness checks without shipping models)."""
