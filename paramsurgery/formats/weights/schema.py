"""Which weights each ncnn layer type reads from the `.bin`, in order, as a function of its
params: one small function per type, all in this file.

Each function mirrors the type's `load_model` in Tencent/ncnn a4d2ea1d4 (src/layer/<type>.cpp)
and was checked read for read against the ncnn 1.0.20261020 wheel with a recording
`ncnn.DataReader` (paramsurgery.formats.weights.oracle; tests/test_weights_oracle.py). A read is

- ``tagged``  `mb.load(n, 0)`: uint32 tag + payload chosen by the tag (see tags.py);
- ``raw``     `mb.load(n, 1)`: `4*n` bytes of float32, no tag;
- ``packed``  wheel only: untagged packed bytes, `align4(n)` long (block-quantized weights).

The wheel registers 108 of the 110 types (ArgMax and SPP are not built: "layer X not exists
or registered"); exactly the 34 in `SCHEMAS` read weights. Every other registered type was
fuzzed in the wheel with a recording reader (each param id 0..31 set to 14 values, and
every pair of ids set to small values, on top of params that load) and never read a byte,
so `NO_WEIGHTS` holds all the others (SDPA and RotaryEmbed included, whatever `18=` says).

Differences between the wheel and a4d2ea1d4, all measured:
- Gemm / MultiHeadAttention block quantization (`18=bits*100+fmt*10+block`, bits 4/6/8):
  the source loads the packed weights tagged (`mb.load(packed_k_bytes, rows, 0)`); the
  wheel reads them **untagged**, `align4(rows*packed_k_bytes)` bytes in one read.
- bf16 tag 0x01348B83 (wheel only), payload `align4(2n)` like fp16.
- the wheel's `load_param` rejects some params the source accepts (see layer_params.py);
  the reads of a layer that loads are the same.

`shape` is the numpy shape of a read: ncnn's load dims reversed (`load(w, h, c)` →
`(c, h, w)`), or, for the flat convolution/inner-product/attention weights, the layout ncnn
indexes them with: output channel outermost, kernel innermost, e.g. Convolution
`(num_output, in_per_group, kh, kw)`, InnerProduct `(num_output, num_input)` (= torch's
Linear weight), MultiHeadAttention q `(embed_dim, qdim)`. When params are not divisible the
shape is flat `(n,)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from paramsurgery.core.errors import BinLayoutError
from paramsurgery.core.layer_params import LAYER_PARAMS, Same
from paramsurgery.core.layer_types import NCNN_LAYER_TYPES
from paramsurgery.core.values import Kind

TAGGED = "tagged"
RAW = "raw"
PACKED = "packed"


@dataclass(frozen=True)
class Read:
    """One `mb.load` call of a layer's `load_model`."""

    role: str  # "weight", "bias", "A", "scales", ...
    count: int  # elements (bytes for PACKED)
    mode: str  # TAGGED, RAW or PACKED
    shape: tuple[int, ...]
    required: bool = True  # load_model returns -100 when this read comes back empty


class SchemaError(BinLayoutError):
    """Params for which ncnn's load_model cannot succeed (or would divide by zero)."""


# ============================================================================ param access

class ParamView:
    """Reads a layer's params the way the wheel's typed `ParamDict::get` does: an absent id
    gives ncnn's default (`Same(k)` defaults follow param k); a float where an int is expected
    also gives the default (the wheel returns the default; a4d2ea1d4 would reinterpret bits)."""

    __slots__ = ("type", "params", "defaults")

    def __init__(self, layer_type: str, params) -> None:
        self.type = layer_type
        self.params = params
        self.defaults = LAYER_PARAMS.get(layer_type, {})

    def i(self, pid: int, default: int | None = None) -> int:
        v = self.params.value(pid) if self.params is not None else None
        if v is not None and v.kind is Kind.INT:
            return int(v.value)
        if default is not None:
            return default
        info = self.defaults.get(pid)
        d = info.default if info else 0
        if isinstance(d, Same):
            return self.i(d.pid)
        return int(d) if isinstance(d, (int, float)) else 0


def _shape(count: int, *dims: int) -> tuple[int, ...]:
    """`dims` when they multiply to `count` and are positive, else flat."""
    if dims and all(d > 0 for d in dims):
        prod = 1
        for d in dims:
            prod *= d
        if prod == count:
            return tuple(dims)
    return (count,)


