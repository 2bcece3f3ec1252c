"""Hostile input for the frame decoder: a seeded fuzz benchmark, and an attacker for live labs.

``python -m lab.fuzz --frames N [--seed S]`` feeds N generated or mutated frames to
``FrameCodec.read_frame`` (stream semantics: bytes after the frame belong to the next one) and
to ``FrameCodec.decode`` (exactly one frame), and checks for every input that:

* only a ``FrameError`` subclass or a valid frame comes out, and a valid frame only from an
  unmodified encoding (a forged, truncated or re-run frame is never accepted); mutations with a
  known outcome (a truncation, a huge length, a wrong run, ...) raise exactly that error;
* the decoder never asks its reader for more than ``header + max_payload + tag`` bytes, in one
  request or in total. The reader allocates each request up front, as ``FrameStream`` does, so
  a decoder that trusted a declared length of 4 GiB would try to allocate it;
* the tracemalloc peak of one decode stays under ``2 (header + max_payload + tag) + 64 KiB``
  (see ``memory_bound``).

It prints counts per outcome and per mutation, and inputs per second. Two passes over the same
seeded stream: one timed without tracemalloc (its overhead would dominate the figure), one
traced for the memory bound.

Cost model: one input costs two decodes, each one MAC pass over at most ``max_payload`` bytes
plus a copy of the payload; payload sizes are skewed small (a few KiB) with a few percent at the
limit, so the benchmark exercises both the per-frame overhead and the large-frame path. The
default ``--max-payload`` (64 KiB) is smaller than a run's (4 MiB) to keep 100,000 inputs
within seconds; the checks are relative to whatever limit the codec has.

``python -m lab.fuzz attack --to ADDR:PORT --frames K [--mode M]`` is the attacker
(``lab.orchestrate.attacker``, shared with ``lab.hostile``): a peer
without the run's secret that opens K connections to a worker's data port and sends one hostile
message on each (well-formed frames signed with the wrong key, random garbage, or a header that
declares an oversized payload), then half-closes and waits for the worker to drop it. It prints
one JSON object: what was sent and how each connection ended. A worker that kept a connection
open past ``--wait`` (``kept_open``) or sent anything back (``answered``) did not reject it.
"""

from __future__ import annotations

import argparse
import collections
import enum
import json
import logging
import random
import struct
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from crew.cli_options import add_json_flag, command_parser, write_json
from crew.wire.frames import (
    DEFAULT_MAX_PAYLOAD,
    HEADER_SIZE,
    MAGIC,
    TAG_SIZE,
    VERSION,
    BadMac,
    BadMagic,
    BadVersion,
    Frame,
    FrameCodec,
    FrameError,
    FrameKind,
    Oversized,
    TrailingData,
    Truncated,
    UnknownKind,
    WrongRun,
)
from lab.orchestrate.attacker import (
    AttackMode,
    attack,
)

log = logging.getLogger(__name__)

DEFAULT_FRAMES = 100_000
DEFAULT_FUZZ_MAX_PAYLOAD = 64 << 10
MEMORY_SLACK = 64 << 10  # Frame objects, exception messages, MAC state: far below this
MAX_VIOLATIONS_KEPT = 20  # examples kept in a report; the count is always exact
_U32 = 0xFFFF_FFFF
_LENGTH_AT = 36  # byte offset of the length field in the header
_VERSION_AT = 4
_KIND_AT = 5
VALID = "valid"  # outcome name of an accepted frame


class Mutation(enum.Enum):
    """How an input was made from one or two validly signed frames."""

    VALID = "valid"  # unchanged
    TRAILING = "trailing"  # a valid frame with bytes after it
    BIT_FLIP = "bit_flip"  # 1-8 distinct bits flipped anywhere
    TRUNCATE = "truncate"  # cut short, anywhere
    LENGTH_LIE = "length_lie"  # length field changed to another value within the limit
    HUGE_LENGTH = "huge_length"  # length field above the limit, up to 4 GiB - 1
    WRONG_RUN = "wrong_run"  # signed with the right key for another run
    WRONG_MAC = "wrong_mac"  # signed with another key
    BAD_MAGIC = "bad_magic"
    BAD_VERSION = "bad_version"
    BAD_KIND = "bad_kind"
    SPLICE = "splice"  # the head of one frame glued to the tail of another
    RANDOM = "random"  # random bytes
    MAGIC_PREFIX = "magic_prefix"  # a plausible magic and version, then random bytes


