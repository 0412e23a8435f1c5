"""`paramsurgery remove-passthrough`: bypass layers that pass data through unchanged."""

from __future__ import annotations

import argparse

from ._common import add_pass_args
from .set_param import run_located


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("remove-passthrough", help="bypass no-op leftovers and layers (Tensor.to "
                       "that keeps ncnn's values, contiguous/clone/Identity, Noop, Dropout, "
                       "1-top Split), rewiring their readers")
    add_pass_args(p, "nopass")
    p.add_argument("--type", nargs="+", default=(), metavar="TYPE",
                   help="only these layer types (default: every known passthrough type)")
    p.add_argument("--pnnx", metavar="PNNX_PARAM",
                   help="pnnx's IR with the traced dtypes (default: X.pnnx.param next to "
                        "X.ncnn.param, if present); needed for Tensor.to")
    p.add_argument("--partial", action="store_true",
                   help="remove the provable ones and keep (and list) the rest instead of "
                        "refusing")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..passes._traced import companion_pnnx
    from ..passes.passthrough import RemovePassthrough

    traced = args.pnnx or companion_pnnx(args.param)
    return run_located(args, lambda: RemovePassthrough(args.type, traced=traced,
                                                       partial=args.partial), "nopass")
