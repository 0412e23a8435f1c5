"""The inputs of a comparison: one array per graph input, as fed to ncnn, with pnnx's batch
axis (`Feed`).

Sources, in order: `--inputs inputs.npz` (keys = input blob names, or the fixtures'
`input_<name>` keys paired through pnnx's traced shapes; `batch_index_<blob>` scalars
optional), then arrays generated at the traced shapes: pnnx's `X_ncnn.py` next to the
file (its first `inputshape` and batch axes), or a static export's input operands in
`X.pnnx.param`. A batch axis nobody recorded is guessed like pnnx chooses it (axis 0 of a
rank >= 2 input whose leading size is 1). Graph inputs the source does not cover are fed
empty (a kv-cache input at the prefill).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.runtime.child import NO_BATCH, Feed, FeedLike, _as_feed

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import PnnxGraph
    from paramsurgery.ir.graph import Graph
    from paramsurgery.formats.pnnx_reference import InputSpec


def input_order(graph: "Graph") -> list[str]:
    """Graph inputs as pnnx numbers them (`in0`, `in1`, …), others after in graph order."""
    from paramsurgery.formats.pnnx_mapping import input_key

    return sorted(graph.inputs, key=input_key)


def traced_input_specs(graph: "Graph", param_path: str | None, pnnx: "PnnxGraph | None",
                       given: "Sequence[InputSpec] | None" = None) -> tuple[list["InputSpec"] | None, str]:
    """The input shapes a run uses when no data is given: `given` specs, pnnx's `X_ncnn.py`
    next to the file, or a static export's traced input shapes. (specs, where from)."""
    from paramsurgery.formats.pnnx_reference import InputSpec, find_pnnx_script, read_pnnx_script

    ins = input_order(graph)
    if given:
        return [replace(s, blob=ins[i]) if i < len(ins) and s.blob not in ins else s
                for i, s in enumerate(given)], "given"
    script = find_pnnx_script(param_path) if param_path else None
    if script:
        try:
            specs, _ = read_pnnx_script(script)
        except (OSError, ValueError):
            specs = []
        if specs and [s.blob for s in specs] == ins:
            return specs, "traced"
    if pnnx is not None and not pnnx.is_dynamic:
        p_ins = pnnx.inputs
        if len(p_ins) == len(ins) and all(o.shape is not None for o in p_ins):
            return [InputSpec(b, tuple(o.shape or ()), "i32" if o.is_int else "f32", None)
                    for b, o in zip(ins, p_ins)], "traced"
    return None, ""


def script_batch_axes(param_path: str | None) -> dict[str, int]:
    """The batch axis pnnx's `X_ncnn.py` feeds each input with (empty when absent)."""
    from paramsurgery.formats.pnnx_reference import find_pnnx_script, read_pnnx_script

    script = find_pnnx_script(param_path) if param_path else None
    if not script:
        return {}
    try:
        specs, _ = read_pnnx_script(script)
    except (OSError, ValueError):
        return {}
    return {s.blob: s.batch_index for s in specs if s.batch_index is not None}


def traced_inputshape(graph: "Graph", param_path: str | None) -> tuple[dict[str, tuple[int, ...]], str]:
    """The inputs' ncnn shapes (pnnx's batch axis dropped) at pnnx's traced shapes: its
    `X_ncnn.py` next to the file, else a static export's `X.pnnx.param`; ({}, "") when
    neither is there (or readable). Also says where they came from."""
    from paramsurgery.core.errors import ParamSurgeryError
    from paramsurgery.formats.pnnx_param import find_pnnx_param, read_pnnx_param
    from paramsurgery.formats.pnnx_reference import find_pnnx_script

    if not param_path:
        return {}, ""
    pnnx = None
    pnnx_path = find_pnnx_param(param_path)
    if pnnx_path:
        try:
            pnnx = read_pnnx_param(pnnx_path)
        except (OSError, ValueError, ParamSurgeryError):
            pnnx = None
    specs, _ = traced_input_specs(graph, param_path, pnnx)
    if not specs:
        return {}, ""
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        shape = list(spec.shape)
        b = spec.effective_batch_index()
        if b != NO_BATCH and 0 <= b < len(shape):
            del shape[b]
        out[spec.blob] = tuple(shape)
    script = find_pnnx_script(param_path)
    where = os.path.basename(script) if script and [s.blob for s in specs] == \
        input_order(graph) else os.path.basename(pnnx_path or "")
    return out, where


def make_feeds(graph: "Graph", param_path: str | None, pnnx: "PnnxGraph | None",
               npz: str | None = None, given: "Sequence[InputSpec] | None" = None,
               seed: int = 0, inputshape: "Mapping[str, Sequence[int]] | None" = None,
               ) -> tuple[dict[str, Feed], str]:
    """Feeds for every input of `graph` and a phrase saying where they came from.
    `inputshape`: concrete numpy shapes by blob (`--inputshape`, symbols already bound),
    fed without a batch axis. Generated values come from `shapes.feeds` (ids within the
    Embed's range, causal masks, N(0, 1)). Raises ParamSurgeryError when there is nothing
    to make them from."""
    from paramsurgery.formats.pnnx_reference import REFERENCE_ERRORS, Reference
    from paramsurgery.analysis.shapes.feeds import make_feeds as generate

    if npz is not None:
        try:
            specs = Reference.load(npz, graph, pnnx).inputs
        except REFERENCE_ERRORS as exc:
            why = str(exc)
            why = why[len(npz) + 2:] if why.startswith(f"{npz}: ") else why
            raise ParamSurgeryError(f"cannot read the inputs: {why}", file=npz) from None
        if not specs:
            raise ParamSurgeryError(f"no array is named after an input blob of the graph "
                                    f"({', '.join(input_order(graph))})", file=npz)
        source = os.path.basename(npz)
        arrays = {s.blob: s.make_array() for s in specs}
    elif inputshape:
        from paramsurgery.formats.pnnx_reference import InputSpec

        specs = [InputSpec(b, tuple(int(d) for d in shp), batch_index=NO_BATCH)
                 for b, shp in inputshape.items()]
        arrays = generate(graph, {s.blob: s.shape for s in specs}, seed=seed)
        source = "--inputshape"
    else:
        traced, _ = traced_input_specs(graph, param_path, pnnx, given)
        if traced is None:
            raise ParamSurgeryError("no inputs: give --inputs inputs.npz (keys = input blob "
                                    "names) or --inputshape, or keep pnnx's X_ncnn.py / "
                                    "X.pnnx.param next to the file", file=param_path)
        specs = traced
        arrays = generate(graph, {s.blob: s.shape for s in specs}, seed=seed)
        source = "given shapes" if given else "traced shapes"
    axes = script_batch_axes(param_path)
    feeds: dict[str, Feed] = {}
    for s in specs:
        b = s.batch_index if s.batch_index is not None else axes.get(s.blob)
        if b is None:
            b = s.effective_batch_index()
        feeds[s.blob] = Feed(np.ascontiguousarray(arrays[s.blob]), b)
    for blob in input_order(graph):
        if blob not in feeds:
            feeds[blob] = Feed(np.zeros((0,), np.float32), NO_BATCH)
    return feeds, source


def largest_batch(feeds: "Mapping[str, FeedLike]") -> int:
    """The biggest ncnn batch `n` any input carries (1 when none has a batch axis)."""
    best = 1
    for f in map(_as_feed, feeds.values()):
        b = f.batch_index
        if b != NO_BATCH and 0 <= b < f.array.ndim:
            best = max(best, int(f.array.shape[b]))
    return best
