"""Time-axis analysis for streaming (`add-conv-cache`): for every blob, which axis is time, how
many samples it carries per input frame (`rate`) and how many samples the stream drops at its
start (`offset`); and which layers hold state between chunks.

The walk goes once over the layers in file order (topological). Every layer either

- mixes time in a way this module knows how to stream: a causal `Convolution1D` /
  `ConvolutionDepthWise1D` (left `Padding` and/or its own `pad_left`, stride 1) or a
  `Deconvolution1D` / `DeconvolutionDepthWise1D` (its own pads and/or a following `Crop` of
  the time axis): a *stage*;
- is pointwise in time (unary math, per-channel affine, norms and matrix products over a
  non-time axis, broadcasts with constants that do not span time, permutes, splits, ...);
- or computes constants only (`MemoryData`, `Reshape` of constants, ...);

and anything else that touches a time blob is refused with the layer and the reason
(`MatchFailure`). A blob's emitted sample count after n input frames is `max(0, rate*n - offset)`:
a causal conv keeps the count (`offset` grows by its start trim `(K-1)*d - pad` when it pads
less than its receptive field), a transposed conv multiplies by its stride and drops its left
trim at the stream start.

Shapes are in ncnn order (w, h, [d,] c); a time extent is `TIME`, an extent not known yet is
a `Dim` that the first layer needing it pins (an input's channel count is pinned by the conv
or Gemm that reads it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, Union

from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.match import MatchFailure
from paramsurgery.analysis.shape_expr import split_top_level
from paramsurgery.analysis.shapes import infer_shapes

if TYPE_CHECKING:
    from paramsurgery.analysis.shapes import ShapeMap

TIME = "T"


class Dim:
    """An extent not known yet; `value` is set by the first layer that needs it."""

    __slots__ = ("value",)

    def __init__(self, value: int | None = None) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "?" if self.value is None else str(self.value)


Extent = Union[int, Dim, str]



def _activation_params(p: Any) -> list:
    """A conv's fused activation params (10=, floats), [] when absent."""
    v = p.get(10)
    return list(v) if isinstance(v, list) else []


def value_of(e: Extent) -> int | str | None:
    if isinstance(e, Dim):
        return e.value
    return e


@dataclass
class TimeBlob:
    shape: list  # ncnn order w, h, [d,] c
    axis: int  # index of TIME in shape
    rate: int  # samples per input frame
    offset: int  # samples dropped at the stream start

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numpy_axis(self) -> int:
        return self.rank - 1 - self.axis

    def count(self, frames: int) -> int:
        """Samples emitted after `frames` input frames (earliest possible)."""
        return max(0, self.rate * frames - self.offset)

    def shape_values(self) -> list:
        return [value_of(e) for e in self.shape]

    def numpy_shape(self) -> list:
        """numpy shape (outermost first), time as "T", unknown extents as None."""
        return list(reversed(self.shape_values()))

    def like(self, **kw: Any) -> "TimeBlob":
        d: dict[str, Any] = dict(shape=list(self.shape), axis=self.axis, rate=self.rate,
                                 offset=self.offset)
        d.update(kw)
        return TimeBlob(**d)


@dataclass
class ConstBlob:
    shape: list | None  # known ncnn shape (ints), or None


@dataclass
class Padded:
    """The output of a `Padding` that only left-pads time and feeds one conv: absorbed."""

    base: TimeBlob
    layer: Layer
    left: int
    value: float


@dataclass
class ConvStage:
    conv: Layer
    padding: Layer | None
    x: str  # the blob the stage reads (before the Padding)
    kernel: int
    dilation: int
    pad: int  # total left pad P (Padding + the conv's pad_left)
    state: int  # (K-1)*d samples kept between chunks
    trim: int  # start trim (K-1)*d - P
    value: float  # the pad value (the initial state)
    channels: int | str | None  # a symbol when the graph does not fix it
    out: str = ""
    kind: str = "conv"

    @property
    def stateful(self) -> bool:
        return self.state > 0


