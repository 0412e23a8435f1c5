"""`paramsurgery fix-slice`: parameterless / batch-axis Slices and raw torch.unbind → valid Slice."""

from __future__ import annotations

import argparse

from ._common import add_pass_args, run_param_pass


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fix-slice", help="repair Slices ncnn cannot run (no slices/indices, "
                       "raw torch.unbind, 1=-233 batch-axis slices)")
    add_pass_args(p, "fixslice")
    p.add_argument("--pnnx", metavar="PNNX_PARAM",
                   help="pnnx's IR with traced shapes (default: X.pnnx.param next to "
                        "X.ncnn.param, if present)")
    p.add_argument("--partial", action="store_true",
                   help="rewrite what can be proven and list the rest, instead of refusing")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..passes._traced import companion_pnnx
    from ..passes.fix_slice import FixSlice

    traced = args.pnnx or companion_pnnx(args.param)
    return run_param_pass(args, FixSlice(traced=traced, partial=args.partial), "fixslice")
