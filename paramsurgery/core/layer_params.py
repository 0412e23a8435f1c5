"""Param ids, names, kinds and defaults of every ncnn layer type (its `load_param`).

Generated from, and checked line by line against, `src/layer/<type>.cpp` `load_param` of
Tencent/ncnn a4d2ea1d4 (one entry per `pd.get(id, default)`), for all 110 registered types
(`layer_types.NCNN_LAYER_TYPES`). Used to give a new param the kind ncnn reads (a float param
set from a Python int is written `2=1.0`, never `2=1`, which the reference ncnn misreads as
float bits), to name params in messages, to type the untyped scalars of a `.param.bin`, by
the weight schemas (`paramsurgery.formats.weights.schema`) and by lint.

Defaults: a number; `Same(k)` = the value of param k (e.g. kernel_h defaults to kernel_w);
`Expr(text)` = computed from other params; None = empty array.

Differences seen in the ncnn 1.0.20261020 wheel (newer than a4d2ea1d4), measured:
- its `load_param` rejects inconsistent sizes the source accepts, e.g. Convolution without
  num_output/kernel, `weight_data_size` not a multiple of num_output*maxk, InnerProduct
  `2=0`, GroupNorm channels % group != 0, MultiHeadAttention embed_dim % num_heads != 0,
  ConvolutionDepthWise int8_scale_term other than 0/1/2/101/102;
- ArgMax and SPP are not registered ("layer X not exists or registered"), though they keep
  their type index; YoloDetectionOutput / Yolov3DetectionOutput need `biases` (and a mask)
  matching num_box to load.
"""

from __future__ import annotations

from typing import NamedTuple

from paramsurgery.core.values import FLT_MAX, Kind

I, F, IA, FA, S = Kind.INT, Kind.FLOAT, Kind.INTS, Kind.FLOATS, Kind.STRING


class P(NamedTuple):
    name: str
    kind: Kind
    default: object = None


class Same(NamedTuple):
    """Default = the value of another param id (e.g. kernel_h defaults to kernel_w)."""

    pid: int


class Expr(NamedTuple):
    """Default computed from other params (documentation only)."""

    text: str


