"""`paramsurgery extract`: cut a subgraph (e.g. an lm_head) with exactly its weights."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import ParamSurgeryError
from ..io import atomic_write, load
from ._common import add_format_arg, add_report_arg, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "extract", help="cut the subgraph that computes --outputs from --inputs, with exactly "
        "its weights",
        description="Write the layers that compute --outputs from --inputs (and nothing else) "
                    "as a new .param, and, given the .bin, a .bin holding exactly their weights "
                    "(bytes copied unchanged). Intermediate blobs named in --inputs become Input "
                    "layers of the same name. Refuses when an output depends on a graph input "
                    "that is not in --inputs, or an input is not needed.")
    p.add_argument("param", help="input .param")
    p.add_argument("bin", nargs="?", help="its .bin (optional: without it only the .param is "
                   "written)")
    p.add_argument("--inputs", help="comma-separated blobs the subgraph starts from (default: "
                   "the graph inputs the outputs need)")
    p.add_argument("--outputs", required=True, help="comma-separated blobs to compute")
    p.add_argument("-o", "--output", metavar="PATH", help="output prefix: PATH.param and "
                   "PATH.bin (or PATH itself if it ends in .param); default <input>.extract")
    p.add_argument("--verify", action="store_true",
                   help="run the full graph and the subgraph through ncnn and require the "
                        "outputs to be bit-identical (needs the .bin and --feeds)")
    p.add_argument("--feeds", metavar="NPZ", help="--verify: arrays for the graph inputs, keyed "
                   "by blob name (numpy shape = ncnn (c,h,w), no batch axis; ids int32)")
    add_format_arg(p)
    add_report_arg(p)
    p.set_defaults(run=run)


def _paths(args: argparse.Namespace) -> tuple[str, str]:
    out = args.output
    if out is None:
        base = args.param[: -len(".param")] if args.param.endswith(".param") else args.param
        out = base + ".extract"
    if out.endswith(".param"):
        return out, out[: -len(".param")] + ".bin"
    return out + ".param", out + ".bin"


def run(args: argparse.Namespace) -> int:
    from ..passes.extract import Extract, check_extract

    param_out, bin_out = _paths(args)
    for path, src in ((param_out, args.param), (bin_out, args.bin)):
        if src and os.path.exists(path) and os.path.samefile(path, src):
            raise ParamSurgeryError("-o would overwrite the input", file=src)
    g = load(args.param, bin=args.bin)
    result = Extract(args.inputs, args.outputs)(g)
    sub = result.graph
    check = None
    if args.verify:
        if not args.bin:
            raise ParamSurgeryError("--verify needs the .bin", file=args.param)
        import tempfile

        import numpy as np

        feeds = {}
        if args.feeds:
            with np.load(args.feeds) as data:
                feeds = {k: data[k] for k in data.files}
        needed = set(result.data["graph_inputs"]) | set(_upstream_inputs(g, result))
        missing = [b for b in g.inputs if b in needed and b not in feeds]
        if missing:
            raise ParamSurgeryError(f"--verify: --feeds has no array for {', '.join(missing)}",
                                    file=args.feeds or args.param)
        with tempfile.TemporaryDirectory(prefix="paramsurgery-extract-") as tmp:
            sp, sb = os.path.join(tmp, "sub.param"), os.path.join(tmp, "sub.bin")
            sub.save(sp, bin=sb)
            check = check_extract(args.param, args.bin, sp, sb, feeds, result.data["outputs"],
                                  cut=result.data["cut"])
        if not check.exact:
            print(check.format(), file=sys.stderr)
            print(f"{args.param}: refusing to write {param_out}: the subgraph does not "
                  f"reproduce the full graph", file=sys.stderr)
            return 1
    if args.bin:
        sub.save(param_out, bin=bin_out)
    else:
        atomic_write(param_out, sub.dump_bytes())
    d = result.data
    if args.format == "json":
        print_json({"param": param_out, "bin": bin_out if args.bin else None,
                    "layers": len(sub), "source_layers": len(g), "inputs": d["inputs"],
                    "cut": d["cut"], "outputs": d["outputs"],
                    "extra_outputs": d["extra_outputs"], "weight_bytes": d.get("weight_bytes"),
                    "notes": result.notes, "verified": None if check is None else check.exact})
        return 0
    print(result.format())
    print(f"inputs: {', '.join(d['inputs'])}" + (f" (cut: {', '.join(d['cut'])})"
                                                  if d["cut"] else ""))
    print(f"outputs: {', '.join(d['outputs'])}" + (f" (extra: {', '.join(d['extra_outputs'])})"
                                                    if d["extra_outputs"] else ""))
    if check is not None:
        print(check.format())
    if args.bin:
        print(f"wrote {param_out}, {bin_out} ({d.get('weight_bytes', 0)} weight bytes)")
    else:
        print(f"wrote {param_out}")
    return 0


def _upstream_inputs(g, result) -> list[str]:  # noqa: ANN001
    """Graph inputs the full graph needs to compute the cut blobs."""
    cut = result.data["cut"]
    if not cut:
        return []
    from ..passes.extract import plan_extract

    return plan_extract(g, None, cut).graph_inputs