# What each mutation must produce: a FrameError subclass, or the original frame (None here).
_EXPECT_STREAM: dict[Mutation, type[FrameError] | None] = {
    Mutation.VALID: None,
    Mutation.TRAILING: None,
    Mutation.BIT_FLIP: FrameError,
    Mutation.TRUNCATE: Truncated,
    Mutation.LENGTH_LIE: FrameError,
    Mutation.HUGE_LENGTH: Oversized,
    Mutation.WRONG_RUN: WrongRun,
    Mutation.WRONG_MAC: BadMac,
    Mutation.BAD_MAGIC: BadMagic,
    Mutation.BAD_VERSION: BadVersion,
    Mutation.BAD_KIND: UnknownKind,
    Mutation.SPLICE: FrameError,
    Mutation.RANDOM: FrameError,
    Mutation.MAGIC_PREFIX: FrameError,
}
_EXPECT_WHOLE = _EXPECT_STREAM | {Mutation.TRAILING: TrailingData}


class ReadBoundExceeded(Exception):
    """The decoder asked its reader for more bytes than any valid frame can have.

    Deliberately not a FrameError: the fuzzer must not mistake it for a proper rejection."""


@dataclass(frozen=True)
class Case:
    """One fuzz input and what the decoder must make of it.

    ``stream``/``whole``: the expected outcome of ``read_frame`` and of ``decode``: the frame
    itself when it must be accepted, else the FrameError class it must raise (``FrameError``
    itself: any rejection will do)."""

    mutation: Mutation
    data: bytes
    stream: Frame | type[FrameError]
    whole: Frame | type[FrameError]


@dataclass(frozen=True)
class Result:
    """What one decode of a Case did."""

    outcome: str  # "valid" or the FrameError class name
    violation: str | None
    max_request: int  # the largest single read the decoder asked for
    total_request: int  # everything it asked for
    peak_bytes: int | None  # tracemalloc peak of the call, when traced


# -- building inputs: pure functions, shared by the seeded generator and the Hypothesis tests ---


