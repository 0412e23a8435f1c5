"""`paramsurgery view`: one self-contained HTML page with the graph drawn top to bottom."""

from __future__ import annotations

import argparse
import sys

from ..errors import ParamSurgeryError
from ..view.scene import MAX_LAYERS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "view", help="draw a graph as one self-contained HTML page (pan, zoom, search)",
        description="Write one HTML file (no network access needed, no external URL) with the "
                    "graph laid out top to bottom: layers as boxes (type, name, params that "
                    "differ from ncnn's defaults; weight dtype and bytes with --bin), blobs as "
                    "wires labelled with their shapes when known (pnnx's traced shapes from "
                    "the X.pnnx.param beside the graph, or -23330 shape hints). Inputs and "
                    "outputs, pnnx leftovers and non-ncnn types are highlighted.")
    p.add_argument("param", help="the .param (or .param.bin)")
    p.add_argument("--bin", help="its weights: adds dtype and bytes to each box")
    p.add_argument("--pnnx-param", metavar="PATH", help="pnnx's X.pnnx.param for the shape "
                   "labels (default: the one beside the graph, if any)")
    p.add_argument("--inputshape", metavar="SHAPES",
                   help="run the graph once through ncnn at these input shapes (pnnx syntax, "
                        "e.g. [1,7,1024]f32,[7]i32) and label every blob with the shape ncnn "
                        "made (weights: --bin, or synthetic ones of the right layout)")
    p.add_argument("--around", metavar="LAYER", help="draw only the layers within --depth "
                   "hops of this layer (or of the producer of this blob)")
    p.add_argument("--depth", type=int, default=8, help="--around: hops (default 8)")
    p.add_argument("--max-layers", type=int, default=MAX_LAYERS,
                   help=f"refuse to draw more layers than this (default {MAX_LAYERS})")
    p.add_argument("-o", "--output", metavar="PAGE", help="the page (default: <input>.html; "
                   "'-' for stdout)")
    p.set_defaults(run=run)


def default_page(param: str) -> str:
    for suffix in (".param.bin", ".param"):
        if param.endswith(suffix):
            return param[: -len(suffix)] + ".html"
    return param + ".html"


def run(args: argparse.Namespace) -> int:
    from ..io import atomic_write, load
    from ..view.labels import blob_shapes
    from ..view.page import graph_page
    from ..view.scene import neighbourhood

    out = args.output or default_page(args.param)
    g = load(args.param, bin=args.bin)
    layers = None
    if args.around is not None:
        try:
            layers = neighbourhood(g, args.around, args.depth)
        except ParamSurgeryError as exc:
            exc.file = args.param
            raise
    elif args.depth != 8:
        raise ParamSurgeryError("--depth needs --around LAYER", file=args.param)
    n = len(g) if layers is None else len(layers)
    if n > args.max_layers:
        hint = g.inputs[0] if g.inputs else next(iter(g)).name
        what = "the graph has" if layers is None else "--around selects"
        raise ParamSurgeryError(
            f"{what} {n} layers, too many to draw readably (limit {args.max_layers}): draw a "
            f"part with --around LAYER --depth N (e.g. --around {hint} --depth 20), or raise "
            f"--max-layers", file=args.param)
    shapes = blob_shapes(g, args.pnnx_param, layers=layers)
    if args.inputshape:
        from ..view.run_shapes import ncnn_blob_shapes

        shapes.update(ncnn_blob_shapes(g, args.inputshape, bin=args.bin))
    types = g.types()
    summary = (f"{len(g)} layers, {g.blob_count()} blobs; inputs {', '.join(g.inputs) or '-'}; "
               f"outputs {', '.join(g.outputs) or '-'}"
               + (f"; drawn: {n} layers within {args.depth} of {args.around}"
                  if layers is not None else "")
               + f"\ntypes: {', '.join(f'{t} {c}' for t, c in sorted(types.items()))}"
               + (f"\n{len(shapes)} blob shapes known"
                  + (f" (ncnn run at {args.inputshape})" if args.inputshape else "")
                  if shapes else "\nno blob shapes known (no X.pnnx.param beside the graph, "
                  "no -23330 hints, no --inputshape)"))
    title = args.param + (f" around {args.around}" if layers is not None else "")
    page = graph_page(g, title=title, layers=layers, shapes=shapes, summary=summary)
    if out == "-":
        sys.stdout.write(page)
    else:
        atomic_write(out, page)
        print(f"wrote {out} ({n} layers)")
    return 0
