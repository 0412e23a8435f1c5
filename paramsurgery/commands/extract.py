"""`paramsurgery extract`: cut the subgraph that computes --outputs from --inputs, with exactly
its weights

Write the layers that compute --outputs from --inputs (and nothing else) as a new .param,
and, given the .bin, a .bin holding exactly their weights (bytes copied unchanged).
Intermediate blobs named in --inputs become Input layers of the same name. Refuses when an
output depends on a graph input that is not in --inputs, or an input is not needed. (E.g. an
lm_head with exactly its weights.)
"""

from __future__ import annotations

import argparse

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.commands._common import add_input_arg, command
from paramsurgery.commands._runner import Check, GraphCommand, PassLike, Outputs, Run, add_bin_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__)
    add_input_arg(p)
    add_bin_arg(p, positional=True)
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
    run.finish(p)


class ExtractCommand(GraphCommand):
    tag, prefix = "extract", True
    refusal = "the subgraph does not reproduce the full graph"

    def make_pass(self, args: argparse.Namespace) -> PassLike:
        from paramsurgery.passes.extract import Extract

        return Extract(args.inputs, args.outputs)

    def verify(self, run: Run, staged: Outputs) -> Check | None:
        import numpy as np

        from paramsurgery.passes.extract import check_extract

        args, result = run.args, run.result
        feeds = {}
        if args.feeds:
            with np.load(args.feeds) as data:
                feeds = {k: data[k] for k in data.files}
        needed = set(result.data["graph_inputs"]) | set(_upstream_inputs(run.source, result))
        missing = [b for b in run.source.inputs if b in needed and b not in feeds]
        if missing:
            raise ParamSurgeryError(f"--verify: --feeds has no array for {', '.join(missing)}",
                                    file=args.feeds or args.param)
        return check_extract(args.param, args.bin, staged.param, staged.bin, feeds,
                             result.data["outputs"], cut=result.data["cut"])

    def json(self, run: Run) -> dict:
        d, sub = run.result.data, run.graph
        return {"param": run.out.param, "bin": run.out.bin, "layers": len(sub),
                "source_layers": len(run.source), "inputs": d["inputs"], "cut": d["cut"],
                "outputs": d["outputs"], "extra_outputs": d["extra_outputs"],
                "weight_bytes": d.get("weight_bytes"),
                "verified": None if run.check is None else run.check.ok}

    def text(self, run: Run) -> list[str]:
        d = run.result.data
        lines = [f"inputs: {', '.join(d['inputs'])}" + (f" (cut: {', '.join(d['cut'])})"
                                                        if d["cut"] else ""),
                 f"outputs: {', '.join(d['outputs'])}" +
                 (f" (extra: {', '.join(d['extra_outputs'])})" if d["extra_outputs"] else "")]
        if run.out.bin:
            lines.append(f"weights: {d.get('weight_bytes', 0)} weight bytes")
        return lines


run = ExtractCommand()


def _upstream_inputs(g, result) -> list[str]:
    """Graph inputs the full graph needs to compute the cut blobs."""
    cut = result.data["cut"]
    if not cut:
        return []
    from paramsurgery.passes.extract import plan_extract

    return plan_extract(g, None, cut).graph_inputs
