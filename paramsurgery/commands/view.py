"""`paramsurgery view`: draw a graph as one self-contained HTML page (pan, zoom, search)

Write one HTML file (no network access needed, no external URL) with the graph laid out top
to bottom: layers as boxes (type, name, params that differ from ncnn's defaults; weight dtype
and bytes with --bin), blobs as wires labelled with their shapes when known (the shapes
analysis: --inputshape, Input params, -23330 hints, static rules, or ncnn with --oracle; then
pnnx's traced shapes from the X.pnnx.param beside the graph). Inputs and outputs, pnnx
leftovers and non-ncnn types are highlighted.
"""

from __future__ import annotations

import argparse
import sys

from paramsurgery.core.words import counted
from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.view.scene import HUB_READERS, MAX_LAYERS
from paramsurgery.commands._common import add_input_arg, command


def register(sub: argparse._SubParsersAction) -> None:
    from paramsurgery.commands._common import add_inputshape_arg

    p = command(sub, __doc__, run)
    add_input_arg(p, "the .param (or .param.bin)")
    from paramsurgery.commands._common import add_format_arg, add_weights_arg

    add_weights_arg(p, "its weights: adds dtype and bytes to each box")
    p.add_argument("--pnnx-param", metavar="PATH", help="pnnx's X.pnnx.param for the shape "
                   "labels (default: the one beside the graph, if any)")
    add_inputshape_arg(p)
    p.add_argument("--oracle", action="store_true",
                   help="shapes from ncnn itself (a child process, lightmode off; weights from "
                        "--bin, zeros otherwise) instead of the static rules")
    p.add_argument("--around", metavar="LAYER", help="draw only the layers within --depth "
                   "hops of this layer (or of the producer of this blob)")
    p.add_argument("--depth", type=int, default=8, help="--around: hops (default 8)")
    p.add_argument("--expand-hubs", action="store_true",
                   help="--around: walk through hub layers too (by default a layer whose tops "
                        "more than --hub-readers layers read, the kv-cache Input or the "
                        "Splits of the mask and rope tables, is one labelled stub)")
    p.add_argument("--hub-readers", type=int, default=HUB_READERS, metavar="N",
                   help=f"--around: a layer read by more than N layers is a hub (default "
                        f"{HUB_READERS})")
    p.add_argument("--max-layers", type=int, default=MAX_LAYERS,
                   help=f"refuse to draw more layers than this (default {MAX_LAYERS})")
    p.add_argument("-o", "--output", metavar="PAGE", help="the page (default: <input>.html; "
                   "'-' for stdout)")
    add_format_arg(p)


def default_page(param: str) -> str:
    from paramsurgery.commands._common import is_stdin

    if is_stdin(param):
        return "-"
    for suffix in (".param.bin", ".param"):
        if param.endswith(suffix):
            return param[: -len(suffix)] + ".html"
    return param + ".html"


