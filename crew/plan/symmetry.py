"""Plans shared between groups that are the same up to renaming the workers. Pure, no I/O.

Why: the route LP (``crew.plan.routelp``) costs tens of milliseconds per cold plan at n = 8,
and most of it goes into *proving* a plan optimal. On a network where many groups look alike
(every link at one rate, as in ``bench-uniform``; or clouds of equal workers) the proof is the
same for each of them: p = 4 of 8 uniform workers is one problem, not 70. A plan computed for
one group answers any other whose inputs become *identical* after renaming the workers.

How: :func:`canonical_order` sorts the workers by a signature that renaming does not change
(member first, then active, then the sorted rates out of and into the worker, the sorted
delays), ties by index. The inputs rewritten in that order are the key (:func:`canonical_key`),
exact to the bit, so a hit is a true isomorphism: the cached routes, renamed back
(:func:`rename_routes`), are a plan for this group with the same predicted time, and the same
elements on the same shaped routes. Nothing is approximated; when the signature fails to line
up two isomorphic groups (ties broken by index differently), the key differs and the group is
simply planned. On a network without symmetry every group gets its own key, as before.

Cost: O(n^2 log n) for the order and the key, microseconds at n = 8 and about 1 ms at n = 256
(against a route LP of 30-200 ms).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence

import numpy as np

from crew.plan.inputs import SharedLink
from crew.plan.routes import Route


def canonical_order(
    bw: np.ndarray,
    members: Sequence[int],
    active: Collection[int] | None,
    delay_s: np.ndarray | None = None,
) -> tuple[int, ...]:
    """Workers in canonical order: ``order[k]`` is the worker that becomes worker k."""
    n = bw.shape[0]
    member = np.zeros(n, dtype=bool)
    member[list(members)] = True
    live = np.ones(n, dtype=bool) if active is None else np.zeros(n, dtype=bool)
    if active is not None:
        live[list(active)] = True
    off = ~np.eye(n, dtype=bool)
    rates = np.where(np.isfinite(bw), bw, -1.0)  # inf (unlimited) sorts apart from any rate
    out_rates = np.sort(rates[off].reshape(n, n - 1), axis=1)
    in_rates = np.sort(rates.T[off].reshape(n, n - 1), axis=1)
    keys: list[tuple] = []
    for i in range(n):
        sig: tuple = (not member[i], not live[i], out_rates[i].tobytes(), in_rates[i].tobytes())
        if delay_s is not None:
            d = np.asarray(delay_s, dtype=float)
            sig += (np.sort(d[i][off[i]]).tobytes(), np.sort(d[:, i][off[:, i]]).tobytes())
        keys.append((sig, i))
    return tuple(i for _, i in sorted(keys))


def canonical_key(
    order: Sequence[int],
    bw: np.ndarray,
    members: Sequence[int],
    active: Collection[int] | None,
    shared: Sequence[SharedLink] | None,
    delay_s: np.ndarray | None,
    *rest: Hashable,
) -> Hashable:
    """The inputs renamed by ``order``, exactly (``rest``: label-free inputs, e.g. size)."""
    idx = np.asarray(order, dtype=np.int64)
    new = np.empty_like(idx)
    new[idx] = np.arange(idx.size)  # new[old worker] = its canonical name
    w = np.asarray(bw, dtype=float)[np.ix_(idx, idx)]
    live = None if active is None else tuple(sorted(int(new[a]) for a in active))
    links = tuple(
        sorted(
            (tuple(sorted((int(new[a]), int(new[b])) for a, b in s.pairs)), s.mbit, s.delay_s)
            for s in shared or ()
        )
    )
    d = None if delay_s is None else np.asarray(delay_s, dtype=float)[np.ix_(idx, idx)]
    return (
        w.tobytes(),
        idx.size,
        tuple(sorted(int(new[m]) for m in members)),
        live,
        links,
        None if d is None else d.tobytes(),
        rest,
    )


def rename_routes(routes: Sequence[Route], names: Sequence[int]) -> tuple[Route, ...]:
    """``routes`` with every worker k renamed ``names[k]`` (edges in their order)."""

    def edges(es: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
        return tuple((names[a], names[b]) for a, b in es)

    return tuple(Route(r.start, r.stop, names[r.root], edges(r.up), edges(r.down)) for r in routes)


def to_canonical(order: Sequence[int]) -> list[int]:
    """``names`` for :func:`rename_routes` that take a group's routes to canonical names."""
    new = [0] * len(order)
    for k, w in enumerate(order):
        new[w] = k
    return new
