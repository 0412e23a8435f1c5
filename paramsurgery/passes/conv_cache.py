"""Streaming conv state (`paramsurgery add-conv-cache`): rewrite a conv stack (a vocoder, a
codec decoder's conv part) so it decodes frame chunks with state kept between calls, and the
concatenated output equals decoding everything at once.

Semantics (issue 10):

- causal Conv1D / ConvolutionDepthWise1D, kernel K, dilation d, left pad P <= (K-1)*d (a
  `Padding` before it and/or its own `pad_left`): the state is the last S = (K-1)*d input
  samples. Each chunk computes `conv(concat(state, x))` without padding, emits as many samples
  as it received, and the new state is the tail of `concat(state, x)` (also when the chunk is
  shorter than the state). The first state is the pad value (zeros): the offline left pad. A
  conv padding less than (K-1)*d drops (K-1)*d - P samples at the stream start.
- Deconvolution1D / DeconvolutionDepthWise1D, kernel extent E = d*(K-1)+1, stride s, right
  trim E-s (its own pads and/or a following `Crop` of time): frame i writes [i*s, i*s+E); after
  n frames every position < n*s is final. The state is the not-yet-final tail (E-s samples,
  without bias); the bias is added once per emitted sample (it moves from the deconv into a
  `MemoryData` + `BinaryOp` after the overlap-add, with any fused activation); the left trim
  applies at the stream start only, the right trim at flush (where nothing is left to emit).

In the graph: one `Input` provides `conv_state_in_<i>`, every stateful layer gets
`Concat(state, x)` + a relative `Crop` for the new state (conv), or `Crop` head/tail +
`BinaryOp` add + `Concat` + relative `Crop`s (deconv overlap-add), and its new state is a
graph output `conv_state_out_<i>` (i counts stateful layers in file order). Pointwise layers
pass through unchanged; anything else touching time is refused with the reason
(`_timeflow.MatchFailure`).

Start trims (a transposed conv's left trim, a conv padding less than its receptive field)
live in a second graph, the *start graph* (same layers and weights plus one `Crop` per
trimmed layer), that the host runs once, on the first frames, as soon as every layer has at
least one sample to emit (`stream_start.buffer_frames`; until then nothing can be emitted
anyway). Without start trims there is no start graph.

The manifest (`PassResult.data["manifest"]`) tells the host the state blobs with shapes and
initial values, what to do at stream start and at flush, and samples per frame.
"""

from __future__ import annotations

from dataclasses import KW_ONLY
from typing import Any, Mapping

import numpy as np

from paramsurgery.core.match import MatchFailure
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.analysis.timeflow import (ConvStage, DeconvStage, TimeBlob, TimeFlow,
                                            infer_layouts, value_of)
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import Pass, PassResult

MANIFEST_FORMAT = "paramsurgery-streaming"
MANIFEST_VERSION = 1
STATE_IN = "conv_state_in_{i}"
STATE_OUT = "conv_state_out_{i}"


def _crop(start: int, end: int) -> dict[int, Any]:
    """A numpy-mode Crop of the innermost (time) axis: [start, end), end 0 = to the end,
    negative = relative to the end."""
    return {9: [start], 10: [end], 11: [-1]}


def parse_time_axis(spec: str | int | Mapping[str, Any] | None,
                    inputs: list[str]) -> dict[str, tuple[int, int]] | None:
    """`time_axis` as given by a user: None (infer), a numpy axis of a 2-D input (0: frames
    are rows (T, C); 1: frames are columns (C, T)) for every input, "w"/"h" (ncnn), or a
    mapping input name -> one of those."""
    if spec is None:
        return None

    def one(v: Any) -> tuple[int, int]:
        if v in (0, "0", "h", "rows"):
            return (2, 1)
        if v in (1, "1", "w", "cols", "columns"):
            return (2, 0)
        raise PassRefused(f"time axis {v!r}: use 0 (numpy rows, ncnn h) or 1 (numpy columns, "
                          f"ncnn w)")

    if isinstance(spec, Mapping):
        unknown = set(spec) - set(inputs)
        if unknown:
            raise PassRefused(f"time axis given for unknown input(s) {', '.join(sorted(unknown))}")
        return {k: one(v) for k, v in spec.items()}
    if isinstance(spec, str) and "=" in spec:
        pairs = dict(p.split("=", 1) for p in spec.split(",") if p)
        return parse_time_axis(pairs, inputs)
    return {b: one(spec) for b in inputs}


