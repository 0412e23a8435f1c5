"""`paramsurgery info`: summarise a graph (counts, types, inputs/outputs)

Layer and blob counts, the header, a type histogram, inputs and outputs, the layers ncnn
cannot load; with --bin the weight bytes per layer type and dtype. One report per file.
"""

from __future__ import annotations

import argparse

from paramsurgery.formats.io import load
from paramsurgery.commands._common import add_format_arg, command, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__, run)
    from paramsurgery.commands._common import add_input_arg, add_weights_arg

    add_input_arg(p, ".param or .param.bin file(s)", nargs="+")
    add_weights_arg(p, "weights file: adds weight bytes per layer type and dtype")
    add_format_arg(p)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.analysis.summary import format_summary, summarize

    results = []
    for path in args.param:
        g = load(path, bin=args.bin if len(args.param) == 1 else None)
        s = summarize(g)
        if args.bin and g.weights is not None:
            from paramsurgery.formats.weights import weight_summary

            s["weights"] = weight_summary(g)
        results.append(s)
    if args.format == "json":  # one object, a `files` entry per file, however many
        print_json({"files": results})
    else:
        print("\n\n".join(format_summary(s) for s in results))
    return 0
