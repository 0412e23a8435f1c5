"""`paramsurgery precision`: which layers break under fp16 / bf16 / int8, and the smallest
set to keep in fp32 (`31=` masks; int8: left unquantized)

Run the graph through ncnn with the reduced-precision options and compare with its fp32
run on the same inputs: each layer's error with only that layer reduced ("alone", at the
outputs), the error accumulated at each layer's tops with every layer reduced
("downstream"), then the smallest set of layers to keep in full precision that brings
every output within --tol: greedy by contribution, then every kept layer proven needed
(without it the tolerance breaks). A mode that changes no bit of any blob on this machine
is said to be not in effect (exit 1), never reported as an error of 0. -o writes the graph
with the kept layers' masks (the keep-precision pass: `31=` bits and an fp32 guard in
front of each). int8: the variants are the graph quantized as `paramsurgery quantize` does
(calibrated on --calib, default the measured inputs), every candidate layer but the kept
ones, without requantization between int8 layers (every top stays fp32, so each blob's
error reads as a number); -o writes that graph and its int8 .bin. Exit 0 when every output
is within tolerance (with the kept set), 1 when no set reaches it, the mode has no effect
here, or ncnn failed; 2 on bad input. --pnnx X.pnnx.param holds the outputs against the model
itself (pnnx's torch export, X_pnnx.py + X.pnnx.bin next to it, run on the same inputs)
instead of ncnn's fp32 run: the tolerance is then torch's, and when ncnn's fp32 run is
already outside it, that is said (no kept set can do better than fp32).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from paramsurgery.commands._common import (add_format_arg, add_input_arg, command,
                                           concrete_inputshape, file_list,
                                           print_json)
from paramsurgery.core.errors import ParamSurgeryError

MODES = ("fp16", "bf16", "int8")


def register(sub: argparse._SubParsersAction) -> None:
    from paramsurgery.commands._common import add_inputshape_at_args
    from paramsurgery.verify.precision.metrics import METRICS

    p = command(sub, __doc__, run)
    add_input_arg(p, "the ncnn graph (.param)")
    p.add_argument("--bin", help="its weights (default: X.bin next to X.param)")
    p.add_argument("--mode", choices=MODES, required=True,
                   help="the reduced precision (int8: the layers `quantize` quantizes, "
                        "calibrated on --calib)")
    p.add_argument("--calib", metavar="DIR|NPZ", help="int8: calibration inputs (default: "
                   "the measured inputs themselves)")
    p.add_argument("--method", choices=("kl", "max"), default="max",
                   help="int8: activation scales (default max: the search runs on few inputs)")
    p.add_argument("--pnnx", metavar="X.pnnx.param",
                   help="hold the outputs against pnnx's torch export of the model (X_pnnx.py "
                        "and X.pnnx.bin next to it; needs torch) instead of ncnn's fp32 run")
    p.add_argument("--metric", choices=sorted(METRICS), default="rel",
                   help="rel: max|Δ|/max|ref| (default), snr: dB, cos: cosine similarity")
    p.add_argument("--tol", type=float, help="every output within this (default: rel 1e-2, "
                                             "snr 30 dB, cos 0.999)")
    p.add_argument("--inputs", metavar="NPZ",
                   help="input arrays keyed by input blob name (default: random arrays at "
                        "--inputshape, the traced shapes or the Input layers' shapes)")
    add_inputshape_at_args(p, "value of a symbol of --inputshape (default 16)")
    p.add_argument("-o", "--output", metavar="OUT.param",
                   help="write the graph with the kept layers masked (its .bin: a link of "
                        "the input's)")
    p.add_argument("--html", metavar="PAGE", help="also write the graph as an HTML page, each "
                   "layer coloured by its downstream relative error (the compare page)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per ncnn run (600)")
    add_format_arg(p)


def _default_bin(param: str) -> str | None:
    stem = param[: -len(".param")] if param.endswith(".param") else param
    return stem + ".bin" if os.path.isfile(stem + ".bin") else None


def _feeds(args: argparse.Namespace, graph: Any) -> tuple[dict, str]:
    from paramsurgery.analysis.traced_inputs import make_feeds
    from paramsurgery.formats.pnnx_param import find_pnnx_param, read_pnnx_param

    if args.inputs is not None and not os.path.isfile(args.inputs):
        raise ParamSurgeryError("--inputs: no such file", file=args.inputs)
    pnnx_path = find_pnnx_param(args.param)
    pnnx = read_pnnx_param(pnnx_path) if pnnx_path and os.path.isfile(pnnx_path) else None
    shapes = concrete_inputshape(args, graph)
    if args.inputs is None and not shapes and pnnx is None:
        shapes = _input_layer_shapes(graph)
        if shapes:
            feeds, _ = make_feeds(graph, args.param, pnnx, inputshape=shapes)
            return feeds, "random, the Input layers' shapes"
    return make_feeds(graph, args.param, pnnx, npz=args.inputs, inputshape=shapes)


def _input_layer_shapes(graph: Any) -> dict | None:
    """numpy shapes from the Input layers' own 0=w 1=h 2=c (None unless every input has them)."""
    out = {}
    for layer in graph.by_type("Input"):
        dims = [int(layer.params.get(k, 0) or 0) for k in (2, 1, 0)]
        dims = [d for d in dims if d > 0]
        if not dims:
            return None
        out[layer.outputs[0]] = tuple(dims)
    return out or None


