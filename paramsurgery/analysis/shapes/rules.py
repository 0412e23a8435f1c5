"""Static shape rules: what one ncnn layer's forward makes of its inputs' shapes.

A rule maps the shapes of a layer's bottoms (numpy order of the `ncnn.Mat`, `[c, h, w]`;
a dim may be symbolic, `None` = not known; a whole shape `None` = rank not known) to the
shapes of its tops. Each follows the layer's `forward` in ncnn (`src/layer/*.cpp`), and
returns None wherever the answer would be a guess (an unknown param form, a size that is
not affine in the symbols, data-dependent outputs such as DetectionOutput). Rules are data:
`RULES[type] = function`, one per layer type; adding a type touches nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from paramsurgery.analysis.shapes.exprs import AXIS_NAMES, ncnn_axes
from paramsurgery.ir.layer import Layer
from paramsurgery.analysis.shapes.affine import MaybeDim, add, div, dmax, floordiv, mul, product, same, sub

Shape = tuple  # tuple[MaybeDim, ...]
Shapes = Sequence["Shape | None"]
Rule = Callable[[Layer, Shapes], "list[Shape | None] | None"]

RULES: dict[str, Rule] = {}


def rule(*types: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        for t in types:
            RULES[t] = fn
        return fn
    return deco


def first_input_known(fn: Rule) -> Rule:
    """For a rule that needs its first bottom's shape: no answer while it is unknown."""
    def infer(layer: Layer, ins: Shapes):
        return None if ins[0] is None else fn(layer, ins)
    return infer


def _first(ins: Shapes) -> Shape:
    """The first bottom's shape in a rule under `first_input_known` (never None there)."""
    x = ins[0]
    assert x is not None, "rule not under first_input_known"
    return x


def _i(layer: Layer, pid: int, default: int) -> int:
    v = layer.params.get(pid, default)
    return v if isinstance(v, int) else default


def _f(layer: Layer, pid: int, default: float) -> float:
    v = layer.params.get(pid, default)
    return float(v) if isinstance(v, (int, float)) else default


def _ints(layer: Layer, pid: int) -> list[int] | None:
    v = layer.params.get(pid)
    if v is None:
        return None
    if isinstance(v, int):
        return [v]
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return list(v)
    return None


def _axis(layer: Layer, pid: int, rank: int) -> int | None:
    """Param `pid` as an axis of a rank-`rank` blob (negative counts from the end), or None
    when out of range."""
    axis = _i(layer, pid, 0)
    if axis < 0:
        axis += rank
    return axis if 0 <= axis < rank else None


def _replaced(x: Shape, axis: int, dim: MaybeDim) -> Shape:
    return (*x[:axis], dim, *x[axis + 1:])


def _nonneg(axes: Sequence[int], rank: int) -> set[int]:
    return {a + rank if a < 0 else a for a in axes}


def _floats(layer: Layer, pid: int) -> list:
    v = layer.params.get(pid)
    if v is None:
        return []
    return list(v) if isinstance(v, list) else [v]


# --------------------------------------------------------------------------- same shape
SAME_SHAPE = (
    "AbsVal", "BatchNorm", "Bias", "BNLL", "CELU", "Cast", "Clip", "CopyTo", "CumulativeSum",
    "Dequantize", "Dropout", "ELU", "Erf", "Exp", "GELU", "GLU_", "GroupNorm", "HardSigmoid",
    "HardSwish", "InstanceNorm", "LayerNorm", "Log", "LRN", "Mish", "MVN", "Normalize",
    "Power", "PReLU", "Quantize", "ReLU", "ReLU6", "Requantize", "RMSNorm", "RotaryEmbed",
    "Scale", "SELU", "Shrink", "ShuffleChannel", "Sigmoid", "Softmax", "Softplus", "Swish",
    "TanH", "Threshold", "UnaryOp", "Eltwise", "LogSoftmax", "Sign", "Tanh",
)


@rule(*SAME_SHAPE)
def _same(layer: Layer, ins: Shapes):
    return [ins[0] if ins else None] * max(1, len(layer.outputs))


@rule("Split")
def _split(layer: Layer, ins: Shapes):
    return [ins[0]] * len(layer.outputs)


@rule("Noop")
def _noop(layer: Layer, ins: Shapes):
    if len(layer.inputs) == len(layer.outputs):
        return list(ins)
    return None