def flip_bits(wire: bytes, bits: Sequence[int]) -> bytes:
    """``wire`` with each bit index in ``bits`` (distinct, < 8 * len) inverted."""
    out = bytearray(wire)
    for b in bits:
        out[b // 8] ^= 1 << (b % 8)
    return bytes(out)


def truncate(wire: bytes, keep: int) -> bytes:
    """The first ``keep`` bytes (``keep < len(wire)``)."""
    if not 0 <= keep < len(wire):
        raise ValueError(f"keep={keep} must be in 0..{len(wire) - 1}")
    return wire[:keep]


def with_length(wire: bytes, length: int) -> bytes:
    """``wire`` with its header's length field replaced (the tag is not recomputed)."""
    return wire[:_LENGTH_AT] + struct.pack("!I", length) + wire[_LENGTH_AT + 4 :]


def with_byte(wire: bytes, at: int, value: int) -> bytes:
    return wire[:at] + bytes([value]) + wire[at + 1 :]


def with_magic(wire: bytes, magic: bytes) -> bytes:
    if len(magic) != len(MAGIC) or magic == MAGIC:
        raise ValueError(f"magic must be 4 bytes other than {MAGIC!r}")
    return magic + wire[len(MAGIC) :]


def splice(a: bytes, b: bytes, cut_a: int, cut_b: int) -> bytes:
    return a[:cut_a] + b[cut_b:]


_UNKNOWN_KINDS = tuple(k for k in range(256) if k not in {int(x) for x in FrameKind})


class CaseGenerator:
    """A seeded stream of Cases for one codec. Same seed, same stream."""

    def __init__(self, codec: FrameCodec, secret: bytes, seed: int) -> None:
        self.codec = codec
        self.rng = random.Random(seed)
        other_secret = bytes(b ^ 0x5A for b in secret)
        other_run = (codec.run + 1 + self.rng.randrange(_U32)) % (_U32 + 1)
        if other_run == codec.run:
            other_run = (codec.run + 1) % (_U32 + 1)
        self.foreign_key = FrameCodec(other_secret, codec.run, codec.max_payload)
        self.foreign_run = FrameCodec(secret, other_run, codec.max_payload)
        self._mutations = list(Mutation)

    def payload_size(self) -> int:
        r, limit = self.rng.random(), self.codec.max_payload
        if r < 0.60:
            return self.rng.randrange(0, min(257, limit + 1))
        if r < 0.90:
            return self.rng.randrange(0, min(4097, limit + 1))
        if r < 0.98:
            return self.rng.randrange(0, limit + 1)
        return limit

    def frame(self, run: int | None = None) -> Frame:
        rng = self.rng
        return Frame(
            kind=rng.choice(list(FrameKind)),
            sender=rng.randrange(0x10000),
            run=self.codec.run if run is None else run,
            group=rng.randrange(_U32 + 1),
            rev=rng.randrange(_U32 + 1),
            block=rng.randrange(_U32 + 1),
            part=rng.randrange(_U32 + 1),
            offset=rng.randrange(1 << 64),
            payload=rng.randbytes(self.payload_size()),
        )

    def case(self) -> Case:
        m = self.rng.choice(self._mutations)
        return self.build(m)

    def build(self, m: Mutation) -> Case:
        rng, codec = self.rng, self.codec
        limit = codec.max_payload
        frame = self.frame()
        wire = codec.encode_bytes(frame)
        match m:
            case Mutation.VALID:
                return Case(m, wire, frame, frame)
            case Mutation.TRAILING:
                return Case(m, wire + rng.randbytes(rng.randrange(1, 200)), frame, TrailingData)
            case Mutation.BIT_FLIP:
                bits = rng.sample(range(len(wire) * 8), rng.randrange(1, 9))
                data = flip_bits(wire, bits)
            case Mutation.TRUNCATE:
                data = truncate(wire, rng.randrange(len(wire)))
            case Mutation.LENGTH_LIE:
                true_len = frame.nbytes
                lie = rng.choice(
                    [rng.randrange(limit + 1), true_len + 1, max(0, true_len - 1), 0, limit]
                )
                if lie == true_len:
                    lie = (true_len + 1) if true_len < limit else true_len - 1
                data = with_length(wire, lie)
            case Mutation.HUGE_LENGTH:
                data = with_length(
                    wire, rng.choice([limit + 1, _U32, rng.randrange(limit + 1, _U32 + 1)])
                )
            case Mutation.WRONG_RUN:
                data = self.foreign_run.encode_bytes(self.frame(run=self.foreign_run.run))
            case Mutation.WRONG_MAC:
                data = self.foreign_key.encode_bytes(frame)
            case Mutation.BAD_MAGIC:
                magic = rng.randbytes(4)
                data = with_magic(wire, magic if magic != MAGIC else b"XXXX")
            case Mutation.BAD_VERSION:
                other = rng.choice([0, 1, 255, rng.randrange(0, 256)])
                data = with_byte(wire, _VERSION_AT, other if other != VERSION else VERSION + 1)
            case Mutation.BAD_KIND:
                data = with_byte(wire, _KIND_AT, rng.choice(_UNKNOWN_KINDS))
            case Mutation.SPLICE:
                other = codec.encode_bytes(self.frame())
                data = splice(
                    wire, other, rng.randrange(1, len(wire)), rng.randrange(1, len(other))
                )
                # The glue can rebuild a whole valid frame at the start (the cut fell in the
                # last bytes of one and the other continued them by chance): then that frame
                # is rightly accepted, and anything after it is the next frame's problem.
                for whole_frame, enc in ((frame, wire), (codec.decode(other), other)):
                    if data.startswith(enc):
                        after = TrailingData if len(data) > len(enc) else whole_frame
                        return Case(m, data, whole_frame, after)
            case Mutation.RANDOM:
                data = rng.randbytes(
                    rng.choice([rng.randrange(HEADER_SIZE + 1), rng.randrange(HEADER_SIZE, 2048)])
                )
            case Mutation.MAGIC_PREFIX:
                data = MAGIC + bytes([VERSION]) + rng.randbytes(rng.randrange(0, 2048))
        stream, whole = _EXPECT_STREAM[m], _EXPECT_WHOLE[m]
        assert stream is not None and whole is not None
        return Case(m, data, stream, whole)


# -- checking ----------------------------------------------------------------------------------


class GuardedReader:
    """A ``recv_exact`` over a byte string that enforces a read bound and, like
    ``FrameStream._read``, allocates each request before filling it."""

    def __init__(self, data: bytes, bound: int) -> None:
        self.data = data
        self.bound = bound
        self.pos = 0
        self.max_request = 0
        self.total = 0

    def __call__(self, n: int) -> bytearray:
        if n < 0 or n > self.bound or self.total + n > self.bound:
            raise ReadBoundExceeded(
                f"decoder asked for {n} bytes after {self.total}; a frame has at most {self.bound}"
            )
        self.max_request = max(self.max_request, n)
        self.total += n
        buf = bytearray(n)
        # Views, not slices: the copy into buf is then the only one, as with recv_into.
        with memoryview(self.data)[self.pos : self.pos + n] as chunk, memoryview(buf) as dst:
            got = len(chunk)
            dst[:got] = chunk
        self.pos += got
        return buf if got == n else buf[:got]


def read_bound(codec: FrameCodec) -> int:
    """The most bytes any valid frame of this codec occupies."""
    return HEADER_SIZE + codec.max_payload + TAG_SIZE


def memory_bound(codec: FrameCodec) -> int:
    """The tracemalloc peak one decode may reach: twice the largest frame plus fixed slack.

    Twice, because a short read returns ``buf[:got]``, a copy of the part filled (as
    ``FrameStream._read`` does), while the request's buffer is still alive. A decoder that
    allocated a declared length instead of the limit would exceed this by orders of magnitude."""
    return 2 * read_bound(codec) + MEMORY_SLACK


def same_frame(a: Frame, b: Frame) -> bool:
    return (a.kind, a.sender, a.run, a.group, a.rev, a.block, a.part, a.offset) == (
        b.kind,
        b.sender,
        b.run,
        b.group,
        b.rev,
        b.block,
        b.part,
        b.offset,
    ) and bytes(a.payload) == bytes(b.payload)


def _judge(expected: Frame | type[FrameError], got: Frame | BaseException) -> str | None:
    """None if ``got`` is what was expected, else what went wrong."""
    if isinstance(got, Frame):
        if isinstance(expected, Frame):
            return None if same_frame(expected, got) else f"decoded a different frame: {got!r}"
        return f"accepted a hostile input as {got!r} (expected {expected.__name__})"
    if not isinstance(got, FrameError):
        return f"{type(got).__name__} escaped the decoder: {got}"
    if isinstance(expected, Frame):
        return f"rejected a valid frame: {type(got).__name__}: {got}"
    if not isinstance(got, expected):
        return f"raised {type(got).__name__} ({got}), expected {expected.__name__}"
    return None


def _run_one(
    call: Callable[[], Frame], expected: Frame | type[FrameError], trace: bool
) -> tuple[str, str | None, int | None]:
    peak: int | None = None
    if trace:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
    try:
        got: Frame | BaseException = call()
    except ReadBoundExceeded as e:
        got = e
    except Exception as e:  # noqa: BLE001 - anything but a FrameError is the finding
        got = e
    if trace:
        peak = tracemalloc.get_traced_memory()[1] - base
    outcome = VALID if isinstance(got, Frame) else type(got).__name__
    return outcome, _judge(expected, got), peak


def check_stream(codec: FrameCodec, case: Case, *, trace: bool = False) -> Result:
    """Run ``read_frame`` over ``case.data`` through a GuardedReader and judge the outcome."""
    reader = GuardedReader(case.data, read_bound(codec))
    outcome, problem, peak = _run_one(lambda: codec.read_frame(reader), case.stream, trace)
    if problem is None and peak is not None and peak > memory_bound(codec):
        problem = f"read_frame peaked at {peak} bytes, bound {memory_bound(codec)}"
    return Result(outcome, problem, reader.max_request, reader.total, peak)


def check_whole(codec: FrameCodec, case: Case, *, trace: bool = False) -> Result:
    """Run ``decode`` over ``case.data`` and judge the outcome."""
    outcome, problem, peak = _run_one(lambda: codec.decode(case.data), case.whole, trace)
    if problem is None and peak is not None and peak > memory_bound(codec):
        problem = f"decode peaked at {peak} bytes, bound {memory_bound(codec)}"
    return Result(outcome, problem, 0, 0, peak)


@dataclass
class FuzzReport:
    """Counts and findings of one fuzz run. ``ok`` means no violation."""

    inputs: int
    seed: int
    max_payload: int
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    by_mutation: dict[str, collections.Counter[str]] = field(default_factory=dict)
    violations: int = 0
    examples: list[str] = field(default_factory=list)
    max_request: int = 0
    max_total_request: int = 0
    read_bound: int = 0
    peak_bytes: int = 0
    memory_bound: int = 0
    traced_inputs: int = 0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.violations == 0

    @property
    def inputs_per_s(self) -> float:
        return self.inputs / self.elapsed_s if self.elapsed_s > 0 else float("nan")

    def note(self, case: Case, which: str, res: Result) -> None:
        self.outcomes[f"{which}:{res.outcome}"] += 1
        self.by_mutation.setdefault(case.mutation.value, collections.Counter())[
            f"{which}:{res.outcome}"
        ] += 1
        self.max_request = max(self.max_request, res.max_request)
        self.max_total_request = max(self.max_total_request, res.total_request)
        if res.peak_bytes is not None:
            self.peak_bytes = max(self.peak_bytes, res.peak_bytes)
        if res.violation is not None:
            self.violations += 1
            if len(self.examples) < MAX_VIOLATIONS_KEPT:
                self.examples.append(
                    f"{case.mutation.value} ({which}, {len(case.data)} bytes): {res.violation}"
                )

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "inputs": self.inputs,
            "seed": self.seed,
            "max_payload": self.max_payload,
            "inputs_per_s": round(self.inputs_per_s, 1),
            "elapsed_s": round(self.elapsed_s, 3),
            "outcomes": dict(sorted(self.outcomes.items())),
            "by_mutation": {
                k: dict(sorted(v.items())) for k, v in sorted(self.by_mutation.items())
            },
            "violations": self.violations,
            "examples": self.examples,
            "max_request": self.max_request,
            "max_total_request": self.max_total_request,
            "read_bound": self.read_bound,
            "peak_bytes": self.peak_bytes,
            "memory_bound": self.memory_bound,
            "traced_inputs": self.traced_inputs,
        }


