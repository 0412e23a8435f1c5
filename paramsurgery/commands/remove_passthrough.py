"""`paramsurgery remove-passthrough`: bypass layers that pass data through unchanged."""

from __future__ import annotations

import argparse

from paramsurgery.commands._common import add_pass_args
from paramsurgery.commands._runner import add_partial_arg, add_pnnx_arg, run_param_pass, traced_path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("remove-passthrough", help="bypass no-op leftovers and layers (Tensor.to "
                       "that keeps ncnn's values, contiguous/clone/Identity, Noop, Dropout, "
                       "1-top Split), rewiring their readers")
    add_pass_args(p, "nopass")
    p.add_argument("--type", nargs="+", default=(), metavar="TYPE",
                   help="only these layer types (default: every known passthrough type)")
    add_pnnx_arg(p, "traced dtypes, needed for Tensor.to")
    add_partial_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.passes.passthrough import RemovePassthrough

    traced = traced_path(args)
    return run_param_pass(args, "nopass", lambda: RemovePassthrough(args.type, traced=traced,
                                                                    partial=args.partial))