@rule("Input")
def _input(layer: Layer, ins: Shapes):
    return [_whdc_shape(layer)] * len(layer.outputs)


@rule("MemoryData")
def _memorydata(layer: Layer, ins: Shapes):
    return [_whdc_shape(layer)]


def _whdc_shape(layer: Layer) -> Shape | None:
    """The shape an Input / MemoryData describes with its w, h, d, c params (0=, 1=, 11=,
    2=; ncnn's dims rule)."""
    w, h, d, c = _i(layer, 0, 0), _i(layer, 1, 0), _i(layer, 11, 0), _i(layer, 2, 0)
    if d:
        return (c, d, h, w)
    if c:
        return (c, h, w)
    if h:
        return (h, w)
    if w:
        return (w,)
    return None


# --------------------------------------------------------------------------- sliding windows
class _Axis(NamedTuple):
    """One spatial axis of a sliding window (convolution, deconvolution, pooling)."""

    k: int
    dil: int
    stride: int
    pa: int  # pad before (left / top)
    pb: int  # pad after (right / bottom)


# Where each layout keeps its window params: (w, h) id pairs, h defaulting to w; pads as
# (left, right, top, bottom), right and top defaulting to left, bottom to top. The 1-D
# layers use the w ids.
_CONV_IDS = {"kernel": (1, 11), "dilation": (2, 12), "stride": (3, 13), "pad": (4, 15, 14, 16)}
_POOL_IDS = {"kernel": (1, 11), "dilation": None, "stride": (2, 12), "pad": (3, 14, 13, 15)}


def _window(layer: Layer, ids: dict) -> tuple[_Axis, _Axis]:
    """The (h, w) axes of a layer's window, read with ncnn's defaults."""
    def pair(key: str, default: int) -> tuple[int, int]:
        if ids[key] is None:
            return default, default
        w_id, h_id = ids[key]
        w = _i(layer, w_id, default)
        return w, _i(layer, h_id, w)

    kw, kh = pair("kernel", 0)
    dw, dh = pair("dilation", 1)
    sw, sh = pair("stride", 1)
    left, right, top, bottom = ids["pad"]
    pl = _i(layer, left, 0)
    pr = _i(layer, right, pl)
    pt = _i(layer, top, pl)
    pb = _i(layer, bottom, pt)
    return _Axis(kh, dh, sh, pt, pb), _Axis(kw, dw, sw, pl, pr)


def _conv_extent(x: MaybeDim, k: int, dil: int, stride: int, pa: int, pb: int) -> MaybeDim:
    """Output size along one axis of ncnn's Convolution (make_padding + the sliding window).
    -233/-234 pad: SAME-style, padded only when the needed pad is positive."""
    ext = dil * (k - 1) + 1
    if stride <= 0:
        return None  # ncnn would divide by zero
    if pa in (-233, -234) or pb in (-233, -234):
        if not isinstance(x, int):
            return None
        need = ext + (x - 1) // stride * stride - x
        if need > 0:
            x = x + need
        return (x - ext) // stride + 1
    v = sub(add(x, pa + pb), ext)
    if v is None:
        return None
    if stride == 1:
        return add(v, 1)
    if isinstance(v, int):
        return v // stride + 1
    q = floordiv(v, stride)
    return add(q, 1)


def _same_pad_2d(h: MaybeDim, w: MaybeDim, ah: _Axis, aw: _Axis) -> tuple | None:
    """(h, w) out of a SAME-padded window (-233/-234 pads, Pooling's pad_mode 2/3): ncnn pads
    both axes together when either needs it (copy_make_border with wpad, hpad)."""
    if ah.stride <= 0 or aw.stride <= 0:
        return None
    if not isinstance(h, int) or not isinstance(w, int):
        return None, None
    ext_h, ext_w = ah.dil * (ah.k - 1) + 1, aw.dil * (aw.k - 1) + 1
    wpad = ext_w + (w - 1) // aw.stride * aw.stride - w
    hpad = ext_h + (h - 1) // ah.stride * ah.stride - h
    if wpad > 0 or hpad > 0:
        w, h = w + wpad, h + hpad
    return (h - ext_h) // ah.stride + 1, (w - ext_w) // aw.stride + 1


