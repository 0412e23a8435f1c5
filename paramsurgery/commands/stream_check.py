"""`paramsurgery stream-check`: stream a conv stack chunk by chunk through its add-conv-cache
conversion and compare with running it once on all frames (exit 1 on mismatch)

Convert MODEL with add-conv-cache (in a temporary directory, or --keep DIR), feed random
frames in the given chunks through the streaming graph with StreamingRunner, and compare the
concatenated output with the original graph run on all frames at once (max|diff| /
max|offline| <= --tol); every chunk must emit exactly the earliest possible sample count.
Exit 0 when both hold, 1 when not, 2 when the model cannot be streamed.
"""

from __future__ import annotations

import argparse
import os

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.commands._common import (add_format_arg, add_input_arg, command, file_list,
                                           print_json)
from paramsurgery.commands.add_conv_cache import parse_chunks


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__, run)
    add_input_arg(p, "the original (offline) .param")
    from paramsurgery.commands._common import add_weights_arg

    add_weights_arg(p, "its weights (.bin)", positional=True, required=True)
    p.add_argument("--chunks", default="1,3,2", help="chunk sizes in frames (default 1,3,2)")
    p.add_argument("--frames", type=int, help="total frames: repeat the --chunks pattern "
                   "until this many frames (default: one pass of --chunks)")
    p.add_argument("--seed", type=int, default=0, help="random frames seed (default 0)")
    p.add_argument("--tol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    p.add_argument("--time-axis", metavar="AXIS", help="numpy axis of the frames (0 rows, 1 "
                   "columns, or NAME=AXIS,...); default: inferred")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1",
                   help="numpy shape of an input whose channel count the graph does not fix "
                        "(T for the time axis), e.g. in0=T,512")
    p.add_argument("--threads", type=int, default=1, help="ncnn threads (default 1)")
    p.add_argument("--keep", metavar="DIR", help="write the conversion into DIR and keep it")
    p.add_argument("--noise-floor", action="store_true",
                   help="also report how far the offline graph disagrees with itself on a "
                        "causal prefix (offline(n)[:k] vs offline(n-1)): the fp32 floor of any "
                        "chunked comparison, useful to pick --tol for large models")
    add_format_arg(p)


def chunk_plan(chunks: list[int], frames: int | None) -> list[int]:
    if frames is None:
        return chunks
    if frames <= 0:
        raise ParamSurgeryError("--frames must be positive")
    plan, total, i = [], 0, 0
    while total < frames:
        c = min(chunks[i % len(chunks)], frames - total)
        plan.append(c)
        total += c
        i += 1
    return plan


def _shapes(items: list[str]) -> dict[str, list[int]]:
    out = {}
    for it in items:
        if "=" not in it:
            raise ParamSurgeryError(f"--input-shape {it!r}: use NAME=D0,D1 (T for time)")
        name, dims = it.split("=", 1)
        out[name] = [0 if d.strip() in ("T", "t") else int(d) for d in dims.split(",")]
    return out


def run(args: argparse.Namespace) -> int:
    from paramsurgery.streaming import check_stream

    chunks = chunk_plan(parse_chunks(args.chunks), args.frames)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    report, manifest = check_stream(args.param, args.bin, chunks, seed=args.seed, tol=args.tol,
                                    time_axis=args.time_axis,
                                    shapes=_shapes(args.input_shape) or None,
                                    num_threads=args.threads, workdir=args.keep,
                                    floor=args.noise_floor)
    if args.format == "json":
        print_json({"ok": report.ok, "frames": report.frames, "samples": report.samples,
                    "offline_samples": report.offline_samples, "max_abs": report.max_abs,
                    "rel": report.rel, "tol": report.tol,
                    "chunks": [c.__dict__ for c in report.chunks],
                    "flush_samples": report.flush_samples, "problems": report.problems,
                    "noise_floor": report.noise_floor,
                    "states": len(manifest["states"]),
                    "samples_per_frame": manifest["samples_per_frame"],
                    "files": file_list(("input", args.param), ("weights", args.bin))})
    else:
        print(report.format())
        if args.keep:
            print(f"kept the conversion in {args.keep}")
    return 0 if report.ok else 1
