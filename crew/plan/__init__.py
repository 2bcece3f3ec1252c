"""Planning, pure: a group's members, capacities and bytes in; routes and their cost out.

* ``inputs`` (units, element size, input checks, ``PlanError``, ``SharedLink``);
* the paper's star planner: ``plantypes`` (``Plan``), ``stars`` (the LPs), ``starcost`` (their
  cost models), ``rounding``, and ``planner``, which gathers them in one import;
* ``bound`` (the fluid lower bound no scheme beats);
* ``routelp`` (the route LP CREW uses, a package), ``routes`` (the route vocabulary the
  engine executes), ``trees`` and ``ringorder`` (tree packing and ring order);
* ``baselines`` (PS, Ring, all-to-all, BLINK, TopoAdopt), ``schemes`` (one entry point per
  scheme, and ``GroupPlanner``, which keeps caches), ``symmetry``, ``memo``, ``plancall``;
* ``hostcpu``, ``modelsize``, ``wiresize``; ``highs`` (the LP solver).
"""
