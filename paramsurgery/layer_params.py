"""Param ids, names, kinds and defaults of ncnn layers (their `load_param`, src/layer/*.cpp).

Used to give a new param the kind ncnn reads (a float param set from a Python int is
written `2=1.0`, never `2=1`, which the reference ncnn misreads as float bits), to name
params in messages, and by lint to spot a value written with the wrong kind.
Layers not listed here get their kind from the Python value.
"""

from __future__ import annotations

from typing import NamedTuple

from .values import Kind

I, F, IA, FA, S = Kind.INT, Kind.FLOAT, Kind.INTS, Kind.FLOATS, Kind.STRING


class P(NamedTuple):
    name: str
    kind: Kind
    default: object = None


_CONV_COMMON = {
    0: P("num_output", I, 0), 1: P("kernel_w", I, 0), 2: P("dilation_w", I, 1),
    3: P("stride_w", I, 1), 4: P("pad_left", I, 0), 5: P("bias_term", I, 0),
    6: P("weight_data_size", I, 0), 8: P("int8_scale_term", I, 0),
    9: P("activation_type", I, 0), 10: P("activation_params", FA),
    11: P("kernel_h", I), 12: P("dilation_h", I), 13: P("stride_h", I), 14: P("pad_top", I),
    15: P("pad_right", I), 16: P("pad_bottom", I), 17: P("impl_type", I, 0),
    18: P("pad_value", F, 0.0), 19: P("dynamic_weight", I, 0),
}
_CONV1D = {
    0: P("num_output", I, 0), 1: P("kernel_w", I, 0), 2: P("dilation_w", I, 1),
    3: P("stride_w", I, 1), 4: P("pad_left", I, 0), 5: P("bias_term", I, 0),
    6: P("weight_data_size", I, 0), 9: P("activation_type", I, 0),
    10: P("activation_params", FA), 15: P("pad_right", I), 18: P("pad_value", F, 0.0),
    19: P("dynamic_weight", I, 0),
}
# 3-D convolutions: only the ids shared with the 2-D layer are listed
_CONV3D = {k: v for k, v in _CONV_COMMON.items() if k <= 16}
_DECONV = {**_CONV_COMMON, 18: P("output_pad_right", I, 0), 19: P("output_pad_bottom", I, 0),
           20: P("output_w", I, 0), 21: P("output_h", I, 0), 28: P("dynamic_weight", I, 0)}
_DECONV1D = {**_CONV1D, 18: P("output_pad_right", I, 0), 20: P("output_w", I, 0),
             28: P("dynamic_weight", I, 0)}
_DECONV1D.pop(19, None)
_GROUPED = {7: P("group", I, 1)}

