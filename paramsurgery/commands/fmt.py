"""`paramsurgery fmt`: normalise a .param to pnnx's format (layout, param order, float
spelling, header counts)

Rewrite a .param in pnnx's canonical layout: line layout, param order, float spelling,
header counts. Writes <input>.fmt.param unless -o / --in-place.
"""

from __future__ import annotations

import argparse

from paramsurgery.core.words import counted
from paramsurgery.formats.io import load
from paramsurgery.commands._common import (add_format_arg, add_input_arg, add_output_args,
                                           add_weights_arg, command, default_output, file_list,
                                           print_json, write_graph)


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__, run)
    add_input_arg(p)
    add_output_args(p, "output .param (default: <input>.fmt.param)")
    add_weights_arg(p, "its weights (.bin): checked against the graph (fmt changes no "
                       "weight)")
    add_format_arg(p)


def run(args: argparse.Namespace) -> int:
    out = default_output(args, "fmt")
    g = load(args.param, bin=args.bin)
    from paramsurgery.formats.normalize import normalize

    normalize(g)
    note = f"wrote {{out}} ({counted(len(g), 'layer')}, {counted(g.blob_count(), 'blob')})"
    write_graph(g, out, note if args.format == "text" else None)
    if args.format == "json":
        print_json({"output": out, "layers": len(g), "blobs": g.blob_count(),
                    "files": file_list(("input", args.param), ("output", out))},
                   stream=__import__("sys").stderr if out == "-" else None)
    return 0
