"""The ``gloo`` scheme: ``torch.distributed.all_reduce`` with the Gloo backend among all n workers.

This is the baseline "what people run today": every worker averages its whole model with every
other worker through Gloo, over the lab's emulated links, with no knowledge of the capacity matrix
and no partial groups.

Why this module imports torch (the crew rule is that only ``crew.train.training`` does): Gloo lives
in ``torch.distributed``; there is no other way to run it. torch is imported lazily, inside the
functions that need it, so importing ``crew.runtime.gloo`` for its spec, errors or docstring stays
cheap and torch-free.

Binding to the identity address
-------------------------------
Every lab worker runs in its own network namespace but all share the root hostname, and each has
one identity address: a /32 on ``lo``, next to 127.0.0.1. Gloo must listen on, and advertise to
its peers, exactly that address. What torch 2.13 offers (read from ``distributed_c10d.py`` and the
Gloo TCP transport it wraps):

* ``init_process_group("gloo")`` builds ``ProcessGroupGloo(store, rank, size, timeout)``, which
  takes no device and chooses one itself: the interfaces named in ``GLOO_SOCKET_IFNAME``, else
  the address this machine's hostname resolves to, else 127.0.0.1. Its ``pg_options`` are
  ignored for Gloo.
* The hostname resolves to the same thing in every namespace (here 127.0.0.1 through
  /etc/hosts), so every rank would advertise its own loopback and no peer could reach it.
* ``GLOO_SOCKET_IFNAME=lo`` takes the *first* IPv4 address ``getifaddrs`` lists for ``lo``,
  which is 127.0.0.1, not the identity /32 added after it. Naming the management interface
  would send the data over the unshaped management network, which is worse: it works, and
  measures the wrong network.
* ``ProcessGroupGloo.create_device(hostname=<address>)`` resolves a numeric address to itself
  and binds exactly it, failing at once with "Cannot resolve ... to a (local) address" when the
  address is not configured in this namespace. A ``ProcessGroupGloo`` built from options that
  carry this device listens on and advertises the identity address, whatever the hostname.

So :class:`GlooAllReduce` builds the group by hand: a ``TCPStore`` served by rank 0 on its
identity address, a ``ProcessGroupGloo`` with that device, wrapped in a ``ProcessGroup`` so the
averaging call is the stock ``torch.distributed.all_reduce(tensor, group=pg)``. The group is not
registered as torch's default group, so several can coexist and none leaks into global state.

Cost model
----------
For dense CPU tensors Gloo runs its ring all-reduce (``gloo::allreduce``, default algorithm):
the vector of M bytes is cut into n chunks; a reduce-scatter then an all-gather pass them
around the ring in rank order, rank r sending to rank r-1 and receiving from r+1. Each rank
sends 2(n-1)/n * M bytes over one link, so on capacity matrix BW the time is about

    T ~ 2 (n-1)/n * M / min_r BW[r][r-1]   (+ 2(n-1) segment latencies)

The ring order is the rank order, not a topology-aware one, and all n workers take part every
round: the slowest ring link and the slowest worker set the pace, which is what CREW is
compared against.

Every collective is bounded by ``timeout_s``. Setup is bounded, but by a few ``timeout_s``
rather than one: the store rendezvous and the Gloo mesh connect are each bounded by it, and
both retry a failed connection (Gloo up to three more times). Measured with ``timeout_s=3``: a
rank given a wrong store port fails after about 5 s; a link cut before setup makes the ranks
on it fail after about 14 s, and the other ranks in their first collective.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from crew.vector import check_flat_float32

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = [
    "GlooAllReduce",
    "GlooClosedError",
    "GlooCollectiveError",
    "GlooError",
    "GlooSetupError",
    "GlooSpec",
    "GlooSpecError",
    "GlooVectorError",
    "demo_vector",
    "main",
]

log = logging.getLogger(__name__)


class GlooError(RuntimeError):
    """Base class of this module's runtime failures."""


