"""Constants pnnx folded from the first trace that are that trace's length, read as the
length again (the first step of `lower`).

pnnx 20261020 folds arithmetic on the size of a dim it reached through an op such as
`transpose` into a constant of the first trace: `torch.ones(B) * x.shape[-1]` after
`x.transpose(1, 2)` becomes `pnnx_fold_N` = 12 when traced at 12 (repro case
`size-after-transpose-folded`). A dynamic export then computes with the traced length at
every length; HF's ECAPA attentive pooling (`_length_to_mask(lengths * seq_len)` and
`mask.sum()`, the Qwen3-TTS speaker encoder) keeps its mask and its mean at T = 300.

Evidence. pnnx's record of the shapes it traced with: its test script `X_ncnn.py` next to
`X.ncnn.param` (`torch.rand(1, 300, 16)`: the first `inputshape`, and the batch axis of
every input), or `--traced-len T` for the one dynamic input dim; the `?` dims of the inputs
in `X.pnnx.param` say which dims are dynamic. A folded constant (a `MemoryData` named
`pnnx_fold_*`) is read as the run-time extent of a dynamic input dim only when
- it holds one element, equal to that dim's traced extent and to no other dynamic dim's;
- the pnnx op reading it also reads a tensor with a dynamic (`?`) dim (the constant takes
  part in arithmetic at the input's length, as a length does).
Anything else is left as it is; a comparison reading a folded constant is then refused by
`lower`, naming the constant and the evidence that would let it proceed.

The extent is computed from the input itself: a MemoryData of ones cropped to the input's
extent (a two-bottom Crop with a shape expression, `20="1h"`) and summed (Reduction: the
partial sums are integers below 2**24, so exact in float32 in any order), reshaped to the
constant's own shape. Exact for extents up to `ARANGE_TABLE`.

Assumption (stated, not provable from the files): a value pnnx computed from the trace that
equals the traced length is that length. A model meaning, say, `min(T, 300)` traced at 300
would be rewritten wrongly above 300; pnnx keeps only the number.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.changes import Change

from paramsurgery.core.ncnn import NO_BATCH
_LETTERS = {1: "w", 2: "hw", 3: "chw", 4: "cdhw"}  # ncnn axes outermost first, by rank


@dataclass(frozen=True)
class TracedDim:
    """One dynamic dim of a graph input and its extent at pnnx's first trace."""

    blob: str       # the ncnn input blob (`in0`)
    dim: int        # the torch dim in the traced shape
    traced: int     # its extent at the first trace
    letter: str     # the ncnn axis holding it (`w`, `h`, `d`, `c`)
    symbol: str     # its name in the shape analysis


@dataclass
class TraceEvidence:
    """What is known of the first trace: the dynamic input dims with their traced extents
    (empty, with `missing` saying why, when nothing records them) and every input's shape
    for the shape analysis (ncnn numpy order, symbols for dynamic dims)."""

    dims: list[TracedDim] = field(default_factory=list)
    inputshape: dict[str, tuple] = field(default_factory=dict)
    missing: str = ""
    source: str = ""


def trace_evidence(pnnx: object, traced_path: str | os.PathLike | None,
                   traced_len: int | None = None) -> TraceEvidence:
    """The traced extents of the dynamic input dims, from pnnx's `X_ncnn.py` next to
    `X.pnnx.param` or from `traced_len` (one dynamic dim)."""
    script = _script_next_to(traced_path)
    specs: dict[str, tuple[tuple[int, ...], int | None]] = {}
    if script is not None:
        from paramsurgery.formats.pnnx_reference import read_pnnx_script

        for spec in read_pnnx_script(script)[0]:
            specs[spec.blob] = (tuple(spec.shape), spec.batch_index)
    ev = TraceEvidence(source=os.path.basename(script) if script else "")
    inputs = list(pnnx.inputs)  # type: ignore[attr-defined]
    dynamic = [(i, d) for i, o in enumerate(inputs) for d, n in enumerate(o.shape or ())
               if n is None]
    names = {key: ("T" if len(dynamic) == 1 else f"T{k}") for k, key in enumerate(dynamic)}
    for i, operand in enumerate(inputs):
        blob = f"in{i}"
        shape = tuple(operand.shape or ())
        traced, batch = specs.get(blob, (None, None))
        if batch is None:
            batch = 0 if len(shape) >= 2 and shape[0] == 1 else NO_BATCH  # pnnx's choice
        kept = [d for d in range(len(shape)) if d != batch]
        ev.inputshape[blob] = tuple(names.get((i, d), shape[d]) for d in kept)
        letters = _LETTERS.get(len(kept), "")
        for d in kept:
            if shape[d] is not None:
                continue
            value = traced[d] if traced is not None and d < len(traced) else None
            if value is None and traced_len is not None and len(dynamic) == 1:
                value, ev.source = traced_len, "--traced-len"
            if value is None or not letters:
                continue
            ev.dims.append(TracedDim(blob, d, int(value), letters[kept.index(d)],
                                     names[(i, d)]))
    if not ev.dims:
        ev.missing = ("nothing records the length pnnx traced at: keep pnnx's X_ncnn.py next "
                      "to X.ncnn.param, or give --traced-len T")
    return ev


def _script_next_to(traced_path: str | os.PathLike | None) -> str | None:
    if traced_path is None:
        return None
    p = os.fspath(traced_path)
    if not p.endswith(".pnnx.param"):
        return None
    cand = p[: -len(".pnnx.param")] + "_ncnn.py"
    return cand if os.path.isfile(cand) else None