@dataclass
class DeconvStage:
    deconv: Layer
    crop: Layer | None
    x: str
    kernel: int
    dilation: int
    stride: int
    extent: int  # d*(K-1)+1
    overlap: int  # extent - stride: the not-yet-final tail kept between chunks
    trim: int  # left trim, at the stream start
    right: int  # right trim (== overlap), at flush
    channels: int | None  # output channels
    bias: bool
    activation: tuple[int, list] = (0, [])
    out: str = ""
    kind: str = "deconv"

    @property
    def stateful(self) -> bool:
        return self.overlap > 0


Stage = Union[ConvStage, DeconvStage]

UNARY = {"UnaryOp", "Sigmoid", "Swish", "GELU", "ReLU", "TanH", "Clip", "ELU", "Mish",
         "HardSwish", "HardSigmoid", "SELU", "Softplus", "Exp", "Log", "Power", "AbsVal", "BNLL",
         "Erf", "CELU", "Shrink", "Dropout", "Noop", "Threshold"}
PER_CHANNEL = {"PReLU": 0, "BatchNorm": 0, "Scale": 0, "Bias": 0}  # count param id
CONVS = ("Convolution1D", "ConvolutionDepthWise1D")
DECONVS = ("Deconvolution1D", "DeconvolutionDepthWise1D")
TIME_MIXING = {"Convolution", "ConvolutionDepthWise", "Deconvolution", "DeconvolutionDepthWise",
               "Pooling", "Pooling1D", "Interp", "GroupNorm", "InstanceNorm", "MVN", "LRN",
               "Reduction", "Flatten", "Reshape", "CumulativeSum", "MultiHeadAttention", "SDPA",
               "RotaryEmbed", "GRU", "LSTM", "RNN", "Spectrogram", "InverseSpectrogram", "Flip",
               "Tile", "ExpandDims", "Squeeze", "StatisticsPooling", "Fold", "Unfold",
               "PixelShuffle", "Reorg", "Embed", "MatMul", "Einsum", "Normalize"}

# ncnn Permute order_type -> for each output axis (w, h, c), the input axis it takes
PERMUTE: dict[int, dict[int, tuple[int, ...]]] = {
    2: {0: (0, 1), 1: (1, 0)},
    3: {0: (0, 1, 2), 1: (1, 0, 2), 2: (0, 2, 1), 3: (2, 0, 1), 4: (1, 2, 0), 5: (2, 1, 0)},
}


def _axis_w_index(axis: int, rank: int) -> int:
    """ncnn axis params count outermost first (negative = rank + axis); -> index in (w,h,..)."""
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise ValueError(axis)
    return rank - 1 - a