class GlooSpecError(ValueError):
    """A :class:`GlooSpec` field is invalid; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"GlooSpec.{field}: {message}")
        self.field = field


class GlooVectorError(ValueError):
    """The vector handed to :meth:`GlooAllReduce.average` is unusable."""


class GlooSetupError(GlooError):
    """Building the process group failed or timed out; the message names rank and addresses."""


class GlooCollectiveError(GlooError):
    """A collective failed or timed out (a peer died, a link was cut, lengths differ)."""


class GlooClosedError(GlooError):
    """The group was used after :meth:`GlooAllReduce.close`."""


@dataclass(frozen=True)
class GlooSpec:
    """Who this rank is and where everybody is.

    ``addresses[r]`` is rank r's identity address (an IP literal, not a hostname: hosts share a
    hostname, and a name could resolve to several local addresses). Rank 0 serves the
    rendezvous ``TCPStore`` on ``addresses[0]:store_port``. Ranks may share an address (tests
    run them all on 127.0.0.1); Gloo gives each its own listening port.
    """

    rank: int
    world: int
    addresses: tuple[str, ...]
    store_port: int
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.world < 1:
            raise GlooSpecError("world", f"must be >= 1, got {self.world}")
        if not 0 <= self.rank < self.world:
            raise GlooSpecError("rank", f"must be in [0, {self.world}), got {self.rank}")
        if not isinstance(self.addresses, tuple):
            raise GlooSpecError("addresses", f"must be a tuple, got {type(self.addresses)}")
        if len(self.addresses) != self.world:
            raise GlooSpecError(
                "addresses", f"needs one per rank: {len(self.addresses)} for world {self.world}"
            )
        for r, addr in enumerate(self.addresses):
            try:
                ipaddress.ip_address(addr)
            except ValueError as exc:
                raise GlooSpecError("addresses", f"rank {r}: {addr!r} is not an IP") from exc
        if not 1 <= self.store_port <= 65535:
            raise GlooSpecError("store_port", f"must be in [1, 65535], got {self.store_port}")
        if not self.timeout_s > 0:
            raise GlooSpecError("timeout_s", f"must be > 0, got {self.timeout_s}")

    @property
    def address(self) -> str:
        """This rank's identity address."""
        return self.addresses[self.rank]

    @property
    def store_endpoint(self) -> str:
        """``host:port`` of the rendezvous store, for messages."""
        return _endpoint(self.addresses[0], self.store_port)


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GlooAllReduce:
    """A Gloo process group over all ``spec.world`` ranks, bound to this rank's identity address.

    Every rank must construct one with the same ``world``, ``addresses`` and ``store_port``,
    and then call :meth:`average` the same number of times with vectors of the same length
    (Gloo cannot tell a length mismatch from a slow peer: it shows up as a timeout).

    The constructor blocks until all ranks have joined, or raises :class:`GlooSetupError`
    naming this rank, its address and the store (see the module docstring for how long that
    can take).
    """

    def __init__(self, spec: GlooSpec) -> None:
        import torch
        import torch.distributed as dist
        from torch._C._distributed_c10d import ProcessGroupGloo

        self.spec = spec
        timeout = timedelta(seconds=spec.timeout_s)
        where = (
            f"rank {spec.rank}/{spec.world} at {spec.address} "
            f"(store {spec.store_endpoint}, timeout {spec.timeout_s:g} s)"
        )
        try:
            # Bind first: a missing identity address is the likeliest mistake, and it fails here
            # at once instead of after the others have waited for us.
            device = ProcessGroupGloo.create_device(hostname=spec.address)
        except RuntimeError as exc:
            raise GlooSetupError(
                f"{where}: cannot bind Gloo to {spec.address}, is it configured in this "
                f"network namespace? ({exc})"
            ) from exc
        try:
            self._store: dist.TCPStore | None = dist.TCPStore(
                spec.addresses[0],
                spec.store_port,
                world_size=spec.world,
                is_master=spec.rank == 0,
                timeout=timeout,
                wait_for_workers=True,
            )
        except (RuntimeError, TimeoutError) as exc:
            role = "serving" if spec.rank == 0 else "reaching"
            raise GlooSetupError(f"{where}: {role} the rendezvous store failed: {exc}") from exc

        options = ProcessGroupGloo._Options()
        options._devices = [device]
        options._timeout = timeout
        # Collectives are issued one at a time, so one Gloo worker thread is enough; the lab's
        # workers share a couple of cores.
        options._threads = 1
        try:
            backend = ProcessGroupGloo(self._store, spec.rank, spec.world, options)
        except (RuntimeError, TimeoutError) as exc:
            raise GlooSetupError(f"{where}: connecting the Gloo mesh failed: {exc}") from exc

        # The stock front end over our backend: average() is torch.distributed.all_reduce.
        pg = dist.ProcessGroup(self._store, spec.rank, spec.world)
        pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
        self._pg: dist.ProcessGroup | None = pg
        self._where = where
        log.info("gloo group up: %s", where)

    def _group(self, what: str) -> dist.ProcessGroup:
        if self._pg is None:
            raise GlooClosedError(f"{what} after close on {self._where}")
        return self._pg

    def average(self, vector: np.ndarray) -> np.ndarray:
        """All-reduce (SUM) ``vector`` over all ranks and divide by ``world``.

        Takes a 1-D float32 array, leaves it untouched and returns a new float32 array.
        """
        check_flat_float32(vector, GlooVectorError)
        pg = self._group("average")

        import torch
        import torch.distributed as dist

        tensor = torch.from_numpy(np.array(vector, dtype=np.float32, copy=True))
        try:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=pg)
        except (RuntimeError, TimeoutError) as exc:
            raise GlooCollectiveError(f"all_reduce failed on {self._where}: {exc}") from exc
        tensor.div_(self.spec.world)
        return tensor.numpy()

    def barrier(self) -> None:
        """Wait until every rank reaches its barrier (bounded by ``timeout_s``)."""
        pg = self._group("barrier")
        try:
            pg.barrier().wait()
        except (RuntimeError, TimeoutError) as exc:
            raise GlooCollectiveError(f"barrier failed on {self._where}: {exc}") from exc

    def close(self) -> None:
        """Destroy the group and, on rank 0, the store. Local and idempotent.

        It does not synchronise: call :meth:`barrier` first if peers may still be in a
        collective, since rank 0 closing takes the store down.
        """
        if self._pg is None:
            return
        pg, self._pg = self._pg, None
        try:
            pg.shutdown()
        except RuntimeError as exc:  # a dead peer must not stop the caller from cleaning up
            log.warning("gloo shutdown on %s: %s", self._where, exc)
        del pg
        self._store = None
        log.info("gloo group closed: %s", self._where)

    def __enter__(self) -> GlooAllReduce:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def demo_vector(seed: int, round_: int, rank: int, length: int) -> np.ndarray:
    """The float32 vector rank ``rank`` contributes in round ``round_`` of the smoke run."""
    return np.random.default_rng([seed, round_, rank]).standard_normal(length).astype(np.float32)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m crew.runtime.gloo",
        description="Smoke run of the gloo scheme: average demo vectors over all ranks and print "
        "one JSON line with this rank's results.",
    )
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--addresses", required=True, help="comma-separated identity address per rank")
    p.add_argument("--store-port", type=int, required=True)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    p.add_argument("--length", type=int, default=1000, help="vector length (default 1000)")
    p.add_argument("--rounds", type=int, default=2, help="averages to run (default 2)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.length < 0:
        p.error("--length must be >= 0")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m crew.runtime.gloo``.

    Returns the exit status (2 on a Gloo failure).
    """
    args = _parse_args(argv)
    addresses = tuple(a.strip() for a in args.addresses.split(",") if a.strip())
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        spec = GlooSpec(
            rank=args.rank,
            world=len(addresses),
            addresses=addresses,
            store_port=args.store_port,
            timeout_s=args.timeout,
        )
    except GlooSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    import torch

    # Several ranks share a couple of cores in the lab.
    torch.set_num_threads(1)
    out: dict[str, Any] = {"rank": spec.rank, "address": spec.address, "averages": []}
    try:
        with GlooAllReduce(spec) as gloo:
            for k in range(args.rounds):
                vec = demo_vector(args.seed, k, spec.rank, args.length)
                out["averages"].append(gloo.average(vec).tolist())
            gloo.barrier()
    except GlooError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