def run(args: argparse.Namespace) -> int:
    from paramsurgery.formats.io import load
    from paramsurgery.verify.precision.metrics import METRICS
    from paramsurgery.verify.precision.search import SearchFailed, search

    if not os.path.isfile(args.param):
        raise ParamSurgeryError("no such file", file=args.param)
    binp = args.bin or _default_bin(args.param)
    if args.bin is not None and not os.path.isfile(args.bin):
        raise ParamSurgeryError("--bin: no such file", file=args.bin)
    if args.output and os.path.exists(args.output) and os.path.samefile(args.output, args.param):
        raise ParamSurgeryError("-o names the input file", file=args.param)
    if args.pnnx is not None and not os.path.isfile(args.pnnx):
        raise ParamSurgeryError("--pnnx: no such file", file=args.pnnx)
    graph = load(args.param, bin=binp) if binp else load(args.param)
    feeds, source = _feeds(args, graph)
    metric = METRICS[args.metric]
    reference = _torch_reference(args, graph, feeds) if args.pnnx else None
    table = None
    if args.mode == "int8":
        table = _calibrate(args, graph, binp, feeds)
        if table is None:
            return 1
    try:
        res = search(graph, binp, feeds, mode=args.mode, metric=args.metric, tol=args.tol,
                     timeout=args.timeout, table=table, reference=reference)
    except SearchFailed as exc:
        print(f"{args.param}: {exc}", file=sys.stderr)
        return 1
    ok = res.in_effect and res.reached and res.control_exact and res.kept_fp32_exact is not False
    written: list[str] = []
    if args.output and ok:
        written = _write(args, res, binp)
    elif args.output:
        print(f"{args.param}: not writing {args.output}: "
              f"{'nothing was measured' if not res.in_effect else 'the tolerance is not met'}",
              file=sys.stderr)
    if args.html:
        _write_html(args.html, graph, res)
        written.append(args.html)
    if args.format == "json":
        print_json({**_json(args, res, source, written), "files": file_list(
            ("input", args.param), ("weights", args.bin),
            ("output", args.output if written else None))})
    else:
        print("\n".join(_text(args, res, source, metric, written)))
    return 0 if ok else 1


def _torch_reference(args: argparse.Namespace, graph: Any, feeds: dict) -> dict:
    from paramsurgery.verify.compare.ncnn_run import cache_tops
    from paramsurgery.verify.compare.torch_run import export_files
    from paramsurgery.verify.precision.torch_reference import torch_outputs

    export_files(args.pnnx)  # X_pnnx.py and X.pnnx.bin must be next to it (located error)
    hidden = cache_tops(graph)
    outputs = [b for b in graph.outputs if b not in hidden]
    return torch_outputs(graph, args.param, args.pnnx, feeds, outputs, timeout=args.timeout)


def _calibrate(args: argparse.Namespace, graph: Any, binp: str | None, feeds: dict) -> Any:
    from paramsurgery.commands.quantize import _feeds as npz_feeds, _npz_files
    from paramsurgery.verify.precision.calibrate import CalibrationFailed, calibrate

    if not binp:
        raise ParamSurgeryError("--mode int8 needs the weights (--bin)", file=args.param)
    calib = [npz_feeds(graph, args.param, f) for f in _npz_files(args.calib)] \
        if args.calib else [feeds]
    try:
        table, _ = calibrate(graph, binp, calib, method=args.method, timeout=args.timeout)
    except CalibrationFailed as exc:
        print(f"{args.param}: {exc}", file=sys.stderr)
        return None
    return table


def _write(args: argparse.Namespace, res: Any, binp: str | None) -> list[str]:
    from paramsurgery.commands._common import link_or_copy
    from paramsurgery.core.fs import atomic_write

    stem = args.output[: -len(".param")] if args.output.endswith(".param") else args.output
    if res.mode == "int8":  # new weights: written with the graph
        from paramsurgery.core.fs import atomic_write_many
        from paramsurgery.formats.weights import write_weights

        g, data = res.graph_out, res.text.encode()
        atomic_write_many({args.output: lambda fh: fh.write(data),
                           stem + ".bin": lambda fh: write_weights(g, fh)})
        return [args.output, stem + ".bin"]
    atomic_write(args.output, res.text)
    out = [args.output]
    if binp:
        if not (os.path.exists(stem + ".bin") and os.path.samefile(stem + ".bin", binp)):
            link_or_copy(binp, stem + ".bin")
            out.append(stem + ".bin")
    return out