def _conv_rule(rank: int, dynamic_weight_pid: int,
               extents: Callable[[Layer, Shape], "tuple | None"]) -> Rule:
    """A Convolution*/Deconvolution* rule: num_output (0=) channels over the spatial sizes
    `extents` gives; a layer with dynamic weights takes its channels from the weight blob
    (no rule)."""
    def infer(layer: Layer, ins: Shapes):
        n = _i(layer, 0, 0)
        if _i(layer, dynamic_weight_pid, 0):
            return None
        x = ins[0]
        if x is None:
            return [(n,) + (None,) * (rank - 1)] if n > 0 else None
        if len(x) != rank:
            return None
        spatial = extents(layer, x)
        return None if spatial is None else [(n, *spatial)]
    return infer


def _conv2d(layer: Layer, x: Shape) -> tuple | None:
    ah, aw = _window(layer, _CONV_IDS)
    if any(p in (-233, -234) for p in (ah.pa, ah.pb, aw.pa, aw.pb)):
        return _same_pad_2d(x[1], x[2], ah, aw)
    return _conv_extent(x[1], *ah), _conv_extent(x[2], *aw)


def _conv1d(layer: Layer, x: Shape) -> tuple:
    return (_conv_extent(x[1], *_window(layer, _CONV_IDS)[1]),)


def _deconv_extent(x: MaybeDim, ax: _Axis, padded: bool, out_pad: int, out_size: int,
                   other_out: int) -> MaybeDim:
    """Output size along one axis of ncnn's Deconvolution: the full extent, cut by the pads
    when any pad is set (`padded`), else the requested output size when both are given."""
    full = add(mul(sub(x, 1), ax.stride), ax.dil * (ax.k - 1) + 1 + out_pad)
    if padded:
        return sub(full, ax.pa + ax.pb)
    if out_size > 0 and other_out > 0:
        return out_size
    return full


def _deconv2d(layer: Layer, x: Shape) -> tuple:
    ah, aw = _window(layer, _CONV_IDS)
    padded = max(ah.pa, ah.pb, aw.pa, aw.pb) > 0
    opr = _i(layer, 18, 0)
    opb = _i(layer, 19, opr)
    ow, oh = _i(layer, 20, 0), _i(layer, 21, _i(layer, 20, 0))
    return (_deconv_extent(x[1], ah, padded, opb, oh, ow),
            _deconv_extent(x[2], aw, padded, opr, ow, oh))


def _deconv1d(layer: Layer, x: Shape) -> tuple:
    aw = _window(layer, _CONV_IDS)[1]
    return (_deconv_extent(x[1], aw, aw.pa > 0 or aw.pb > 0, _i(layer, 18, 0),
                           _i(layer, 20, 0), 1),)


rule("Convolution", "ConvolutionDepthWise")(_conv_rule(3, 19, _conv2d))
rule("Convolution1D", "ConvolutionDepthWise1D")(_conv_rule(2, 19, _conv1d))
rule("Deconvolution", "DeconvolutionDepthWise")(_conv_rule(3, 28, _deconv2d))
rule("Deconvolution1D", "DeconvolutionDepthWise1D")(_conv_rule(2, 28, _deconv1d))


def _pool_extent(x: MaybeDim, ax: _Axis, mode: int) -> MaybeDim:
    k, s, pa, pb = ax.k, ax.stride, ax.pa, ax.pb
    if s <= 0:
        return None
    if mode == 0:  # full padding: the tail is padded so no input is dropped
        if not isinstance(x, int):
            if s != 1:
                return None
            return add(x, pa + pb - k + 1)
        tail = (x + pa + pb - k) % s
        extra = s - tail if tail else 0
        return (x + pa + pb + extra - k) // s + 1
    if mode == 1:  # valid
        return _conv_extent(x, k, 1, s, pa, pb)
    return None


@rule("Pooling")
def _pooling(layer: Layer, ins: Shapes):
    x = ins[0]
    if x is None or len(x) != 3:
        return None
    c, h, w = x
    if _i(layer, 4, 0):
        return [(c,)]
    if _i(layer, 7, 0):
        ow = _i(layer, 8, 0)
        return [(c, _i(layer, 18, ow), ow)]
    ah, aw = _window(layer, _POOL_IDS)
    if ah.stride <= 0 or aw.stride <= 0:
        return None
    mode = _i(layer, 5, 0)
    if mode in (2, 3):  # tf SAME
        hw = _same_pad_2d(h, w, ah, aw)
        return None if hw is None else [(c, *hw)]
    return [(c, _pool_extent(h, ah, mode), _pool_extent(w, aw, mode))]


