"""`paramsurgery synth-bin`: a random `.bin` of exactly the layout a `.param` needs."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import ParamSurgeryError
from ..io import atomic_open, load


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth-bin",
        help="write random weights of exactly the layout a .param needs",
        description="Write a .bin with small random weights (uniform ±sqrt(3/fan_in), biases "
                    "±0.1, norm scales ≈ 1) in exactly the layout the .param makes ncnn read, "
                    "so a param-only graph can be loaded and run. Deterministic in --seed.")
    p.add_argument("param", help=".param or .param.bin file")
    p.add_argument("-o", "--output", required=True, metavar="BIN",
                   help="output .bin (written atomically)")
    p.add_argument("--force", action="store_true",
                   help="replace BIN if it exists (it may hold real weights)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="storage of tagged weights (default fp32 = tag 0; untagged weights "
                        "are always raw fp32)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..weights.synth import write_synth_bin

    g = load(args.param)
    if os.path.exists(args.output) and os.path.samefile(args.output, args.param):
        raise ParamSurgeryError("-o names the input .param", file=args.param)
    if os.path.lexists(args.output) and not args.force:
        raise ParamSurgeryError("exists; random weights would replace it (pass --force to "
                                "overwrite)", file=args.output)
    with atomic_open(args.output) as fh:
        n = write_synth_bin(g, fh, seed=args.seed, dtype=args.dtype)
    print(f"{args.output}: {n} bytes of {args.dtype} weights for {len(g)} layers",
          file=sys.stderr)
    return 0
