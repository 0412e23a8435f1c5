"""`paramsurgery fix-reduction`: stack + Reduction with dropped axes → element-wise sum/mean."""

from __future__ import annotations

import argparse

from paramsurgery.commands._common import add_pass_args
from paramsurgery.commands._runner import run_param_pass
from paramsurgery.commands._runner import add_partial_arg, add_pnnx_arg, traced_path
from paramsurgery.formats.pnnx_traced import load_traced


def register(sub: argparse._SubParsersAction) -> None:
    from paramsurgery.passes.fix_reduction import FixReduction

    p = sub.add_parser("fix-reduction", help=FixReduction.summary, description=FixReduction.summary)
    add_pass_args(p, "fixred")
    p.add_argument("--style", choices=("eltwise", "binaryop"), default="eltwise",
                   help="write one Eltwise (default) or a chain of BinaryOps")
    add_pnnx_arg(p)
    add_partial_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.passes.fix_reduction import FixReduction

    return run_param_pass(args, "fixred", lambda: FixReduction(
        style=args.style, traced=load_traced(traced_path(args)), partial=args.partial))
