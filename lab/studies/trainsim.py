"""One-process check of the training modes: n workers, partial-reduce-like groups, no network.

``python -m lab.studies.trainsim --mode diloco --local-steps 8 --outer-lr 0.7 --outer-momentum 0.9
--compress int8``: n Trainers (the lab's MLP and shards, or the lm workload) in one process.
Every round each worker runs H local steps; the workers are then dealt, in a seeded random
order, into groups of p (as partial reduce groups the first p ready workers, and with equal
speeds the order of readiness is random). Each group reduces as a CREW star: the root adds its
own vector in float32, every other member's weighted vector is encoded, decoded and added, the
sum is encoded once for the broadcast, and every member loads the decoded result, through the
same ``crew.train.outer`` and ``crew.train.compress`` code the worker and engine are meant to call.

``--aggregate clip`` reduces each group by CenteredClip instead (``crew.control.clipping``, per
part of ``MAX_ROUTE_PART_ELEMS`` as the engine's roots do) and prints the honest members'
spread: ``||v_m - x|| / ||x||`` per part against the weighted mean ``x`` of their group, the
figure the radius must stay above. The radius is learned as the coordinator learns it
(``crew.control.clipradius``: ``--clip-factor`` times the members' spread on a random vector,
at most ``--clip-radius``; ``--clip-factor 0`` keeps ``--clip-radius``). ``--poison-scale S``:
worker 0 offers S times its model to every group (a member that poisons its own vector,
``lab.orchestrate.selfpoison``).

``--overlap``: each group's result reaches its members one round late, after they have run
the next H local steps from the model they offered, and is applied as a delta against that
offer (``crew.train.overlap``, as ``crew.Averager.start`` does): quality against local steps
when every reduce is hidden behind one iteration. ``--overlap-steps K`` makes it arrive after
K of those steps instead, as the lab's worker applies a result between two steps: a reduce
that takes K of the H steps' time. ``--eval-mean`` also evaluates the workers'
mean model, their consensus, apart from the noise of each worker's unaveraged steps.

It measures quality against local steps, not time: the lab's benchmark owns time to target.
Prints one line per evaluation and a summary line: local steps per worker and rounds to reach
``--target`` (mean held-out accuracy of all workers, MLP) or ``--target-loss`` (lm), final
quality, and wire bytes sent per worker per round (leaf parts, as encoded).
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import numpy as np

from crew.cli_options import command_parser
from crew.control.assignment import MAX_ROUTE_PART_ELEMS
from crew.control.clipping import DEFAULT_RHO, centered_clip
from crew.control.clipradius import DEFAULT_FACTOR, ClipRadius
from crew.control.verify import check_vector
from crew.train.compress import Codec, encoded_size
from crew.train.datasets import Partition
from crew.train.outer import OuterConfig, OuterLoop, SyncMode
from crew.train.overlap import DelayedUpdates
from crew.train.partcodec import PartCodec
from crew.train.workloads import DEFAULTS, Workload, make_trainer


def _trainers(args: argparse.Namespace) -> list:
    w = Workload(args.workload)
    if w is Workload.LM:
        from crew.train.textdata import load_text_split, unigram_cross_entropy

        train, test = load_text_split(cache_dir=args.cache_dir)
        print(f"unigram baseline loss {unigram_cross_entropy(train, test):.4f}")
    return [
        make_trainer(
            w,
            n=args.n,
            index=i,
            partition=Partition(args.partition),
            seed=args.seed,
            lr=args.lr if args.lr is not None else DEFAULTS[w].lr,
            batch_size=args.batch_size or DEFAULTS[w].batch_size,
            local_steps=args.local_steps,
            cache_dir=args.cache_dir,
        )
        for i in range(args.n)
    ]


def star_reduce(
    codecs: list[PartCodec] | None, offers: list[np.ndarray], weights: list[float]
) -> np.ndarray:
    """Root = the first member: own vector unencoded, leaves encoded, broadcast encoded, each
    through the encoding member's own PartCodec (as the engine does; error feedback with it)."""
    total: np.ndarray = np.float32(weights[0]) * offers[0]
    if codecs is None:
        for w, v in zip(weights[1:], offers[1:], strict=True):
            total = total + np.float32(w) * v
        return total
    for pc, w, v in zip(codecs[1:], weights[1:], offers[1:], strict=True):
        total = total + pc.encode(np.float32(w) * v, 0, 0.0)[1]
    return codecs[0].encode(total, 0, 0.0)[1]


def clip_reduce(
    offers: list[np.ndarray], weights: list[float], rho: float
) -> tuple[np.ndarray, np.ndarray]:
    """CenteredClip of ``offers`` part by part, as the roots of a clipped star do, and how
    many parts each member was clipped in."""
    x = np.empty_like(offers[0])
    clipped = np.zeros(len(offers), dtype=np.int64)
    for s in range(0, x.size, MAX_ROUTE_PART_ELEMS):
        part = np.stack([v[s : s + MAX_ROUTE_PART_ELEMS] for v in offers])
        x[s : s + MAX_ROUTE_PART_ELEMS], c = centered_clip(part, weights, rho)
        clipped += c < 1.0
    return x, clipped