def make_codec(seed: int, max_payload: int) -> tuple[FrameCodec, bytes]:
    rng = random.Random(f"codec:{seed}")
    secret = rng.randbytes(32)
    return FrameCodec(secret, rng.randrange(_U32 + 1), max_payload), secret


def cases(codec: FrameCodec, secret: bytes, seed: int, count: int) -> Iterator[Case]:
    gen = CaseGenerator(codec, secret, seed)
    for _ in range(count):
        yield gen.case()


def run_fuzz(
    inputs: int = DEFAULT_FRAMES,
    seed: int = 0,
    max_payload: int = DEFAULT_FUZZ_MAX_PAYLOAD,
    traced_inputs: int | None = None,
) -> FuzzReport:
    """Fuzz a fresh codec with ``inputs`` seeded cases; see the module docstring.

    The timed pass checks everything but memory; the traced pass repeats the first
    ``traced_inputs`` cases (default: all) under tracemalloc.
    """
    if inputs < 0:
        raise ValueError(f"inputs={inputs} must be >= 0")
    codec, secret = make_codec(seed, max_payload)
    traced = inputs if traced_inputs is None else min(traced_inputs, inputs)
    report = FuzzReport(
        inputs,
        seed,
        max_payload,
        read_bound=read_bound(codec),
        memory_bound=memory_bound(codec),
        traced_inputs=traced,
    )
    busy = 0.0
    for case in cases(codec, secret, seed, inputs):
        t0 = time.perf_counter()
        stream, whole = check_stream(codec, case), check_whole(codec, case)
        busy += time.perf_counter() - t0
        report.note(case, "read_frame", stream)
        report.note(case, "decode", whole)
    report.elapsed_s = busy
    if traced:
        was_tracing = tracemalloc.is_tracing()
        if not was_tracing:
            tracemalloc.start()
        try:
            for case in cases(codec, secret, seed, traced):
                for res, which in (
                    (check_stream(codec, case, trace=True), "read_frame"),
                    (check_whole(codec, case, trace=True), "decode"),
                ):
                    if res.peak_bytes is not None:
                        report.peak_bytes = max(report.peak_bytes, res.peak_bytes)
                    if res.violation is not None and "peaked" in res.violation:
                        report.note(case, f"{which}-traced", res)
        finally:
            if not was_tracing:
                tracemalloc.stop()
    return report


