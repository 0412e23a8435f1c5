"""`paramsurgery fold-gqa`: remove K/V expansion from kv heads to q heads before SDPA
(ExpandDims+Tile+Reshape, HF repeat_kv leftovers, stack): SDPA does GQA natively

Remove the expansion of K and V from G kv heads to H query heads before SDPA and feed SDPA
the kv-head K/V (ncnn's SDPA does grouped-query attention natively). Works before and after
add-kvcache; the .bin does not change (the removed layers have no weights).
"""

from __future__ import annotations

import argparse
from typing import Any

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.ir.graph import Graph
from paramsurgery.commands._common import add_input_arg, add_output_args, command
from paramsurgery.commands._runner import (Check, GraphCommand, PassLike, Outputs, Run, add_bin_arg,
                                           add_pnnx_arg, add_verify_args, prove_equivalent, traced_path)


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__)
    add_input_arg(p)
    add_output_args(p, "output .param (default: <input>.gqa.param)")
    add_bin_arg(p)
    add_pnnx_arg(p, "the traced shapes of repeat_kv's Tensor.expand/Tensor.reshape leftovers")
    p.add_argument("--only", nargs="+", default=[], metavar="NAME", help="only these SDPA layers")
    p.add_argument("--skip", nargs="+", default=[], metavar="NAME",
                   help="leave these SDPA layers alone")
    add_verify_args(p, "compare the folded decoder with the input graph (or --reference) "
                       "through ncnn at --lengths (needs --bin)", tol=1e-5)
    p.add_argument("--reference", help="--verify against this graph instead of the input (e.g. "
                   "the repeat_interleave twin when the input cannot load); same --bin unless "
                   "--reference-bin")
    p.add_argument("--reference-bin", help="weights of --reference")
    p.add_argument("--lengths", default="1,9,17", help="--verify: sequence lengths")
    from paramsurgery.commands.verify_kvcache import add_decoder_io_args

    add_decoder_io_args(p)
    from paramsurgery.commands._common import add_inputshape_args

    add_inputshape_args(p)
    run.finish(p, explain="say why SDPA layers were left alone")


class FoldGQACommand(GraphCommand):
    # --verify runs without weights too when --inputshape/--inputs describe the inputs
    tag, bin_note, verify_needs_bin = "gqa", True, False
    refusal = "the folded graph is not proven equal"

    def make_pass(self, args: argparse.Namespace) -> PassLike:
        from paramsurgery.passes.fold_gqa import FoldGQA
        from paramsurgery.commands._common import inputshape_of

        from paramsurgery.formats.pnnx_param import read_pnnx_param

        traced = traced_path(args)
        return FoldGQA(only=frozenset(args.only or ()), skip=frozenset(args.skip or ()),
                       inputshape=inputshape_of(args),
                       traced=read_pnnx_param(traced) if traced is not None else None)

    def prepare(self, args: argparse.Namespace, g: Graph) -> None:
        from paramsurgery.commands._common import inputshape_of

        inputshape_of(args, g)  # --inputshape names blobs of this graph

    def verify(self, run: Run, staged: Outputs) -> Check | None:
        args = run.args
        if not run.result.modified:
            return None
        from paramsurgery.verify.gqa import verify_fold
        from paramsurgery.commands._common import inputshape_of
        from paramsurgery.commands.verify_kvcache import decoder_io_from_args

        shapes = inputshape_of(args)
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
        check: Any
        if shapes or args.inputs:  # generic: any graph, from the input spec
            check = prove_equivalent(args, staged, args.reference or args.param, args.reference_bin)
        else:
            if staged.bin is None:
                raise ParamSurgeryError("--verify needs the weights (--bin model.bin)",
                                        file=args.param)
            check = verify_fold(staged.param, staged.bin, args.reference or args.param,
                                lengths=lengths, io=decoder_io_from_args(args), tol=args.tol,
                                seed=args.seed, reference_bin=args.reference_bin)
        check.reference = args.reference or args.param
        return check

    def json(self, run: Run) -> dict:
        check = run.check
        return {"folded": run.result.data.get("folded", []),
                "unloadable": run.result.data.get("unloadable", {}),
                "verify": None if check is None else {"ok": check.ok, "rel": check.rel,
                                                      "reference": check.reference}}


run = FoldGQACommand()