def _lead(count: int, *inner: int) -> tuple[int, ...]:
    """`(count / prod(inner), *inner)` when divisible."""
    prod = 1
    for d in inner:
        prod *= d
    if prod > 0 and count % prod == 0 and count > 0:
        return _shape(count, count // prod, *inner)
    return (count,)


def T(role: str, *dims: int, shape: tuple[int, ...] | None = None) -> Read:
    """Tagged read of `load(w[, h[, d[, c]]], 0)`; `dims` in ncnn order (w first)."""
    count = _prod(dims)
    return Read(role, count, TAGGED, shape or _shape(count, *reversed(dims)))


def R(role: str, *dims: int, required: bool = True) -> Read:
    """Raw float32 read of `load(w[, h[, c]], 1)`."""
    count = _prod(dims)
    return Read(role, count, RAW, _shape(count, *reversed(dims)), required)


def _prod(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _div(a: int, b: int, what: str) -> int:
    """C++ int division (truncating toward zero); b == 0 is a crash in ncnn."""
    if b == 0:
        raise SchemaError(f"{what} divides by zero (ncnn's load_model would crash)")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


# ============================================================================ schemas
# Each takes a ParamView and returns the reads in load_model order.

def _conv(p: ParamView, kernel: tuple[int, ...], *, dynamic: int | None,
          int8: str | None = None) -> list[Read]:
    """Convolution / ConvolutionDepthWise / Deconvolution* / DeformableConv2D (and 1D/3D):
    0=num_output 5=bias_term 6=weight_data_size, kernel ids as given, `dynamic` = the
    dynamic_weight id (19, or 28 for Deconvolution*, None if the type has none)."""
    if dynamic is not None and p.i(dynamic):
        return []  # weights come from the second input
    num_output, size = p.i(0), p.i(6)
    ks = tuple(p.i(k) for k in kernel)
    maxk = _prod(ks)
    per_out = num_output * maxk
    shape = ((num_output, size // per_out, *ks) if per_out > 0 and size > 0
             and size % per_out == 0 else (size,))
    reads = [Read("weight", size, TAGGED, shape)]
    if p.i(5):
        reads.append(R("bias", num_output))
    if int8 == "conv":  # Convolution, InnerProduct: any nonzero 8=int8_scale_term
        term = p.i(8)
        if term:
            reads += [R("weight_scales", num_output, required=False),
                      R("input_scale", 1, required=False)]
        if term > 100:
            reads.append(R("output_scale", 1, required=False))
    elif int8 == "dw":  # ConvolutionDepthWise: 1/101 per group, 2/102 one scale
        term, group = p.i(8), p.i(7)
        if term in (1, 101):
            reads += [R("weight_scales", group, required=False),
                      R("input_scale", 1, required=False)]
        elif term in (2, 102):
            reads += [R("weight_scales", 1, required=False),
                      R("input_scale", 1, required=False)]
        if term > 100:
            reads.append(R("output_scale", 1, required=False))
    return reads


K1, K2, K3 = (1,), (11, 1), (21, 11, 1)  # kernel_w=1, kernel_h=11, kernel_d=21


def convolution(p: ParamView) -> list[Read]:
    """src/layer/convolution.cpp: T weight[6] (num_output, in, kh, kw); R bias[0] if 5;
    int8 (8≠0): R weight_scales[0], R input_scale[1]; 8>100: R output_scale[1];
    19=dynamic_weight: nothing."""
    return _conv(p, K2, dynamic=19, int8="conv")


def convolution_depthwise(p: ParamView) -> list[Read]:
    """src/layer/convolutiondepthwise.cpp: T weight[6]; R bias[0] if 5; 8=1/101: R
    weight_scales[7=group], R input_scale[1]; 8=2/102: R weight_scale[1], R input_scale[1];
    8>100: R output_scale[1]; 19=dynamic_weight: nothing."""
    return _conv(p, K2, dynamic=19, int8="dw")


def innerproduct(p: ParamView) -> list[Read]:
    """src/layer/innerproduct.cpp: T weight[2=weight_data_size] (num_output, num_input);
    R bias[0] if 1=bias_term; int8 (8≠0): R weight_scales[0], R input_scale[1]."""
    num_output, size = p.i(0), p.i(2)
    reads = [Read("weight", size, TAGGED, _lead(size, size // num_output) if num_output > 0
                  and size % num_output == 0 else (size,))]
    if p.i(1):
        reads.append(R("bias", num_output))
    if p.i(8):
        reads += [R("weight_scales", num_output, required=False),
                  R("input_scale", 1, required=False)]
    return reads


def embed(p: ParamView) -> list[Read]:
    """src/layer/embed.cpp: T weight[3=weight_data_size] (input_dim, num_output);
    R bias[0=num_output] if 2=bias_term; R weight_scale[1] if 18=int8_scale_term."""
    num_output, size = p.i(0), p.i(3)
    reads = [Read("weight", size, TAGGED, _lead(size, num_output) if num_output > 0
                  else (size,))]
    if p.i(2):
        reads.append(R("bias", num_output))
    if p.i(18):
        reads.append(R("weight_scale", 1, required=False))
    return reads


def _block_quant(term: int) -> tuple[int, int, bool] | None:
    """(bits, block_size, has_input_scale) for `18=bits*100+fmt*10+block_code`."""
    bits, fmt, code = term // 100, term % 100 // 10, term % 10
    if bits not in (4, 6, 8) or fmt not in (0, 1) or not 0 <= code <= 2:
        return None
    return bits, (32, 64, 128)[code], fmt == 1


def _packed_k(k: int, bits: int) -> int:
    if k <= 0:
        raise SchemaError(f"block-quantized K={k} (ncnn's load_model fails)")
    return (k * bits + 7) // 8


def gemm(p: ParamView) -> list[Read]:
    """src/layer/gemm.cpp: 4=constantA → T A (transA=0: load(K,M); 1: load(M,K));
    5=constantB → T B (transB=0: load(N,K); 1: load(K,N)); block quant (18=4xx/6xx/8xx,
    wheel: untagged packed bytes, N rows of ceil(K*bits/8)); 6=constantC and 10≠-1 → T C
    (10=0: [1]; 1: [M]; 2: load(1,M); 3: load(N,M); 4: load(N,1)); block quant: R B_scales
    load(ceil(K/block),N), R B_input_scales[K] if fmt=1; int8 (18 other ≠0): R A_scales[M]
    if constantA, R B_scale[1] if constantB. M=7, N=8, K=9."""
    trans_a, trans_b = p.i(2), p.i(3)
    const_a, const_b, const_c = p.i(4), p.i(5), p.i(6)
    m, n, k = p.i(7), p.i(8), p.i(9)
    bct = p.i(10)
    term = p.i(18)
    bq = _block_quant(term)
    reads: list[Read] = []
    if const_a == 1:
        reads.append(T("A", m, k) if trans_a else T("A", k, m))
    if const_b == 1:
        if trans_b == 0:
            reads.append(T("B", n, k))
        elif bq is not None:
            pk = _packed_k(k, bq[0])
            reads.append(Read("B", pk * n, PACKED, _shape(pk * n, n, pk)))
        else:
            reads.append(T("B", k, n))
    if const_c == 1 and bct != -1:
        c = {0: (1,), 1: (m,), 2: (1, m), 3: (n, m), 4: (n, 1)}.get(bct)
        if c is None:
            raise SchemaError(f"Gemm constant_broadcast_type_C (10) = {bct}: ncnn loads no C "
                              f"and load_model fails")
        reads.append(T("C", *c))
    if bq is not None:
        bits, block, input_scale = bq
        reads.append(R("B_scales", (k + block - 1) // block, n))
        if input_scale:
            reads.append(R("B_input_scales", k))
    elif term:
        if const_a == 1:
            reads.append(R("A_scales", m, required=False))
        if const_b == 1:
            reads.append(R("B_scale", 1, required=False))
    return reads


def multiheadattention(p: ParamView) -> list[Read]:
    """src/layer/multiheadattention.cpp: qdim = 2=weight_data_size / 0=embed_dim;
    T q_weight (embed,qdim), R q_bias[embed], T k_weight (embed,kdim=3), R k_bias[embed],
    T v_weight (embed,vdim=4), R v_bias[embed], T out_weight (qdim,embed), R out_bias[qdim];
    int8 (18≠0, not block): R q/k/v_scales[embed], R out_scale[1]. Block quant (wheel):
    the 4 weights untagged packed (rows × ceil(in*bits/8)), then R scales for q,k,v,out
    (rows × ceil(in/block)), then R input scales[qdim,kdim,vdim,embed] if fmt=1."""
    embed_dim, size = p.i(0), p.i(2)
    kdim, vdim = p.i(3, embed_dim), p.i(4, embed_dim)
    qdim = _div(size, embed_dim, "MultiHeadAttention weight_data_size / embed_dim")
    term = p.i(18)
    bq = _block_quant(term)
    if bq is not None:
        bits, block, input_scale = bq
        reads = []
        for name, rows, inner in (("q", embed_dim, qdim), ("k", embed_dim, kdim),
                                  ("v", embed_dim, vdim), ("out", qdim, embed_dim)):
            pk = _packed_k(inner, bits)
            reads.append(Read(f"{name}_weight", pk * rows, PACKED, _shape(pk * rows, rows, pk)))
            reads.append(R(f"{name}_bias", rows))
        for name, rows, inner in (("q", embed_dim, qdim), ("k", embed_dim, kdim),
                                  ("v", embed_dim, vdim), ("out", qdim, embed_dim)):
            reads.append(R(f"{name}_scales", (inner + block - 1) // block, rows))
        if input_scale:
            for name, inner in (("q", qdim), ("k", kdim), ("v", vdim), ("out", embed_dim)):
                reads.append(R(f"{name}_input_scales", inner))
        return reads
    reads = [
        Read("q_weight", embed_dim * qdim, TAGGED, _shape(embed_dim * qdim, embed_dim, qdim)),
        R("q_bias", embed_dim),
        Read("k_weight", embed_dim * kdim, TAGGED, _shape(embed_dim * kdim, embed_dim, kdim)),
        R("k_bias", embed_dim),
        Read("v_weight", embed_dim * vdim, TAGGED, _shape(embed_dim * vdim, embed_dim, vdim)),
        R("v_bias", embed_dim),
        Read("out_weight", qdim * embed_dim, TAGGED, _shape(qdim * embed_dim, qdim, embed_dim)),
        R("out_bias", qdim),
    ]
    if term:
        reads += [R("q_scales", embed_dim, required=False),
                  R("k_scales", embed_dim, required=False),
                  R("v_scales", embed_dim, required=False),
                  R("out_scale", 1, required=False)]
    return reads


def _dirs(p: ParamView) -> int:
    return 2 if p.i(2) == 2 else 1


def rnn(p: ParamView) -> list[Read]:
    """src/layer/rnn.cpp: dirs = 2 if 2=direction==2; size = 1=weight_data_size/dirs/0;
    T weight_xc load(size,num_output,dirs), T bias_c load(num_output,1,dirs),
    T weight_hc load(num_output,num_output,dirs); int8 (8≠0): R xc_scales, R hc_scales
    load(num_output,dirs)."""
    num_output, dirs = p.i(0), _dirs(p)
    size = _div(_div(p.i(1), dirs, "RNN"), num_output, "RNN weight_data_size / num_output")
    reads = [T("weight_xc", size, num_output, dirs), T("bias_c", num_output, 1, dirs),
             T("weight_hc", num_output, num_output, dirs)]
    if p.i(8):
        reads += [R("weight_xc_scales", num_output, dirs, required=False),
                  R("weight_hc_scales", num_output, dirs, required=False)]
    return reads


def lstm(p: ParamView) -> list[Read]:
    """src/layer/lstm.cpp: hidden = 3=hidden_size (default num_output);
    size = 1/dirs/hidden/4; T weight_xc load(size,hidden*4,dirs), T bias_c
    load(hidden,4,dirs), T weight_hc load(num_output,hidden*4,dirs), T weight_hr
    load(hidden,num_output,dirs) if num_output≠hidden; int8: R xc/hc scales
    load(hidden*4,dirs)."""
    num_output, dirs = p.i(0), _dirs(p)
    hidden = p.i(3, num_output)
    size = _div(_div(_div(p.i(1), dirs, "LSTM"), hidden, "LSTM weight_data_size / hidden_size"),
                4, "LSTM")
    reads = [T("weight_xc", size, hidden * 4, dirs), T("bias_c", hidden, 4, dirs),
             T("weight_hc", num_output, hidden * 4, dirs)]
    if num_output != hidden:
        reads.append(T("weight_hr", hidden, num_output, dirs))
    if p.i(8):
        reads += [R("weight_xc_scales", hidden * 4, dirs, required=False),
                  R("weight_hc_scales", hidden * 4, dirs, required=False)]
    return reads


def gru(p: ParamView) -> list[Read]:
    """src/layer/gru.cpp: size = 1/dirs/num_output/3; T weight_xc
    load(size,num_output*3,dirs), T bias_c load(num_output,4,dirs), T weight_hc
    load(num_output,num_output*3,dirs); int8: R xc/hc scales load(num_output*3,dirs)."""
    num_output, dirs = p.i(0), _dirs(p)
    size = _div(_div(_div(p.i(1), dirs, "GRU"), num_output, "GRU weight_data_size / num_output"),
                3, "GRU")
    reads = [T("weight_xc", size, num_output * 3, dirs), T("bias_c", num_output, 4, dirs),
             T("weight_hc", num_output, num_output * 3, dirs)]
    if p.i(8):
        reads += [R("weight_xc_scales", num_output * 3, dirs, required=False),
                  R("weight_hc_scales", num_output * 3, dirs, required=False)]
    return reads


def memorydata(p: ParamView) -> list[Read]:
    """src/layer/memorydata.cpp: 0=w 1=h 11=d 2=c, 21=load_type (1 = raw, default; 0 =
    tagged); the rank is the last non-zero of d, c, h, w; all zero → no read."""
    w, h, d, c = p.i(0), p.i(1), p.i(11), p.i(2)
    load_type = p.i(21)
    if d:
        dims: tuple[int, ...] = (w, h, d, c)
    elif c:
        dims = (w, h, c)
    elif h:
        dims = (w, h)
    elif w:
        dims = (w,)
    else:
        return []
    if load_type == 0:
        return [T("data", *dims)]
    if load_type == 1:
        return [R("data", *dims)]
    raise SchemaError(f"MemoryData load_type (21) = {load_type}: ncnn has only 0 (tagged) and "
                      f"1 (raw) (\"ModelBin load type {load_type} not implemented\")")


def batchnorm(p: ParamView) -> list[Read]:
    """src/layer/batchnorm.cpp: R slope, mean, var, bias [0=channels]."""
    c = p.i(0)
    return [R("slope", c), R("mean", c), R("var", c), R("bias", c)]


def bias(p: ParamView) -> list[Read]:
    """src/layer/bias.cpp: R bias[0=bias_data_size]."""
    return [R("bias", p.i(0))]


def scale(p: ParamView) -> list[Read]:
    """src/layer/scale.cpp: 0=scale_data_size (-233: scale from the 2nd input, no read);
    R scale[n]; R bias[n] if 1=bias_term."""
    n = p.i(0)
    if n == -233:
        return []
    reads = [R("scale", n)]
    if p.i(1):
        reads.append(R("bias", n))
    return reads


def prelu(p: ParamView) -> list[Read]:
    """src/layer/prelu.cpp: R slope[0=num_slope]."""
    return [R("slope", p.i(0))]


def padding(p: ParamView) -> list[Read]:
    """src/layer/padding.cpp: R per_channel_pad[6] if 6=per_channel_pad_data_size ≠ 0
    (not checked for emptiness)."""
    n = p.i(6)
    return [R("per_channel_pad", n, required=False)] if n else []


def normalize(p: ParamView) -> list[Read]:
    """src/layer/normalize.cpp: R scale[3=scale_data_size]."""
    return [R("scale", p.i(3))]


def _affine(size_id: int, affine_id: int, beta: bool = True) -> Callable[[ParamView], list[Read]]:
    def f(p: ParamView) -> list[Read]:
        if p.i(affine_id) == 0:
            return []
        n = p.i(size_id)
        return [R("gamma", n), R("beta", n)] if beta else [R("gamma", n)]
    return f


instancenorm = _affine(0, 2)  # src/layer/instancenorm.cpp: R gamma, beta [0=channels] if 2=affine
groupnorm = _affine(1, 3)  # src/layer/groupnorm.cpp: R gamma, beta [1=channels] if 3=affine
layernorm = _affine(0, 2)  # src/layer/layernorm.cpp: R gamma, beta [0=affine_size] if 2=affine
rmsnorm = _affine(0, 2, beta=False)  # src/layer/rmsnorm.cpp: R gamma [0=affine_size] if 2=affine


def quantize(p: ParamView) -> list[Read]:
    """src/layer/quantize.cpp: R scale[0=scale_data_size, default 1]."""
    return [R("scale", p.i(0))]


def dequantize(p: ParamView) -> list[Read]:
    """src/layer/dequantize.cpp: R scale[0, default 1]; R bias[1=bias_data_size] if ≠ 0."""
    reads = [R("scale", p.i(0))]
    if p.i(1):
        reads.append(R("bias", p.i(1)))
    return reads


def requantize(p: ParamView) -> list[Read]:
    """src/layer/requantize.cpp: R scale_in[0, default 1]; R scale_out[1, default 1];
    R bias[2=bias_data_size] if ≠ 0."""
    reads = [R("scale_in", p.i(0)), R("scale_out", p.i(1))]
    if p.i(2):
        reads.append(R("bias", p.i(2)))
    return reads


SCHEMAS: dict[str, Callable[[ParamView], list[Read]]] = {
    "BatchNorm": batchnorm,
    "Bias": bias,
    "Convolution": convolution,
    "Convolution1D": lambda p: _conv(p, K1, dynamic=19),  # convolution1d.cpp
    "Convolution3D": lambda p: _conv(p, K3, dynamic=None),  # convolution3d.cpp: no dynamic
    "ConvolutionDepthWise": convolution_depthwise,
    "ConvolutionDepthWise1D": lambda p: _conv(p, K1, dynamic=19),
    "ConvolutionDepthWise3D": lambda p: _conv(p, K3, dynamic=None),
    "Deconvolution": lambda p: _conv(p, K2, dynamic=28),  # deconvolution.cpp: 28=dynamic
    "Deconvolution1D": lambda p: _conv(p, K1, dynamic=28),
    "Deconvolution3D": lambda p: _conv(p, K3, dynamic=None),
    "DeconvolutionDepthWise": lambda p: _conv(p, K2, dynamic=28),
    "DeconvolutionDepthWise1D": lambda p: _conv(p, K1, dynamic=28),
    "DeconvolutionDepthWise3D": lambda p: _conv(p, K3, dynamic=None),
    "DeformableConv2D": lambda p: _conv(p, K2, dynamic=None),  # deformableconv2d.cpp
    "Dequantize": dequantize,
    "Embed": embed,
    "Gemm": gemm,
    "GroupNorm": groupnorm,
    "GRU": gru,
    "InnerProduct": innerproduct,
    "InstanceNorm": instancenorm,
    "LayerNorm": layernorm,
    "LSTM": lstm,
    "MemoryData": memorydata,
    "MultiHeadAttention": multiheadattention,
    "Normalize": normalize,
    "Padding": padding,
    "PReLU": prelu,
    "Quantize": quantize,
    "Requantize": requantize,
    "RMSNorm": rmsnorm,
    "RNN": rnn,
    "Scale": scale,
}

NO_WEIGHTS: frozenset[str] = frozenset(t for t in NCNN_LAYER_TYPES if t not in SCHEMAS)

_CUSTOM: dict[str, Callable[[ParamView], list[Read]]] = {}


def register_schema(layer_type: str, fn: Callable[[ParamView], list[Read]]) -> None:
    """Declare the reads of a custom layer type (`fn(ParamView) -> [Read]`); use
    `lambda p: []` for a custom type without weights."""
    _CUSTOM[layer_type] = fn


def has_schema(layer_type: str) -> bool:
    return layer_type in SCHEMAS or layer_type in NO_WEIGHTS or layer_type in _CUSTOM


def reads_for(layer_type: str, params) -> list[Read] | None:
    """The reads a layer of this type makes with these params, or None when the type is
    unknown (not ncnn's, not registered). Raises SchemaError for params ncnn cannot load."""
    fn = SCHEMAS.get(layer_type) or _CUSTOM.get(layer_type)
    if fn is None:
        return [] if layer_type in NO_WEIGHTS else None
    reads = fn(ParamView(layer_type, params))
    for r in reads:
        if r.count < 0:
            raise SchemaError(f"{layer_type} weight {r.role!r} would have {r.count} elements")
    return reads


def layer_reads(layer) -> list[Read] | None:
    """`reads_for` of a Layer, with errors located at its param line."""
    try:
        return reads_for(layer.type, layer.params)
    except SchemaError as exc:
        raise SchemaError(f"layer {layer.name!r} ({layer.type}): {exc.message}",
                          file=layer.source_file, line=layer.source_line) from None
