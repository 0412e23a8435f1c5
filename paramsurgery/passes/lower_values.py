"""Lowering rules for leftovers that compute values from shapes: `arange`, integer casts.

Composed into `lower`'s default rules (`paramsurgery.passes.lower.RULES`).

- `torch.arange(end)` with `end` a static number, or exactly the run-time extent of one dim
  of a tensor (`arange(x.shape[d])`, proven by `int_affine`): a `MemoryData` holding
  `start, start+1, ..., start+N-1` (N = `ARANGE_TABLE`) cropped against that tensor's extent
  by a two-bottom `Crop` with a shape expression (`20="1h"`). Exact for every extent up to
  N; the values are integers, exact in float32 (N < 2**24).
  Its positions' bounds and extent are recorded for `lower_masks` (comparisons, expand).
- Casts (`Tensor.to`, `.long()`, `.float()`, ...) between integer and float dtypes whose
  input does not come from a graph input: ncnn computes every layer in float32, so an
  integer tensor computed in the graph (positions from `arange`, shape arithmetic) already
  holds its integer values as floats, and the cast changes nothing. Integer tensors fed as
  graph inputs hold int32 bit patterns (what `Embed` reads): a cast of those is refused
  unless the cast is the input's only reader (through layout layers), goes int → float and
  feeds float arithmetic (HF's `position_ids.float()` of a positions input; not a graph
  output): then the input takes float values
  and the pass reports the contract change; refused as well are rounding casts (float →
  int of computed floats, float → f16/bf16). A bool → number
  cast of a comparison `lower_masks` lowered is the identity (it holds 0/1 already).
"""

from __future__ import annotations

import numpy as np

from paramsurgery.core.match import MatchFailure
from paramsurgery.ir.graph import Graph
from paramsurgery.analysis.int_affine import Affine, NotAffine, ShapeArith
from paramsurgery.passes.lowering import TABLE, Rule, Rules, Site, rule
from paramsurgery.passes.lower_layout import ncnn_axis
from paramsurgery.passes.lower_masks import COMPARISONS, record_positions

_VALUES: list[Rule] = []
ARANGE_TABLE = TABLE  # positions a lowered arange can produce
_LETTER = {-1: "w", -2: "h"}

_INTS = ("i8", "u8", "i16", "i32", "i64")
_FLOATS = ("f32", "f64")
_LAYOUT_ONLY = ("Split", "Reshape", "Crop", "Permute", "Squeeze", "ExpandDims", "Flatten",
                "Concat", "Slice", "Tensor.to", "Tensor.long", "Tensor.int", "Tensor.float")


# arange(start, L) = Crop(MemoryData[start .. start+N-1], [0, L - start)) against x's extent
@rule("torch.arange", doc="MemoryData [start, start+N) cropped to the extent (static, or a "
      "tensor's dim via a Crop shape expression)", into=_VALUES)
def arange(s: Site) -> str:
    op = s.op()
    start, step = op.param("start", 0), op.param("step", 1)
    start = 0 if start is None else start
    step = 1 if step is None else step
    if not isinstance(start, int) or step != 1:
        raise MatchFailure.declined(f"start={start!r} step={step!r}: only a static int start and step 1 "
                       f"are lowered")
    if not s.layer.inputs:
        end = op.param("end")
        if not isinstance(end, int) or end < start:
            raise MatchFailure.declined(f"end={end!r} is not a static int")
        n = end - start
        _needs_weights(s)
        return s.emit("MemoryData", [], {0: n}, "table",
                      {"data": np.arange(start, end, dtype=np.float32)})
    if len(s.layer.inputs) != 1:
        raise MatchFailure.declined(f"{len(s.layer.inputs)} computed bottoms (only a computed end is "
                       f"lowered)")
    arith = ShapeArith(s.g, s.traced())
    try:
        end = arith.value(s.layer.inputs[0])
    except NotAffine as exc:
        raise MatchFailure.declined(f"end is not exact shape arithmetic: {exc}") from None
    if not isinstance(end, Affine) or end.const != 0 or len(end.coefs) != 1 \
            or end.coefs[0][1] != 1 or end.coefs[0][0][0] != "size":
        raise MatchFailure.declined(f"end = {end}: only the extent of one dim (x.shape[d]) is lowered")
    sym = end.coefs[0][0]
    _, _, dim, shape = sym
    axis = ncnn_axis(s, dim, shape)
    if axis not in _LETTER:
        raise MatchFailure.declined(f"the extent of dim {dim} of {shape}: ncnn axis {axis} is c or d "
                       f"depending on the blob's rank, which the traced shape does not fix")
    ref = arith.reader[sym]
    _needs_weights(s)
    values = np.arange(start, start + ARANGE_TABLE, dtype=np.float32)
    if _read_as_ids(s):  # an Embed reads its ids as int32: the table holds int32 bit patterns
        values = np.arange(start, start + ARANGE_TABLE, dtype=np.int32).view(np.float32)
    table = s.emit("MemoryData", [], {0: ARANGE_TABLE}, "table", {"data": values})
    limit = f"1{_LETTER[axis]}" if start == 0 else f"-(1{_LETTER[axis]},{start})"
    record_positions(s, s.layer.outputs[0], start, ref, axis)
    return s.emit("Crop", [table, ref], {19: "0", 20: limit, 21: "0"}, "arange")


