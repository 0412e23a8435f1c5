"""`paramsurgery quantize`: int8 weights and scales for the layers ncnn runs in int8,
calibrated through ncnn, written in ncnn's int8 .param/.bin layouts

Calibration (as ncnn2table): every input in --calib (a directory of .npz files or one
.npz, arrays keyed by input blob name) runs through the fp32 graph in ncnn; the bottom blob
of every Convolution / ConvolutionDepthWise / InnerProduct gives its input scale (--method
kl, ncnn2table's default, or max); weight scales are per output channel (per group for
depthwise). Quantization (as ncnn2int8): those layers get `8=2` (`8=1` depthwise) with int8
weights; Gemm with constant A/B and Embed get int8 weights (`18=2`; activations quantized
at run time). --keep NAME (or --keep-from a `precision --format json` report) leaves layers
in fp32; --table uses a calibration table (ncnn2table's format, e.g. from ncnn's own tool)
instead of calibrating; --save-table writes the one computed. The quantized graph is then
run through ncnn against the fp32 graph on --inputs (default: the calibration inputs) and
the error at each output reported; nothing is written when ncnn cannot run it, when int8
changes no bit (not in effect), or when --tol is given and the relative error exceeds it
(exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

from paramsurgery.commands._common import (add_format_arg, add_input_arg, command, file_list,
                                           print_json)
from paramsurgery.core.errors import ParamSurgeryError


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__, run)
    add_input_arg(p, "the fp32 ncnn graph (.param)")
    p.add_argument("--bin", required=True, help="its fp32 weights")
    p.add_argument("--calib", metavar="DIR|NPZ",
                   help="calibration inputs: a directory of .npz files (or one .npz), arrays "
                        "keyed by input blob name")
    p.add_argument("--method", choices=("kl", "max"), default="kl",
                   help="activation scales: kl (ncnn2table's default) or max")
    p.add_argument("--table", metavar="TABLE", help="use this calibration table (ncnn2table's "
                   "format) instead of calibrating")
    p.add_argument("--save-table", metavar="TABLE", help="also write the calibration table")
    p.add_argument("--keep", action="append", default=[], metavar="NAME",
                   help="a layer to leave in fp32 (repeatable)")
    p.add_argument("--keep-from", metavar="JSON", help="leave the layers a `precision "
                   "--format json` report kept (its \"kept\") in fp32")
    p.add_argument("--no-requantize", action="store_true", help="do not fuse requantization "
                   "between int8 convolutions (ncnn2int8 fuses it)")
    p.add_argument("--inputs", metavar="NPZ", help="inputs the result is measured on "
                   "(default: the calibration inputs)")
    p.add_argument("--tol", type=float, help="refuse when an output's relative error "
                   "(max|Δ|/max|fp32|) exceeds this")
    p.add_argument("-o", "--output", metavar="Q.param",
                   help="the int8 graph (default: <input>.int8.param; its .bin next to it)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per ncnn run (600)")
    add_format_arg(p)


def _npz_files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".npz"))
        if not files:
            raise ParamSurgeryError("no .npz file in the calibration directory", file=path)
        return files
    if not os.path.isfile(path):
        raise ParamSurgeryError("--calib: no such file or directory", file=path)
    return [path]


def _feeds(graph: Any, param: str, path: str) -> dict:
    from paramsurgery.analysis.traced_inputs import make_feeds

    feeds, _ = make_feeds(graph, param, None, npz=path)
    return feeds


def _keep(args: argparse.Namespace) -> set[str]:
    keep = set(args.keep)
    if args.keep_from:
        try:
            with open(args.keep_from) as fh:
                data = json.load(fh)
        except OSError as exc:
            raise ParamSurgeryError(f"cannot read: {exc.strerror}", file=args.keep_from) from None
        except ValueError as exc:
            raise ParamSurgeryError(f"not JSON: {exc}", file=args.keep_from) from None
        if not isinstance(data, dict) or not isinstance(data.get("kept"), list):
            raise ParamSurgeryError("no \"kept\" list (a `precision --format json` report)",
                                    file=args.keep_from)
        keep.update(str(x) for x in data["kept"])
    return keep


def _output(args: argparse.Namespace) -> tuple[str, str]:
    from paramsurgery.commands._common import derived_output

    out = args.output or derived_output(args.param, "int8")
    stem = out[: -len(".param")] if out.endswith(".param") else out
    for path in (out, stem + ".bin"):
        for src in (args.param, args.bin):
            if os.path.exists(path) and os.path.samefile(path, src):
                raise ParamSurgeryError(f"output {path} would overwrite the input", file=src)
    return out, stem + ".bin"


def run(args: argparse.Namespace) -> int:
    from paramsurgery.formats.io import load
    from paramsurgery.passes.quantize_int8 import Int8Table, QuantizeInt8
    from paramsurgery.verify.precision.calibrate import CalibrationFailed, calibrate

    for path, what in ((args.param, "the graph"), (args.bin, "--bin")):
        if not os.path.isfile(path):
            raise ParamSurgeryError(f"{what}: no such file", file=path)
    if not args.calib and not args.table:
        raise ParamSurgeryError("give --calib inputs/ (or --table TABLE and --inputs NPZ)",
                                file=args.param)
    out_param, out_bin = _output(args)
    keep = _keep(args)
    graph = load(args.param, bin=args.bin)
    calib = [_feeds(graph, args.param, f) for f in _npz_files(args.calib)] if args.calib else []
    evals = [_feeds(graph, args.param, args.inputs)] if args.inputs else calib
    if not evals:
        raise ParamSurgeryError("nothing to measure the result on: give --inputs NPZ",
                                file=args.param)
    stats: list = []
    if args.table:
        table = Int8Table.read(args.table)
        source = f"table {args.table}"
    else:
        try:
            table, stats = calibrate(graph, args.bin, calib, method=args.method, keep=keep,
                                     timeout=args.timeout)
        except CalibrationFailed as exc:
            print(f"{args.param}: {exc}", file=sys.stderr)
            return 1
        source = f"{len(calib)} calibration input(s), {args.method}"
    result = QuantizeInt8(table, frozenset(keep), requantize=not args.no_requantize)(graph)
    if not result.modified:
        print(f"{args.param}: no layer to quantize " +
              "; ".join(s.format() for s in result.skipped[:5]), file=sys.stderr)
        return 1
    measured = _measure(args, graph, result.graph, evals)
    report = _report(args, result, measured, stats, source, out_param, out_bin, keep)
    failure = _failure(args, measured)
    if failure is None:
        _write(result.graph, out_param, out_bin, table if args.save_table else None,
               args.save_table)
        report["written"] = [out_param, out_bin] + ([args.save_table] if args.save_table else [])
    else:
        report["refused"] = failure
    if args.format == "json":
        written = report.get("written", [])
        print_json({**report, "files": file_list(
            ("input", args.param), ("weights", args.bin),
            *([("output", out_param), ("output weights", out_bin)] if written else []))})
    else:
        print("\n".join(_text(report)))
    if failure is not None:
        print(f"{args.param}: not writing {out_param}: {failure}", file=sys.stderr)
        return 1
    return 0


def _measure(args: argparse.Namespace, graph: Any, qgraph: Any, evals: list) -> dict:
    """fp32 vs int8 through ncnn on every evaluation input: per output, the worst rel / snr
    / cos, and whether int8 changed any bit."""
    from paramsurgery.formats.io import save
    from paramsurgery.formats.param_text import dumps
    from paramsurgery.verify.compare.ncnn_run import cache_tops
    from paramsurgery.verify.compare.options import PARITY
    from paramsurgery.verify.precision.batch import Variant, Worker
    from paramsurgery.verify.precision.metrics import METRICS, same_bits

    hidden = cache_tops(graph)
    outputs = [b for b in graph.outputs if b not in hidden]
    fp32 = dict(PARITY, use_int8_inference=True)
    with tempfile.TemporaryDirectory(prefix="paramsurgery-quantize-") as tmp:
        qp, qb = os.path.join(tmp, "q.param"), os.path.join(tmp, "q.bin")
        save(qgraph, qp, bin=qb)
        qtext = open(qp).read()
        text = dumps(graph)
        variants = []
        for feeds in evals:
            variants.append(Variant(text, fp32, outputs, feeds=feeds))
            variants.append(Variant(qtext, fp32, outputs, bin=qb, feeds=feeds))
        with Worker(args.bin, evals[0], timeout=args.timeout) as worker:
            results = worker.run(variants)
    bad = next((r for r in results if not r.ok), None)
    if bad is not None:
        return {"failed": f"ncnn {bad.status} {bad.message}".strip()}
    per: dict[str, dict[str, float]] = {o: {} for o in outputs}
    same = True
    for ref, q in zip(results[0::2], results[1::2]):
        for o in outputs:
            same = same and same_bits(q.arrays[o], ref.arrays[o])
            for name, m in METRICS.items():
                v = m.measure(q.arrays[o], ref.arrays[o])
                per[o][name] = v if name not in per[o] else m.worst([per[o][name], v])
    return {"outputs": per, "in_effect": not same, "inputs": len(evals)}


def _failure(args: argparse.Namespace, measured: dict) -> str | None:
    if "failed" in measured:
        return measured["failed"]
    if not measured["in_effect"]:
        return "int8 not in effect here: the int8 graph's outputs are bit for bit the fp32 ones"
    if args.tol is not None:
        worst = max(v["rel"] for v in measured["outputs"].values())
        if worst > args.tol:
            return f"relative error {worst:.3g} exceeds --tol {args.tol:g}"
    return None


def _report(args: argparse.Namespace, result: Any, measured: dict, stats: list, source: str,
            out_param: str, out_bin: str, keep: set[str]) -> dict:
    from collections import Counter

    from paramsurgery.verify.precision.metrics import json_number as num

    layers = result.data.get("int8_layers", [])
    types = Counter(result.graph.layer(n).type for n in layers)
    return {
        "param": args.param, "source": source, "int8_layers": layers,
        "int8_by_type": dict(sorted(types.items())), "kept": sorted(keep),
        "skipped": [s.__dict__ for s in result.skipped],
        "scales": {s.layer: {"blob": s.blob, "absmax": s.absmax, "threshold": s.threshold,
                             "scale": s.scale} for s in stats},
        "measured_on": measured.get("inputs"), "in_effect": measured.get("in_effect"),
        "errors": {o: {k: num(v) for k, v in d.items()}
                   for o, d in measured.get("outputs", {}).items()},
        "output": out_param, "bin": out_bin,
    }


def _text(report: dict) -> list[str]:
    from paramsurgery.verify.precision.metrics import METRICS

    by = ", ".join(f"{t} {n}" for t, n in report["int8_by_type"].items())
    lines = [f"{report['param']}: int8 from {report['source']}: {len(report['int8_layers'])} "
             f"layer(s) ({by})"]
    if report["kept"]:
        lines.append(f"kept in fp32: {', '.join(report['kept'])}")
    left = [s for s in report["skipped"] if "kept" not in s["reason"]]
    if left:
        lines.append(f"left in fp32 ({len(left)}): " +
                     "; ".join(f"{s['layer']}: {s['reason']}" for s in left[:6]) +
                     (" ..." if len(left) > 6 else ""))
    for o, d in report["errors"].items():
        vals = {k: (float(v) if not isinstance(v, str) else float(v)) for k, v in d.items()}
        lines.append(f"{o}: int8 vs fp32 through ncnn over {report['measured_on']} input(s): "
                     f"rel {METRICS['rel'].format(vals['rel'])}, snr "
                     f"{METRICS['snr'].format(vals['snr'])}, cos {METRICS['cos'].format(vals['cos'])}")
    if report.get("written"):
        lines.append("wrote " + ", ".join(report["written"]))
    return lines


def _write(graph: Any, out_param: str, out_bin: str, table: Any, table_path: str | None) -> None:
    from paramsurgery.core.fs import atomic_write_many
    from paramsurgery.formats.io import param_bytes
    from paramsurgery.formats.weights import write_weights

    data = param_bytes(graph, out_param)
    writers: dict = {out_param: lambda fh: fh.write(data),
                     out_bin: lambda fh: write_weights(graph, fh)}
    if table is not None and table_path:
        text = table.format().encode()
        writers[table_path] = lambda fh: fh.write(text)
    atomic_write_many(writers)
