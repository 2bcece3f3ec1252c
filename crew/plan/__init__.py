"""Planning, pure: a group's members, capacities and bytes in; routes and their cost out.

``planner`` (the paper's LP and the lower bound), ``routelp`` (the route LP CREW uses),
``routes`` (the route vocabulary the engine executes), ``baselines`` (PS, Ring, all-to-all,
BLINK, TopoAdopt), ``schemes`` (one entry point per scheme), ``modelsize``.
"""
