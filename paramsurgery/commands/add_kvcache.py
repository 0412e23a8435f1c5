"""`paramsurgery add-kvcache`: inject ncnn's native kv cache into attention layers."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from ..errors import PassRefused
from ..io import atomic_write, load
from ._common import add_format_arg, add_output_args, derived_output, link_or_copy, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("add-kvcache", help="add ncnn's native kv cache to SDPA / "
                       "MultiHeadAttention layers (4->6 bottoms, 1->3 tops, 7=1)")
    p.add_argument("param", help="input .param (a decoder exported without cache)")
    add_output_args(p, "output .param (default: <input>.kvcache.param)")
    p.add_argument("--bin", help="the weights; with -o, linked (or copied) next to the output "
                   "as <output>.bin, and used by --verify")
    p.add_argument("--naming", choices=("ncnn-docs", "ncnn-llm"), default="ncnn-docs",
                   help="cache blob names: cache_k_in_{i}/cache_k_out_{i} (ncnn docs, default) "
                   "or cache_k{i}/out_cache_k{i} (ncnn benchmark LLM params, ncnn_llm)")
    p.add_argument("--split-inputs", action="store_true",
                   help="one Input layer per cache blob instead of one for all")
    p.add_argument("--input-name", help="name of the cache Input layer")
    p.add_argument("--only", nargs="+", default=[], metavar="NAME",
                   help="only these attention layers")
    p.add_argument("--skip", nargs="+", default=[], metavar="NAME",
                   help="leave these attention layers alone")
    p.add_argument("--dynamic-gemm", action="store_true",
                   help="Gemm 7=constantM -> 7=0 where A is an input (dynamic sequence length)")
    p.add_argument("--verify", action="store_true",
                   help="prove parity through ncnn before writing (needs --bin); refuse on failure")
    p.add_argument("--n", type=int, default=8, help="--verify: prefill length (default 8)")
    p.add_argument("--m", type=int, default=4, help="--verify: single-token steps (default 4)")
    p.add_argument("--tol", type=float, default=1e-5, help="--verify: relative tolerance")
    p.add_argument("--explain", action="store_true", help="say why layers were left alone")
    from .verify_kvcache import add_decoder_io_args

    add_decoder_io_args(p)
    from ._common import add_inputshape_args

    add_inputshape_args(p)
    add_format_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..passes.kvcache import AddKVCache

    out = args.output
    if out is None and not args.in_place:
        out = derived_output(args.param, "kvcache")
        args.output = out
    from ._common import output_path

    out = output_path(args, args.param)
    # with --bin, check the weights match the param first (a mismatch names the layer)
    g = load(args.param, bin=args.bin) if args.bin else load(args.param)
    before = (len(g), g.blob_count())
    result = AddKVCache(naming=args.naming, split_inputs=args.split_inputs, only=args.only,
                        skip=args.skip, dynamic_gemm=args.dynamic_gemm,
                        input_name=args.input_name)(g)
    new = result.graph
    data = new.dump_bytes()
    parity = None
    if args.verify:
        if not args.bin:
            raise PassRefused("--verify needs the weights (--bin model.bin)", file=args.param)
        from ..kvcache_verify import verify_kvcache

        with tempfile.TemporaryDirectory(prefix="paramsurgery-kv-") as tmp:
            candidate = os.path.join(tmp, "candidate.param")
            with open(candidate, "wb") as fh:
                fh.write(data)
            from ._common import inputshape_of
            from .verify_kvcache import decoder_io_from_args

            parity = verify_kvcache(candidate, args.bin, n=args.n, m=args.m, tol=args.tol,
                                    io=decoder_io_from_args(args), seed=args.seed,
                                    reference_param=args.param,
                                    inputshape=inputshape_of(args) or None, inputs=args.inputs)
        if not parity.ok:
            if args.format == "text":
                print(result.format(args.explain))
                print(parity.format())
            print(f"{args.param}: refusing to write {out}: kv-cache parity failed",
                  file=sys.stderr)
            return 1
    if result.modified or out != args.param:
        if out == "-":
            sys.stdout.buffer.write(data)
        else:
            atomic_write(out, data)
    bin_note = "weights: unchanged (the .bin needs no rewrite)"
    if args.bin and out not in ("-", args.param) and args.output:
        target = out[: -len(".param")] + ".bin" if out.endswith(".param") else out + ".bin"
        how = link_or_copy(args.bin, target)
        bin_note += f"; {target} is a {how} of {args.bin}"
    if args.format == "json":
        print_json({"output": out, "modified": result.modified,
                    "changes": [c.__dict__ for c in result.changes],
                    "skipped": [s.__dict__ for s in result.skipped],
                    "header": {"before": before, "after": [len(new), new.blob_count()]},
                    "cache": [s.__dict__ for s in result.data.get("slots", [])],
                    "parity": None if parity is None else {
                        "ok": parity.ok, "steps": [s.__dict__ for s in parity.steps]}})
        return 0
    stream = sys.stderr if out == "-" else sys.stdout
    print(result.format(args.explain), file=stream)
    print(f"header: {before[0]} {before[1]} -> {len(new)} {new.blob_count()}", file=stream)
    if parity is not None:
        print(parity.format(), file=stream)
    print(bin_note, file=stream)
    if out != "-":
        print(f"wrote {out}" if (result.modified or out != args.param) else
              f"{out} unchanged", file=stream)
    return 0