def folded_value(layer: Layer) -> float | None:
    """The one value of a one-element `MemoryData` (None when it has more, or no weights)."""
    if layer.type != "MemoryData" or not layer.weights or len(layer.weights) != 1:
        return None
    w = layer.weights[0]
    if w.count != 1:
        return None
    return float(w.array().reshape(-1)[0])


def is_folded(layer: Layer | None) -> bool:
    return layer is not None and layer.type == "MemoryData" and layer.name.startswith("pnnx_fold")


def frozen_lengths(g: Graph, pnnx: object, ev: TraceEvidence,
                   value_of: Callable[[Layer], float | None] | None = None
                   ) -> tuple[list[tuple[Layer, TracedDim, float]], dict[str, str]]:
    """The folded constants proven to be a traced extent (module doc), each with its dim and
    value, and, by layer name, why each other one-element folded constant is not.
    `value_of` reads a constant's value (default: the layer's loaded weights)."""
    found: list[tuple[Layer, TracedDim, float]] = []
    kept: dict[str, str] = {}
    if not ev.dims:
        return found, kept
    read = value_of or folded_value
    readers: dict[str, list] = {}
    for op in pnnx.ops:  # type: ignore[attr-defined]
        for name in op.inputs:
            readers.setdefault(name, []).append(op)
    for layer in g.by_type("MemoryData"):
        if not is_folded(layer):
            continue
        value = read(layer)
        if value is None:
            if not layer.weights:  # one holding more than one value is no length
                kept[layer.name] = "its value is in the .bin, which is not loaded (--bin)"
            continue
        matches = [d for d in ev.dims if d.traced == value]
        if len(matches) != 1:
            traced = ", ".join(f"{d.blob} dim {d.dim} = {d.traced}" for d in ev.dims)
            kept[layer.name] = (
                f"{value:g} is the traced extent of {len(matches)} input dims: which one is "
                f"not known" if matches else
                f"{value:g} is not the traced extent of a dynamic input dim ({traced}, "
                f"{ev.source}), so what pnnx computed it from is not known")
            continue
        dim = matches[0]
        attr = pnnx.op_by_name(layer.name)  # type: ignore[attr-defined]
        operand = attr.outputs[0] if attr is not None and attr.outputs else None
        users = readers.get(operand, []) if operand is not None else []
        if not any(pnnx.operand(o) is not None and None in (pnnx.operand(o).shape or ())  # type: ignore[attr-defined]
                   for op in users for o in op.inputs if o != operand):
            kept[layer.name] = (f"{value:g} equals the traced extent of {dim.blob} dim "
                                f"{dim.dim}, but no op reads it with a tensor of a dynamic "
                                f"length: left as a constant")
            continue
        found.append((layer, dim, value))
    return found, kept


def thaw(g: Graph, pnnx: object, ev: TraceEvidence, facts: dict,
         table: int) -> tuple[list[Change], dict[str, str]]:
    """Rewrite every folded constant proven to be a traced extent (`frozen_lengths`) into
    that extent computed from the input. Returns the changes and, by layer name, why each
    other folded constant was left alone; `facts[blob] = (lo, hi)` records the value bounds
    of each rewritten constant."""
    from paramsurgery.analysis.shapes.affine import Affine
    from paramsurgery.formats.weights import set_weights

    changes: list[Change] = []
    found, notes = frozen_lengths(g, pnnx, ev)
    for layer, dim, value in found:
        if g.weights is None:
            notes[layer.name] = (f"{value:g} is the traced extent of {dim.blob} dim "
                                 f"{dim.dim}; computing it adds a MemoryData to the .bin: "
                                 f"load the weights (--bin)")
            continue
        line = layer.source_line
        shape = [layer.params.get(k, 0) for k in (0, 1, 11, 2)]
        rank = sum(1 for n in shape if n)
        top = layer.outputs[0]
        ones = g.add_layer("MemoryData", g.unique_layer_name(f"{layer.name}_ones"), [],
                           [g.unique_blob_name(f"{top}_ones")], {0: table}, before=layer)
        set_weights(ones, {"data": np.ones(table, dtype=np.float32)})
        crop = g.add_layer("Crop", g.unique_layer_name(f"{layer.name}_extent"),
                           [ones.outputs[0], dim.blob], [g.unique_blob_name(f"{top}_extent")],
                           {19: "0", 20: f"1{dim.letter}", 21: "0"}, before=layer)
        params: dict[int, object] = {0: 0, 1: 1, 4: 1, 5: 1}  # sum of all, keep dims
        if rank <= 1:
            g.replace_layer(layer, "Reduction", layer.name, inputs=[crop.outputs[0]],
                            params=params)
            after = f"MemoryData {ones.name}, Crop {crop.name}, Reduction {layer.name}"
        else:
            total = g.add_layer("Reduction", g.unique_layer_name(f"{layer.name}_sum"),
                                [crop.outputs[0]], [g.unique_blob_name(f"{top}_sum")],
                                params, before=layer)
            dims = {k: 1 for k, n in zip((0, 1, 11, 2), shape) if n}
            g.replace_layer(layer, "Reshape", layer.name, inputs=[total.outputs[0]],
                            params=dims)
            after = (f"MemoryData {ones.name}, Crop {crop.name}, Reduction {total.name}, "
                     f"Reshape {layer.name}")
        sym = Affine.symbol(dim.symbol)
        facts[top] = (sym, sym)
        changes.append(Change(layer.name, f"thaw [a constant pnnx folded at the first trace "
                                          f"= {dim.blob} dim {dim.dim} there ({dim.traced}, "
                                          f"{ev.source}): its extent at run time]",
                              f"MemoryData {layer.name} = {value:g}", after, line))
    if changes:
        g.insert_splits()  # the input now also feeds the extent Crop
    return changes, notes
