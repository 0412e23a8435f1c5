"""`paramsurgery compare`: find the first layer whose output goes wrong, against another ncnn
graph or against pnnx's torch export

Run A.param on the same inputs as --reference B.param (ncnn vs ncnn, e.g. before/after a
pass, fp16 vs fp32 with --options) or as pnnx's own torch export (--pnnx X.pnnx.param, with
X_pnnx.py and X.pnnx.bin next to it), compare every blob as it is produced, and name the
first divergence: the earliest layer whose outputs differ while all its inputs agree. Blobs
are compared with size-1 axes dropped; a blob differs when max|a-b| > atol + rtol * max|b|.
Exit 1 when a divergence is found (or ncnn crashed, or pnnx's torch export stopped partway),
0 when none.

Text output is one line per compared blob, like ruff (`file:line: layer (Type) blob ~
counterpart  status  max_abs  rel`), then a verdict line; `--format json` prints
`{"first_divergence", "coverage", "blobs", ...}`. Exit 1 when a divergence is found or
the graph crashed, 2 when an input cannot be read, else 0.
"""

from __future__ import annotations

import argparse
import os

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.commands._common import (add_format_arg, add_input_arg, command,
                                           concrete_inputshape, file_list,
                                           print_json)


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__, run)
    add_input_arg(p, "the ncnn graph under test (.param)")
    from paramsurgery.commands._common import add_weights_arg

    add_weights_arg(p, "its weights (default: A.bin / A.ncnn.bin next to it; none for "
                       "weightless graphs)", positional=True)
    ref = p.add_mutually_exclusive_group(required=True)
    ref.add_argument("--reference", metavar="B.param", help="another ncnn graph to compare with")
    ref.add_argument("--pnnx", metavar="X.pnnx.param",
                     help="pnnx's IR; X_pnnx.py and X.pnnx.bin must be next to it")
    p.add_argument("--reference-bin", metavar="B.bin", help="weights of --reference (default: "
                                                           "next to it, else A's)")
    p.add_argument("--inputs", metavar="NPZ",
                   help="input arrays as fed to ncnn, keyed by input blob name (int ids "
                        "allowed; batch_index_<blob> scalars optional); reference outputs "
                        "out0…/output_* in it are checked too (--pnnx). Default: random "
                        "arrays at pnnx's traced shapes (X_ncnn.py / X.pnnx.param)")
    from paramsurgery.commands._common import add_inputshape_at_args

    add_inputshape_at_args(p, "value of a symbol of --inputshape (default 16: the shape "
                              "oracle's base value)")
    p.add_argument("--reference-inputs", metavar="NPZ",
                   help="inputs of --reference when a pass changed them (fuse-codebooks "
                        "packs ids): then inputs that differ pair with nothing (default: the "
                        "same inputs as A, paired by name)")
    p.add_argument("--options", metavar="OPTS",
                   help="ncnn options for A: fp16, bf16, threads=N, packing=0, or any "
                        "ncnn.Option attribute=0/1 (default: fp32 parity)")
    p.add_argument("--reference-options", metavar="OPTS", help="ncnn options for --reference")
    p.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (1e-4)")
    p.add_argument("--rtol", type=float, default=1e-3,
                   help="tolerance relative to the blob's max |value| (1e-3)")
    p.add_argument("--all", action="store_true", help="text: also list blobs not compared")
    p.add_argument("--html", metavar="PAGE",
                   help="also write an HTML page of the graph with each layer's relative "
                        "error written in its box and drawn as its colour (the view page)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run (600)")
    add_format_arg(p)


def _weights_next_to(param: str) -> str | None:
    stem = param[: -len(".param")] if param.endswith(".param") else param
    cand = stem + ".bin"
    return cand if os.path.isfile(cand) else None


def _existing(path: str | None, what: str) -> str | None:
    if path is not None and not os.path.isfile(path):
        raise ParamSurgeryError(f"{what}: no such file", file=path)
    return path


