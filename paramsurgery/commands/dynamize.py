"""`paramsurgery dynamize`: a traced length baked into params → relative forms."""

from __future__ import annotations

import argparse

from ._common import add_pass_args, run_param_pass
from ._runner import add_pnnx_arg, traced_path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dynamize", help="rewrite the traced length of a static export (Crop "
                       "ends, Reshape dims, Gemm 7=) so the graph runs at any length")
    add_pass_args(p, "dynamic")
    p.add_argument("--traced-len", type=int, metavar="T",
                   help="the length the graph was traced at")
    p.add_argument("--pair", metavar="OTHER_PARAM",
                   help="the same model exported at another length: every differing value is "
                        "length-derived")
    p.add_argument("--pair-len", type=int, metavar="T2",
                   help="the length OTHER_PARAM was traced at (for the a + b·T report; "
                        "inferred from the .pnnx.param inputs when possible)")
    p.add_argument("--axis", type=int, metavar="DIM",
                   help="torch dim of the inputs that carries the length, counted from the end "
                        "(-1 = last); default: the one input dim equal to T")
    p.add_argument("--reshape-axes", nargs="+", choices=("w", "h", "d", "c"), metavar="AXIS",
                   help="only rewrite Reshape dims on these ncnn axes (w h d c)")
    p.add_argument("--layers", nargs="+", metavar="NAME[:PARAM]",
                   help="only rewrite these layers (and params); resolves ambiguous occurrences")
    add_pnnx_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import ParamSurgeryError
    from ..passes.dynamize import Dynamize

    if args.traced_len is None and args.pair is None:
        raise ParamSurgeryError("give --traced-len T or --pair OTHER.param", file=args.param)
    p = Dynamize(args.traced_len, pair=args.pair, pair_len=args.pair_len, axis=args.axis,
                 reshape_axes=args.reshape_axes, layers=args.layers, traced=traced_path(args))
    return run_param_pass(args, p, "dynamic")