def run(args: argparse.Namespace) -> int:
    from paramsurgery.core.fs import atomic_write
    from paramsurgery.formats.io import load
    from paramsurgery.view.labels import blob_shapes
    from paramsurgery.view.page import graph_page
    from paramsurgery.view.scene import hub_layers, hub_readers, neighbourhood

    out = args.output or default_page(args.param)
    g = load(args.param, bin=args.bin)
    layers = None
    hubs: set[int] = set()
    if args.around is not None:
        hubs = set() if args.expand_hubs else hub_layers(g, args.hub_readers)
        try:
            layers = neighbourhood(g, args.around, args.depth, hubs=hubs)
        except ParamSurgeryError as exc:
            exc.file = args.param
            raise
    else:
        for flag, given in (("--depth", args.depth != 8), ("--expand-hubs", args.expand_hubs),
                            ("--hub-readers", args.hub_readers != HUB_READERS)):
            if given:
                raise ParamSurgeryError(f"{flag} needs --around LAYER", file=args.param)
    n = len(g) if layers is None else len(layers)
    if n > args.max_layers:
        hint = g.inputs[0] if g.inputs else next(iter(g)).name
        what = "the graph has" if layers is None else "--around selects"
        raise ParamSurgeryError(
            f"{what} {n} layers, too many to draw readably (limit {args.max_layers}): draw a "
            f"part with --around LAYER --depth N (e.g. --around {hint} --depth 20), or raise "
            f"--max-layers", file=args.param)
    from paramsurgery.analysis.shapes import infer_shapes
    from paramsurgery.analysis.shapes.spec import check_blobs, inputshape_from_args

    given = inputshape_from_args(args)
    check_blobs(g, given, args.param)
    # a neighbourhood needs only its ancestors' shapes (not the whole graph's)
    analysis = infer_shapes(g, given, oracle=args.oracle, bin=args.bin,
                            layers=layers if layers is not None and not args.oracle else None)
    shapes = blob_shapes(g, args.pnnx_param, analysis=analysis)
    if layers is not None:  # label (and count) the drawn blobs only
        drawn = {b for i in layers for lay in (g.layer(i),) for b in (*lay.inputs, *lay.outputs)}
        shapes = {b: s for b, s in shapes.items() if b in drawn}
    types = g.types()
    summary = (f"{counted(len(g), 'layer')}, {counted(g.blob_count(), 'blob')}; "
               f"inputs {', '.join(g.inputs) or '-'}; outputs {', '.join(g.outputs) or '-'}"
               + (f"; drawn: {counted(n, 'layer')} within {args.depth} of {args.around}"
                  if layers is not None else "")
               + _hub_note(g, hubs, layers, hub_readers)
               + f"\ntypes: {', '.join(f'{t} {c}' for t, c in sorted(types.items()))}"
               + (f"\n{len(shapes)} blob shapes known"
                  + (" among the drawn layers" if layers is not None else "")
                  + (f" (inputs {' '.join(f'{k}=[{chr(44).join(map(str, v))}]' for k, v in given.items())}"
                     f"{', ncnn as the oracle' if args.oracle else ''})" if given else "")
                  if shapes else "\nno blob shapes known (no X.pnnx.param beside the graph, "
                  "no -23330 hints, no --inputshape)"))
    title = args.param + (f" around {args.around}" if layers is not None else "")
    page = graph_page(g, title=title, layers=layers, shapes=shapes, summary=summary,
                      hubs=hubs, center=_center(g, args.around) if layers is not None else None)
    if out == "-":
        sys.stdout.write(page)
    else:
        atomic_write(out, page)
        if args.format == "text":
            print(f"wrote {out} ({n} layers)")
    if args.format == "json":
        from paramsurgery.commands._common import print_json

        print_json({"output": out, "layers": len(g), "drawn": n, "blobs": g.blob_count(),
                    "shapes_known": len(shapes), "around": args.around,
                    "depth": args.depth if args.around is not None else None,
                    "files": [{"file": args.param, "role": "input"},
                              *([{"file": args.bin, "role": "weights"}] if args.bin else []),
                              {"file": out, "role": "page"}]},
                   stream=sys.stderr if out == "-" else None)
    return 0


def _center(g, around: str) -> str:
    """The layer `--around` names (or the producer of the blob it names)."""
    lay = g.find(around) or g.producer(around)
    return lay.name


def _hub_note(g, hubs: set[int], layers: set[int] | None, readers) -> str:
    """`; hubs drawn as stubs: NAME (Type, N readers), ...` for the hubs the view touches."""
    if layers is None or not hubs:
        return ""
    touched = sorted(h for h in hubs - layers
                     if any(nb.id in layers for lay in (g.layer(h),)
                            for nb in (*g.predecessors(lay), *g.successors(lay))))
    if not touched:
        return ""
    return ("\nhubs drawn as one stub each (--expand-hubs draws through them): "
            + ", ".join(f"{g.layer(h).name} ({g.layer(h).type}, {readers(g, g.layer(h))} "
                        f"readers)" for h in touched))
