"""`paramsurgery fix-reduction`: stack + Reduction with dropped axes → element-wise sum/mean."""

from __future__ import annotations

import argparse

from ._common import add_pass_args, run_param_pass


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fix-reduction", help="repair Reductions whose axes pnnx dropped "
                       "(Concat 0=-233 + Reduction -23303=0 → Eltwise sum/mean)")
    add_pass_args(p, "fixred")
    p.add_argument("--style", choices=("eltwise", "binaryop"), default="eltwise",
                   help="write one Eltwise (default) or a chain of BinaryOps")
    p.add_argument("--pnnx", metavar="PNNX_PARAM",
                   help="pnnx's own IR with traced shapes (default: X.pnnx.param next to "
                        "X.ncnn.param, if present)")
    p.add_argument("--partial", action="store_true",
                   help="rewrite what can be proven and list the rest, instead of refusing")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..passes._traced import companion_pnnx
    from ..passes.fix_reduction import FixReduction

    traced = args.pnnx or companion_pnnx(args.param)
    return run_param_pass(args, FixReduction(style=args.style, traced=traced,
                                             partial=args.partial), "fixred")
