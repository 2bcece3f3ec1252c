"""The emulated network: Mininet mesh, tc shaping, preflight checks, cleanup, link monitor,
ping probes and the helper processes that run inside host namespaces (flows, goodput)."""
