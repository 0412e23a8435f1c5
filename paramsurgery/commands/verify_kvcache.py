"""`paramsurgery verify-kvcache`: prefill + cached steps vs a full prefill, through ncnn."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from paramsurgery.commands._common import add_format_arg, print_json

if TYPE_CHECKING:  # imported when the command runs: registering it stays cheap (CLI start)
    from paramsurgery.verify.kvcache import DecoderIO


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify-kvcache", help="prove a kv-cache decoder matches a full prefill "
                       "through ncnn (per-step max abs/rel error)")
    p.add_argument("param", help="the decoder with kv cache (.param)")
    from paramsurgery.commands._common import add_weights_arg

    add_weights_arg(p, "its weights (.bin)", positional=True, required=True)
    p.add_argument("--n", type=int, default=8, help="prefill length (default 8)")
    p.add_argument("--m", type=int, default=4, help="single-token steps (default 4)")
    p.add_argument("--tol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    p.add_argument("--reference", help="the same decoder without cache: also compare the full "
                   "prefill with it")
    add_decoder_io_args(p)
    from paramsurgery.commands._common import add_inputshape_args

    add_inputshape_args(p)
    add_format_arg(p)
    p.set_defaults(run=run)


def add_decoder_io_args(p: argparse.ArgumentParser) -> None:
    """The decoder convention (shared with add-kvcache --verify)."""
    p.add_argument("--manifest", help="JSON with decoder conventions (keys of DecoderIO: "
                   "embeds, mask, cos, sin, output, hidden, head_dim, rope_theta)")
    for name in ("embeds", "mask", "cos", "sin"):
        p.add_argument(f"--{name}", help=f"blob name of the {name} (default: fixtures' convention)")
    p.add_argument("--output-blob", help="blob name of the decoder output (default out0)")
    p.add_argument("--hidden", type=int, help="hidden size (default: inferred)")
    p.add_argument("--head-dim", type=int, help="RoPE head_dim (default: inferred)")
    p.add_argument("--rope-theta", type=float, help="RoPE theta (default 10000)")
    p.add_argument("--seed", type=int, default=0)


def decoder_io_from_args(args: argparse.Namespace) -> "DecoderIO":
    from paramsurgery.verify.kvcache import DecoderIO

    io = DecoderIO()
    if args.manifest:
        with open(args.manifest) as fh:
            conf = json.load(fh)
        for k, v in conf.items():
            if hasattr(io, k):
                setattr(io, k, v)
    for k in ("embeds", "mask", "cos", "sin", "output_blob", "hidden", "head_dim", "rope_theta"):
        v = getattr(args, k)
        if v is not None:
            setattr(io, "output" if k == "output_blob" else k, v)
    return io


def run(args: argparse.Namespace) -> int:
    from paramsurgery.verify.kvcache import verify_kvcache

    io = decoder_io_from_args(args)
    from paramsurgery.commands._common import inputshape_of

    report = verify_kvcache(args.param, args.bin, n=args.n, m=args.m, io=io, tol=args.tol,
                            seed=args.seed, reference_param=args.reference,
                            inputshape=inputshape_of(args) or None, inputs=args.inputs)
    if args.format == "json":
        print_json({**report.to_json(),
                    "files": [{"file": args.param, "role": "input"},
                              {"file": args.bin, "role": "weights"}]})
    else:
        from paramsurgery.core import progress

        rest = progress.unshown(report.format())  # the steps were printed as they finished
        if rest:
            print(rest)
    return 0 if report.ok else 1