@rule("Pooling1D")
def _pooling1d(layer: Layer, ins: Shapes):
    x = ins[0]
    if x is None or len(x) != 2:
        return None
    h, w = x
    if _i(layer, 4, 0):
        return [(h,)]
    if _i(layer, 7, 0):
        return [(h, _i(layer, 8, 0))]
    return [(h, _pool_extent(w, _window(layer, _POOL_IDS)[1], _i(layer, 5, 0)))]


# --------------------------------------------------------------------------- dense layers
@rule("InnerProduct")
def _innerproduct(layer: Layer, ins: Shapes):
    n, wds = _i(layer, 0, 0), _i(layer, 2, 0)
    x = ins[0]
    if n <= 0:
        return None
    if x is None:
        return None
    if len(x) == 2 and n and wds % n == 0 and same(x[1], wds // n):
        return [(x[0], n)]
    return [(n,)]


@rule("Gemm")
def _gemm(layer: Layer, ins: Shapes):
    trans_a, trans_b = _i(layer, 2, 0), _i(layer, 3, 0)
    const_a, const_b = _i(layer, 4, 0), _i(layer, 5, 0)
    k = 0
    if const_a:
        m: MaybeDim = _i(layer, 7, 0) or None
    else:
        a = ins[k]
        k += 1
        if a is None or len(a) not in (2, 3):
            return None
        m = a[-1] if trans_a else a[0]
    if const_b:
        n: MaybeDim = _i(layer, 8, 0) or None
    else:
        if k >= len(ins):
            return None
        b = ins[k]
        if b is None or len(b) not in (2, 3):
            return None
        n = b[0] if trans_b else b[-1]
    n1m, tr = _i(layer, 11, 0), _i(layer, 14, 0)
    if tr:
        m, n = n, m
    return [(m, 1, n) if n1m else (m, n)]


@rule("MatMul")
def _matmul(layer: Layer, ins: Shapes):
    if len(ins) < 2 or ins[0] is None or ins[1] is None:
        return None
    a, b = ins[0], ins[1]
    if _i(layer, 0, 0) and len(b) >= 2:
        b = tuple(b[:-2]) + (b[-1], b[-2])
    if len(a) == 1 and len(b) == 1:
        return [(1,)]
    if len(a) == 1:
        return [tuple(b[:-2]) + (b[-1],)] if len(b) == 2 else _batched(None, a, b)
    if len(b) == 1:
        return [tuple(a[:-1])]
    return _batched(a[-2], a, b)


def _batched(m: MaybeDim, a: Shape, b: Shape):
    batch_a, batch_b = a[:-2] if len(a) > 1 else (), b[:-2]
    out = list(_broadcast_right(batch_a, batch_b) or ())
    if len(batch_a) and len(batch_b) and out is None:
        return None
    if m is not None or len(a) > 1:
        out.append(m)
    out.append(b[-1])
    return [tuple(out)]


def _broadcast_right(a: Sequence, b: Sequence):
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return tuple(dmax(x, y) for x, y in zip(a, b))


@rule("torch.where", "aten::where")
def _where(layer: Layer, ins: Shapes):
    """torch.where(cond, x, y) (a leftover ncnn does not load): torch's broadcast of the three
    (right-aligned, each dim equal or 1), so what reads it keeps its shapes (eager
    attention's masked scores); None when a shape is not known or a dim could differ."""
    if len(ins) != 3 or any(x is None for x in ins):
        return None
    n = max(len(x) for x in ins)  # type: ignore[arg-type]
    padded = [(1,) * (n - len(x)) + tuple(x) for x in ins]  # type: ignore[arg-type]
    out = []
    for dims in zip(*padded):
        big = {d for d in dims if d != 1}
        if len(big) > 1:
            return None
        out.append(big.pop() if big else 1)
    return [tuple(out)]


@rule("Embed")
def _embed(layer: Layer, ins: Shapes):
    x = ins[0]
    n = _i(layer, 0, 0)
    if x is None or n <= 0:
        return None
    return [(product(x), n)]


@rule("MultiHeadAttention")
def _mha(layer: Layer, ins: Shapes):
    q = ins[0]
    e = _i(layer, 0, 0)
    if q is None or len(q) != 2:
        return None
    outs: list = [(q[0], e)]
    if _i(layer, 7, 0) and len(layer.outputs) == 3:
        outs += [None, None]
    return outs


@rule("SDPA")
def _sdpa(layer: Layer, ins: Shapes):
    if len(ins) < 3:
        return None
    q, k, v = ins[0], ins[1], ins[2]
    out = None  # ncnn creates [heads, Lq, dv] (3-D even for 2-D q: heads = 1)
    if q is not None and v is not None and len(q) in (2, 3) and len(v) in (2, 3):
        out = (q[0] if len(q) == 3 else 1, q[-2], v[-1])
    outs: list = [out]
    if _i(layer, 7, 0):
        past = 4 if _i(layer, 5, 0) else 3
        pk = ins[past] if len(ins) > past else None
        pv = ins[past + 1] if len(ins) > past + 1 else None
        for cur, prev in ((k, pk), (v, pv)):
            if cur is None or prev is None or len(cur) != 3 or len(prev) != 3:
                outs.append(None)
            else:
                outs.append((cur[0], add(prev[1], cur[1]), cur[2]))
    return outs[: len(layer.outputs)] + [None] * (len(layer.outputs) - len(outs))


@rule("LSTM", "GRU", "RNN")
def _rnn(layer: Layer, ins: Shapes):
    x = ins[0]
    if x is None or len(x) != 2:
        return None
    n = _i(layer, 0, 0)
    if layer.type == "LSTM":
        n = _i(layer, 3, n)
    d = 2 if _i(layer, 2, 0) == 2 else 1
    return [(x[0], n * d)] + [None] * (len(layer.outputs) - 1)


# --------------------------------------------------------------------------- broadcasting
@rule("BinaryOp")
def _binaryop(layer: Layer, ins: Shapes):
    if _i(layer, 1, 0) or len(ins) < 2:
        return [ins[0]]
    a, b = ins[0], ins[1]
    if a is None or b is None:
        return None
    return [_ncnn_broadcast(a, b)]


def _ncnn_broadcast(a: Shape, b: Shape) -> Shape | None:
    """BinaryOp's broadcast: the lower-rank operand is aligned to the outer axes (a 1-D
    operand to the outermost when its size matches it, else to w), then per-axis max."""
    n = max(len(a), len(b))
    a2, b2 = _expand_for_binary(a, b, n), _expand_for_binary(b, a, n)
    if a2 is None or b2 is None:
        return None
    out = []
    for x, y in zip(a2, b2):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif isinstance(x, int) and isinstance(y, int):
            return None  # not broadcastable: ncnn would misbehave
        else:
            out.append(dmax(x, y))
    return tuple(out)


def _expand_for_binary(a: Shape, other: Shape, n: int) -> Shape | None:
    if len(a) == n:
        return tuple(a)
    if len(a) == 1:
        hit = same(a[0], other[0])
        if hit is None and a[0] != 1:
            return None
        if hit:
            return (a[0],) + (1,) * (n - 1)
        return (1,) * (n - 1) + (a[0],)
    return tuple(a) + (1,) * (n - len(a))


# --------------------------------------------------------------------------- layout
@rule("Concat")
def _concat(layer: Layer, ins: Shapes):
    known = [s for s in ins if s is not None]
    if len(known) != len(ins) or not known:
        return None
    rank = len(known[0])
    if any(len(s) != rank for s in known):
        return None
    axis = _axis(layer, 0, rank)
    if axis is None:
        return None
    total: MaybeDim = 0
    for s in known:
        total = add(total, s[axis])
    return [_replaced(known[0], axis, total)]


@rule("Slice")
@first_input_known
def _slice(layer: Layer, ins: Shapes):
    x = _first(ins)
    rank = len(x)
    axis = _axis(layer, 1, rank)
    if axis is None:
        return None
    L = x[axis]
    n = len(layer.outputs)
    sizes: list[MaybeDim] = []
    indices = _ints(layer, 2)
    if indices:
        prev: MaybeDim = 0
        for i in range(n):
            if i < len(indices):
                e = indices[i]
                end: MaybeDim = e if e >= 0 else add(L, e)
            else:
                end = L
            sizes.append(sub(end, prev))
            prev = end
    else:
        slices = _ints(layer, 0)
        if slices is None or len(slices) != n:
            return None
        q: MaybeDim = 0
        for i, s in enumerate(slices):
            if s == -233:
                size = floordiv(sub(L, q), n - i) if isinstance(sub(L, q), int) \
                    else div(sub(L, q), n - i)
            elif s < 0:
                return None
            else:
                size = s
            sizes.append(size)
            q = add(q, size)
    return [_replaced(x, axis, size) for size in sizes]


def _crop_exprs(layer: Layer, ins: Shapes, x: Shape):
    """Crop with shape expressions (`19=` starts, `20=` ends, `21=` numpy axes, e.g. pnnx's
    `x[:y.size(0)]` as `20="1h"`): each bound evaluated on the inputs; an end that is an
    int, or the axis' own extent, is modelled; another symbolic end (min(L, e)) is not."""
    from paramsurgery.analysis.shapes.exprs import eval_shape_expr

    p = layer.params
    raw = [p.get(pid) for pid in (19, 20, 21)]
    if any(t is not None and not isinstance(t, str) for t in raw) or not raw[1]:
        return None
    texts = [t if isinstance(t, str) else "" for t in raw]
    starts = eval_shape_expr(texts[0], ins) if texts[0] else None
    ends = eval_shape_expr(texts[1], ins)
    axes = eval_shape_expr(texts[2], ins) if texts[2] else None
    rank = len(x)
    if ends is None or (texts[0] and starts is None) or (texts[2] and axes is None):
        return None
    axes = axes if axes is not None else list(range(len(ends)))
    starts = starts if starts is not None else [0] * len(ends)
    if len(axes) != len(ends) or len(starts) != len(ends) or \
            not all(isinstance(a, int) for a in axes):
        return None
    out = list(x)
    for ax, st, en in zip(axes, starts, ends):
        assert isinstance(ax, int)
        ax = ax + rank if ax < 0 else ax
        if not 0 <= ax < rank or not isinstance(st, int) or st < 0:
            return None
        L = x[ax]
        if isinstance(en, int) and isinstance(L, int):
            end: MaybeDim = L if en == -233 else (min(L, en) if en >= 0 else L + en)
        elif en == L or en == -233:
            end = L
        else:
            out[ax] = None  # min(L, e) of a symbolic e: not affine
            continue
        out[ax] = sub(end, st)
    return [tuple(out)]


@rule("Crop")
@first_input_known
def _crop(layer: Layer, ins: Shapes):
    x = _first(ins)
    p = layer.params
    if p.get(19) is not None or p.get(20) is not None:
        return _crop_exprs(layer, ins, x)
    rank = len(x)
    if len(ins) > 1 and _i(layer, 0, 0) == -233:
        return None
    starts, ends = _ints(layer, 9), _ints(layer, 10)
    if starts and ends:
        out = list(x)
        axes = _ints(layer, 11) or list(range(rank))
        for i, ax in enumerate(axes):
            if i >= len(starts) or i >= len(ends):
                return None
            if ax < 0:
                ax += rank
            if not 0 <= ax < rank:
                return None
            L = x[ax]
            st, en = starts[i], ends[i]
            st = 0 if st == -233 else st
            off = st if st >= 0 else add(L, st)
            if en == -233:
                end: MaybeDim = L
            elif en > 0:
                if not isinstance(L, int):
                    out[ax] = None  # min(L, end): not affine in L
                    continue
                end = min(L, en)
            else:
                end = add(L, en)
            out[ax] = sub(end, off)
        return [tuple(out)]
    if len(ins) > 1:  # crop to a reference blob's size: its w/h/d, and c when same rank
        ref = ins[1]
        if ref is None or rank > 4:
            return None
        r = ncnn_axes(ref)
        return [tuple((r[nm] if (nm != "c" or len(ref) == rank) else x[ax])
                      for ax, nm in enumerate(AXIS_NAMES[rank]))]
    names = AXIS_NAMES.get(rank)
    if names is None:
        return None
    ids = {"w": (0, 6, 3), "h": (1, 7, 4), "d": (13, 15, 14), "c": (2, 8, 5)}
    out = []
    for ax, nm in enumerate(names):
        o1, o2, osz = (_i(layer, q, 0) for q in ids[nm])
        v = sub(x[ax], o1 + o2)
        if osz != -233:
            if not isinstance(v, int):
                return None
            v = min(osz, v)
        out.append(v)
    if any(isinstance(v, int) and v <= 0 for v in out):
        return None
    return [tuple(out)]


@rule("Flatten")
@first_input_known
def _flatten(layer: Layer, ins: Shapes):
    x = _first(ins)
    return [(product(x),)]


@rule("Reshape")
@first_input_known
def _reshape(layer: Layer, ins: Shapes):
    x = _first(ins)
    p = layer.params
    if p.get(6) not in (None, ""):
        from paramsurgery.analysis.shapes.exprs import eval_shape_expr

        target = eval_shape_expr(str(p.get(6)), ins)
        if target is None:
            return None
        w, h, d, c = (target + [-233] * 4)[:4]
        if len(target) == 1:
            h = d = c = -233
        elif len(target) == 2:
            d = c = -233
        elif len(target) == 3:
            c, d = target[2], -233
        else:
            d, c = target[2], target[3]
    else:
        if _i(layer, 3, 0):  # legacy permute flag
            return None
        w, h, d, c = _i(layer, 0, -233), _i(layer, 1, -233), _i(layer, 11, -233), \
            _i(layer, 2, -233)
    if h == -233:
        names, vals = "w", [w]
    elif c == -233:
        names, vals = "hw", [h, w]
    elif d == -233:
        names, vals = "chw", [c, h, w]
    else:
        names, vals = "cdhw", [c, d, h, w]
    mine = ncnn_axes(x)
    total = product(x)
    out: list[MaybeDim] = []
    for nm, v in zip(names, vals):
        if isinstance(v, int) and v == 0:
            v = mine.get(nm, 1)
        out.append(v)
    if sum(1 for v in out if isinstance(v, int) and v == -1) > 1:
        return None
    if any(isinstance(v, int) and v == -1 for v in out):
        known = product([v for v in out if not (isinstance(v, int) and v == -1)])
        inferred = div(total, known)
        out = [inferred if isinstance(v, int) and v == -1 else v for v in out]
    return [tuple(out)]


_PERM3 = ["whc", "hwc", "wch", "cwh", "hcw", "chw"]  # ncnn Permute order_type → (out w, h, c)


def _perm4() -> list[str]:
    out = []
    for last, rest in (("c", "whd"), ("d", "whc"), ("h", "wdc"), ("w", "hdc")):
        a, b, c = tuple(rest)
        for p in (a + b + c, b + a + c, a + c + b, c + a + b, b + c + a, c + b + a):
            out.append(p + last)
    return out


_PERM4 = _perm4()


@rule("Permute")
@first_input_known
def _permute(layer: Layer, ins: Shapes):
    x = _first(ins)
    t = _i(layer, 0, 0)
    if len(x) == 1:
        return [x]
    src = ncnn_axes(x)
    if len(x) == 2:
        return [x if t == 0 else (x[1], x[0])]
    if len(x) == 3:
        if not 0 <= t < 6:
            return None
        w, h, c = (src[a] for a in _PERM3[t])
        return [(c, h, w)]
    if not 0 <= t < 24:
        return None
    w, h, d, c = (src[a] for a in _PERM4[t])
    return [(c, d, h, w)]


@rule("ExpandDims")
@first_input_known
def _expanddims(layer: Layer, ins: Shapes):
    x = _first(ins)
    axes = _ints(layer, 3)
    if not axes:
        return [x]  # ncnn reads only the axes (3=): none given, nothing is added
    n = len(x) + len(axes)
    if n > 4:
        return None
    where = _nonneg(axes, n)
    if len(where) != len(axes) or not all(0 <= a < n for a in where):
        return None
    it = iter(x)
    return [tuple(1 if i in where else next(it) for i in range(n))]


@rule("Squeeze")
@first_input_known
def _squeeze(layer: Layer, ins: Shapes):
    x = _first(ins)
    axes = _ints(layer, 3)
    rank = len(x)
    if axes:
        drop = _nonneg(axes, rank)
    else:
        names = AXIS_NAMES[rank]
        flag = {"w": _i(layer, 0, 0), "h": _i(layer, 1, 0), "d": _i(layer, 11, 0),
                "c": _i(layer, 2, 0)}
        drop = {i for i, nm in enumerate(names) if flag[nm]}
    out = []
    for i, v in enumerate(x):
        if i in drop:
            if v is None or not isinstance(v, int):
                return None
            if v == 1:
                continue
        out.append(v)
    return [tuple(out) if out else (1,)]


@rule("Tile")
@first_input_known
def _tile(layer: Layer, ins: Shapes):
    x = _first(ins)
    reps = _ints(layer, 2)
    if reps:
        n = max(len(x), len(reps))
        if n > 4:
            return None
        xs = (1,) * (n - len(x)) + tuple(x)
        rs = (1,) * (n - len(reps)) + tuple(reps)
        return [tuple(mul(a, r) for a, r in zip(xs, rs))]
    axis, tiles = _axis(layer, 0, len(x)), _i(layer, 1, 1)
    if axis is None:
        return None
    return [_replaced(x, axis, mul(x[axis], tiles))]


@rule("Reduction")
@first_input_known
def _reduction(layer: Layer, ins: Shapes):
    x = _first(ins)
    rank = len(x)
    keep = _i(layer, 4, 0)
    if _i(layer, 1, 1):
        axes = set(range(rank))
    else:
        ax = _ints(layer, 3)
        if not ax or not _i(layer, 5, 0):
            return None
        axes = _nonneg(ax, rank)
    if keep:
        return [tuple(1 if i in axes else v for i, v in enumerate(x))]
    out = tuple(v for i, v in enumerate(x) if i not in axes)
    return [out if out else (1,)]


@rule("Padding")
def _padding(layer: Layer, ins: Shapes):
    x = ins[0]
    if x is None or len(ins) > 1:
        return None
    t, b, lft, r = _i(layer, 0, 0), _i(layer, 1, 0), _i(layer, 2, 0), _i(layer, 3, 0)
    f, bh = _i(layer, 7, 0), _i(layer, 8, 0)
    out = list(x)
    out[-1] = add(out[-1], lft + r)
    if len(x) >= 2:
        out[-2] = add(out[-2], t + b)
    if len(x) >= 3:
        out[0] = add(out[0], f + bh)
    return [tuple(out)]


@rule("Interp")
def _interp(layer: Layer, ins: Shapes):
    x = ins[0]
    if x is None or len(ins) > 1 or _i(layer, 5, 0) or layer.params.get(9) not in (None, ""):
        return None
    oh, ow = _i(layer, 3, 0), _i(layer, 4, 0)
    hs, ws = _f(layer, 1, 1.0), _f(layer, 2, 1.0)
    if len(x) == 3:
        c, h, w = x
        if not ow or not oh:
            if not isinstance(h, int) or not isinstance(w, int):
                return None
            oh, ow = int(h * _f32(hs)), int(w * _f32(ws))
        return [(c, oh, ow)]
    if len(x) in (1, 2):  # only w is scaled
        w = x[-1]
        if not ow:
            if not isinstance(w, int):
                return None
            ow = int(w * _f32(ws))
        return [(*x[:-1], ow)]
    return None


def _f32(v: float) -> float:
    import struct

    return struct.unpack("f", struct.pack("f", v))[0]


@rule("PriorBox")
def _priorbox(layer: Layer, ins: Shapes):
    x = ins[0]
    if x is None or len(x) < 2:
        return None
    h, w = x[-2], x[-1]
    mins, maxs, ratios = _floats(layer, 0), _floats(layer, 1), _floats(layer, 2)
    area = mul(h, w)
    iw, ih = _i(layer, 9, 0), _i(layer, 10, 0)
    if len(ins) == 1 and iw == -233 and ih == -233 and not maxs:
        return [(mul(area, 4 * (len(mins) - 1 + len(ratios))),)]
    n = len(mins) * len(ratios) + len(mins) + len(maxs)
    if _i(layer, 7, 1):
        n += len(mins) * len(ratios)
    return [(2, mul(area, 4 * n))]


def infer_layer(layer: Layer, ins: Shapes) -> list[Shape | None] | None:
    """The tops' shapes of one layer, or None when no rule knows."""
    fn = RULES.get(layer.type)
    if fn is None:
        return None
    try:
        out = fn(layer, ins)
    except IndexError:
        # a layer given fewer bottoms than its type reads (a malformed file, e.g. a Split
        # with none): no shape rather than an internal error; lint reports the layer
        return None
    if out is None:
        return None
    if len(out) < len(layer.outputs):
        out = list(out) + [None] * (len(layer.outputs) - len(out))
    return out