def spreads(offers: list[np.ndarray]) -> list[float]:
    """``||v_m - x|| / ||x||`` per member and part, ``x`` the members' mean."""
    out = []
    mean = np.mean(np.stack(offers).astype(np.float64), axis=0)
    for s in range(0, mean.size, MAX_ROUTE_PART_ELEMS):
        x = mean[s : s + MAX_ROUTE_PART_ELEMS]
        out += [float(np.linalg.norm(v[s : s + x.size] - x) / np.linalg.norm(x)) for v in offers]
    return out


def _evaluate_mean(trainers: list) -> tuple[float, float]:
    """(loss, accuracy) of the workers' mean model, on the first worker's model and data: the
    quality of their consensus, without the local steps no group has averaged yet."""
    own = trainers[0].get_vector()
    mean = np.mean(np.stack([t.get_vector() for t in trainers]), axis=0, dtype=np.float64)
    trainers[0].set_vector(mean.astype(np.float32))
    try:
        loss, acc = trainers[0].evaluate()
    finally:
        trainers[0].set_vector(own)
    return float(loss), float(acc)


def run(args: argparse.Namespace) -> dict[str, float | int | None]:
    trainers = _trainers(args)
    mode = SyncMode(args.mode)
    cfg = OuterConfig(mode, args.local_steps, args.outer_lr, args.outer_momentum)
    loops = [OuterLoop(cfg, t.get_vector()) for t in trainers]
    codec = Codec(args.compress)
    check = check_vector(1, trainers[0].num_params)
    codecs = (
        None
        if codec is Codec.NONE
        else [PartCodec(codec, check, error_feedback=args.error_feedback == "on") for _ in trainers]
    )
    rng = np.random.default_rng(args.seed)
    rounds = args.steps // args.local_steps
    reached = None
    quality = float("nan")
    spread: list[float] = []
    radius = ClipRadius(args.clip_radius, args.clip_factor)
    radii: list[float] = []
    honest_clipped = honest_parts = 0
    check_rng = np.random.default_rng([args.seed, 1])  # apart from the groups' order
    delayed = [DelayedUpdates() for _ in trainers]
    arriving: dict[int, tuple[int, np.ndarray]] = {}  # overlap: member -> (ticket, result)
    started = time.perf_counter()
    arrive_after = args.overlap_steps or args.local_steps

    def apply_arrived(m: int, done: int) -> None:
        """Member m's last-round result, after ``arrive_after`` of this round's local steps."""
        if done != arrive_after or m not in arriving:
            return
        ticket, result = arriving.pop(m)
        synced = loops[m].after_reduce(result)
        trainers[m].set_vector(delayed[m].resolve(ticket, trainers[m].get_vector(), synced))

    for r in range(1, rounds + 1):
        for m, t in enumerate(trainers):
            t.step(functools.partial(apply_arrived, m))
        order = rng.permutation(args.n).tolist()
        for g in range(0, args.n - args.p + 1, args.p):
            members = order[g : g + args.p]
            models = [trainers[m].get_vector() for m in members]
            offers = [loops[m].before_reduce(x) for m, x in zip(members, models, strict=True)]
            spread += spreads([v for m, v in zip(members, offers, strict=True) if m != 0])
            if args.poison_scale != 1.0 and 0 in members:
                offers[members.index(0)] = offers[members.index(0)] * np.float32(args.poison_scale)
            pcs = None if codecs is None else [codecs[m] for m in members]
            weights = [1.0 / len(members)] * len(members)
            if args.aggregate == "clip":
                radii.append(radius.current())
                result, clipped = clip_reduce(offers, weights, radii[-1])
                honest = [k for k, m in enumerate(members) if m != 0 or args.poison_scale == 1]
                honest_clipped += int(clipped[honest].sum())
                honest_parts += len(honest) * math.ceil(result.size / MAX_ROUTE_PART_ELEMS)
                # what the members' proofs tell the coordinator (crew.control.clipcheck)
                r_g = check_rng.standard_normal(result.size)
                radius.observe([float(r_g @ v) for v in offers], float(np.linalg.norm(result)))
            else:
                result = star_reduce(pcs, offers, weights)
            for m, x in zip(members, models, strict=True):
                if args.overlap:
                    arriving[m] = (delayed[m].offer(x), result)
                else:
                    trainers[m].set_vector(loops[m].after_reduce(result))
        for m in order[(args.n // args.p) * args.p :]:  # left over: not in a group this round
            loops[m].on_abandon()
        if r % max(1, args.eval_rounds) == 0 or r == rounds:
            evals = [t.evaluate() for t in trainers]
            loss = float(np.mean([e[0] for e in evals]))
            acc = float(np.mean([e[1] for e in evals]))
            quality = acc if args.workload == "mlp" else loss
            mean_part = ""
            if args.eval_mean:
                mean_loss, mean_acc = _evaluate_mean(trainers)
                mean_part = f" mean-model loss {mean_loss:.4f} acc {mean_acc:.4f}"
            hit = acc >= args.target if args.workload == "mlp" else loss <= args.target_loss
            if hit and reached is None:
                reached = r
            print(
                f"round {r:4d} steps {r * args.local_steps:5d} loss {loss:.4f} "
                f"acc {acc:.4f} ppl {math.exp(loss):.2f}{mean_part}"
                f" t {time.perf_counter() - started:.0f}s",
                flush=True,
            )
    n_elems = trainers[0].num_params
    if radii:
        lo, med, hi = np.percentile(radii, [0, 50, 100])
        print(f"clip radius rho per group: min {lo:.4f} median {med:.4f} max {hi:.4f}")
        print(f"honest members' parts clipped: {honest_clipped / max(1, honest_parts):.1%}")
    if spread:
        med, p95, p99, top = np.percentile(spread, [50, 95, 99, 100])
        print(
            f"honest spread ||v - x|| / ||x|| per part: median {med:.4f} p95 {p95:.4f}"
            f" p99 {p99:.4f} max {top:.4f}"
        )
    return {
        "rounds_to_target": reached,
        "steps_to_target": None if reached is None else reached * args.local_steps,
        "final": quality,
        "bytes_per_round": encoded_size(codec, n_elems),
        "bytes_fp32_per_round": encoded_size(Codec.NONE, n_elems),
    }


def main(argv: list[str] | None = None) -> int:
    p = command_parser("python -m lab.studies.trainsim", __doc__)
    p.add_argument("--workload", choices=["mlp", "lm"], default="mlp")
    p.add_argument("--mode", choices=[m.value for m in SyncMode], default="every-step")
    p.add_argument("--local-steps", type=int, default=1)
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--compress", choices=[c.value for c in Codec], default="none")
    p.add_argument(
        "--error-feedback",
        choices=["on", "off"],
        default="on",
        help="each encoding worker adds what its last encode rounded away (fp16/int8)",
    )
    p.add_argument(
        "--overlap",
        action="store_true",
        help="apply each group's result one round late, as a delta against the offer",
    )
    p.add_argument(
        "--overlap-steps",
        type=int,
        default=None,
        help="with --overlap: each result arrives after this many of the next round's local"
        " steps (default: all H of them)",
    )
    p.add_argument(
        "--eval-mean",
        action="store_true",
        help="also evaluate the workers' mean model (their consensus) at each evaluation",
    )
    p.add_argument("--aggregate", choices=["mean", "clip"], default="mean")
    p.add_argument("--clip-radius", type=float, default=DEFAULT_RHO, help="the radius's ceiling")
    p.add_argument(
        "--clip-factor",
        type=float,
        default=DEFAULT_FACTOR,
        help="the radius is this times the members' learned spread (0: --clip-radius)",
    )
    p.add_argument("--poison-scale", type=float, default=1.0, help="worker 0 offers S x its model")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--p", type=int, default=4)
    p.add_argument("--steps", type=int, default=480, help="local steps per worker")
    p.add_argument("--lr", type=float, default=None, help="inner lr (workload default)")
    p.add_argument("--batch-size", type=int, default=None, help="(workload default)")
    p.add_argument("--partition", choices=[x.value for x in Partition], default="iid")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.85, help="mean accuracy (mlp)")
    p.add_argument("--target-loss", type=float, default=2.0, help="mean held-out loss (lm)")
    p.add_argument("--eval-rounds", type=int, default=5, help="evaluate every this many rounds")
    p.add_argument("--cache-dir", default=None, help="lm text cache folder")
    args = p.parse_args(argv)
    if not 1 <= args.p <= args.n:
        p.error("need 1 <= p <= n")
    if args.overlap_steps is not None and not args.overlap:
        p.error("--overlap-steps needs --overlap")
    if args.overlap_steps is not None and not 1 <= args.overlap_steps <= args.local_steps:
        p.error(f"--overlap-steps must be 1 to --local-steps ({args.local_steps})")
    out = run(args)
    print(
        f"SUMMARY workload={args.workload} mode={args.mode} H={args.local_steps} "
        f"outer_lr={args.outer_lr} mu={args.outer_momentum} compress={args.compress} "
        f"ef={args.error_feedback} overlap={args.overlap} aggregate={args.aggregate} "
        f"rho={args.clip_radius} factor={args.clip_factor} "
        f"poison={args.poison_scale} "
        f"n={args.n} p={args.p} partition={args.partition} steps_to_target="
        f"{out['steps_to_target']} rounds_to_target={out['rounds_to_target']} "
        f"final={out['final']:.4f} bytes/round={out['bytes_per_round']} "
        f"({float(out['bytes_per_round'] or 0) / float(out['bytes_fp32_per_round'] or 1):.3f}"
        "x fp32)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
