"""int8 calibration through ncnn, as ncnn's tools/quantize/ncnn2table.cpp computes it.

Every calibration input runs through the fp32 graph (parity options, in one `Worker`); the
bottom blob of every Convolution / ConvolutionDepthWise / InnerProduct is extracted and
measured:

- `max`: input scale = 127 / max|x| over all calibration inputs;
- `kl` (ncnn2table's default): a 2048-bin histogram of |x| (zeros left out) over
  [0, max|x|], the clipping bin count t ≥ 128 with the least KL divergence between the
  clipped histogram and its 128-level quantization (`passes.quantize_int8.kl_threshold`),
  threshold = (t + 0.5)·max/2048, input scale = 127 / threshold.

Weight scales are ncnn2table's (`passes.quantize_int8.weight_scales`; `table_weight_sets` for
the recurrent layers and MultiHeadAttention, which need no run). The result is an
`Int8Table` (ncnn2table's format).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from paramsurgery.ir.graph import Graph
from paramsurgery.passes.quantize_int8 import (ACTIVATION_TYPES, Int8Table, _ip, kl_threshold,
                                               table_weight_sets, weight_scales)
from paramsurgery.runtime.child import FeedLike
from paramsurgery.verify.compare.options import PARITY
from paramsurgery.verify.precision.batch import Variant, Worker
from paramsurgery.formats.param_text import dumps

HISTOGRAM_BINS = 2048
METHODS = ("kl", "max")


class CalibrationFailed(RuntimeError):
    pass


@dataclass
class BlobStat:
    layer: str
    blob: str
    absmax: float = 0.0
    threshold: float = 0.0
    histogram: np.ndarray = field(default_factory=lambda: np.zeros(HISTOGRAM_BINS, np.int64))

    @property
    def scale(self) -> float:
        return 1.0 if self.threshold == 0.0 else float(np.float32(127) / np.float32(self.threshold))


def calibration_layers(graph: Graph, keep: set[str] = frozenset()) -> list:  # type: ignore[assignment]
    """The layers whose input scale calibration measures."""
    out = []
    for layer in graph:
        if layer.type not in ACTIVATION_TYPES or layer.name in keep:
            continue
        if _ip(layer.params, 8, 0):
            continue
        if layer.type != "InnerProduct" and _ip(layer.params, 19, 0):
            continue
        out.append(layer)
    return out


def calibrate(graph: Graph, bin: str, inputs: Sequence[Mapping[str, FeedLike]], *,
              method: str = "kl", keep: set[str] = frozenset(),  # type: ignore[assignment]
              timeout: float = 600.0) -> tuple[Int8Table, list[BlobStat]]:
    layers = calibration_layers(graph, keep)
    stats = [BlobStat(layer.name, layer.inputs[0]) for layer in layers]
    table = Int8Table()
    # the weight-only layers' scales need no run; ncnn2table writes them all the same
    for layer in graph:
        sets = None if layer.name in keep else table_weight_sets(layer)
        if sets:
            table.weights[layer.name], table.more_weights[layer.name] = sets[0], sets[1:]
    if not layers:
        return table, stats
    text = dumps(graph)
    blobs = sorted({s.blob for s in stats})
    with Worker(bin, inputs[0], timeout=timeout) as worker:
        results = worker.run([Variant(text, dict(PARITY), blobs, feeds=feeds) for feeds in inputs])
    for i, r in enumerate(results):
        if not r.ok:
            raise CalibrationFailed(f"calibration input {i}: ncnn {r.status} {r.message}".strip())
    arrays = [r.arrays for r in results]
    for s in stats:
        s.absmax = max(float(np.max(np.abs(a[s.blob]))) if a[s.blob].size else 0.0
                       for a in arrays)
        if s.absmax == 0.0:
            continue
        if method == "max":
            s.threshold = s.absmax
            continue
        absmax = np.float32(s.absmax)
        for a in arrays:
            v = np.abs(np.asarray(a[s.blob], np.float32).reshape(-1))
            v = v[v != 0]
            idx = np.minimum((v / absmax * np.float32(HISTOGRAM_BINS)).astype(np.int64),
                             HISTOGRAM_BINS - 1)
            s.histogram += np.bincount(idx, minlength=HISTOGRAM_BINS)
        t = kl_threshold(s.histogram)
        s.threshold = float((np.float32(t) + np.float32(0.5)) * absmax / np.float32(HISTOGRAM_BINS))
    for layer, s in zip(layers, stats):
        table.weights[layer.name] = weight_scales(layer)
        table.inputs[layer.name] = s.scale
    return table, stats