def _write_html(path: str, graph: Any, res: Any) -> None:
    from paramsurgery.commands.compare import SHAPE_MISMATCH_REL
    from paramsurgery.core.fs import atomic_write
    from paramsurgery.view.page import values_page

    values = {}
    for row in res.rows:
        if row.downstream_rel is not None:
            rel = row.downstream_rel
            values[row.name] = SHAPE_MISMATCH_REL if rel == float("inf") else rel
    kept = ", ".join(res.kept) or "none"
    summary = (f"{res.mode} vs fp32, every layer reduced: the relative error at each layer's "
               f"tops\nkept in fp32: {kept}\n" + "\n".join(res.notes))
    atomic_write(path, values_page(graph, values, label="rel", summary=summary.strip(),
                                   title=f"{graph.source.path or 'graph'}: {res.mode} error"))


def _verdict(res: Any) -> str:
    m = res.metric
    if not res.in_effect:
        return f"{res.mode} not in effect here"
    if not res.reached:
        return f"tolerance {m.format(res.tol)} not reached"
    if not res.kept:
        return f"every output within {m.format(res.tol)} with every layer in {res.mode}"
    return (f"every output within {m.format(res.tol)} with {len(res.kept)} layer(s) kept in "
            f"fp32: {', '.join(res.kept)}")


def _text(args: argparse.Namespace, res: Any, source: str, m: Any, written: list[str]) -> list[str]:
    against = "fp32" if res.reference == "fp32" else f"torch ({args.pnnx}'s export)"
    lines = [f"{args.param}: {res.mode} vs {against} through ncnn (inputs: {source}; metric "
             f"{m.name}, tolerance {m.format(res.tol)})"]
    if res.fp32_vs_reference:
        outs = ", ".join(f"{o} {m.format(v)}" for o, v in res.fp32_vs_reference.items())
        lines.append(f"ncnn fp32 vs torch: {outs}")
    if not res.in_effect:
        lines.extend(res.notes)
        lines.append(f"verdict: {_verdict(res)}")
        return lines
    live = [r for r in res.rows if r.in_effect]
    types = sorted({r.type for r in live})
    others = "" if len(live) == len(res.rows) else \
        "; the others run fp32 here whatever the option"
    lines.append(f"{res.mode} in effect in {len(live)} of {len(res.rows)} layers "
                 f"({', '.join(types)}){others}")
    width = max([len(r.name) for r in res.rows] + [5])
    twidth = max([len(r.type) for r in res.rows] + [4])
    lines.append(f"{'layer':<{width}}  {'type':<{twidth}}  {'alone':>12}  {'downstream':>12}  kept")
    for r in res.rows:
        alone = m.format(r.alone) if r.in_effect else "not in effect"
        lines.append(f"{r.name:<{width}}  {r.type:<{twidth}}  {alone:>12}  "
                     f"{m.format(r.downstream):>12}  {'kept' if r.kept else ''}".rstrip())
    outs = ", ".join(f"{o} {m.format(v)}" for o, v in res.all_reduced.items())
    lines.append(f"every layer in {res.mode}: {outs}")
    if res.kept:
        outs = ", ".join(f"{o} {m.format(v)}" for o, v in res.final.items())
        lines.append(f"kept {', '.join(res.kept)} in fp32: {outs}")
        need = ", ".join(f"without {k}: {m.format(v)}" for k, v in res.proof.items())
        if need:
            lines.append(f"each kept layer is needed ({need}; tolerance {m.format(res.tol)})")
        if res.kept_fp32_exact:
            lines.append("the masked graph run in fp32: bit for bit the input's fp32 outputs")
    lines.extend(f"note: {n}" for n in res.notes)
    lines.append(f"{res.runs} ncnn runs")
    lines.append(f"verdict: {_verdict(res)}")
    if written:
        lines.append("wrote " + ", ".join(written))
    return lines


def _json(args: argparse.Namespace, res: Any, source: str, written: list[str]) -> dict:
    from paramsurgery.verify.precision.metrics import json_number as num

    return {
        "param": args.param, "mode": res.mode, "metric": res.metric.name, "tol": res.tol,
        "inputs": source, "reference": res.reference,
        "fp32_vs_reference": {o: num(v) for o, v in res.fp32_vs_reference.items()} or None,
        "in_effect": res.in_effect,
        "in_effect_layers": [r.name for r in res.rows if r.in_effect],
        # not in effect: nothing was measured, no error of 0 is reported
        "all_reduced": {o: num(v) for o, v in res.all_reduced.items()} if res.in_effect else None,
        "final": {o: num(v) for o, v in res.final.items()} if res.in_effect else None,
        "kept": res.kept, "reached": res.reached,
        "proof": {k: num(v) for k, v in res.proof.items()},
        "control_exact": res.control_exact, "kept_fp32_exact": res.kept_fp32_exact,
        "layers": [{"layer": r.name, "type": r.type, "line": r.line, "in_effect": r.in_effect,
                    "alone": num(r.alone), "downstream": num(r.downstream),
                    "downstream_rel": num(r.downstream_rel), "kept": r.kept}
                   for r in res.rows],
        "runs": res.runs, "notes": res.notes, "verdict": _verdict(res), "written": written,
    }
