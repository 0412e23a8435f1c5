"""`paramsurgery dynamize`: a traced length baked into params → relative forms."""

from __future__ import annotations

import argparse

from paramsurgery.commands._common import add_pass_args
from paramsurgery.commands._runner import run_param_pass
from paramsurgery.commands._runner import add_pnnx_arg, traced_path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dynamize", help="rewrite the traced length of a static export (Crop "
                       "ends, Reshape dims, Gemm 7=) so the graph runs at any length")
    add_pass_args(p, "dynamic")
    from paramsurgery.commands._pass_commands import add_option_args
    from paramsurgery.passes.dynamize import Dynamize

    add_option_args(p, Dynamize)  # --traced-len --pair-len --axis --reshape-axes --layers
    p.add_argument("--pair", metavar="OTHER_PARAM",
                   help="the same model exported at another length: every differing value is "
                        "length-derived")
    p.add_argument("--reference", metavar="REF_NPZ",
                   help="one trace: a reference whose inputs are the traced ones at another "
                        "length (`in0`… or `input_*` arrays); the traced length becomes a "
                        "symbol of the shape analysis, which proves each rewrite (needs "
                        "pnnx's IR: X.pnnx.param or --pnnx)")
    add_pnnx_arg(p)
    p.add_argument("--pair-bin", metavar="OTHER_BIN", help="the weights of --pair")
    p.add_argument("--pair-pnnx", metavar="OTHER_PNNX_PARAM",
                   help="pnnx's IR of --pair (default: next to it)")
    from paramsurgery.commands._common import add_inputshape_args

    add_inputshape_args(p, inputs=False)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.commands._pass_commands import option_values
    from paramsurgery.core.errors import ParamSurgeryError
    from paramsurgery.formats.pnnx_traced import companion_pnnx
    from paramsurgery.passes.dynamize import Dynamize

    if args.traced_len is None and args.pair is None and args.reference is None:
        raise ParamSurgeryError("give --traced-len T, --pair OTHER.param or --reference "
                                "REF.npz", file=args.param)
    from paramsurgery.commands._common import inputshape_of

    traced = traced_path(args)
    shapes = inputshape_of(args)
    if shapes and any(not isinstance(d, int) for s in shapes.values() for d in s):
        raise ParamSurgeryError("dynamize: --inputshape gives the traced shapes: numbers only "
                                "(e.g. in0=[4,20] for --traced-len 20)", file=args.param)
    # the command reads the files, the pass gets the graph and pnnx's ops
    from paramsurgery.formats.io import load
    from paramsurgery.formats.pnnx_traced import load_traced

    if args.pair_bin and not (args.pair and args.bin):
        raise ParamSurgeryError("--pair-bin goes with --pair and --bin", file=args.param)
    reference = None
    if args.reference is not None:
        from paramsurgery.passes.dynamize_shapes import reference_shapes

        shapes_ref = reference_shapes(args.reference)
        if shapes_ref is None:
            raise ParamSurgeryError("cannot read the input/output shapes of this reference "
                                    "(`in0`… / `input_*` arrays)", file=args.reference)
        if traced is None:
            raise ParamSurgeryError("--reference needs pnnx's IR (the traced input shapes): "
                                    "X.pnnx.param next to the file, or --pnnx", file=args.param)
        reference = (*shapes_ref, args.reference)
    pair = load(args.pair, bin=args.pair_bin) if args.pair else None
    # the pair's pnnx IR: --pair-pnnx, else the one next to it
    pair_traced = args.pair_pnnx or (companion_pnnx(args.pair) if args.pair else None)
    p = Dynamize(
        **option_values(Dynamize, args), pair=pair, reference=reference,
        traced=load_traced(traced), inputshape=shapes, pair_traced=load_traced(pair_traced),
        # named in messages when read without weights (as before the move)
        pair_path=None if args.pair_bin else args.pair)
    return run_param_pass(args, "dynamic", lambda: p)
