"""`paramsurgery fmt`: rewrite a graph in pnnx's canonical layout."""

from __future__ import annotations

import argparse

from paramsurgery.formats.io import load
from paramsurgery.commands._common import add_output_args, output_path, write_graph


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fmt", help="normalise a .param to pnnx's format (layout, param order, "
                       "float spelling, header counts)")
    p.add_argument("param", help="input .param")
    add_output_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = output_path(args, args.param)
    g = load(args.param)
    from paramsurgery.formats.normalize import normalize

    normalize(g)
    assert out is not None  # required
    write_graph(g, out, f"wrote {{out}} ({len(g)} layers, {g.blob_count()} blobs)")
    return 0
