"""An SDPA mask proven all zero at every length is dropped (`lower` runs it first).

HF's encoders called without `attention_mask` build the default all-ones padding mask in
the graph (BERT: `torch.ones((B, T))` → `[:, None, None, :]` → `expand(B, 1, T, T)` →
`1.0 - m` → `masked_fill(m.to(bool), finfo.min)`): every element is 0 whatever T is, but
pnnx's dynamic export leaves `torch.ones`, `Tensor.expand`, `Tensor.to` and
`Tensor.masked_fill`, none of which ncnn loads, and the broadcasting expand has no
length-correct ncnn form. Adding 0.0 to a score is exact, so the SDPA without its mask
input (`5=0`) computes the same values bit for bit; the construction is then unread.

The value is proven element-independent, not traced: a walk over the producers of the mask
(worklist, each blob once) computes the one value every element holds, from
- `torch.ones` / `torch.zeros` / `torch.full` (its `fill_value` from X.pnnx.param) of any
  size, a one-element MemoryData;
- layers that only move or copy elements (Split, Reshape, ExpandDims, Squeeze, Permute,
  Crop, Flatten, Tile, `Tensor.expand` / `reshape` / `view` / `repeat` / `contiguous`);
- casts (`Tensor.to` to bool: v ≠ 0; to an integer dtype: truncation; to float: v);
- BinaryOp of uniform operands or with a scalar (add, sub, mul, div, max, min, rsub, rdiv);
- `Tensor.masked_fill(x, m, v)` with m uniform (false: x, true: v) and `torch.where`.
Anything else (a graph input, a computed tensor) leaves the value unknown and the mask
alone. Only exactly 0.0 is dropped: a uniform non-zero shift leaves the softmax the same in
exact arithmetic but not in float32.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from paramsurgery.core.changes import Change
from paramsurgery.core.layer_types import ELEMENT_MOVING
from paramsurgery.core.ncnn import BinaryOpType
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import PnnxGraph

# copy or move elements from bottom 0 (further bottoms give only a shape)
_MOVING = tuple(ELEMENT_MOVING) + ("Crop", "Reshape", "Tile", "Tensor.expand", "Tensor.expand_as",
                                   "Tensor.reshape", "Tensor.view", "Tensor.repeat",
                                   "Tensor.contiguous", "torch.flatten", "torch.unsqueeze",
                                   "torch.squeeze", "Tensor.unsqueeze", "Tensor.squeeze")
_CASTS = ("Tensor.to", "Tensor.float", "Tensor.bool", "Tensor.long", "Tensor.int", "aten::to")
_FILLS = {"torch.ones": 1.0, "torch.zeros": 0.0, "torch.ones_like": 1.0, "torch.zeros_like": 0.0}
_BINARY: dict[int, Callable[[float, float], float]] = {
    int(BinaryOpType.ADD): lambda a, b: a + b, int(BinaryOpType.SUB): lambda a, b: a - b,
    int(BinaryOpType.MUL): lambda a, b: a * b, int(BinaryOpType.MAX): max, int(BinaryOpType.MIN): min,
    int(BinaryOpType.RSUB): lambda a, b: b - a,
    int(BinaryOpType.DIV): lambda a, b: a / b if b else math.nan,
    int(BinaryOpType.RDIV): lambda a, b: b / a if a else math.nan,
}


def _f32(v: float) -> float:
    return float(np.float32(v))


def _number(v: object) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(str(v))
    except ValueError:
        return None


def _leaf(g: Graph, layer: Layer, pnnx: "PnnxGraph | None") -> tuple[bool, float | None]:
    """(True, v) when `layer` makes a uniform value from no tensor input; (False, None)
    when its value depends on its bottoms; (True, None) when it is not uniform."""
    t = layer.type
    if t in _FILLS:
        return True, _FILLS[t]
    if t == "torch.full":
        op = pnnx.op_by_name(layer.name) if pnnx is not None else None
        v = _number(op.param("fill_value")) if op is not None and op.type == t else None
        return True, None if v is None else _f32(v)
    if t == "MemoryData":
        if not layer.weights or not len(layer.weights):
            return True, None
        arr = layer.weights[0].array().reshape(-1)
        return True, (float(arr[0]) if arr.size == 1 else None)
    return False, None


def _data_inputs(g: Graph, layer: Layer, pnnx: "PnnxGraph | None") -> list[str] | None:
    """The bottoms whose values `layer`'s value is computed from (None: not a uniform-
    preserving layer)."""
    t = layer.type
    if t in _MOVING or t in _CASTS:
        return list(layer.inputs[:1])
    if t == "BinaryOp":
        op = layer.params.get(0, 0)
        if not isinstance(op, int) or op not in _BINARY:
            return None
        return list(layer.inputs[:1] if layer.params.get(1, 0) else layer.inputs[:2])
    if t in ("Tensor.masked_fill", "torch.where"):
        return list(layer.inputs)
    return None


def _combine(layer: Layer, values: list[float], pnnx: "PnnxGraph | None",
             blob_value: dict[str, float | None]) -> float | None:
    t = layer.type
    if t in _MOVING:
        return values[0]
    if t in _CASTS:
        op = pnnx.op_by_name(layer.name) if pnnx is not None else None
        dtype = str(op.param("dtype")) if op is not None and op.type == t else \
            {"Tensor.float": "torch.float", "Tensor.bool": "torch.bool"}.get(t, "")
        v = values[0]
        if dtype == "torch.bool":
            return 1.0 if v != 0 else 0.0
        if dtype in ("torch.float", "torch.float32"):
            return v
        if dtype in ("torch.int64", "torch.long", "torch.int32", "torch.int"):
            return float(math.trunc(v)) if math.isfinite(v) else None
        return None
    if t == "BinaryOp":
        fn = _BINARY[int(layer.params.get_int(0, 0))]
        b = _number(layer.params.get(2, 0.0)) if layer.params.get(1, 0) else values[1]
        return None if b is None else _f32(fn(values[0], b))
    if t == "Tensor.masked_fill":
        op = pnnx.op_by_name(layer.name) if pnnx is not None else None
        if op is None or op.type != t:
            return None
        x_name, m_name = op.arg_names.get("input"), op.arg_names.get("mask")
        if x_name not in op.inputs or m_name not in op.inputs:
            return None
        x = blob_value.get(layer.inputs[op.inputs.index(x_name)])
        m = blob_value.get(layer.inputs[op.inputs.index(m_name)])
        fill = _number(op.param("value"))
        if m is None:
            return None
        return x if m == 0 else (None if fill is None else _f32(fill))
    if t == "torch.where" and len(values) == 3:
        return values[1] if values[0] != 0 else values[2]
    return None


def uniform_value(g: Graph, blob: str, pnnx: "PnnxGraph | None") -> float | None:
    """The one value every element of `blob` holds at every length, or None when that is
    not proven (iterative post-order over the producers, each blob once)."""
    value: dict[str, float | None] = {}
    stack: list[tuple[str, bool]] = [(blob, False)]
    while stack:
        b, expanded = stack.pop()
        if b in value and not expanded:
            continue
        layer = g.producer(b)
        if layer is None or layer.type == "Input":
            value[b] = None
            continue
        leaf, v = _leaf(g, layer, pnnx)
        if leaf:
            value[b] = v
            continue
        ins = _data_inputs(g, layer, pnnx)
        if ins is None or not ins:
            value[b] = None
            continue
        if not expanded:
            stack.append((b, True))
            stack.extend((i, False) for i in ins if i not in value)
            continue
        vals = [value.get(i) for i in ins]
        if layer.type == "Tensor.masked_fill":
            value[b] = _combine(layer, [], pnnx, value)
        elif any(x is None for x in vals):
            value[b] = None
        else:
            value[b] = _combine(layer, [x for x in vals if x is not None], pnnx, value)
    return value.get(blob)


def drop_zero_masks(g: Graph, pnnx: "PnnxGraph | None") -> list[Change]:
    """Drop the mask input of every SDPA (no cache) whose mask is proven all 0.0."""
    changes: list[Change] = []
    for sdpa in list(g.by_type("SDPA")):
        if sdpa.params.get(5, 0) != 1 or sdpa.params.get(7, 0) or len(sdpa.inputs) != 4:
            continue
        mask = sdpa.inputs[3]
        v = uniform_value(g, mask, pnnx)
        if v is None or v != 0.0:
            continue
        src = g.producer(mask)
        params = {k: v for k, v in sdpa.params.items() if k != 5}
        line = sdpa.source_line
        g.replace_layer(sdpa, "SDPA", sdpa.name, inputs=sdpa.inputs[:3], params=params)
        removed = g.remove_dead([src] if src is not None else [])
        g.remove_trivial_splits()
        changes.append(Change(
            sdpa.name, "mask proven all 0 at every length (adding 0.0 is exact): dropped",
            f"SDPA {sdpa.name} 5=1 mask {mask}",
            f"SDPA {sdpa.name} without a mask; removed {', '.join(removed) or 'nothing'}", line))
    return changes
