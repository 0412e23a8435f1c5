"""`paramsurgery fold-gqa`: drop the K/V head expansion before SDPA (native GQA)."""

from __future__ import annotations

import argparse

from ._common import add_output_args
from ._runner import Check, GraphCommand, PassLike, Outputs, Run, add_bin_arg, add_verify_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fold-gqa", help="remove K/V expansion from kv heads to q heads before SDPA "
        "(ExpandDims+Tile+Reshape, HF repeat_kv leftovers, stack): SDPA does GQA natively",
        description="Remove the expansion of K and V from G kv heads to H query heads before "
                    "SDPA and feed SDPA the kv-head K/V (ncnn's SDPA does grouped-query "
                    "attention natively). Works before and after add-kvcache; the .bin does not "
                    "change (the removed layers have no weights).")
    p.add_argument("param", help="input .param")
    add_output_args(p, "output .param (default: <input>.gqa.param)")
    add_bin_arg(p)
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
    from .verify_kvcache import add_decoder_io_args

    add_decoder_io_args(p)
    run.finish(p, explain="say why SDPA layers were left alone")


def _verify(run: Run, staged: Outputs) -> Check | None:
    args = run.args
    if not (args.verify and run.result.modified):
        return None
    from ..passes.fold_gqa import verify_fold
    from .verify_kvcache import decoder_io_from_args

    assert staged.bin is not None  # --verify needs --bin (the runner checks)
    check = verify_fold(staged.param, staged.bin, args.reference or args.param,
                        lengths=[int(x) for x in args.lengths.split(",") if x.strip()],
                        io=decoder_io_from_args(args), tol=args.tol, seed=args.seed,
                        reference_bin=args.reference_bin)
    check.reference = args.reference or args.param
    return check


def _json(run: Run) -> dict:
    check = run.check
    return {"folded": run.result.data.get("folded", []),
            "unloadable": run.result.data.get("unloadable", {}),
            "verify": None if check is None else {"ok": check.ok, "rel": check.rel,
                                                  "reference": check.reference}}


def _make_pass(args: argparse.Namespace) -> PassLike:
    from ..passes.fold_gqa import FoldGQA

    return FoldGQA(only=args.only, skip=args.skip)


run = GraphCommand("gqa", _make_pass, bin_note=True, verify=_verify,
                   refusal="the folded graph is not proven equal", json=_json)