def run(args: argparse.Namespace) -> int:
    from paramsurgery.verify.compare import NcnnSide
    from paramsurgery.verify.compare.against_ncnn import compare_ncnn
    from paramsurgery.verify.compare.against_torch import compare_torch
    from paramsurgery.analysis.traced_inputs import make_feeds
    from paramsurgery.verify.compare.options import parse_options
    from paramsurgery.formats.pnnx_param import find_pnnx_param, read_pnnx_param
    from paramsurgery.formats.io import load

    _existing(args.param, "the graph")
    binp = _existing(args.bin, "weights") or _weights_next_to(args.param)
    _existing(args.inputs, "--inputs")
    _existing(args.reference, "--reference")
    if args.pnnx:
        from paramsurgery.verify.compare.torch_run import export_files

        export_files(args.pnnx)
    settings = parse_options(args.options)
    ref_settings = parse_options(args.reference_options)
    graph = load(args.param)
    # pnnx's IR pairs input_<name> arrays with in0, in1, ...; an edited copy has none next
    # to it, its reference usually does
    pnnx_path = args.pnnx or find_pnnx_param(args.param) or \
        (find_pnnx_param(args.reference) if args.reference else None)
    pnnx = read_pnnx_param(pnnx_path) if pnnx_path and os.path.isfile(pnnx_path) else None
    feeds, _ = make_feeds(graph, args.param, pnnx, npz=args.inputs,
                          inputshape=concrete_inputshape(args, graph))
    target = NcnnSide(args.param, binp, settings)
    if args.reference:
        ref_bin = _existing(args.reference_bin, "--reference-bin") or \
            _weights_next_to(args.reference) or binp
        reference = NcnnSide(args.reference, ref_bin, ref_settings)
        ref_feeds = None
        if args.reference_inputs:
            _existing(args.reference_inputs, "--reference-inputs")
            rg = load(args.reference)
            rp = find_pnnx_param(args.reference)
            ref_feeds, _ = make_feeds(rg, args.reference,
                                      read_pnnx_param(rp) if rp else None,
                                      npz=args.reference_inputs)
        report = compare_ncnn(target, reference, feeds, reference_feeds=ref_feeds,
                              atol=args.atol, rtol=args.rtol, timeout=args.timeout)
    else:
        outputs = _reference_outputs(args.inputs, graph, pnnx)
        report = compare_torch(target, args.pnnx, feeds, reference_outputs=outputs,
                               atol=args.atol, rtol=args.rtol, timeout=args.timeout)
    if args.html:
        _write_html(args.html, graph, report)
    if args.format == "json":
        print_json({**report.to_json(), "files": file_list(
            ("input", args.param), ("weights", args.bin),
            ("reference", args.reference or args.pnnx))})
    else:
        print(report.format_text(show_all=args.all))
    # exit 1 also when pnnx's torch export stopped partway: not every blob was compared
    return 1 if report.first_divergence() is not None or report.status != "ok" or \
        report.reference_status != "ok" else 0


# a shape mismatch has no finite error: drawn as this relative error (the top of the scale)
SHAPE_MISMATCH_REL = 1e6


def _write_html(path: str, graph, report) -> None:
    """The view page with the largest relative error of each layer's compared tops, the
    tolerance as the colour break (a layer with a top out of tolerance is never green),
    a legend, and the first divergence outlined (the page opens on it)."""
    from paramsurgery.core.fs import atomic_write
    from paramsurgery.verify.compare.report import DIFFERS
    from paramsurgery.view.page import values_page

    per_layer: dict[str, float] = {}
    over: set[str] = set()
    for row in report.compared:
        rel = row.error.rel if row.error is not None else 0.0
        rel = SHAPE_MISMATCH_REL if rel == float("inf") else rel
        per_layer[row.layer] = max(per_layer.get(row.layer, 0.0), rel)
        if row.status == DIFFERS:
            over.add(row.layer)
    fd = report.first_divergence()
    summary = report.format_text().splitlines()[-1]
    if fd is not None and fd.note:
        summary += f"\n{fd.layer}: {fd.note}"
    summary += (f"\ncolours: green = within tolerance (max|a-b| <= atol {report.atol:g} + rtol "
                f"{report.rtol:g} * max|b|), yellow to red = out of it, by rel = "
                f"max|a-b| / max|b|")
    atomic_write(path, values_page(graph, per_layer, label="rel", summary=summary,
                                   title=f"{report.target} vs {report.reference}",
                                   threshold=report.rtol, over=over,
                                   first=fd.layer if fd is not None else None))



def _reference_outputs(npz: str | None, graph, pnnx):
    """Output arrays of the original model in the --inputs file, by output blob."""
    if npz is None:
        return None
    import numpy as np

    from paramsurgery.formats.pnnx_reference import Reference

    ref = Reference.load(npz, graph, pnnx)
    if not ref.output_keys:
        return None
    with np.load(npz) as z:
        return {blob: z[key] for blob, key in ref.output_keys.items()}
