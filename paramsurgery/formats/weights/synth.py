"""Random weights of exactly the layout a `.param` needs (`paramsurgery synth-bin`).

Values are small and keep activations bounded through deep stacks: matrix/conv weights are
uniform in ±sqrt(3/fan_in) (variance 1/fan_in), biases ±0.1, norm gammas and scales ≈ 1,
BatchNorm variances in [0.9, 1.1], PReLU slopes 0.1–0.3, int8 scale tables matched to the
weight range (127/max|w|). Generation is deterministic in (seed, layer index, read index)
and streamed in chunks, so a multi-GB `.bin` never sits in memory.

Tagged reads are stored fp32 (tag 0) or fp16 (tag 0x01306B47, zero pad); untagged reads are
raw float32 as ncnn requires; block-quantized (packed) weights are random bytes.
"""

from __future__ import annotations

import math
import struct
from typing import IO, TYPE_CHECKING, Iterator, Mapping

import numpy as np

from paramsurgery.core.errors import BinLayoutError
from paramsurgery.formats.weights import tags as T
from paramsurgery.formats.weights.binfile import LayerWeights, Weight, _Sink
from paramsurgery.formats.weights.schema import PACKED, RAW, TAGGED, Read, layer_reads

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph
    from paramsurgery.ir.layer import Layer

_CHUNK = 1 << 22  # elements per generated chunk

_MATRIX = {"weight", "A", "B", "weight_xc", "weight_hc", "weight_hr", "q_weight", "k_weight",
           "v_weight", "out_weight"}
_SMALL = {"bias", "C", "bias_c", "beta", "per_channel_pad", "mean", "q_bias", "k_bias",
          "v_bias", "out_bias"}
_NEAR_ONE = {"gamma", "var", "scale"}
GAIN = math.sqrt(3.0)


def _fan_in(layer: "Layer", r: Read) -> int:
    """Inputs per output of a matrix-like read (its shape's inner dims)."""
    shape = r.shape
    if layer.type == "Gemm" and r.role == "B" and layer.params.get(3, 0) == 0:
        return max(1, shape[0])  # B is (K, N)
    if layer.type == "Embed" or r.role == "A":
        return 1
    if len(shape) >= 2:
        return max(1, int(np.prod(shape[1:])))
    return 1


def _recipe(layer: "Layer", r: Read, fan: int, packed: bool = False) -> tuple[float, float]:
    """(low, high) of the uniform distribution for one read (`packed`: the layer's weights
    are block-quantized bytes)."""
    t, role = layer.type, r.role
    if role in _MATRIX:
        a = GAIN / math.sqrt(fan) if fan > 1 else 1.0
        return -a, a
    if t == "BatchNorm" and role == "slope":
        return 0.9, 1.1
    if t == "PReLU":
        return 0.1, 0.3
    if t == "Quantize":
        return 30.0, 34.0
    if t == "Dequantize":
        return (1 / 34, 1 / 30) if role == "scale" else (-0.1, 0.1)
    if t == "Requantize":
        return {"scale_in": (1 / 34, 1 / 30), "scale_out": (30.0, 34.0)}.get(role, (-0.1, 0.1))
    if role in _NEAR_ONE or role == "slope":
        return 0.9, 1.1
    if role in _SMALL:
        return -0.1, 0.1
    if role.endswith("input_scales"):  # block-quant activation scales
        return 0.9, 1.1
    if packed and role.endswith("_scales"):
        # block-quant weight scales: the packed values are random bytes
        s = 1.0 / (128.0 * math.sqrt(max(fan, 1)))
        return 0.5 * s, 1.5 * s
    if role in ("input_scale", "output_scale"):
        return 127 / 8.5, 127 / 7.5
    if role.endswith("scales") or role.endswith("scale"):  # int8 weight scales: 127/max|w|
        a = GAIN / math.sqrt(fan) if fan > 1 else 1.0
        s = 127.0 / a
        return 0.99 * s, 1.01 * s
    if role == "data":
        return -1.0, 1.0
    return -0.1, 0.1


def _weight_fan(layer: "Layer", reads: list[Read]) -> int:
    """fan_in of the layer's first matrix-like read (for its scale tables)."""
    for r in reads:
        if r.mode == PACKED:
            return max(1, r.shape[-1] * 2)  # about K for 4-bit packing
        if r.role in _MATRIX:
            return _fan_in(layer, r)
    return 1


def _values(rng: np.random.Generator, lo: float, hi: float, n: int) -> np.ndarray:
    return (lo + (hi - lo) * rng.random(n)).astype(np.float32)


def blob_chunks(layer: "Layer", r: Read, index: int, read_index: int, seed: int,
                dtype: str, fan: int, packed: bool = False) -> Iterator[bytes]:
    """The stored bytes of one synthetic blob, in chunks."""
    rng = np.random.default_rng([seed, index, read_index])
    if r.mode == PACKED:
        left = r.count
        while left:
            k = min(left, _CHUNK)
            yield rng.integers(0, 256, k, dtype=np.uint8).tobytes()
            left -= k
        pad = T.align4(r.count) - r.count
        if pad:
            yield bytes(pad)
        return
    own_fan = _fan_in(layer, r) if r.role in _MATRIX else fan
    lo, hi = _recipe(layer, r, own_fan, packed)
    kind = T.RAW if r.mode == RAW else dtype
    if r.mode == TAGGED:
        yield struct.pack("<I", T.DTYPE_TAG[kind])
    left = r.count
    while left:
        k = min(left, _CHUNK)
        yield T.encode(kind, _values(rng, lo, hi, k))
        left -= k
    pad = T.payload_size(kind, r.count) - T.data_size(kind, r.count)
    if pad:
        yield bytes(pad)


