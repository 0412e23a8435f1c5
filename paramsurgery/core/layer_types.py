"""ncnn's built-in layer types, in registry order (src/CMakeLists.txt `ncnn_add_layer`), which
is also the type index stored in `.param.bin` and returned by `ncnn.layer_to_index`.
Checked against the installed wheel by the tests."""

from __future__ import annotations

NCNN_LAYER_TYPES: tuple[str, ...] = tuple("""
AbsVal ArgMax BatchNorm Bias BNLL Concat Convolution Crop Deconvolution Dropout
Eltwise ELU Embed Exp Flatten InnerProduct Input Log LRN MemoryData
MVN Pooling Power PReLU Proposal Reduction ReLU Reshape ROIPooling Scale
Sigmoid Slice Softmax Split SPP TanH Threshold Tile RNN LSTM
BinaryOp UnaryOp ConvolutionDepthWise Padding Squeeze ExpandDims Normalize Permute PriorBox DetectionOutput
Interp DeconvolutionDepthWise ShuffleChannel InstanceNorm Clip Reorg YoloDetectionOutput Quantize Dequantize Yolov3DetectionOutput
PSROIPooling ROIAlign Packing Requantize Cast HardSigmoid SELU HardSwish Noop PixelShuffle
DeepCopy Mish StatisticsPooling Swish Gemm GroupNorm LayerNorm Softplus GRU MultiHeadAttention
GELU Convolution1D Pooling1D ConvolutionDepthWise1D Convolution3D ConvolutionDepthWise3D Pooling3D MatMul Deconvolution1D DeconvolutionDepthWise1D
Deconvolution3D DeconvolutionDepthWise3D Einsum DeformableConv2D GLU Fold Unfold GridSample CumulativeSum CopyTo
Erf Diag CELU Shrink RMSNorm Spectrogram InverseSpectrogram Flip SDPA RotaryEmbed
""".split())

TYPE_INDEX: dict[str, int] = {name: i for i, name in enumerate(NCNN_LAYER_TYPES)}

# prefixes of the torch-side op names pnnx writes when it has no ncnn conversion
CONVERTER_PREFIXES: tuple[str, ...] = ("pnnx.", "Tensor.", "torch.", "F.", "nn.", "aten::",
                                       "prim::")

# ncnn layers that only move, copy or select elements (no arithmetic): a value seen through
# them is one of the values above (an id stays an id, a 0/1 mask stays 0/1); a Crop's or
# Reshape's second bottom gives only a shape
ELEMENT_MOVING: tuple[str, ...] = ("Split", "Reshape", "ExpandDims", "Squeeze", "Flatten",
                                   "Permute", "Crop", "Slice", "Concat", "Tile")


def is_ncnn_layer(type_name: str) -> bool:
    return type_name in TYPE_INDEX


def is_converter_leftover(type_name: str) -> bool:
    """A type pnnx wrote because it could not convert a torch op (never loadable)."""
    return type_name.startswith(CONVERTER_PREFIXES)
