"""`paramsurgery add-conv-cache`: streaming conv state for chunked decoding of a conv stack."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from ..errors import ParamSurgeryError
from ._common import add_format_arg, print_json
from ._runner import add_bin_arg, add_verify_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "add-conv-cache",
        help="make a causal conv / transposed-conv stack stream frame chunks (state blobs, "
             "in-graph state update, host manifest)",
        description="Rewrite causal Convolution1D / ConvolutionDepthWise1D (left Padding or "
                    "pad_left) and Deconvolution1D / DeconvolutionDepthWise1D (right trim K-s) "
                    "into a streaming graph: one conv_state_in_<i> / conv_state_out_<i> pair "
                    "per stateful layer, the state update in the graph, pointwise layers "
                    "unchanged. Writes OUT.param, OUT.bin, OUT.json (the manifest: state "
                    "shapes and initial values, stream start, flush, samples per frame) and, "
                    "when the stream has start trims, OUT.start.param; all atomically. "
                    "Refuses, with the layer and the reason, what it cannot stream.")
    p.add_argument("param", help="input .param (e.g. a codec decoder's conv part)")
    add_bin_arg(p, positional=True, required=True)
    p.add_argument("-o", "--output", metavar="OUT",
                   help="output prefix (OUT.param, OUT.bin, OUT.json; default: <input>.stream)")
    p.add_argument("--time-axis", metavar="AXIS",
                   help="numpy axis of the frames in each 2-D input: 0 = rows (T, C), 1 = "
                        "columns (C, T), or NAME=AXIS,...; default: inferred")
    add_verify_args(p, "stream random frames through the result and compare with the input "
                       "graph", tol=1e-5)
    p.add_argument("--chunks", default="1,3,2,1", help="--verify: chunk sizes in frames "
                   "(default 1,3,2,1)")
    p.add_argument("--explain", action="store_true", help="list every change")
    add_format_arg(p)
    p.set_defaults(run=run)


def default_output(param: str) -> str:
    base = param[:-len(".param")] if param.endswith(".param") else param
    return base + ".stream"


def run(args: argparse.Namespace) -> int:
    from ..streaming import check_stream, convert, output_paths

    out = args.output or default_output(args.param)
    paths = output_paths(out)
    if any(os.path.exists(x) and os.path.samefile(x, y) for x in paths
           for y in (args.param, args.bin)):
        raise ParamSurgeryError("the output would overwrite the input; choose another -o",
                                file=args.param)
    check = None
    if args.verify:
        chunks = parse_chunks(args.chunks)
        with tempfile.TemporaryDirectory(prefix="paramsurgery-cc-") as tmp:
            check, _ = check_stream(args.param, args.bin, chunks, tol=args.tol,
                                    time_axis=args.time_axis, workdir=tmp)
        if not check.ok:
            if args.format == "text":
                print(check.format())
            print(f"{args.param}: refusing to write {paths[0]}: the streamed output differs "
                  f"from the offline output", file=sys.stderr)
            return 1
    conv = convert(args.param, args.bin, out, time_axis=args.time_axis)
    man = conv.manifest
    result = conv.result
    written = [conv.param, conv.bin, conv.manifest_path] + ([conv.start_param]
                                                            if conv.start_param else [])
    if args.format == "json":
        print_json({"outputs": written, "changes": [c.__dict__ for c in result.changes],
                    "notes": result.notes,
                    "manifest": {k: v for k, v in man.items() if not k.startswith("_")},
                    "verify": None if check is None else {
                        "ok": check.ok, "max_abs": check.max_abs, "rel": check.rel,
                        "chunks": [c.__dict__ for c in check.chunks]}})
        return 0
    states = man["states"]
    print(f"add-conv-cache: {len(states)} state blob(s), "
          f"{sum(s['samples'] * s['channels'] for s in states)} floats of state")
    if args.explain:
        print(result.format(True))
    else:
        for s in states:
            print(f"  {s['in']} -> {s['out']}: {s['kind']} {s['layer']}, numpy "
                  f"{tuple(s['numpy_shape'])}, init {s['init']['fill']:g}")
        for n in result.notes:
            print(f"  note: {n}")
    for i in man["inputs"]:
        print(f"  input {i['name']}: frames along numpy axis {i['numpy_axis']} of "
              f"{_shape(i['numpy_shape'])}")
    for o in man["outputs"]:
        print(f"  output {o['name']}: {o['samples_per_frame']} samples per frame along numpy "
              f"axis {o['numpy_axis']}" + (f", minus {o['start_trim']} at the stream start"
                                           if o["start_trim"] else ""))
    if man["stream_start"]["graph"] == "start_param":
        print(f"  stream start: buffer {man['stream_start']['buffer_frames']} frame(s), run "
              f"{os.path.basename(conv.start_param)} once, then {os.path.basename(conv.param)}")
    if check is not None:
        print(check.format())
    print("wrote " + ", ".join(written))
    return 0


def _shape(shape: list) -> str:
    return "(" + ", ".join("?" if v is None else str(v) for v in shape) + ")"


def parse_chunks(text: str) -> list[int]:
    try:
        chunks = [int(c) for c in str(text).replace(" ", "").split(",") if c]
    except ValueError:
        raise ParamSurgeryError(f"--chunks {text!r}: give frame counts like 1,3,2") from None
    if not chunks or any(c <= 0 for c in chunks):
        raise ParamSurgeryError(f"--chunks {text!r}: frame counts must be positive")
    return chunks