def _layer_plan(graph: "Graph") -> Iterator[tuple[int, "Layer", list[Read], int, bool]]:
    for index, layer in enumerate(graph):
        reads = layer_reads(layer)
        if not reads:
            continue
        for r in reads:
            if r.count == 0 and r.required:
                raise BinLayoutError(f"layer {layer.name!r} ({layer.type}, {layer.where()}): "
                                     f"weight {r.role!r} has 0 elements: ncnn's load_model "
                                     f"fails on it; fix the params",
                                     file=layer.source_file, line=layer.source_line)
        packed = any(r.mode == PACKED for r in reads)
        yield index, layer, reads, _weight_fan(layer, reads), packed


def given_chunks(layer: "Layer", reads: list[Read], values: np.ndarray) -> Iterator[bytes]:
    """The stored bytes of a layer whose values are given instead of drawn: one raw float32
    read (a `MemoryData`'s, the only layout where a value is the weight itself) holding
    exactly `values.size` elements."""
    if len(reads) != 1 or reads[0].mode != RAW:
        raise BinLayoutError(f"layer {layer.name!r} ({layer.type}, {layer.where()}): given "
                             f"values need a layer with one raw float32 weight (MemoryData); "
                             f"it reads {len(reads)} weight(s)",
                             file=layer.source_file, line=layer.source_line)
    r = reads[0]
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    if flat.size != r.count:
        raise BinLayoutError(f"layer {layer.name!r} ({layer.type}, {layer.where()}): "
                             f"{flat.size} given value(s) for a weight of {r.count} elements",
                             file=layer.source_file, line=layer.source_line)
    yield T.encode(T.RAW, flat)
    pad = T.payload_size(T.RAW, r.count) - T.data_size(T.RAW, r.count)
    if pad:
        yield bytes(pad)


def write_synth_bin(graph: "Graph", fh: IO[bytes], *, seed: int = 0,
                    dtype: str = T.FP32, given: Mapping[str, np.ndarray] | None = None) -> int:
    """Stream a synthetic `.bin` for `graph` into `fh`; returns the bytes written. Layers
    named in `given` get those values instead (`given_chunks`): constants that are not
    learned weights, such as the values pnnx folded from its trace, kept from an export."""
    if dtype not in (T.FP32, T.FP16, T.BF16):
        raise ValueError(f"synthetic weights are fp32, fp16 or bf16, not {dtype!r}")
    given = dict(given or {})
    unknown = sorted(set(given) - {layer.name for layer in graph})
    if unknown:
        raise BinLayoutError(f"given values for {len(unknown)} layer(s) not in the graph: "
                             f"{', '.join(unknown[:5])}")
    from paramsurgery.core import progress

    sink = _Sink(fh)
    with progress.task("synth-bin", total=len(graph), unit="layer") as task:
        last = 0
        for index, layer, reads, fan, packed in _layer_plan(graph):
            task.done(n=index + 1 - last)  # the bar moves; no line per layer
            last = index + 1
            if layer.name in given:
                for chunk in given_chunks(layer, reads, given.pop(layer.name)):
                    sink.write(chunk)
                continue
            for ri, r in enumerate(reads):
                for chunk in blob_chunks(layer, r, index, ri, seed, dtype, fan, packed):
                    sink.write(chunk)
        task.done(n=len(graph) - last)
    if given:
        raise BinLayoutError(f"given values for layer(s) that read no weights: "
                             f"{', '.join(sorted(given)[:5])}")
    return sink.written


def synth_weights(graph: "Graph", *, seed: int = 0, dtype: str = T.FP32) -> "Graph":
    """Give every layer of `graph` synthetic weights in memory (the same bytes
    `write_synth_bin` writes). For small graphs; use `write_synth_bin` for big ones."""
    from paramsurgery.formats.weights.binfile import _EMPTY

    planned = {layer.id: (index, reads, fan, packed)
               for index, layer, reads, fan, packed in _layer_plan(graph)}
    for layer in graph:
        plan = planned.get(layer.id)
        if plan is None:
            reads = layer_reads(layer)
            layer.weights = LayerWeights((), assumed=reads is None) if reads is None else _EMPTY
            continue
        index, reads, fan, packed = plan
        blobs = []
        for ri, r in enumerate(reads):
            data = b"".join(blob_chunks(layer, r, index, ri, seed, dtype, fan, packed))
            if r.mode == TAGGED:
                stored, tag = dtype, T.DTYPE_TAG[dtype]
            else:
                stored, tag = (T.RAW if r.mode == RAW else T.PACKED), None
            blobs.append(Weight(r.role, r.mode, r.count, r.shape, stored, tag, len(data),
                                data=data))
        layer.weights = LayerWeights(blobs)
    return graph


def synth_size(graph: "Graph", dtype: str = T.FP32) -> int:
    """Bytes of the `.bin` `write_synth_bin` writes for `graph` (= the fp32 size of its
    layout with dtype fp32): the weights' size without generating any."""
    n = 0
    for layer in graph:
        for r in layer_reads(layer) or ():
            if r.mode == TAGGED:
                n += 4 + T.payload_size(dtype, r.count)
            else:
                n += T.payload_size(T.RAW if r.mode == RAW else T.PACKED, r.count)
    return n