class TimeFlow:
    """Run the analysis. `layouts` maps each graph input to (rank, time axis index in ncnn
    order: 0 = w, 1 = h); raises `MatchFailure` on the first layer it cannot stream."""

    def __init__(self, g: Graph, layouts: dict[str, tuple[int, int]], *,
                 shapes: "ShapeMap | None" = None,
                 inputshape: "Mapping[str, tuple] | None" = None) -> None:
        self.g = g
        # constants' shapes and the given input extents come from the shared shape analysis
        self.shapes = shapes if shapes is not None else infer_shapes(g, inputshape=inputshape)
        self.given = dict(inputshape or {})
        self.info: dict[str, Any] = {}
        self.stages: list[Stage] = []
        self.absorbed: set[int] = set()  # layer ids handled as part of a stage
        self.inputs: list[str] = []
        for layer in g:
            if layer.id in self.absorbed:
                continue
            self._visit(layer, layouts)
        self.outputs = list(g.outputs)
        for b in self.outputs:
            info = self.info.get(b)
            if not isinstance(info, TimeBlob):
                prod = g.producer(b)
                raise MatchFailure(prod, f"graph output {b!r} does not depend on the frames; a "
                                    f"streaming graph has only per-frame outputs")

    # ------------------------------------------------------------------ helpers
    def _ins(self, layer: Layer) -> list:
        out = []
        for b in layer.inputs:
            if b not in self.info:
                raise MatchFailure(layer, f"reads blob {b!r} that no earlier layer produces")
            out.append(self.info[b])
        return out

    def _set(self, layer: Layer, *infos: Any) -> None:
        for b, info in zip(layer.outputs, infos):
            self.info[b] = info

    def _pin(self, layer: Layer, e: Extent, want: int, what: str) -> None:
        if isinstance(e, Dim):
            if e.value is None:
                e.value = want
                return
            e = e.value
        if e == TIME:
            raise MatchFailure(layer, f"{what} would be the time axis")
        if e != want:
            raise MatchFailure(layer, f"{what} is {e}, the layer needs {want}")

    def _single_consumer(self, blob: str) -> Layer | None:
        cons = self.g.consumer_layers(blob)
        return cons[0] if len(cons) == 1 else None

    # ------------------------------------------------------------------ dispatch
    def _visit(self, layer: Layer, layouts: dict[str, tuple[int, int]]) -> None:
        t = layer.type
        if t == "Input":
            for b in layer.outputs:
                if b not in layouts:
                    raise MatchFailure(layer, f"input {b!r} has no time layout")
                rank, axis = layouts[b]
                shape: list = [Dim() for _ in range(rank)]
                known = self.shapes.shape_of(b) if b in self.given else None
                if known is not None and len(known) == rank:  # --inputshape pins extents
                    for i, v in enumerate(reversed(known)):
                        if isinstance(v, int):
                            shape[i] = Dim(v)
                shape[axis] = TIME
                self.info[b] = TimeBlob(shape, axis, 1, 0)
                self.inputs.append(b)
            return
        ins = self._ins(layer)
        if all(isinstance(i, ConstBlob) for i in ins):
            self._set(layer, *[ConstBlob(s) for s in self._const_shapes(layer, ins)])
            return
        if any(isinstance(i, Padded) for i in ins) and t not in CONVS:
            raise MatchFailure(layer, "reads a Padding output that was taken for a conv")
        handler = getattr(self, "_" + t, None)
        if t in UNARY:
            handler = self._unary
        elif t in PER_CHANNEL:
            handler = self._per_channel
        elif t in ("LayerNorm", "RMSNorm"):
            handler = self._norm
        if handler is None:
            why = ("mixes samples along the time axis" if t in TIME_MIXING else
                   "its behaviour along the time axis is not known to paramsurgery")
            raise MatchFailure(layer, f"{why}; cannot stream it")
        handler(layer, ins)

    # ------------------------------------------------------------------ constants
    def _const_shapes(self, layer: Layer, ins: list) -> list:
        """ncnn-order shapes (w, h, [d,] c) of a constant layer's tops, from the shared
        static shape analysis (None where it does not know)."""
        out: list = []
        for b in layer.outputs:
            known = self.shapes.known(b)
            if known is None or not all(isinstance(v, int) for v in known):
                out.append(None)
            else:
                out.append(list(reversed(known)))
        return out

    # ------------------------------------------------------------------ pointwise
    def _Split(self, layer: Layer, ins: list) -> None:
        self._set(layer, *[ins[0]] * len(layer.outputs))

    def _unary(self, layer: Layer, ins: list) -> None:
        if len(ins) != 1:
            raise MatchFailure(layer, f"has {len(ins)} inputs; expected 1")
        self._set(layer, ins[0])

    def _per_channel(self, layer: Layer, ins: list) -> None:
        if len(ins) != 1:
            raise MatchFailure(layer, f"has {len(ins)} inputs; only the 1-input form is handled")
        x = ins[0]
        count = layer.params.get_int(PER_CHANNEL[layer.type], 0)
        if count > 1:
            ch = x.rank - 1  # 1-D: w, 2-D: h, 3-D: c
            if ch == x.axis:
                raise MatchFailure(layer, f"its {count} per-channel values would run along the time "
                                     f"axis")
            self._pin(layer, x.shape[ch], count, "its channel axis")
        self._set(layer, x)

    def _norm(self, layer: Layer, ins: list) -> None:
        x = ins[0]
        affine = layer.params.get_int(0, 0)
        if x.rank == 1:
            normalized = {0}
        elif x.rank == 2:
            normalized = {0}
        else:
            w = value_of(x.shape[0])
            normalized = {0} if (w == affine or w is None) else {0, 1}
        if x.axis in normalized:
            raise MatchFailure(layer, f"normalizes over the time axis ({'w' if x.axis == 0 else 'h'})")
        if x.rank == 2 and affine:
            self._pin(layer, x.shape[0], affine, "its normalized axis")
        self._set(layer, x)

    def _Softmax(self, layer: Layer, ins: list) -> None:
        x = ins[0]
        axis = layer.params.get_int(0, 0)
        if x.rank == 3 and not layer.params.get(1, 0):
            raise MatchFailure(layer, "3-D Softmax without fixbug0 (1=1): legacy axis meaning")
        if _axis_w_index(axis, x.rank) == x.axis:
            raise MatchFailure(layer, "Softmax along the time axis")
        self._set(layer, x)

    def _Permute(self, layer: Layer, ins: list) -> None:
        x = ins[0]
        order = layer.params.get_int(0, 0)
        table = PERMUTE.get(x.rank, {})
        if order not in table:
            raise MatchFailure(layer, f"Permute order_type {order} on a {x.rank}-D blob is not handled")
        src = table[order]
        shape = [x.shape[i] for i in src]
        self._set(layer, x.like(shape=shape, axis=src.index(x.axis)))

    def _check_same_time(self, layer: Layer, xs: Sequence[TimeBlob]) -> None:
        a = xs[0]
        for b in xs[1:]:
            if (b.rank, b.axis) != (a.rank, a.axis):
                raise MatchFailure(layer, f"operands carry time on different axes ({a.rank}-D axis "
                                     f"{a.axis} vs {b.rank}-D axis {b.axis})")
            if (b.rate, b.offset) != (a.rate, a.offset):
                raise MatchFailure(layer, f"operands run at different rates/offsets "
                                     f"({a.rate}/frame from {a.offset} vs {b.rate}/frame from "
                                     f"{b.offset})")

    def _merge(self, layer: Layer, xs: Sequence[TimeBlob]) -> TimeBlob:
        out = xs[0].like()
        for b in xs[1:]:
            for i, e in enumerate(b.shape):
                if i == out.axis:
                    continue
                v = value_of(e)
                if isinstance(v, int):
                    self._pin(layer, out.shape[i], v, f"axis {i}")
        return out

    def _Eltwise(self, layer: Layer, ins: list) -> None:
        if not all(isinstance(i, TimeBlob) for i in ins):
            raise MatchFailure(layer, "Eltwise of a time blob and a constant")
        self._check_same_time(layer, ins)
        self._set(layer, self._merge(layer, ins))

    def _BinaryOp(self, layer: Layer, ins: list) -> None:
        if len(ins) == 1:
            self._set(layer, ins[0])
            return
        a, b = ins
        if isinstance(a, TimeBlob) and isinstance(b, TimeBlob):
            self._check_same_time(layer, [a, b])
            self._set(layer, self._merge(layer, [a, b]))
            return
        t, c = (a, b) if isinstance(a, TimeBlob) else (b, a)
        self._check_broadcast(layer, t, c)
        self._set(layer, t)

    def _check_broadcast(self, layer: Layer, t: TimeBlob, c: ConstBlob) -> None:
        """A constant operand must not vary along time (ncnn-format.md §4 BinaryOp; ncnn's
        docs/developer-guide/binaryop-broadcasting.md, measured with the wheel: a same-rank
        constant broadcasts explicitly (size-1 axes), a lower-rank one aligns with the outer
        axes, except a 1-D constant whose size equals the inner extent)."""
        if c.shape is None:
            raise MatchFailure(layer, "a constant operand of unknown shape: cannot tell whether it "
                                 "varies along time")
        shape = list(c.shape)
        if all(v == 1 for v in shape):
            return
        rt, rc = t.rank, len(shape)
        if rc > rt:
            raise MatchFailure(layer, f"a {rc}-D constant broadcast against a {rt}-D time blob")
        if rc == rt:
            if shape[t.axis] != 1:
                raise MatchFailure(layer, f"the constant operand has {shape[t.axis]} values along "
                                     f"the time axis")
            for i, v in enumerate(shape):
                if i != t.axis and v != 1:
                    self._pin(layer, t.shape[i], v, f"axis {i}")
            return
        if rc == 1:
            n = shape[0]
            if t.axis == 0:
                raise MatchFailure(layer, f"a 1-D constant of {n} values against a blob whose "
                                     f"innermost axis is time: ncnn aligns it with time "
                                     f"whenever a chunk has {n} samples")
            if value_of(t.shape[0]) == n:
                return  # inner axis
            if t.axis == rt - 1:
                raise MatchFailure(layer, "a 1-D constant aligned with the outer (time) axis")
            self._pin(layer, t.shape[rt - 1], n, "the outer axis")
            return
        first = rt - rc  # aligned with the outer axes
        for j, v in enumerate(shape):
            i = first + j
            if i == t.axis and v != 1:
                raise MatchFailure(layer, f"the constant operand has {v} values along the time axis")
            if i != t.axis and v != 1:
                self._pin(layer, t.shape[i], v, f"axis {i}")

    def _Concat(self, layer: Layer, ins: list) -> None:
        if not all(isinstance(i, TimeBlob) for i in ins):
            raise MatchFailure(layer, "Concat of a time blob and a constant")
        self._check_same_time(layer, ins)
        x = ins[0]
        axis = _axis_w_index(layer.params.get_int(0, 0), x.rank)
        if axis == x.axis:
            raise MatchFailure(layer, "concatenates along the time axis")
        out = x.like()
        vals = [value_of(i.shape[axis]) for i in ins]
        ints = [v for v in vals if isinstance(v, int)]
        out.shape[axis] = sum(ints) if len(ints) == len(vals) else Dim()
        self._set(layer, out)

    def _Slice(self, layer: Layer, ins: list) -> None:
        x = ins[0]
        axis = _axis_w_index(layer.params.get_int(1, 0), x.rank)
        if axis == x.axis:
            raise MatchFailure(layer, "slices the time axis")
        outs = []
        for _ in layer.outputs:
            o = x.like()
            o.shape[axis] = Dim()
            outs.append(o)
        self._set(layer, *outs)

    def _Padding(self, layer: Layer, ins: list) -> None:
        x = ins[0]
        p = layer.params
        pads = {0: (p.get_int(2, 0), p.get_int(3, 0)), 1: (p.get_int(0, 0), p.get_int(1, 0))}
        if x.rank >= 3:
            pads[x.rank - 1] = (p.get_int(7, 0), p.get_int(8, 0))
        if len(ins) != 1:
            raise MatchFailure(layer, "Padding with pads from a second input")
        left, right = pads.get(x.axis, (0, 0))
        consumer = self._single_consumer(layer.outputs[0])
        other = any(v for a, v2 in pads.items() if a != x.axis for v in v2)
        if (left or right) and consumer is not None and consumer.type in CONVS \
                and x.axis == 0 and x.rank == 2:
            if right:
                raise MatchFailure(layer, f"pads the right of the time axis by {right}: the conv "
                                     f"after it looks {right} samples ahead")
            if other:
                raise MatchFailure(layer, "pads the channel axis too")
            if p.get(4, 0) != 0:
                raise MatchFailure(layer, f"padding type {p.get(4, 0)} (replicate/reflect) depends "
                                     f"on the stream start's samples; only constant padding "
                                     f"streams")
            if p.get(6, 0):
                raise MatchFailure(layer, "per-channel pad values")
            self._set(layer, Padded(x, layer, left, p.get_float(5, 0.0)))
            return
        if left or right:
            raise MatchFailure(layer, f"pads the time axis ({left}, {right}) without feeding a "
                                 f"causal conv")
        out = x.like()
        for a, (lo, hi) in pads.items():
            if lo or hi:
                v = value_of(out.shape[a])
                out.shape[a] = v + lo + hi if isinstance(v, int) else Dim()
        self._set(layer, out)

    def _Crop(self, layer: Layer, ins: list) -> None:
        x = ins[0]
        if len(ins) != 1:
            raise MatchFailure(layer, "Crop to a reference blob")
        spans = crop_spans(layer, x.rank)
        if spans is None:
            raise MatchFailure(layer, "Crop form not understood (legacy offsets or expressions)")
        out = x.like()
        for axis, (start, end) in spans.items():
            if axis == x.axis:
                if start == 0 and end == 0:
                    continue
                raise MatchFailure(layer, "crops the time axis, and not right after a transposed "
                                     "conv")
            out.shape[axis] = Dim()
        self._set(layer, out)

    def _Gemm(self, layer: Layer, ins: list) -> None:
        p = layer.params
        if len(ins) != 1 or p.get(4, 0) or not p.get(5, 0):
            raise MatchFailure(layer, "Gemm with more than one input (only x·W with constant B is "
                                 "handled)")
        x = ins[0]
        if x.rank != 2:
            raise MatchFailure(layer, f"Gemm on a {x.rank}-D blob")
        trans_a = p.get_int(2, 0)
        k_axis = 1 if trans_a else 0
        if x.axis == k_axis:
            raise MatchFailure(layer, "Gemm reduces over the time axis")
        k = p.get_int(9, 0)
        if k:
            self._pin(layer, x.shape[k_axis], k, "its reduced axis")
        n = p.get_int(8, 0) or Dim()
        shape = [TIME, n] if p.get(14, 0) else [n, TIME]
        self._set(layer, x.like(shape=shape, axis=shape.index(TIME)))

    def _InnerProduct(self, layer: Layer, ins: list) -> None:
        x = ins[0]
        if x.rank != 2 or x.axis != 1:
            raise MatchFailure(layer, "InnerProduct flattens its input, time included (only 2-D "
                                 "[w=features, h=time] rows are handled)")
        n = layer.params.get_int(0, 0)
        size = layer.params.get_int(2, 0)
        if n and size and size % n == 0:
            self._pin(layer, x.shape[0], size // n, "its input features")
        self._set(layer, x.like(shape=[n or Dim(), TIME], axis=1))

    # ------------------------------------------------------------------ stages
    def _conv_common(self, layer: Layer, x: TimeBlob) -> None:
        if x.rank != 2 or x.axis != 0:
            raise MatchFailure(layer, f"reads time on axis {x.axis} of a {x.rank}-D blob; a 1-D conv "
                                 f"needs [w=time, h=channels]")

    def _conv(self, layer: Layer, ins: list) -> None:
        p = layer.params
        src = ins[0]
        padded = src if isinstance(src, Padded) else None
        x = padded.base if padded else src
        self._conv_common(layer, x)
        if p.get(19, 0):
            raise MatchFailure(layer, "dynamic weights (19=1)")
        k, d, s = p.get_int(1, 0), p.get_int(2, 1), p.get_int(3, 1)
        if s != 1:
            raise MatchFailure(layer, f"stride {s}: downsampling convs are not handled")
        pl = p.get_int(4, 0)
        pr = p.get_int(15, pl)
        if pl in (-233, -234) or pr in (-233, -234):
            raise MatchFailure(layer, "SAME padding (-233/-234) pads both sides")
        if pr > 0:
            raise MatchFailure(layer, f"pads the right by {pr}: output sample t would need input "
                                 f"t+{pr}")
        value = p.get_float(18, 0.0)
        total = pl
        if padded:
            if pl and padded.value != value:
                raise MatchFailure(layer, "the Padding and the conv pad with different values")
            value = padded.value
            total += padded.left
        state = d * (k - 1)
        if total > state:
            raise MatchFailure(layer, f"left pad {total} > (K-1)*d = {state}: the output would be "
                                 f"longer than the input")
        num_out = p.get_int(0, 0)
        wds = p.get_int(6, 0)
        group = p.get_int(7, 1) if layer.type == "ConvolutionDepthWise1D" else 1
        cin = wds * group // (num_out * k) if num_out and k else None
        if cin:
            self._pin(layer, x.shape[1], cin, "its input channels")
        trim = state - total
        stage = ConvStage(layer, padded.layer if padded else None,
                          padded.layer.inputs[0] if padded else layer.inputs[0], k, d, total,
                          state, trim, value, value_of(x.shape[1]), out=layer.outputs[0])
        if stage.stateful or stage.trim:
            self.stages.append(stage)
        if padded:
            self.absorbed.add(padded.layer.id)
        self._set(layer, TimeBlob([TIME, num_out], 0, x.rate, x.offset + trim))

    _Convolution1D = _conv
    _ConvolutionDepthWise1D = _conv

    def _deconv(self, layer: Layer, ins: list) -> None:
        p = layer.params
        x = ins[0]
        self._conv_common(layer, x)
        if p.get(28, 0):
            raise MatchFailure(layer, "dynamic weights (28=1)")
        k, d, s = p.get_int(1, 0), p.get_int(2, 1), p.get_int(3, 1)
        extent = d * (k - 1) + 1
        if extent < s:
            raise MatchFailure(layer, f"kernel extent {extent} < stride {s}: frames leave gaps")
        pl = p.get_int(4, 0)
        pr = p.get_int(15, pl)
        if pl in (-233, -234) or pr in (-233, -234) or p.get(20, 0):
            raise MatchFailure(layer, "output_w / SAME padding: the output length is fixed or "
                                 "depends on the whole input")
        opr = p.get_int(18, 0)
        left, right = pl, pr - opr
        crop = None
        out_blob = layer.outputs[0]
        consumer = self._single_consumer(out_blob)
        if consumer is not None and consumer.type == "Crop" and len(consumer.inputs) == 1:
            trims = time_crop(consumer, 2, 0)
            if trims is not None and trims != (0, 0):
                crop = consumer
                left += trims[0]
                right += trims[1]
        overlap = extent - s
        if right > overlap:
            raise MatchFailure(layer, f"right trim {right} > K-s = {overlap}: the last samples "
                                 f"before the trim depend on the stream end")
        if right < overlap:
            raise MatchFailure(layer, f"right trim {right} < K-s = {overlap}: flush would have to "
                                 f"push the last {overlap - right} samples through the layers "
                                 f"after it (not handled; causal upsamplers trim K-s)")
        act = p.get_int(9, 0)
        if act not in (0, 1, 2, 3, 4):
            raise MatchFailure(layer, f"fused activation {act}")
        num_out = p.get_int(0, 0)
        group = p.get_int(7, 1) if layer.type == "DeconvolutionDepthWise1D" else 1
        wds = p.get_int(6, 0)
        cin = wds * group // (num_out * k) if num_out and k else None
        if cin:
            self._pin(layer, x.shape[1], cin, "its input channels")
        stage = DeconvStage(layer, crop, layer.inputs[0], k, d, s, extent, overlap, left, right,
                            num_out, bool(p.get(5, 0)), (act, _activation_params(p)),
                            out=crop.outputs[0] if crop else out_blob)
        if stage.stateful or stage.trim or crop is not None or pl or pr or opr:
            self.stages.append(stage)
        out = TimeBlob([TIME, num_out], 0, x.rate * s, x.offset * s + left)
        if crop is not None:
            self.absorbed.add(crop.id)
            self.info[out_blob] = out
            self.info[crop.outputs[0]] = out
        else:
            self._set(layer, out)

    _Deconvolution1D = _deconv
    _DeconvolutionDepthWise1D = _deconv


# ---------------------------------------------------------------------- Crop parsing

def crop_spans(layer: Layer, rank: int) -> dict[int, tuple[int, int]] | None:
    """Per axis (ncnn w-first index): (start, end) of a numpy- or expression-mode Crop, with
    start >= 0 and end as a relative end (0 = to the end, -r = drop r), or an absolute
    positive end. None for forms not understood."""
    p = layer.params
    starts, ends, axes = p.get_ints(9) or [], p.get_ints(10) or [], p.get_ints(11)
    if starts and ends:
        def numeric(st: int, en: int, a: int) -> tuple[int, int] | None:
            st, en = (0 if st == -233 else st), (0 if en == -233 else en)
            return None if st < 0 else (st, en)

        return _spans_by_axis(zip(starts, ends, axes or range(len(starts))), rank, numeric)
    se, ee, ae = p.get(19), p.get(20), p.get(21)
    if se and ee and ae:
        try:
            st_l = split_top_level(str(se))
            en_l = split_top_level(str(ee))
            ax_l = [int(v) for v in split_top_level(str(ae))]
        except ValueError:
            return None
        if not (len(st_l) == len(en_l) == len(ax_l)):
            return None

        def expression(st_s: str, en_s: str, a: int) -> tuple[int, int] | None:
            st, en = _expr_start(st_s), _expr_end(en_s, "wh?c"[a] if rank <= 3 else None)
            return None if st is None or en is None else (st, en)

        return _spans_by_axis(zip(st_l, en_l, ax_l), rank, expression)
    if any(k in p for k in (9, 10, 19, 20)):
        return None
    # legacy offsets: only the all-default/auto form is understood
    legacy = [p.get(k, 0) for k in (0, 1, 13, 2, 6, 7, 15, 8)]
    sizes = [p.get(k, -233) for k in (3, 4, 14, 5)]
    if any(legacy) or any(v not in (-233,) for v in sizes):
        return None
    return {}


def _spans_by_axis(specs: Iterable[tuple[Any, Any, int]], rank: int,
                   span: Callable[[Any, Any, int], tuple[int, int] | None]
                   ) -> dict[int, tuple[int, int]] | None:
    """Axis (w-first index) → `span(start, end, axis)` for each (start, end, numpy axis);
    None when an axis is out of range or a span is not understood."""
    out = {}
    for st, en, ax in specs:
        try:
            a = _axis_w_index(ax, rank)
        except ValueError:
            return None
        got = span(st, en, a)
        if got is None:
            return None
        out[a] = got
    return out


def time_crop(layer: Layer, rank: int, axis: int) -> tuple[int, int] | None:
    """(left, right) samples a Crop drops from the time axis `axis`, or None when it crops
    other axes, uses an absolute end, or a form not understood."""
    spans = crop_spans(layer, rank)
    if spans is None:
        return None
    if any(a != axis and span != (0, 0) for a, span in spans.items()):
        return None
    st, en = spans.get(axis, (0, 0))
    if en > 0:
        return None
    return st, -en


def _expr_start(s: str) -> int | None:
    return int(s) if re.fullmatch(r"\d+", s) else None


def _expr_end(s: str, dim: str | None) -> int | None:
    """Relative end: 0 = to the end, -r = drop the last r."""
    if re.fullmatch(r"-?\d+", s):
        return int(s)  # positive = an absolute end (time_crop refuses it)
    if dim and s == f"0{dim}":
        return 0
    m = re.fullmatch(r"-\(0" + (dim or "w") + r",(\d+)\)", s)
    if m:
        return -int(m.group(1))
    m = re.fullmatch(r"\+\(0" + (dim or "w") + r",-(\d+)\)", s)
    if m:
        return -int(m.group(1))
    return None


def infer_layouts(g: Graph, given: dict[str, tuple[int, int]] | None = None,
                  inputshape: "Mapping[str, tuple] | None" = None
                  ) -> tuple[TimeFlow, dict[str, tuple[int, int]]]:
    """Try [w=time, h=channels] and [w=channels, h=time] for every input not in `given`
    (2-D only); keep the combination the analysis accepts. Raises the most informative
    MatchFailure when none is accepted, and MatchFailure(None, ...) when several are."""
    import itertools

    inputs = list(g.inputs)
    if not inputs:
        raise MatchFailure(None, "the graph has no Input layer")
    given = dict(given or {})
    shapes = infer_shapes(g, inputshape=inputshape)  # once, shared by every candidate layout
    free = [b for b in inputs if b not in given]
    ok: list[tuple[TimeFlow, dict]] = []
    errors: list[tuple[int, MatchFailure, dict]] = []
    pos = g.position()
    for combo in itertools.product([(2, 1), (2, 0)], repeat=len(free)):
        layouts = dict(given)
        layouts.update(zip(free, combo))
        try:
            ok.append((TimeFlow(g, layouts, shapes=shapes, inputshape=inputshape), layouts))
        except MatchFailure as exc:
            depth = pos.get(exc.stopped_at.id, -1) if exc.stopped_at is not None else -1
            errors.append((depth, exc, layouts))
    if len(ok) == 1:
        return ok[0][0], ok[0][1]
    if len(ok) > 1:
        stateful = [(f, l) for f, l in ok if any(s.stateful for s in f.stages)]
        if len(stateful) == 1:
            return stateful[0]
        raise MatchFailure(None, "cannot tell which input axis is time (several layouts stream); "
                            "give it explicitly (time_axis)")
    errors.sort(key=lambda e: e[0])
    raise errors[-1][1]
