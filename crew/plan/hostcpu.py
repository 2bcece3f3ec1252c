"""The host's CPU as one more capacity of the route LP, for labs where one machine runs every
worker's data path.

**Cost model.** Every byte a link carries costs CPU on the host: framing, the MAC and the copy at
the sender, the same and the add at the receiver, and the kernel's TCP and shaping work in
between. ``lab.bench`` measures it per scheme as ``cpu_s_per_gb``: the workers' CPU seconds
(from ``/proc``) per GB of link bytes, 12.2 for crew on bench-hetero with 8 workers on 2 cores.
With ``cores`` cores the host moves at most ``cores / cpu_s_per_gb`` GB of link bytes per
second, whatever the links could carry; so the sum over every directed pair of its bytes
drains at that rate, which is exactly a :class:`~crew.plan.inputs.SharedLink` over all pairs.
The LP then stops spreading a group over more relays than the host can feed: on bench-hetero
(56 links, 10-120 Mbit/s, about 2.5 Gbit/s in all) the links can take more than the host's
2 / 12.2 GB/s (1.3 Gbit/s) can send.

On separate machines (a real deployment) each worker has its own CPU and this capacity does not
apply; ``RunConfig.host_cpu_s_per_gb = 0`` leaves it out.
"""

from __future__ import annotations

from crew.plan.inputs import PlanError, SharedLink

MBIT_PER_GB = 8000.0


def host_cpu_link(n: int, cpu_s_per_gb: float, cores: float) -> SharedLink:
    """The host's CPU as a capacity shared by all n x (n - 1) directed pairs (Mbit/s)."""
    if n < 1:
        raise PlanError("n", f"must be >= 1, got {n}")
    if not cpu_s_per_gb > 0 or not cores > 0:
        raise PlanError(
            "host cpu", f"needs cpu_s_per_gb > 0 and cores > 0, got {cpu_s_per_gb}, {cores}"
        )
    pairs = tuple((a, b) for a in range(n) for b in range(n) if a != b)
    return SharedLink(pairs, cores / cpu_s_per_gb * MBIT_PER_GB)