def _read_as_ids(s: Site) -> bool:
    """True when every reader of the arange (through layout-only layers) is an Embed's ids
    (GPT-2's `wpe(arange(T))` in a dynamic export): ncnn's Embed reads its bottom as int32,
    so float32 positions would be read as huge ids. Declines when Embeds and other layers
    both read it (one table cannot hold both)."""
    work, embeds, others = list(s.layer.outputs), [], []
    seen: set[str] = set()
    while work:
        b = work.pop()
        if b in seen:
            continue
        seen.add(b)
        for reader, slot in s.g.consumers(b):
            if reader.type == "Embed" and slot == 0:
                embeds.append(reader)
            elif reader.type in _LAYOUT_ONLY and slot == 0 and reader.type not in (
                    "Tensor.to", "Tensor.float", "Concat"):
                work.extend(reader.outputs)
            else:
                others.append(reader)
    if embeds and others:
        raise MatchFailure.declined(f"its positions are read both as ids by Embed "
                                    f"{embeds[0].name!r} (int32) and as values by "
                                    f"{others[0].type} {others[0].name!r} (float32)")
    return bool(embeds)


def _needs_weights(s: Site) -> None:
    if s.g.weights is None:
        raise MatchFailure.declined("it adds a MemoryData table to the .bin: load the weights (--bin; "
                       "for a param without weights, synth-bin's)")


# a cast of a value computed in the graph: ncnn already holds it as float32 (identity)
@rule("Tensor.to", "Tensor.long", "Tensor.int", "Tensor.float", "Tensor.double", "aten::to",
      doc="identity on values computed in the graph (ncnn holds them as float32)",
      into=_VALUES)
def int_cast(s: Site) -> str:
    op = s.op()
    src = op.arg_names.get("input") or (op.inputs[0] if op.inputs else None)
    traced = s.traced()
    src_operand = traced.operand(src) if src else None
    out_operand = traced.operand(op.outputs[0]) if op.outputs else None
    din = src_operand.dtype if src_operand else None
    dout = out_operand.dtype if out_operand else None
    if din is None or dout is None:
        raise MatchFailure.declined("pnnx recorded no dtype for its input or output")
    if din in _FLOATS and dout in _INTS:
        raise MatchFailure.declined(f"{din} -> {dout} rounds toward zero; ncnn has no such conversion")
    if not ({din, dout} <= set(_INTS + _FLOATS) or din == "bool"):
        raise MatchFailure.declined(f"{din} -> {dout} changes the values (ncnn computes in float32)")
    if din == "bool":
        prod = s.g.producer(s.g.above_splits(s.input(0)))
        if prod is None or prod.type in COMPARISONS or s.g.above_splits(s.input(0)) \
                not in s.shared.get("facts", {}):
            raise MatchFailure.declined("bool -> number: a comparison leftover produced it (lowered only "
                           "with the comparison)")
        return s.input(0)  # a lowered comparison already holds 0/1 as float32
    fed = _graph_input_source(s.g, s.input(0))
    if fed is not None and (din in _INTS) != (dout in _INTS):
        if din in _INTS and dout in _FLOATS and _read_only_by(s.g, fed, s.layer) and \
                s.g.consumers(s.layer.outputs[0]):  # computed on, not handed out as is
            # positions fed as ints and only ever used as floats (HF's rotary embedding:
            # `position_ids.float()`): the input takes float values instead
            s.shared.setdefault("contracts", []).append(
                f"input {fed!r}: was {din} ({s.layer.name} casts it to {dout}); now fed as "
                f"float32 values (the cast is gone: ncnn reads the Mat as floats)")
            return s.input(0)
        raise MatchFailure.declined(f"its {din} input comes from graph input {fed!r}, which ncnn holds as "
                       f"int32 bit patterns, not as float values")
    return s.input(0)


def _read_only_by(g: Graph, blob: str, cast) -> bool:
    """Every reader of graph input `blob`, through layout-only layers, is `cast`."""
    from paramsurgery.patterns.match import visit_once

    def expand(b: str) -> list[str]:
        return [o for c in g.consumer_layers(b) if c.id != cast.id for o in c.outputs]

    for b in visit_once([blob], expand):
        for c in g.consumer_layers(b):
            if c.id != cast.id and (c.type not in _LAYOUT_ONLY or c.type.startswith("Tensor.")):
                return False
    return True


def _graph_input_source(g: Graph, blob: str) -> str | None:
    """The graph input `blob` is a layout-only view of, if any (worklist over producers)."""
    from paramsurgery.patterns.match import visit_once

    def up(b: str) -> list[str]:
        p = g.producer(b)
        if p is None or p.type not in _LAYOUT_ONLY:
            return []
        # a Crop's / Reshape's second bottom is a shape reference: only its extents are
        # read, so an arange table cropped to in0's length holds positions, not in0's values
        return list(p.inputs[:1]) if p.type in ("Crop", "Reshape") else list(p.inputs)

    return next((b for b in visit_once([blob], up)
                 if (prod := g.producer(b)) is not None and prod.type == "Input"), None)


VALUE_RULES = Rules(_VALUES)
