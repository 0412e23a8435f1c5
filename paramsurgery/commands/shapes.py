"""`paramsurgery shapes`: every blob's shape (static rules, hints, or ncnn as the oracle),
and `--write-hints`: ncnnoptimize's `-23330` shape hints for the given input shapes."""

from __future__ import annotations

import argparse

import sys

from paramsurgery.commands._common import (add_format_arg, add_report_arg, default_output,
                                           file_list, print_json, write_graph)


def register(sub: argparse._SubParsersAction) -> None:
    from paramsurgery.commands._common import add_inputshape_arg

    p = sub.add_parser("shapes", help="every blob's shape (numpy order of the ncnn.Mat), "
                       "symbolic in the input sizes; --write-hints writes -23330 hints",
                       description="Every blob's shape in the numpy order of the ncnn.Mat, "
                       "symbolic in the input sizes given by --inputshape (static rules, the "
                       "file's -23330 hints, or ncnn itself with --oracle); --write-hints "
                       "writes ncnnoptimize's -23330 hints (<input>.hints.param unless -o).")
    from paramsurgery.commands._common import add_input_arg, add_weights_arg

    add_input_arg(p, ".param or .param.bin file")
    add_weights_arg(p, "weights for --oracle (default: zeros)")
    add_inputshape_arg(p)
    how = p.add_mutually_exclusive_group()
    how.add_argument("--static", dest="oracle", action="store_false",
                     help="static rules only (default)")
    how.add_argument("--oracle", dest="oracle", action="store_true",
                     help="run ncnn (child process, lightmode off) at 3 values of each symbol "
                          "and fit affine forms; static disagreements are reported")
    p.set_defaults(oracle=False)
    p.add_argument("--values", action="append", metavar="SYM=a,b,c",
                   help="the oracle's sample values of a symbol (default 16,19,23)")
    p.add_argument("--no-hints", action="store_true",
                   help="ignore the file's -23330 hints")
    p.add_argument("--write-hints", action="store_true",
                   help="write -23330 shape hints (ncnnoptimize's format) for every layer "
                        "whose output shapes are known (default output: "
                        "<input>.hints.param; -o / --in-place)")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="--write-hints: output .param ('-' for stdout)")
    p.add_argument("--in-place", action="store_true", help="--write-hints: overwrite the input")
    add_report_arg(p)
    add_format_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.core.errors import ParamSurgeryError
    from paramsurgery.formats.io import load
    from paramsurgery.analysis.shapes import infer_shapes
    from paramsurgery.analysis.shapes.spec import check_blobs, inputshape_from_args

    shapes_in = inputshape_from_args(args)
    g = load(args.param)
    check_blobs(g, shapes_in, args.param)
    traced_from = ""
    if not shapes_in and not args.write_hints:
        # no --inputshape: the shapes pnnx traced (its X_ncnn.py / a static X.pnnx.param)
        from paramsurgery.analysis.traced_inputs import traced_inputshape

        traced, traced_from = traced_inputshape(g, args.param)
        shapes_in = dict(traced)
    values = _parse_values(args.values)
    sm = infer_shapes(g, shapes_in, oracle=args.oracle, bin=args.bin,
                      use_hints=not args.no_hints, values=values)
    if args.write_hints:
        from paramsurgery.analysis.shapes.hints import write_hints

        out = default_output(args, "hints")
        if sm.symbols():
            raise ParamSurgeryError("-23330 hints hold numbers: give concrete input shapes "
                                    f"(symbols {', '.join(sm.symbols())} are not allowed)",
                                    file=args.param)
        changed = write_hints(g, sm)
        write_graph(g, out, f"{changed} layer(s) got new hints; wrote {{out}}"
                    if args.format == "text" else None)
        if args.format == "json":
            print_json({"output": out, "hinted": changed,
                        "files": file_list(("input", args.param), ("output", out))},
                       stream=sys.stderr if out == "-" else None)
        return 0
    if args.output or args.in_place:
        raise ParamSurgeryError("-o / --in-place go with --write-hints", file=args.param)
    order = g.blob_names()
    if args.format == "json":
        print_json({**sm.to_json(order), "files": [{"file": args.param, "role": "input"}]})
        return 0
    width = max((len(b) for b in order), default=0)
    for b in order:
        s = sm.shape_of(b)
        tag = sm.source.get(b, "")
        extra = f"  not affine: {sm.not_affine[b]}" if b in sm.not_affine else ""
        print(f"{b:<{width}}  {sm.format_shape(s):<24} {tag}{extra}".rstrip())
    if traced_from:
        print(f"note: input shapes traced by pnnx (from {traced_from}); --inputshape "
              f"gives others, symbols included")
    for note in sm.notes:
        print(f"note: {note}")
    return 0


def _parse_values(specs: list[str] | None) -> dict[str, list[int]]:
    from paramsurgery.core.errors import ParamSurgeryError

    out: dict[str, list[int]] = {}
    for spec in specs or ():
        name, _, vals = spec.partition("=")
        try:
            out[name.strip()] = [int(v) for v in vals.split(",")]
        except ValueError:
            raise ParamSurgeryError(f"--values {spec!r}: expected SYM=a,b,c") from None
    return out
