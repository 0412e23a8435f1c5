"""`paramsurgery add-conv-cache`: make a causal conv / transposed-conv stack stream frame
chunks (state blobs, in-graph state update, host manifest)

Rewrite causal Convolution1D / ConvolutionDepthWise1D (left Padding or pad_left) and
Deconvolution1D / DeconvolutionDepthWise1D (right trim K-s) into a streaming graph: one
conv_state_in_<i> / conv_state_out_<i> pair per stateful layer, the state update in the
graph, pointwise layers unchanged. Writes OUT.param, OUT.bin, OUT.json (the manifest: state
shapes and initial values, stream start, flush, samples per frame) and, when the stream has
start trims, OUT.start.param; all atomically. Refuses, with the layer and the reason, what it
cannot stream.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.commands._common import add_input_arg, command
from paramsurgery.commands._runner import (Check, GraphCommand, Outputs, PassLike, Run, Writer, add_bin_arg,
                                           add_verify_args)
from paramsurgery.formats.param_text import dump_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__)
    add_input_arg(p, "input .param (e.g. a codec decoder's conv part)")
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
    from paramsurgery.commands._common import add_inputshape_args

    add_inputshape_args(p, inputs=False)
    run.finish(p, explain="list every change")


def default_output(param: str) -> str:
    base = param[:-len(".param")] if param.endswith(".param") else param
    return base + ".stream"


class AddConvCacheCommand(GraphCommand):
    tag, prefix, bin_required = "stream", True, True
    extra = {"json": ".json", "start": ".start.param"}
    refusal = "the streamed output differs from the offline output"

    def default_prefix(self, param: str) -> str:
        return default_output(param)

    def make_pass(self, args: argparse.Namespace) -> PassLike:
        from paramsurgery.passes.conv_cache import AddConvCache

        from paramsurgery.commands._common import inputshape_of

        return AddConvCache(args.time_axis, inputshape=inputshape_of(args) or None)

    def before_write(self, run: Run) -> None:
        """The start graph exists only when the stream has start trims; the manifest names
        the files as written."""
        from paramsurgery.streaming import stream_manifest

        out, args = run.out, run.args
        if run.result.data["start_graph"] is None:
            del out.extra["start"]
        assert out.bin is not None  # the .bin is a required argument
        run.result.data["host_manifest"] = stream_manifest(run.result, out.param, out.bin,
                                                           out.extra.get("start"), args.param,
                                                           args.bin)

    def extra_writers(self, run: Run) -> dict[str, Writer]:
        manifest = (json.dumps(run.result.data["host_manifest"], indent=2) + "\n").encode()
        writers: dict[str, Writer] = {"json": lambda fh: fh.write(manifest)}
        start = run.result.data["start_graph"]
        if start is not None:
            writers["start"] = lambda fh: fh.write(dump_bytes(start))
        return writers

    def verify(self, run: Run, staged: Outputs) -> Check | None:
        """Streams random frames through a conversion of the input and compares with running
        the input once on all frames."""
        from paramsurgery.streaming import check_stream

        args = run.args
        with tempfile.TemporaryDirectory(prefix="paramsurgery-cc-") as tmp:
            check, _ = check_stream(args.param, args.bin, parse_chunks(args.chunks),
                                    tol=args.tol, time_axis=args.time_axis, workdir=tmp)
        return check

    def json(self, run: Run) -> dict:
        check, man = run.check, run.result.data["host_manifest"]
        return {"outputs": run.out.all(),
                "manifest": {k: v for k, v in man.items() if not k.startswith("_")},
                "verify": None if check is None else {
                    "ok": check.ok, "max_abs": check.max_abs, "rel": check.rel,
                    "chunks": [c.__dict__ for c in check.chunks]}}

    def summary(self, run: Run) -> list[str]:
        man, result = run.result.data["host_manifest"], run.result
        states = man["states"]
        lines = [f"add-conv-cache: {len(states)} state blob(s), "
                 f"{sum(s['samples'] * s['channels'] for s in states)} floats of state"]
        if run.args.explain:
            lines.append(result.format(True))
        else:
            lines += [f"  {s['in']} -> {s['out']}: {s['kind']} {s['layer']}, numpy "
                      f"{tuple(s['numpy_shape'])}, init {s['init']['fill']:g}" for s in states]
            lines += [f"  note: {n}" for n in result.notes]
        lines += [f"  input {i['name']}: frames along numpy axis {i['numpy_axis']} of "
                  f"{_shape(i['numpy_shape'])}" for i in man["inputs"]]
        lines += [f"  output {o['name']}: {o['samples_per_frame']} samples per frame along numpy "
                  f"axis {o['numpy_axis']}" + (f", minus {o['start_trim']} at the stream start"
                                               if o["start_trim"] else "") for o in man["outputs"]]
        if man["stream_start"]["graph"] == "start_param":
            lines.append(f"  stream start: buffer {man['stream_start']['buffer_frames']} "
                         f"frame(s), run {os.path.basename(man['start_param'])} once, then "
                         f"{os.path.basename(man['param'])}")
        return lines


run = AddConvCacheCommand()


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