LAYER_PARAMS: dict[str, dict[int, P]] = {
    "Input": {0: P("w", I, 0), 1: P("h", I, 0), 11: P("d", I, 0), 2: P("c", I, 0)},
    "MemoryData": {0: P("w", I, 0), 1: P("h", I, 0), 11: P("d", I, 0), 2: P("c", I, 0),
                   21: P("load_type", I, 1)},
    "Split": {},
    "Concat": {0: P("axis", I, 0)},
    "Slice": {0: P("slices", IA), 1: P("axis", I, 0), 2: P("indices", IA)},
    "Reshape": {0: P("w", I, -233), 1: P("h", I, -233), 11: P("d", I, -233),
                2: P("c", I, -233), 6: P("shape_expr", S), 12: P("input_batch_axis", I, 233),
                13: P("output_batch_axis", I, 233)},
    "Crop": {0: P("woffset", I, 0), 1: P("hoffset", I, 0), 13: P("doffset", I, 0),
             2: P("coffset", I, 0), 3: P("outw", I, 0), 4: P("outh", I, 0),
             14: P("outd", I, 0), 5: P("outc", I, 0), 6: P("woffset2", I, 0),
             7: P("hoffset2", I, 0), 15: P("doffset2", I, 0), 8: P("coffset2", I, 0),
             9: P("starts", IA), 10: P("ends", IA), 11: P("axes", IA),
             19: P("starts_expr", S), 20: P("ends_expr", S), 21: P("axes_expr", S)},
    "Reduction": {0: P("operation", I, 0), 1: P("reduce_all", I, 1), 2: P("coeff", F, 1.0),
                  3: P("axes", IA), 4: P("keepdims", I, 0), 5: P("fixbug0", I, 0)},
    "Embed": {0: P("num_output", I, 0), 1: P("input_dim", I, 0), 2: P("bias_term", I, 0),
              3: P("weight_data_size", I, 0), 18: P("int8_scale_term", I, 0)},
    "Gemm": {0: P("alpha", F, 1.0), 1: P("beta", F, 1.0), 2: P("transA", I, 0),
             3: P("transB", I, 0), 4: P("constantA", I, 0), 5: P("constantB", I, 0),
             6: P("constantC", I, 0), 7: P("constantM", I, 0), 8: P("constantN", I, 0),
             9: P("constantK", I, 0), 10: P("constant_broadcast_type_C", I, 0),
             11: P("output_N1M", I, 0), 12: P("output_elempack", I, 0),
             13: P("output_elemtype", I, 0), 14: P("output_transpose", I, 0),
             18: P("int8_scale_term", I, 0), 20: P("constant_TILE_M", I, 0),
             21: P("constant_TILE_N", I, 0), 22: P("constant_TILE_K", I, 0)},
    "BinaryOp": {0: P("op_type", I, 0), 1: P("with_scalar", I, 0), 2: P("b", F, 0.0)},
    "UnaryOp": {0: P("op_type", I, 0)},
    "Eltwise": {0: P("op_type", I, 0), 1: P("coeffs", FA)},
    "MatMul": {0: P("transB", I, 0)},
    "Softmax": {0: P("axis", I, 0), 1: P("fixbug0", I, 0)},
    "Permute": {0: P("order_type", I, 0)},
    "LayerNorm": {0: P("affine_size", I, 0), 1: P("eps", F, 0.001), 2: P("affine", I, 1)},
    "RMSNorm": {0: P("affine_size", I, 0), 1: P("eps", F, 0.001), 2: P("affine", I, 1)},
    "GroupNorm": {0: P("group", I, 1), 1: P("channels", I, 0), 2: P("eps", F, 0.001),
                  3: P("affine", I, 1)},
    "InstanceNorm": {0: P("channels", I, 0), 1: P("eps", F, 0.001), 2: P("affine", I, 1)},
    "BatchNorm": {0: P("channels", I, 0), 1: P("eps", F, 0.0)},
    "Scale": {0: P("scale_data_size", I, 0), 1: P("bias_term", I, 0)},
    "Bias": {0: P("bias_data_size", I, 0)},
    "PReLU": {0: P("num_slope", I, 0)},
    "RotaryEmbed": {0: P("interleaved", I, 0)},
    "MultiHeadAttention": {0: P("embed_dim", I, 0), 1: P("num_heads", I, 1),
                           2: P("weight_data_size", I, 0), 3: P("kdim", I), 4: P("vdim", I),
                           5: P("attn_mask", I, 0), 6: P("scale", F), 7: P("kv_cache", I, 0),
                           18: P("int8_scale_term", I, 0)},
    "SDPA": {5: P("attn_mask", I, 0), 6: P("scale", F, 0.0), 7: P("kv_cache", I, 0),
             18: P("int8_scale_term", I, 0)},
    "InnerProduct": {0: P("num_output", I, 0), 1: P("bias_term", I, 0),
                     2: P("weight_data_size", I, 0), 8: P("int8_scale_term", I, 0),
                     9: P("activation_type", I, 0), 10: P("activation_params", FA)},
    "Convolution": {**_CONV_COMMON, 18: P("pad_value", F, 0.0), 19: P("dynamic_weight", I, 0)},
    "ConvolutionDepthWise": {**_CONV_COMMON, **_GROUPED},
    "Convolution1D": _CONV1D,
    "ConvolutionDepthWise1D": {**_CONV1D, **_GROUPED},
    "Convolution3D": _CONV3D,
    "ConvolutionDepthWise3D": {**_CONV3D, **_GROUPED},
    "Deconvolution": _DECONV,
    "DeconvolutionDepthWise": {**_DECONV, **_GROUPED},
    "Deconvolution1D": _DECONV1D,
    "DeconvolutionDepthWise1D": {**_DECONV1D, **_GROUPED},
    "Padding": {0: P("top", I, 0), 1: P("bottom", I, 0), 2: P("left", I, 0), 3: P("right", I, 0),
                4: P("type", I, 0), 5: P("value", F, 0.0), 6: P("per_channel_pad_data_size", I, 0),
                7: P("front", I, 0), 8: P("behind", I, 0)},
    "Clip": {0: P("min", F), 1: P("max", F)},
    "ReLU": {0: P("slope", F, 0.0)},
    "ELU": {0: P("alpha", F, 0.1)},
    "Dropout": {0: P("scale", F, 1.0)},
    "GELU": {0: P("fast_gelu", I, 0)},
    "HardSigmoid": {0: P("alpha", F, 0.2), 1: P("beta", F, 0.5)},
    "HardSwish": {0: P("alpha", F, 0.2), 1: P("beta", F, 0.5)},
    "Power": {0: P("power", F, 1.0), 1: P("scale", F, 1.0), 2: P("shift", F, 0.0)},
    "Threshold": {0: P("threshold", F, 0.0)},
    "ExpandDims": {3: P("axes", IA)},
    "Squeeze": {0: P("squeeze_w", I, 0), 1: P("squeeze_h", I, 0), 2: P("squeeze_c", I, 0),
                3: P("axes", IA)},
    "Tile": {0: P("axis", I, 0), 1: P("tiles", I, 1), 2: P("repeats", IA)},
    "Flatten": {},
    "Noop": {},
    "Swish": {},
    "Sigmoid": {},
    "TanH": {},
    "Interp": {0: P("resize_type", I, 0), 1: P("height_scale", F, 1.0),
               2: P("width_scale", F, 1.0), 3: P("output_height", I, 0),
               4: P("output_width", I, 0), 5: P("dynamic_target_size", I, 0),
               6: P("align_corner", I, 0), 9: P("size_expr", S)},
    "Pooling": {0: P("pooling_type", I, 0), 1: P("kernel_w", I, 0), 11: P("kernel_h", I),
                2: P("stride_w", I, 1), 12: P("stride_h", I), 3: P("pad_left", I, 0),
                14: P("pad_right", I), 13: P("pad_top", I), 15: P("pad_bottom", I),
                4: P("global_pooling", I, 0), 5: P("pad_mode", I, 0),
                6: P("avgpool_count_include_pad", I, 0), 7: P("adaptive_pooling", I, 0),
                8: P("out_w", I, 0), 18: P("out_h", I, 0)},
    "Normalize": {0: P("across_spatial", I, 0), 1: P("channel_shared", I, 0),
                  2: P("eps", F, 0.0001), 3: P("scale_data_size", I, 0),
                  4: P("across_channel", I, 0), 9: P("eps_mode", I, 0)},
    "Quantize": {0: P("scale_data_size", I, 1)},
    "Dequantize": {0: P("scale_data_size", I, 1), 1: P("bias_data_size", I, 0)},
    "Requantize": {0: P("scale_in_data_size", I, 1), 1: P("scale_out_data_size", I, 1),
                   2: P("bias_data_size", I, 0), 3: P("activation_type", I, 0),
                   4: P("activation_params", FA)},
    "CumulativeSum": {0: P("axis", I, 0)},
}


def param_info(layer_type: str, pid: int) -> P | None:
    return LAYER_PARAMS.get(layer_type, {}).get(pid)


def param_kind(layer_type: str, pid: int) -> Kind | None:
    info = param_info(layer_type, pid)
    return info.kind if info else None


def param_name(layer_type: str, pid: int) -> str:
    info = param_info(layer_type, pid)
    return f"{pid}({info.name})" if info else str(pid)
