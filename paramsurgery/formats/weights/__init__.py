"""Weights: the exact `.bin` layout of every ncnn layer type.

- `schema`  which blobs each layer type reads, as a function of its params (one function
  per type, checked read for read against the ncnn wheel);
- `tags`    the storage forms of a blob (fp32, fp16, bf16, int8, ... tags and padding);
- `binfile` the memory-mapped reader and streaming writer (`Weight`, `LayerWeights`);
- `synth`   random weights of exactly the layout a `.param` needs (`synth-bin`);
- `oracle`  a recording `ncnn.DataReader`: every read `Net.load_model` makes.

Typical use::

    g = paramsurgery.load("m.param", bin="m.bin")   # layer.weights for every layer
    w = g.layer("fc").weights["weight"]              # Weight: dtype, shape, offset, nbytes
    x = w.array()                                    # zero-copy read-only numpy view
    replace_weight(g.layer("fc"), "bias", np.zeros(10, np.float32))
    save(g, "out.param", bin="out.bin")              # untouched bytes copied kernel-side
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paramsurgery.formats.weights.binfile import (LayerWeights, Weight, WeightFile, attach_weights,
                                                  make_weight, replace_weight, set_weights, weights_bytes,
                                                  write_weights)
from paramsurgery.formats.weights.schema import (NO_WEIGHTS, SCHEMAS, Read, SchemaError, has_schema,
                                                 layer_reads, reads_for, register_schema)
from paramsurgery.formats.weights.synth import synth_size, synth_weights, write_synth_bin

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph

__all__ = [
    "LayerWeights", "Weight", "WeightFile", "Read", "SchemaError", "SCHEMAS", "NO_WEIGHTS",
    "attach_weights", "write_weights", "weights_bytes", "weight_summary", "set_weights",
    "replace_weight", "make_weight", "reads_for", "layer_reads", "has_schema",
    "register_schema", "weights_fingerprint", "synth_weights", "write_synth_bin", "synth_size",
]


def weight_summary(graph: "Graph") -> dict[str, Any]:
    """Weight bytes of a graph with a `.bin` attached: total, per layer type and per storage
    dtype (tags and pad included), plus the file size, trailing bytes and layers whose type
    has no schema (assumed to read nothing)."""
    by_type: dict[str, int] = {}
    by_dtype: dict[str, int] = {}
    count_by_type: dict[str, int] = {}
    total = 0
    blobs = 0
    assumed = []
    for layer in graph:
        lw = layer.weights
        if lw is None:
            continue
        if getattr(lw, "assumed", False):
            assumed.append({"name": layer.name, "type": layer.type, "line": layer.source_line})
        if not len(lw):
            continue
        n = lw.nbytes
        total += n
        by_type[layer.type] = by_type.get(layer.type, 0) + n
        count_by_type[layer.type] = count_by_type.get(layer.type, 0) + 1
        for w in lw:
            blobs += 1
            by_dtype[w.dtype] = by_dtype.get(w.dtype, 0) + w.nbytes
    wf = graph.weights
    return {
        "file": getattr(wf, "path", None),
        "file_bytes": getattr(wf, "size", total),
        "total_bytes": total,
        "trailing_bytes": getattr(wf, "trailing", 0),
        "blobs": blobs,
        "by_type": dict(sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))),
        "layers_by_type": dict(sorted(count_by_type.items(), key=lambda kv: kv[0])),
        "by_dtype": dict(sorted(by_dtype.items(), key=lambda kv: (-kv[1], kv[0]))),
        "assumed_no_weights": assumed,
    }


def weights_fingerprint(graph: "Graph") -> dict[str, str]:
    """Layer name → sha256 of its weights, for every layer holding any: compare before and
    after a pass to prove which weights it touched."""
    out = {}
    for layer in graph:
        lw = layer.weights
        if lw is not None and len(lw):
            out[f"{layer.name}#{layer.id}"] = lw.sha256
    return out