def print_report(report: FuzzReport, out: TextIO | None = None) -> None:
    w = (out or sys.stdout).write
    w(
        f"fuzzed {report.inputs} inputs (seed {report.seed}, max_payload {report.max_payload})"
        f" in {report.elapsed_s:.2f} s of decoding: {report.inputs_per_s:,.0f} inputs/s"
        f" (each through read_frame and decode)\n"
    )
    w("outcomes:\n")
    for k, v in sorted(report.outcomes.items()):
        w(f"  {k:<28} {v:>9}\n")
    w("per mutation:\n")
    for m, c in sorted(report.by_mutation.items()):
        w(f"  {m:<14} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) + "\n")
    w(
        f"largest read request {report.max_request} B, largest per frame "
        f"{report.max_total_request} B (bound {report.read_bound} B)\n"
    )
    w(
        f"tracemalloc peak per decode {report.peak_bytes} B over {report.traced_inputs} inputs "
        f"(bound {report.memory_bound} B)\n"
    )
    w(f"violations: {report.violations}\n")
    for e in report.examples:
        w(f"  {e}\n")


# -- command line ------------------------------------------------------------------------------


def _addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected ADDR:PORT, got {text!r}")
    return host, int(port)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "python -m lab.fuzz",
        "Fuzz benchmark of the frame decoder, or (subcommand attack) a hostile "
        "peer for a running lab. See the module docstring.",
    )
    p.add_argument(
        "--frames",
        type=_positive_int,
        default=DEFAULT_FRAMES,
        help=f"inputs to generate (default {DEFAULT_FRAMES})",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the input stream (default 0)")
    p.add_argument(
        "--max-payload",
        type=_positive_int,
        default=DEFAULT_FUZZ_MAX_PAYLOAD,
        help=f"the codec's payload limit (default {DEFAULT_FUZZ_MAX_PAYLOAD})",
    )
    p.add_argument(
        "--traced",
        type=int,
        default=None,
        metavar="N",
        help="inputs to repeat under tracemalloc (default: all)",
    )
    add_json_flag(p, "the report")
    sub = p.add_subparsers(dest="command")
    a = sub.add_parser("attack", help="send hostile connections to a worker's data port")
    a.add_argument("--to", type=_addr, required=True, metavar="ADDR:PORT")
    a.add_argument(
        "--frames",
        dest="attack_frames",
        type=_positive_int,
        default=30,
        help="connections to open, one hostile message each (default 30)",
    )
    a.add_argument("--mode", choices=[m.value for m in AttackMode], default="mixed")
    a.add_argument("--seed", dest="attack_seed", type=int, default=0)
    a.add_argument(
        "--max-payload",
        dest="attack_max_payload",
        type=_positive_int,
        default=DEFAULT_MAX_PAYLOAD,
        help="the target's payload limit, for oversized headers (default 4 MiB)",
    )
    a.add_argument(
        "--wait",
        type=float,
        default=10.0,
        help="seconds to wait for the target to drop each connection (default 10)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "attack":
        host, port = args.to
        report = attack(
            host,
            port,
            args.attack_frames,
            AttackMode(args.mode),
            seed=args.attack_seed,
            max_payload=args.attack_max_payload,
            wait_s=args.wait,
        )
        print(json.dumps(report.to_dict()), flush=True)
        return 0 if report.dropped == args.attack_frames else 1
    fuzz = run_fuzz(args.frames, args.seed, args.max_payload, args.traced)
    if write_json(args.json, fuzz.to_dict()):
        print_report(fuzz)
    return 0 if fuzz.ok else 1


if __name__ == "__main__":
    sys.exit(main())
