"""`paramsurgery fold-gqa`: drop the K/V head expansion before SDPA (native GQA)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from ..errors import ParamSurgeryError
from ..io import atomic_write, load
from ._common import add_format_arg, add_output_args, derived_output, link_or_copy, print_json


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
    p.add_argument("--bin", help="the weights; with -o linked (or copied) next to the output as "
                   "<output>.bin, and used by --verify")
    p.add_argument("--only", nargs="+", default=[], metavar="NAME", help="only these SDPA layers")
    p.add_argument("--skip", nargs="+", default=[], metavar="NAME",
                   help="leave these SDPA layers alone")
    p.add_argument("--verify", action="store_true",
                   help="compare the folded decoder with the input graph (or --reference) "
                        "through ncnn at --lengths before writing (needs --bin); refuse on "
                        "mismatch")
    p.add_argument("--reference", help="--verify against this graph instead of the input (e.g. "
                   "the repeat_interleave twin when the input cannot load); same --bin unless "
                   "--reference-bin")
    p.add_argument("--reference-bin", help="weights of --reference")
    p.add_argument("--lengths", default="1,9,17", help="--verify: sequence lengths")
    p.add_argument("--tol", type=float, default=1e-5, help="--verify: relative tolerance")
    p.add_argument("--explain", action="store_true", help="say why SDPA layers were left alone")
    from .verify_kvcache import add_decoder_io_args

    add_decoder_io_args(p)
    from ._common import add_inputshape_args

    add_inputshape_args(p)
    add_format_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..passes.fold_gqa import FoldGQA, verify_fold
    from ._common import output_path

    if args.output is None and not args.in_place:
        args.output = derived_output(args.param, "gqa")
    out = output_path(args, args.param)
    # with --bin, check the weights match the param first (a mismatch names the layer)
    g = load(args.param, bin=args.bin) if args.bin else load(args.param)
    from ._common import inputshape_of, run_pass_located

    shapes = inputshape_of(args, g)
    result = run_pass_located(FoldGQA(only=args.only, skip=args.skip, inputshape=shapes), g,
                              args.param)
    data = result.graph.dump_bytes()
    check = None
    if args.verify and result.modified:
        if not args.bin and not (shapes or args.inputs):
            raise ParamSurgeryError("--verify needs the weights (--bin model.bin)", file=args.param)
        from .verify_kvcache import decoder_io_from_args

        with tempfile.TemporaryDirectory(prefix="paramsurgery-gqa-") as tmp:
            cand = os.path.join(tmp, "folded.param")
            with open(cand, "wb") as fh:
                fh.write(data)
            if shapes or args.inputs:  # generic: any graph, from the input spec
                from ..equivalence import verify_equivalent

                lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
                syms = {getattr(d, "symbols", ())[0] for s in shapes.values() for d in s
                        if getattr(d, "symbols", ())}
                check = verify_equivalent(cand, args.reference or args.param, bin=args.bin,
                                          reference_bin=args.reference_bin, inputshape=shapes,
                                          values={sym: lengths for sym in syms},
                                          inputs=args.inputs, tol=args.tol, seed=args.seed)
            else:
                check = verify_fold(cand, args.bin, args.reference or args.param,
                                    lengths=[int(x) for x in args.lengths.split(",")
                                             if x.strip()],
                                    io=decoder_io_from_args(args), tol=args.tol,
                                    seed=args.seed, reference_bin=args.reference_bin)
            check.reference = args.reference or args.param
        if not check.ok:
            print(result.format(args.explain), file=sys.stderr)
            print(check.format(), file=sys.stderr)
            print(f"{args.param}: refusing to write {out}: the folded graph is not proven equal",
                  file=sys.stderr)
            return 1
    if out == "-":
        sys.stdout.buffer.write(data)
    elif result.modified or out != args.param:
        atomic_write(out, data)
    bin_note = "weights: unchanged (only weightless layers were removed)"
    if args.bin and out not in ("-", args.param):
        target = out[: -len(".param")] + ".bin" if out.endswith(".param") else out + ".bin"
        how = link_or_copy(args.bin, target)
        bin_note += f"; {target} is a {how} of {args.bin}"
    if args.format == "json":
        print_json({"output": out, "modified": result.modified,
                    "changes": [c.__dict__ for c in result.changes],
                    "skipped": [s.__dict__ for s in result.skipped], "notes": result.notes,
                    "folded": result.data.get("folded", []),
                    "unloadable": result.data.get("unloadable", {}),
                    "verify": None if check is None else {"ok": check.ok, "rel": check.rel,
                                                          "reference": check.reference}})
        return 0
    stream = sys.stderr if out == "-" else sys.stdout
    print(result.format(args.explain), file=stream)
    if check is not None:
        print(check.format(), file=stream)
    print(bin_note, file=stream)
    if out != "-":
        print(f"wrote {out}" if (result.modified or out != args.param) else f"{out} unchanged",
              file=stream)
    return 0
