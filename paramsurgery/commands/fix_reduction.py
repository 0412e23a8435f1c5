"""`paramsurgery fix-reduction`: stack + Reduction with dropped axes → element-wise sum/mean."""

from __future__ import annotations

import argparse

from ._common import add_pass_args, run_param_pass
from ._runner import add_partial_arg, add_pnnx_arg, traced_path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fix-reduction", help="repair Reductions whose axes pnnx dropped "
                       "(Concat 0=-233 + Reduction -23303=0 → Eltwise sum/mean)")
    add_pass_args(p, "fixred")
    p.add_argument("--style", choices=("eltwise", "binaryop"), default="eltwise",
                   help="write one Eltwise (default) or a chain of BinaryOps")
    add_pnnx_arg(p)
    add_partial_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..passes.fix_reduction import FixReduction

    return run_param_pass(args, FixReduction(style=args.style, traced=traced_path(args),
                                             partial=args.partial), "fixred")