class AddConvCache(Pass, name="add-conv-cache",
                   summary="streaming conv state: causal Conv1D / transposed-conv state blobs, in-graph "
                           "update, start graph and host manifest"):
    time_axis: str | int | Mapping[str, Any] | None = None
    _: KW_ONLY
    inputshape: Mapping[str, tuple] | None = None  # pins the inputs' non-time extents

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputshape", dict(self.inputshape or {}))

    def requires(self, g: Graph) -> None:
        taken = [b for b in g.inputs if b.startswith("conv_state_in_")]
        if taken:
            raise PassRefused(f"the graph already streams (it has {taken[0]!r})")
        if not g.by_type(*("Convolution1D", "ConvolutionDepthWise1D", "Deconvolution1D",
                           "DeconvolutionDepthWise1D")):
            raise PassRefused("the graph has no Convolution1D / ConvolutionDepthWise1D / "
                              "Deconvolution1D / DeconvolutionDepthWise1D layer")

    # ------------------------------------------------------------------ analysis
    def analyze(self, g: Graph) -> TimeFlow:
        layouts = parse_time_axis(self.time_axis, list(g.inputs))
        try:
            if layouts is not None and set(layouts) == set(g.inputs):
                return TimeFlow(g, layouts, inputshape=self.inputshape)
            return infer_layouts(g, layouts, self.inputshape)[0]
        except MatchFailure as exc:
            where = exc.stopped_at
            raise PassRefused(f"cannot stream: {exc.format()}",
                              file=where.source_file if where else g.source.path,
                              line=where.source_line if where else None) from None

    # ------------------------------------------------------------------ rewrite
    def run(self, g: Graph) -> PassResult:
        flow = self.analyze(g)
        result = PassResult(g, False)
        stateful = [s for s in flow.stages if s.stateful]
        names = [(STATE_IN.format(i=i), STATE_OUT.format(i=i)) for i in range(len(stateful))]
        for s_in, s_out in names:
            if g.has_blob(s_in) or g.has_blob(s_out):
                raise PassRefused(f"blob {s_in if g.has_blob(s_in) else s_out!r} already exists")
        if names:
            # one Input per state blob, with its shape as Input's hints (0=w 1=h)
            after = g.by_type("Input")[-1]
            for stage, (state_in, _) in zip(stateful, names):
                w = stage.state if isinstance(stage, ConvStage) else stage.overlap
                params = {0: w, 1: stage.channels} if stage.channels else {0: w}
                after = g.add_layer("Input", g.unique_layer_name(state_in), [], [state_in],
                                    params, after=after)
            result.changes.append(Change("Input", f"added {len(names)} state input(s) "
                                                  f"{names[0][0]}..{names[-1][0]}"))
        start_trims: list[tuple[Layer, int]] = []
        states: list[dict] = []
        stage_info: list[dict] = []
        k = 0
        for stage in flow.stages:
            sin: str | None = None
            sout: str | None = None
            if stage.stateful:
                sin, sout = names[k]
                k += 1
            if isinstance(stage, ConvStage):
                last = self._conv(g, stage, sin, sout, result)
                shape = [stage.state, stage.channels]
            else:
                last = self._deconv(g, stage, sin, sout, result)
                shape = [stage.overlap, stage.channels]
            if stage.trim:
                start_trims.append((last, stage.trim))
            info = _stage_dict(stage, sin, sout)
            stage_info.append(info)
            if sin is not None:
                init = {"fill": 0.0}
                if isinstance(stage, ConvStage) and stage.value != 0.0:
                    init = {"fill": stage.value}
                states.append({"index": len(states), "in": sin, "out": sout,
                               "layer": info["layer"], "kind": stage.kind,
                               "samples": shape[0], "channels": shape[1],
                               "ncnn_shape": {"w": shape[0], "h": shape[1]},
                               "numpy_shape": [shape[1], shape[0]], "init": init})
        g.insert_splits()
        start = None
        if start_trims:
            start = g.copy()
            order = {layer.id: i for i, layer in enumerate(g)}
            start_layers = start.layers
            for layer, trim in start_trims:
                at = start_layers[order[layer.id]]
                start.insert_after(at, "Crop", start.unique_layer_name(f"{at.name}_start_trim"),
                                   _crop(trim, 0))
        result.modified = True
        result.data["start_graph"] = start
        result.data["manifest"] = self._manifest(flow, states, stage_info, start is not None)
        result.data["flow"] = flow
        if start is not None:
            result.notes.append(f"start trims in {len(start_trims)} layer(s): a start graph "
                                f"runs once on the first "
                                f"{result.data['manifest']['stream_start']['buffer_frames']} "
                                f"frame(s)")
        return result

    def _conv(self, g: Graph, st: ConvStage, sin: str | None, sout: str | None,
              result: PassResult) -> Layer:
        conv = st.conv
        if st.padding is not None:
            pad = st.padding
            g.remove_layer(pad)
            g.set_input(conv, 0, st.x)
            left = st.pad - conv.params.get_int(4, 0)
            result.changes.append(Change(pad.name, f"removed Padding (left {left}): the state "
                                                   f"is the left context",
                                         line=pad.source_line))
        p = conv.params
        if p.get(4, 0):
            conv.set(4, 0)
        if 15 in p:
            conv.set(15, 0)
        if sin is None or sout is None:
            return conv
        ctx = g.unique_blob_name(f"{conv.name}_ctx")
        cat = g.add_layer("Concat", g.unique_layer_name(f"{conv.name}_state_cat"), [sin, st.x],
                          [ctx], {0: -1}, before=conv)
        g.set_input(conv, 0, ctx)
        g.add_layer("Crop", g.unique_layer_name(f"{conv.name}_state_next"), [ctx], [sout],
                    _crop(-st.state, 0), after=cat)
        result.changes.append(Change(conv.name, f"conv state {sin} -> {sout}: {st.state} x "
                                                f"{st.channels} (K={st.kernel}, d={st.dilation})",
                                     line=conv.source_line))
        return conv

    def _deconv(self, g: Graph, st: DeconvStage, sin: str | None, sout: str | None,
                result: PassResult) -> Layer:
        dec = st.deconv
        out = st.out
        if st.crop is not None:
            crop = st.crop
            g.remove_layer(crop)
            result.changes.append(Change(crop.name, "removed Crop (trims): left at the stream "
                                                    "start, right at flush",
                                         line=crop.source_line))
        p = dec.params
        for pid in (4, 15, 18):
            if p.get(pid, 0):
                dec.set(pid, 0)
        if sin is None or sout is None:
            if dec.outputs[0] != out:
                g.set_outputs(dec, [out])
            return dec
        full = g.unique_blob_name(f"{dec.name}_full")
        g.set_outputs(dec, [full])
        bias = None
        if st.bias:
            dec.set(5, 0)
            if dec.weights is not None:
                from paramsurgery.formats.weights import set_weights

                bias = np.array(dec.weights["bias"].array(), dtype=np.float32).reshape(-1)
                set_weights(dec, weight=dec.weights["weight"])
        act, act_params = st.activation
        if act:
            dec.set(9, 0)
            if 10 in p:
                dec.unset(10)
        n = dec.name
        o = st.overlap
        u = g.unique_blob_name
        ul = g.unique_layer_name
        head, added, tail, cat = u(f"{n}_head"), u(f"{n}_head_sum"), u(f"{n}_tail"), u(f"{n}_ola")
        at = dec

        def add(typ: str, name: str, ins: list[str], outs: list[str], params: dict) -> Layer:
            nonlocal at
            at = g.add_layer(typ, ul(name), ins, outs, params, after=at)
            return at

        add("Crop", f"{n}_head", [full], [head], _crop(0, o))
        add("BinaryOp", f"{n}_overlap_add", [head, sin], [added], {0: 0})
        add("Crop", f"{n}_tail", [full], [tail], _crop(o, 0))
        add("Concat", f"{n}_ola", [added, tail], [cat], {0: -1})
        add("Crop", f"{n}_state_next", [cat], [sout], _crop(-o, 0))
        chain: list[tuple[str, dict, str | None]] = []  # (type, params, bias blob)
        if st.bias:
            bname = u(f"{n}_bias")
            md = add("MemoryData", f"{n}_bias", [], [bname], {0: 1, 1: st.channels})
            if bias is not None:
                from paramsurgery.formats.weights import set_weights

                set_weights(md, data=bias.reshape(-1, 1))  # (channels, 1)
            chain.append(("BinaryOp", {0: 0}, bname))
        if act == 1:
            chain.append(("ReLU", {}, None))
        elif act == 2:
            chain.append(("ReLU", {0: float(act_params[0])}, None))
        elif act == 3:
            chain.append(("Clip", {0: float(act_params[0]), 1: float(act_params[1])}, None))
        elif act == 4:
            chain.append(("Sigmoid", {}, None))
        cur = u(f"{n}_emit") if chain else out
        last = add("Crop", f"{n}_emit", [cat], [cur], _crop(0, -o))
        for i, (typ, params, extra) in enumerate(chain):
            nxt = out if i == len(chain) - 1 else u(f"{n}_{typ.lower()}")
            last = add(typ, f"{n}_{'bias_add' if extra else typ.lower()}",
                       [cur] + ([extra] if extra else []), [nxt], params)
            cur = nxt
        what = f"overlap-add state {sin} -> {sout}: {o} x {st.channels} (K={st.kernel}, " \
               f"s={st.stride}" + (f", d={st.dilation}" if st.dilation != 1 else "") + ")"
        if st.bias:
            what += "; bias after the overlap-add"
        if act:
            what += f"; activation {act} after the overlap-add"
        result.changes.append(Change(dec.name, what, line=dec.source_line))
        return last

    # ------------------------------------------------------------------ manifest
    def _manifest(self, flow: TimeFlow, states: list[dict], stages: list[dict],
                  has_start: bool) -> dict:
        blobs = [i for i in flow.info.values() if isinstance(i, TimeBlob)]
        buffer_frames = max((b.offset // b.rate + 1 for b in blobs), default=1)

        def blob_dict(name: str, b: TimeBlob) -> dict:
            shape = b.numpy_shape()
            return {"name": name, "numpy_axis": b.numpy_axis, "numpy_shape": shape,
                    "ncnn_axis": "whdc"[b.axis] if b.rank < 4 else b.axis,
                    "samples_per_frame": b.rate, "start_trim": b.offset}

        outputs = [blob_dict(o, flow.info[o]) for o in flow.outputs]
        for o in outputs:
            o["flush_samples"] = 0
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "param": None, "bin": None, "start_param": None,
            "inputs": [blob_dict(i, flow.info[i]) for i in flow.inputs],
            "outputs": outputs,
            "samples_per_frame": {o["name"]: o["samples_per_frame"] for o in outputs},
            "states": states,
            "stages": stages,
            "stream_start": {
                "states": "every conv_state_in_<i> filled with its init value (zeros: the "
                          "offline left padding / an empty overlap)",
                "buffer_frames": buffer_frames if has_start else 1,
                "graph": "start_param" if has_start else "param",
                "note": ("run start_param once on the first buffer_frames frames (fewer "
                         "frames cannot emit anything), then param for every later chunk"
                         if has_start else "every chunk runs param"),
            },
            "push": "feed the chunk's frames and every conv_state_in_<i>; the outputs are the "
                    "samples that became final; conv_state_out_<i> is the next "
                    "conv_state_in_<i>",
            "emitted_after_n_frames": "max(0, samples_per_frame * n - start_trim) per output "
                                      "(0 while n < stream_start.buffer_frames)",
            "flush": {
                "emit_samples": 0,
                "note": "every transposed conv trims K-s at the right, which is exactly its "
                        "pending tail: nothing is left to emit; reset the states for the next "
                        "stream",
            },
        }


def _stage_dict(stage: ConvStage | DeconvStage, sin: str | None, sout: str | None) -> dict:
    if isinstance(stage, ConvStage):
        d = {"kind": "conv", "layer": stage.conv.name, "type": stage.conv.type,
             "kernel": stage.kernel, "dilation": stage.dilation, "left_pad": stage.pad,
             "state_samples": stage.state, "start_trim": stage.trim,
             "padding_layer": stage.padding.name if stage.padding else None}
    else:
        d = {"kind": "deconv", "layer": stage.deconv.name, "type": stage.deconv.type,
             "kernel": stage.kernel, "dilation": stage.dilation, "stride": stage.stride,
             "state_samples": stage.overlap, "start_trim": stage.trim,
             "right_trim": stage.right, "crop_layer": stage.crop.name if stage.crop else None,
             "bias_moved": stage.bias and stage.stateful}
    d["state_in"], d["state_out"] = sin, sout
    return d


def add_conv_cache(g: Graph, time_axis: Any = None) -> PassResult:
    """Run the pass on a copy: `result.graph` (steady graph), `result.data["start_graph"]`
    (or None) and `result.data["manifest"]`."""
    return AddConvCache(time_axis)(g)


__all__ = ["AddConvCache", "add_conv_cache", "parse_time_axis", "value_of"]