LAYER_PARAMS: dict[str, dict[int, P]] = {
    'AbsVal': {},
    'ArgMax': {
        0: P('out_max_val', I, 0), 1: P('topk', I, 1),
    },
    'BatchNorm': {
        0: P('channels', I, 0), 1: P('eps', F, 0.0),
    },
    'Bias': {
        0: P('bias_data_size', I, 0),
    },
    'BNLL': {},
    'Concat': {
        0: P('axis', I, 0),
    },
    'Convolution': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)),
        2: P('dilation_w', I, 1), 12: P('dilation_h', I, Same(2)), 3: P('stride_w', I, 1),
        13: P('stride_h', I, Same(3)), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        14: P('pad_top', I, Same(4)), 16: P('pad_bottom', I, Same(14)), 18: P('pad_value', F, 0.0),
        5: P('bias_term', I, 0), 6: P('weight_data_size', I, 0), 8: P('int8_scale_term', I, 0),
        9: P('activation_type', I, 0), 10: P('activation_params', FA, None),
        19: P('dynamic_weight', I, 0),
    },
    'Crop': {
        0: P('woffset', I, 0), 1: P('hoffset', I, 0), 13: P('doffset', I, 0),
        2: P('coffset', I, 0), 3: P('outw', I, 0), 4: P('outh', I, 0), 14: P('outd', I, 0),
        5: P('outc', I, 0), 6: P('woffset2', I, 0), 7: P('hoffset2', I, 0),
        15: P('doffset2', I, 0), 8: P('coffset2', I, 0), 9: P('starts', IA, None),
        10: P('ends', IA, None), 11: P('axes', IA, None), 19: P('starts_expr', S, ""),
        20: P('ends_expr', S, ""), 21: P('axes_expr', S, ""),
    },
    'Deconvolution': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)),
        2: P('dilation_w', I, 1), 12: P('dilation_h', I, Same(2)), 3: P('stride_w', I, 1),
        13: P('stride_h', I, Same(3)), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        14: P('pad_top', I, Same(4)), 16: P('pad_bottom', I, Same(14)),
        18: P('output_pad_right', I, 0), 19: P('output_pad_bottom', I, Same(18)),
        20: P('output_w', I, 0), 21: P('output_h', I, Same(20)), 5: P('bias_term', I, 0),
        6: P('weight_data_size', I, 0), 9: P('activation_type', I, 0),
        10: P('activation_params', FA, None), 28: P('dynamic_weight', I, 0),
    },
    'Dropout': {
        0: P('scale', F, 1.0),
    },
    'Eltwise': {
        0: P('op_type', I, 0), 1: P('coeffs', FA, None),
    },
    'ELU': {
        0: P('alpha', F, 0.1),
    },
    'Embed': {
        0: P('num_output', I, 0), 1: P('input_dim', I, 0), 2: P('bias_term', I, 0),
        3: P('weight_data_size', I, 0), 18: P('int8_scale_term', I, 0),
    },
    'Exp': {
        0: P('base', F, -1.0), 1: P('scale', F, 1.0), 2: P('shift', F, 0.0),
    },
    'Flatten': {},
    'InnerProduct': {
        0: P('num_output', I, 0), 1: P('bias_term', I, 0), 2: P('weight_data_size', I, 0),
        8: P('int8_scale_term', I, 0), 9: P('activation_type', I, 0),
        10: P('activation_params', FA, None),
    },
    'Input': {
        0: P('w', I, 0), 1: P('h', I, 0), 11: P('d', I, 0), 2: P('c', I, 0),
    },
    'Log': {
        0: P('base', F, -1.0), 1: P('scale', F, 1.0), 2: P('shift', F, 0.0),
    },
    'LRN': {
        0: P('region_type', I, 0), 1: P('local_size', I, 5), 2: P('alpha', F, 1.0),
        3: P('beta', F, 0.75), 4: P('bias', F, 1.0),
    },
    'MemoryData': {
        0: P('w', I, 0), 1: P('h', I, 0), 11: P('d', I, 0), 2: P('c', I, 0),
        21: P('load_type', I, 1),
    },
    'MVN': {
        0: P('normalize_variance', I, 0), 1: P('across_channels', I, 0), 2: P('eps', F, 0.0001),
    },
    'Pooling': {
        0: P('pooling_type', I, 0), 1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)),
        2: P('stride_w', I, 1), 12: P('stride_h', I, Same(2)), 3: P('pad_left', I, 0),
        14: P('pad_right', I, Same(3)), 13: P('pad_top', I, Same(3)),
        15: P('pad_bottom', I, Same(13)), 4: P('global_pooling', I, 0), 5: P('pad_mode', I, 0),
        6: P('avgpool_count_include_pad', I, 0), 7: P('adaptive_pooling', I, 0),
        8: P('out_w', I, 0), 18: P('out_h', I, Same(8)),
    },
    'Power': {
        0: P('power', F, 1.0), 1: P('scale', F, 1.0), 2: P('shift', F, 0.0),
    },
    'PReLU': {
        0: P('num_slope', I, 0),
    },
    'Proposal': {
        0: P('feat_stride', I, 16), 1: P('base_size', I, 16), 2: P('pre_nms_topN', I, 6000),
        3: P('after_nms_topN', I, 300), 4: P('nms_thresh', F, 0.7), 5: P('min_size', I, 16),
    },
    'Reduction': {
        0: P('operation', I, 0), 1: P('reduce_all', I, 1), 2: P('coeff', F, 1.0),
        3: P('axes', IA, None), 4: P('keepdims', I, 0), 5: P('fixbug0', I, 0),
    },
    'ReLU': {
        0: P('slope', F, 0.0),
    },
    'Reshape': {
        0: P('w', I, -233), 1: P('h', I, -233), 11: P('d', I, -233), 2: P('c', I, -233),
        12: P('input_batch_axis', I, 233), 13: P('output_batch_axis', I, 233),
        6: P('shape_expr', S, ""),
    },
    'ROIPooling': {
        0: P('pooled_width', I, 0), 1: P('pooled_height', I, 0), 2: P('spatial_scale', F, 1.0),
    },
    'Scale': {
        0: P('scale_data_size', I, 0), 1: P('bias_term', I, 0),
    },
    'Sigmoid': {},
    'Slice': {
        0: P('slices', IA, None), 1: P('axis', I, 0), 2: P('indices', IA, None),
    },
    'Softmax': {
        0: P('axis', I, 0), 1: P('fixbug0', I, 0),
    },
    'Split': {},
    'SPP': {
        0: P('pooling_type', I, 0), 1: P('pyramid_height', I, 1),
    },
    'TanH': {},
    'Threshold': {
        0: P('threshold', F, 0.0),
    },
    'Tile': {
        0: P('axis', I, 0), 1: P('tiles', I, 1), 2: P('repeats', IA, None),
    },
    'RNN': {
        0: P('num_output', I, 0), 1: P('weight_data_size', I, 0), 2: P('direction', I, 0),
        8: P('int8_scale_term', I, 0),
    },
    'LSTM': {
        0: P('num_output', I, 0), 1: P('weight_data_size', I, 0), 2: P('direction', I, 0),
        3: P('hidden_size', I, Same(0)), 8: P('int8_scale_term', I, 0),
    },
    'BinaryOp': {
        0: P('op_type', I, 0), 1: P('with_scalar', I, 0), 2: P('b', F, 0.0),
    },
    'UnaryOp': {
        0: P('op_type', I, 0),
    },
    'ConvolutionDepthWise': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)),
        2: P('dilation_w', I, 1), 12: P('dilation_h', I, Same(2)), 3: P('stride_w', I, 1),
        13: P('stride_h', I, Same(3)), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        14: P('pad_top', I, Same(4)), 16: P('pad_bottom', I, Same(14)), 18: P('pad_value', F, 0.0),
        5: P('bias_term', I, 0), 6: P('weight_data_size', I, 0), 7: P('group', I, 1),
        8: P('int8_scale_term', I, 0), 9: P('activation_type', I, 0),
        10: P('activation_params', FA, None), 19: P('dynamic_weight', I, 0),
    },
    'Padding': {
        0: P('top', I, 0), 1: P('bottom', I, 0), 2: P('left', I, 0), 3: P('right', I, 0),
        4: P('type', I, 0), 5: P('value', F, 0.0), 6: P('per_channel_pad_data_size', I, 0),
        7: P('front', I, 0), 8: P('behind', I, 0),
    },
    'Squeeze': {
        0: P('squeeze_w', I, 0), 1: P('squeeze_h', I, 0), 11: P('squeeze_d', I, 0),
        2: P('squeeze_c', I, 0), 3: P('axes', IA, None),
    },
    'ExpandDims': {
        3: P('axes', IA, None),
    },
    'Normalize': {
        0: P('across_spatial', I, 0), 4: P('across_channel', I, 1), 1: P('channel_shared', I, 0),
        2: P('eps', F, 0.0001), 9: P('eps_mode', I, 0), 3: P('scale_data_size', I, 0),
    },
    'Permute': {
        0: P('order_type', I, 0),
    },
    'PriorBox': {
        0: P('min_sizes', FA, None), 1: P('max_sizes', FA, None), 2: P('aspect_ratios', FA, None),
        3: P('variances0', F, 0.1), 4: P('variances1', F, 0.1), 5: P('variances2', F, 0.2),
        6: P('variances3', F, 0.2), 7: P('flip', I, 1), 8: P('clip', I, 0),
        9: P('image_width', I, 0), 10: P('image_height', I, 0), 11: P('step_width', F, -233.0),
        12: P('step_height', F, -233.0), 13: P('offset', F, 0.0), 14: P('step_mmdetection', I, 0),
        15: P('center_mmdetection', I, 0),
    },
    'DetectionOutput': {
        0: P('num_class', I, 0), 1: P('nms_threshold', F, 0.05), 2: P('nms_top_k', I, 300),
        3: P('keep_top_k', I, 100), 4: P('confidence_threshold', F, 0.5),
        5: P('variances0', F, 0.1), 6: P('variances1', F, 0.1), 7: P('variances2', F, 0.2),
        8: P('variances3', F, 0.2),
    },
    'Interp': {
        0: P('resize_type', I, 0), 1: P('height_scale', F, 1.0), 2: P('width_scale', F, 1.0),
        3: P('output_height', I, 0), 4: P('output_width', I, 0), 5: P('dynamic_target_size', I, 0),
        6: P('align_corner', I, 0), 9: P('size_expr', S, ""),
    },
    'DeconvolutionDepthWise': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)),
        2: P('dilation_w', I, 1), 12: P('dilation_h', I, Same(2)), 3: P('stride_w', I, 1),
        13: P('stride_h', I, Same(3)), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        14: P('pad_top', I, Same(4)), 16: P('pad_bottom', I, Same(14)),
        18: P('output_pad_right', I, 0), 19: P('output_pad_bottom', I, Same(18)),
        20: P('output_w', I, 0), 21: P('output_h', I, Same(20)), 5: P('bias_term', I, 0),
        6: P('weight_data_size', I, 0), 7: P('group', I, 1), 9: P('activation_type', I, 0),
        10: P('activation_params', FA, None), 28: P('dynamic_weight', I, 0),
    },
    'ShuffleChannel': {
        0: P('group', I, 1), 1: P('reverse', I, 0),
    },
    'InstanceNorm': {
        0: P('channels', I, 0), 1: P('eps', F, 0.001), 2: P('affine', I, 1),
    },
    'Clip': {
        0: P('min', F, -FLT_MAX), 1: P('max', F, FLT_MAX),
    },
    'Reorg': {
        0: P('stride', I, 1), 1: P('mode', I, 0),
    },
    'YoloDetectionOutput': {
        0: P('num_class', I, 20), 1: P('num_box', I, 5), 2: P('confidence_threshold', F, 0.01),
        3: P('nms_threshold', F, 0.45), 4: P('biases', FA, None),
    },
    'Quantize': {
        0: P('scale_data_size', I, 1),
    },
    'Dequantize': {
        0: P('scale_data_size', I, 1), 1: P('bias_data_size', I, 0),
    },
    'Yolov3DetectionOutput': {
        0: P('num_class', I, 20), 1: P('num_box', I, 5), 2: P('confidence_threshold', F, 0.01),
        3: P('nms_threshold', F, 0.45), 4: P('biases', FA, None), 5: P('mask', FA, None),
        6: P('anchors_scale', FA, None),
    },
    'PSROIPooling': {
        0: P('pooled_width', I, 7), 1: P('pooled_height', I, 7), 2: P('spatial_scale', F, 0.0625),
        3: P('output_dim', I, 0),
    },
    'ROIAlign': {
        0: P('pooled_width', I, 0), 1: P('pooled_height', I, 0), 2: P('spatial_scale', F, 1.0),
        3: P('sampling_ratio', I, 0), 4: P('aligned', I, 0), 5: P('version', I, 0),
    },
    'Packing': {
        0: P('out_elempack', I, 1), 1: P('use_padding', I, 0), 2: P('cast_type_from', I, 0),
        3: P('cast_type_to', I, 0),
    },
    'Requantize': {
        0: P('scale_in_data_size', I, 1), 1: P('scale_out_data_size', I, 1),
        2: P('bias_data_size', I, 0), 3: P('activation_type', I, 0),
        4: P('activation_params', FA, None),
    },
    'Cast': {
        0: P('type_from', I, 0), 1: P('type_to', I, 0),
    },
    'HardSigmoid': {
        0: P('alpha', F, 0.2), 1: P('beta', F, 0.5),
    },
    'SELU': {
        0: P('alpha', F, 1.67326324), 1: P('lambda', F, 1.050700987),
    },
    'HardSwish': {
        0: P('alpha', F, 0.2), 1: P('beta', F, 0.5),
    },
    'Noop': {},
    'PixelShuffle': {
        0: P('upscale_factor', I, 1), 1: P('mode', I, 0),
    },
    'DeepCopy': {},
    'Mish': {},
    'StatisticsPooling': {
        0: P('include_stddev', I, 0),
    },
    'Swish': {},
    'Gemm': {
        0: P('alpha', F, 1.0), 1: P('beta', F, 1.0), 2: P('transA', I, 0), 3: P('transB', I, 0),
        4: P('constantA', I, 0), 5: P('constantB', I, 0), 6: P('constantC', I, 0),
        7: P('constantM', I, 0), 8: P('constantN', I, 0), 9: P('constantK', I, 0),
        10: P('constant_broadcast_type_C', I, 0), 11: P('output_N1M', I, 0),
        12: P('output_elempack', I, 0), 13: P('output_elemtype', I, 0),
        14: P('output_transpose', I, 0), 18: P('quantize_term', I, 0),
        20: P('constant_TILE_M', I, 0), 21: P('constant_TILE_N', I, 0),
        22: P('constant_TILE_K', I, 0),
    },
    'GroupNorm': {
        0: P('group', I, 1), 1: P('channels', I, 0), 2: P('eps', F, 0.001), 3: P('affine', I, 1),
    },
    'LayerNorm': {
        0: P('affine_size', I, 0), 1: P('eps', F, 0.001), 2: P('affine', I, 1),
    },
    'Softplus': {},
    'GRU': {
        0: P('num_output', I, 0), 1: P('weight_data_size', I, 0), 2: P('direction', I, 0),
        8: P('int8_scale_term', I, 0),
    },
    'MultiHeadAttention': {
        0: P('embed_dim', I, 0), 1: P('num_heads', I, 1), 2: P('weight_data_size', I, 0),
        3: P('kdim', I, Same(0)), 4: P('vdim', I, Same(0)), 5: P('attn_mask', I, 0),
        6: P('scale', F, Expr("1/sqrt(embed_dim/num_heads)")), 7: P('kv_cache', I, 0),
        18: P('quantize_term', I, 0),
    },
    'GELU': {
        0: P('fast_gelu', I, 0),
    },
    'Convolution1D': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 2: P('dilation_w', I, 1),
        3: P('stride_w', I, 1), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        18: P('pad_value', F, 0.0), 5: P('bias_term', I, 0), 6: P('weight_data_size', I, 0),
        9: P('activation_type', I, 0), 10: P('activation_params', FA, None),
        19: P('dynamic_weight', I, 0),
    },
    'Pooling1D': {
        0: P('pooling_type', I, 0), 1: P('kernel_w', I, 0), 2: P('stride_w', I, 1),
        3: P('pad_left', I, 0), 14: P('pad_right', I, Same(3)), 4: P('global_pooling', I, 0),
        5: P('pad_mode', I, 0), 6: P('avgpool_count_include_pad', I, 0),
        7: P('adaptive_pooling', I, 0), 8: P('out_w', I, 0),
    },
    'ConvolutionDepthWise1D': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 2: P('dilation_w', I, 1),
        3: P('stride_w', I, 1), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        18: P('pad_value', F, 0.0), 5: P('bias_term', I, 0), 6: P('weight_data_size', I, 0),
        7: P('group', I, 1), 9: P('activation_type', I, 0), 10: P('activation_params', FA, None),
        19: P('dynamic_weight', I, 0),
    },
    'Convolution3D': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)),
        21: P('kernel_d', I, Same(1)), 2: P('dilation_w', I, 1), 12: P('dilation_h', I, Same(2)),
        22: P('dilation_d', I, Same(2)), 3: P('stride_w', I, 1), 13: P('stride_h', I, Same(3)),
        23: P('stride_d', I, Same(3)), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        14: P('pad_top', I, Same(4)), 16: P('pad_bottom', I, Same(14)),
        24: P('pad_front', I, Same(4)), 17: P('pad_behind', I, Same(24)),
        18: P('pad_value', F, 0.0), 5: P('bias_term', I, 0), 6: P('weight_data_size', I, 0),
        9: P('activation_type', I, 0), 10: P('activation_params', FA, None),
    },
    'ConvolutionDepthWise3D': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)),
        21: P('kernel_d', I, Same(1)), 2: P('dilation_w', I, 1), 12: P('dilation_h', I, Same(2)),
        22: P('dilation_d', I, Same(2)), 3: P('stride_w', I, 1), 13: P('stride_h', I, Same(3)),
        23: P('stride_d', I, Same(3)), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        14: P('pad_top', I, Same(4)), 16: P('pad_bottom', I, Same(14)),
        24: P('pad_front', I, Same(4)), 17: P('pad_behind', I, Same(24)),
        18: P('pad_value', F, 0.0), 5: P('bias_term', I, 0), 6: P('weight_data_size', I, 0),
        7: P('group', I, 1), 9: P('activation_type', I, 0), 10: P('activation_params', FA, None),
    },
    'Pooling3D': {
        0: P('pooling_type', I, 0), 1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)),
        21: P('kernel_d', I, Same(1)), 2: P('stride_w', I, 1), 12: P('stride_h', I, Same(2)),
        22: P('stride_d', I, Same(2)), 3: P('pad_left', I, 0), 14: P('pad_right', I, Same(3)),
        13: P('pad_top', I, Same(3)), 15: P('pad_bottom', I, Same(13)),
        23: P('pad_front', I, Same(3)), 16: P('pad_behind', I, Same(23)),
        4: P('global_pooling', I, 0), 5: P('pad_mode', I, 0),
        6: P('avgpool_count_include_pad', I, 0), 7: P('adaptive_pooling', I, 0),
        8: P('out_w', I, 0), 18: P('out_h', I, Same(8)), 28: P('out_d', I, Same(8)),
    },
    'MatMul': {
        0: P('transB', I, 0),
    },
    'Deconvolution1D': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 2: P('dilation_w', I, 1),
        3: P('stride_w', I, 1), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        18: P('output_pad_right', I, 0), 20: P('output_w', I, 0), 5: P('bias_term', I, 0),
        6: P('weight_data_size', I, 0), 9: P('activation_type', I, 0),
        10: P('activation_params', FA, None), 28: P('dynamic_weight', I, 0),
    },
    'DeconvolutionDepthWise1D': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 2: P('dilation_w', I, 1),
        3: P('stride_w', I, 1), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        18: P('output_pad_right', I, 0), 20: P('output_w', I, 0), 5: P('bias_term', I, 0),
        6: P('weight_data_size', I, 0), 7: P('group', I, 1), 9: P('activation_type', I, 0),
        10: P('activation_params', FA, None), 28: P('dynamic_weight', I, 0),
    },
    'Deconvolution3D': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)),
        21: P('kernel_d', I, Same(1)), 2: P('dilation_w', I, 1), 12: P('dilation_h', I, Same(2)),
        22: P('dilation_d', I, Same(2)), 3: P('stride_w', I, 1), 13: P('stride_h', I, Same(3)),
        23: P('stride_d', I, Same(3)), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        14: P('pad_top', I, Same(4)), 16: P('pad_bottom', I, Same(14)),
        24: P('pad_front', I, Same(4)), 17: P('pad_behind', I, Same(24)),
        18: P('output_pad_right', I, 0), 19: P('output_pad_bottom', I, Same(18)),
        20: P('output_pad_behind', I, Same(18)), 25: P('output_w', I, 0),
        26: P('output_h', I, Same(25)), 27: P('output_d', I, Same(25)), 5: P('bias_term', I, 0),
        6: P('weight_data_size', I, 0), 9: P('activation_type', I, 0),
        10: P('activation_params', FA, None),
    },
    'DeconvolutionDepthWise3D': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)),
        21: P('kernel_d', I, Same(1)), 2: P('dilation_w', I, 1), 12: P('dilation_h', I, Same(2)),
        22: P('dilation_d', I, Same(2)), 3: P('stride_w', I, 1), 13: P('stride_h', I, Same(3)),
        23: P('stride_d', I, Same(3)), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        14: P('pad_top', I, Same(4)), 16: P('pad_bottom', I, Same(14)),
        24: P('pad_front', I, Same(4)), 17: P('pad_behind', I, Same(24)),
        18: P('output_pad_right', I, 0), 19: P('output_pad_bottom', I, Same(18)),
        20: P('output_pad_behind', I, Same(18)), 25: P('output_w', I, 0),
        26: P('output_h', I, Same(25)), 27: P('output_d', I, Same(25)), 5: P('bias_term', I, 0),
        6: P('weight_data_size', I, 0), 7: P('group', I, 1), 9: P('activation_type', I, 0),
        10: P('activation_params', FA, None),
    },
    'Einsum': {
        0: P('equation_mat', IA, None),
    },
    'DeformableConv2D': {
        0: P('num_output', I, 0), 1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)),
        2: P('dilation_w', I, 1), 12: P('dilation_h', I, Same(2)), 3: P('stride_w', I, 1),
        13: P('stride_h', I, Same(3)), 4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)),
        14: P('pad_top', I, Same(4)), 16: P('pad_bottom', I, Same(14)), 5: P('bias_term', I, 0),
        6: P('weight_data_size', I, 0), 9: P('activation_type', I, 0),
        10: P('activation_params', FA, None),
    },
    'GLU': {
        0: P('axis', I, 0),
    },
    'Fold': {
        1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)), 2: P('dilation_w', I, 1),
        12: P('dilation_h', I, Same(2)), 3: P('stride_w', I, 1), 13: P('stride_h', I, Same(3)),
        4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)), 14: P('pad_top', I, Same(4)),
        16: P('pad_bottom', I, Same(14)), 20: P('output_w', I, 0), 21: P('output_h', I, Same(20)),
    },
    'Unfold': {
        1: P('kernel_w', I, 0), 11: P('kernel_h', I, Same(1)), 2: P('dilation_w', I, 1),
        12: P('dilation_h', I, Same(2)), 3: P('stride_w', I, 1), 13: P('stride_h', I, Same(3)),
        4: P('pad_left', I, 0), 15: P('pad_right', I, Same(4)), 14: P('pad_top', I, Same(4)),
        16: P('pad_bottom', I, Same(14)), 18: P('pad_value', F, 0.0),
    },
    'GridSample': {
        0: P('sample_type', I, 1), 1: P('padding_mode', I, 1), 2: P('align_corner', I, 0),
        3: P('permute_fusion', I, 0),
    },
    'CumulativeSum': {
        0: P('axis', I, 0),
    },
    'CopyTo': {
        0: P('woffset', I, 0), 1: P('hoffset', I, 0), 13: P('doffset', I, 0),
        2: P('coffset', I, 0), 9: P('starts', IA, None), 11: P('axes', IA, None),
    },
    'Erf': {},
    'Diag': {
        0: P('diagonal', I, 0),
    },
    'CELU': {
        0: P('alpha', F, 1.0),
    },
    'Shrink': {
        0: P('bias', F, 0.0), 1: P('lambd', F, 0.5),
    },
    'RMSNorm': {
        0: P('affine_size', I, 0), 1: P('eps', F, 0.001), 2: P('affine', I, 1),
    },
    'Spectrogram': {
        0: P('n_fft', I, 0), 1: P('power', I, 0), 2: P('hoplen', I, Expr("n_fft/4")),
        3: P('winlen', I, Same(0)), 4: P('window_type', I, 0), 5: P('center', I, 1),
        6: P('pad_type', I, 2), 7: P('normalized', I, 0), 8: P('onesided', I, 1),
    },
    'InverseSpectrogram': {
        0: P('n_fft', I, 0), 1: P('returns', I, 0), 2: P('hoplen', I, Expr("n_fft/4")),
        3: P('winlen', I, Same(0)), 4: P('window_type', I, 0), 5: P('center', I, 1),
        7: P('normalized', I, 0),
    },
    'Flip': {
        0: P('axes', IA, None),
    },
    'SDPA': {
        5: P('attn_mask', I, 0), 6: P('scale', F, 0.0), 7: P('kv_cache', I, 0),
        18: P('int8_scale_term', I, 0),
    },
    'RotaryEmbed': {
        0: P('interleaved', I, 0),
    },
}

# the generic ids every layer may carry (src/net.cpp): 30 = top shape hints, 31 = featmask
GENERIC_PARAMS: dict[int, P] = {30: P("shape_hints", IA, None), 31: P("featmask", I, 0)}


def param_info(layer_type: str, pid: int) -> P | None:
    info = LAYER_PARAMS.get(layer_type, {}).get(pid)
    return info if info is not None else GENERIC_PARAMS.get(pid)


def param_kind(layer_type: str, pid: int) -> Kind | None:
    info = param_info(layer_type, pid)
    return info.kind if info else None


def param_name(layer_type: str, pid: int) -> str:
    info = param_info(layer_type, pid)
    return f"{pid}({info.name})" if info else str(pid)


def param_default(layer_type: str, pid: int, params=None):
    """ncnn's default for a param id; `Same(k)` defaults are resolved through `params`
    (anything with `.get(id, default)`) when given."""
    info = param_info(layer_type, pid)
    if info is None:
        return None
    d = info.default
    seen = 0
    while isinstance(d, Same) and seen < 8:
        ref = d.pid
        if params is not None and params.get(ref) is not None:
            return params.get(ref)
        d = LAYER_PARAMS[layer_type][ref].default
        seen += 1
    return d
