"""1-D convolutions as ncnn's 2-D ops on a (C, 1, T) view (`paramsurgery conv1d-as-2d`).

Why: ncnn 1.0.20261020's x86 `Deconvolution1D` and `Convolution1D` kernels are much slower
than its 2-D `Deconvolution` / `Convolution` on the same weights. Measured on the real-size
Qwen3-TTS codec decoder, each layer alone, 1 thread (`tools/qwen3tts/profile_codec.py`):
the 6 transposed convs took 4371 ms as Deconvolution1D and 325 ms as Deconvolution, the 26
convs 4094 ms as Convolution1D and 2121 ms as Convolution (torch: 461 and 1328 ms).

Each `Convolution1D`, `Deconvolution1D` and `ConvolutionDepthWise1D` becomes

    Reshape  0=-1 1=1 2=<C in>       (w=T, h=C) -> (w=T, h=1, c=C)
    <2-D op> the same params, kernel/dilation/stride 1 and no padding along h
    Reshape  0=-1 1=<C out>          back to (w=T', h=C')

with the same weights: ncnn's 1-D and 2-D layouts agree when kernel_h is 1 ((out, in, kw) =
(out, in, 1, kw)), so the `.bin` bytes are unchanged. The h-direction params are written out
because ncnn defaults each of them to its w-direction value (kernel_h = kernel_w, ...).

Left alone, with the reason (`--explain`): a dynamic-weight conv (19=1 / 28=1: the weights are
a second bottom), int8 (8= scale terms), a transposed conv with a fixed output size (20=) and
a conv whose input channel count cannot be read from its params.
"""

from __future__ import annotations

from paramsurgery.core.changes import Change
from paramsurgery.core.match import MatchFailure
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.passes.base import Pass, PassResult

TWO_D = {"Convolution1D": "Convolution", "Deconvolution1D": "Deconvolution",
         "ConvolutionDepthWise1D": "ConvolutionDepthWise"}
# h-direction params of the 2-D ops, each of which ncnn defaults to its w-direction value:
# kernel_h, dilation_h, stride_h, pad_top, pad_bottom (+ output_pad_bottom for Deconvolution)
H_PARAMS = {11: 1, 12: 1, 13: 1, 14: 0, 16: 0}


def _in_channels(layer: Layer) -> int | None:
    p = layer.params
    out, k, size = p.get_int(0, 0), p.get_int(1, 1), p.get_int(6, 0)
    groups = p.get_int(7, 1) if layer.type == "ConvolutionDepthWise1D" else 1
    if out <= 0 or k <= 0 or size <= 0 or size % (out * k):
        return None
    per_group = size // (out * k)        # (out, in / groups, k) weights
    return per_group * groups


def _why_not(layer: Layer) -> str | None:
    p = layer.params
    if len(layer.inputs) != 1 or len(layer.outputs) != 1:
        return f"{len(layer.inputs)} bottoms / {len(layer.outputs)} tops (dynamic weights?)"
    if p.get_int(19, 0) or p.get_int(28, 0):
        return "dynamic weights"
    if p.get_int(8, 0):
        return "int8 scales (8=)"
    if layer.type == "Deconvolution1D" and p.get_int(20, 0):
        return "a fixed output size (20=)"
    if _in_channels(layer) is None:
        return "input channels not readable from 0=, 1=, 6= (and 7=)"
    return None


class Conv1dAs2d(Pass, name="conv1d-as-2d", tag="conv2d",
                 summary="Convolution1D / Deconvolution1D / ConvolutionDepthWise1D -> ncnn's 2-D "
                         "op on a (C, 1, T) view (same weights; ncnn's 1-D x86 kernels are "
                         "2-13x slower)"):
    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        todo = []
        for layer in g:
            if layer.type in TWO_D:
                why = _why_not(layer)
                if why is None:
                    todo.append(layer)
                else:
                    result.skipped.append(MatchFailure(layer.name, why, line=layer.source_line))
        for layer in todo:
            p = layer.params
            cin, cout = _in_channels(layer), p.get_int(0, 0)
            src, dst, name, line = layer.inputs[0], layer.outputs[0], layer.name, \
                layer.source_line
            params = dict(p.items())
            before = " ".join(p.tokens())
            params.update(H_PARAMS)
            if layer.type == "Deconvolution1D":
                params[19] = 0                       # output_pad_bottom
            weights = layer.weights
            view_in = g.unique_blob_name(f"{name}_chw")
            view_out = g.unique_blob_name(f"{name}_chw_out")
            g.add_layer("Reshape", g.unique_layer_name(f"{name}_to_2d"), [src], [view_in],
                        {0: -1, 1: 1, 2: cin}, before=layer)
            new = g.replace_layer(layer, TWO_D[layer.type], name, inputs=[view_in],
                                  outputs=[view_out], params=params)
            new.weights = weights
            g.add_layer("Reshape", g.unique_layer_name(f"{name}_to_1d"), [view_out], [dst],
                        {0: -1, 1: cout}, after=new)
            result.changes.append(Change(name, f"as {new.type} on a (C, 1, T) view",
                                         before,
                                         f"{' '.join(new.params.tokens())}", line))
            result.modified = True
        if not todo:
            result.notes.append("no 1-D convolution to rewrite")
        return result
