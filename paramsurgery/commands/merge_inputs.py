"""`paramsurgery merge-inputs`: several graph inputs → one multi-top Input."""

from __future__ import annotations

import argparse

from paramsurgery.commands._common import add_pass_args
from paramsurgery.commands._runner import run_param_pass


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("merge-inputs", help="merge graph inputs (e.g. per-layer kv-cache "
                       "Inputs) into one multi-top Input layer; blob names are kept")
    add_pass_args(p, "merged")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--inputs", metavar="A,B,...",
                      help="the input blobs to merge, in the order the new Input lists them")
    what.add_argument("--kv-cache", action="store_true",
                      help="every cache input of the attention layers with 7=1 (k, v per "
                           "layer, in layer order)")
    p.add_argument("--name", default="kv_cache", metavar="LAYER",
                   help="name of the merged Input layer (default: kv_cache)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.passes.io_edits import MergeInputs

    inputs = [b.strip() for b in args.inputs.split(",") if b.strip()] if args.inputs else None
    return run_param_pass(args, "merged", lambda: MergeInputs(inputs, layer_name=args.name,
                                                              kv_cache=args.kv_cache))
