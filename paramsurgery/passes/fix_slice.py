"""Repair Slices ncnn cannot run (`paramsurgery fix-slice`), pnnx-bugs.md case 2.

Three forms, each rewritten only when the axis and the sizes follow from the graph:

1. **A Slice with no slices and no indices** (`Slice unbind_0 1 3 in0 1 2 3`, or `-23300=0`):
   ncnn segfaults. The axis comes from pnnx's traced op (`torch.unbind dim=..`,
   `torch.chunk`, `torch.tensor_split`, `Tensor.split` in `X.pnnx.param`, paired by kind and
   order) or from the consumers: pnnx follows an unbind with one `Reshape 6="0w[,0h[,0d]]"`
   per output, which drops exactly the outermost axis, so the Slice input has one more dim
   than the Reshape keeps and the axis is the outermost (one element per output). Sizes: one
   per output for an unbind; for chunk/tensor_split from the traced extent (torch's rule:
   the first parts get the remainder); a dynamic extent that the parts may not divide is
   refused (ncnn and torch split it differently).
2. **A raw `torch.unbind`** left on pnnx's batch axis, and 3. **a `Slice 1=-233`** (slices of
   the batch axis): ncnn cannot slice its batch axis `n`. The batch axis is moved into a real
   outer axis (`Reshape 12=<b> 13=233 6="0w,..,0n"`), sliced there, and each part reshaped
   back without it. This needs the traced op (the batch dim, the rank); unbind outputs that
   pnnx then reads with `Reshape 12=0 13=233 6="0n"` (element on the batch axis) are given
   the element directly and that Reshape is removed.

Anything else is refused with what is missing.
"""

from __future__ import annotations

import re
from dataclasses import KW_ONLY
from typing import Sequence

from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.values import Ints
from paramsurgery.formats import pnnx_traced as _traced
from paramsurgery.core.changes import Change
from paramsurgery.passes.options import loaded_ops
from paramsurgery.passes.base import Pass, PassResult, RepairContext, keep_or_refuse
from paramsurgery.core.match import Match, MatchFailure, fail, matched

KIND_OPS = {"unbind": ("torch.unbind", "Tensor.unbind"), "chunk": ("torch.chunk", "Tensor.chunk"),
            "tensor_split": ("torch.tensor_split", "Tensor.tensor_split"),
            "split": ("torch.split", "Tensor.split")}
_DROP_RE = re.compile(r"^0w(,0h(,0d)?)?$")
_DIMS = ("w", "h", "d", "c")


def slice_kind(layer: Layer) -> str | None:
    """What pnnx made the layer from, by its name (`unbind_0`, `chunk_2`, ...)."""
    base = layer.name.split(".")[-1]
    for kind in ("tensor_split", "unbind", "chunk", "split"):
        if base.startswith(kind + "_") or base == kind or layer.type in KIND_OPS[kind]:
            return kind
    return None


def needs_fix(layer: Layer) -> str | None:
    """Why this layer is a broken Slice, or None."""
    if layer.type in ("torch.unbind", "Tensor.unbind"):
        return "raw torch.unbind"
    if layer.type != "Slice":
        return None
    if layer.params.get(1, 0) == -233:
        return "Slice on the batch axis (1=-233)"
    if not layer.params.get(0) and not layer.params.get(2):
        return "Slice without slices or indices"
    return None



class FixSlice(Pass, name="fix-slice", repair_order=40,
               summary="parameterless Slice / raw torch.unbind / batch-axis Slice → valid Slice (+ Reshape)"):
    @classmethod
    def claims(cls, layer: Layer) -> bool:
        return needs_fix(layer) is not None  # a raw torch.unbind

    @classmethod
    def for_fix(cls, ctx: RepairContext, asked: bool) -> "FixSlice | None":
        return cls(traced=ctx.traced_ops) if asked else None

    _: KW_ONLY
    traced: Sequence[_traced.PnnxOp] | None = None  # pnnx's ops (read by the command / fix)
    partial: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "traced", loaded_ops("FixSlice(traced=...)", self.traced))

    # ------------------------------------------------------------------ traced ops
    def _aligned(self, g: Graph) -> dict[int, _traced.PnnxOp]:
        """ncnn split-like layers ↔ pnnx ops, by kind and order (only when counts agree)."""
        out: dict[int, _traced.PnnxOp] = {}
        if self.traced is None:
            return out
        for kind, types in KIND_OPS.items():
            layers = [l for l in g.by_type("Slice", "torch.unbind", "Tensor.unbind")
                      if slice_kind(l) == kind]
            if not layers:
                continue
            ops = _traced.ops_of(self.traced, types)
            try:
                pairs = _traced.align(layers, ops)
            except MatchFailure:  # counts differ: pair on the graph inputs instead
                out.update(self._aligned_on_inputs(g, layers, ops))
                continue
            out.update((l.id, pairs[l.id]) for l in layers
                       if len(pairs[l.id].outputs) == len(l.outputs))
        return out

    def _aligned_on_inputs(self, g: Graph, layers: list[Layer],
                           ops: list[_traced.PnnxOp]) -> dict[int, _traced.PnnxOp]:
        """When the counts differ (pnnx fused some of its ops into other layers, e.g. RoPE's
        tensor_split into RotaryEmbed), pair a layer that reads graph input k with the one
        op of its kind that reads pnnx's input k (same output count)."""
        inputs = [lay.outputs[0] for lay in g.by_type("Input") if lay.outputs]
        pnnx_inputs = [op.outputs[0] for op in self.traced or ()
                       if op.type == "pnnx.Input" and op.outputs]
        out: dict[int, _traced.PnnxOp] = {}
        for lay in layers:
            if not lay.inputs or lay.inputs[0] not in inputs:
                continue
            k = inputs.index(lay.inputs[0])
            if k >= len(pnnx_inputs):
                continue
            cands = [op for op in ops if op.inputs and op.inputs[0] == pnnx_inputs[k]
                     and len(op.outputs) == len(lay.outputs)]
            if len(cands) == 1:
                out[lay.id] = cands[0]
        return out

    # ------------------------------------------------------------------ run
    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        cands = [(l, why) for l in g.layers if (why := needs_fix(l))]
        if not cands:
            result.notes.append("no parameterless, batch-axis or raw-unbind Slice")
            return result
        aligned = self._aligned(g)
        cands = self._merge_split_unbinds(g, cands, aligned, result)
        refused: list[MatchFailure] = []
        for layer, why in cands:
            op = aligned.get(layer.id)
            if why == "Slice without slices or indices":
                m = self._match_paramless(g, layer, op)
            else:
                m = self._match_batch(g, layer, op, why)
            if not m:
                refused.append(MatchFailure(layer.name, f"{why}: {m.reason}", line=layer.source_line))
                continue
            m.captures["apply"](g, m, result)
        keep_or_refuse(self.name, result, refused, partial=self.partial, what="layer(s)")
        return result

    def _merge_split_unbinds(self, g: Graph, cands: list[tuple[Layer, str]],
                             aligned: dict[int, _traced.PnnxOp], result: PassResult
                             ) -> list[tuple[Layer, str]]:
        """`Slice 1=-233` into parts whose every part is read only by a raw `torch.unbind`
        with as many outputs as the part has elements (an RVQ decode: `codes.split(...)`,
        then `enumerate` per part) is one unbind of the batch axis: the Slice and its
        unbinds become one raw `torch.unbind`, given the traced op of an unbind along the
        sliced dim, which the batch-axis rewrite below then handles."""
        out: list[tuple[Layer, str]] = []
        merged: set[int] = set()
        for layer, why in cands:
            if layer.id in merged:
                continue
            op = aligned.get(layer.id)
            unbinds = [g.consumer_layers(b) for b in layer.outputs] \
                if why.startswith("Slice on the batch axis") and op is not None else []
            dims = op.ints("dim") if op is not None else None
            shape = op.in_shape if op is not None else None
            if not unbinds or not all(len(r) == 1 and r[0].type in KIND_OPS["unbind"]
                                      for r in unbinds) or not dims or shape is None \
                    or shape[dims[0] % len(shape)] != sum(len(r[0].outputs) for r in unbinds) \
                    or op is None:
                out.append((layer, why))
                continue
            parts = [r[0] for r in unbinds]
            tops = [t for p in parts for t in p.outputs]
            line = layer.source_line
            for p in parts:
                merged.add(p.id)
                g.remove_layer(p)
            new = g.replace_layer(layer, "torch.unbind", layer.name, inputs=list(layer.inputs),
                                  outputs=tops, params={})
            aligned[new.id] = _traced.pnnx_op("torch.unbind", op.name, list(op.inputs[:1]),
                                              [f"{op.name}.{i}" for i in range(len(tops))],
                                              {"dim": str(dims[0])}, dict(op.shapes), op.line)
            result.changes.append(Change(layer.name, f"Slice of the batch axis + "
                                         f"{len(parts)} unbinds of its parts = one unbind of "
                                         f"{len(tops)}", ", ".join(p.name for p in parts),
                                         f"torch.unbind {layer.name}", line))
            result.modified = True
            out.append((new, "raw torch.unbind"))
        return [(lay, why) for lay, why in out if lay.id not in merged]

    # ------------------------------------------------------------------ 1. parameterless
    def _match_paramless(self, g: Graph, layer: Layer, op: _traced.PnnxOp | None) -> Match:
        k = len(layer.outputs)
        kind = slice_kind(layer)
        if op is not None:
            shape = op.in_shape
            dims = op.ints("dim")
            if shape is None or not dims:
                return fail(layer, f"pnnx op {op.name!r} has no dim= or traced input shape")
            d = dims[0] % len(shape)
            axis = d - len(shape)  # negative: unaffected by a dropped leading batch axis
            extent = shape[d]
            if kind == "unbind" or op.type.endswith("unbind"):
                sizes = [1] * k
            else:
                if extent is None:
                    return fail(layer, f"the traced extent along dim {d} is dynamic; torch gives "
                                       f"the first parts the remainder and ncnn the last, so the "
                                       f"sizes are unknowable at runtime")
                split = _torch_split_sizes(op, extent, k)
                if split is None:
                    return fail(layer, f"cannot recover the split sizes of pnnx op {op.name!r} "
                                       f"({op.type} {op.params})")
                sizes = split
            return matched(layer, axis=axis, sizes=sizes, how=f"pnnx op {op.name!r} "
                           f"(line {op.line}): dim {d} of {_fmt(shape)}",
                           apply=self._apply_paramless)
        # consumers: one `Reshape 6="0w[,0h[,0d]]"` per output drops the outermost axis
        kept = set()
        for b in layer.outputs:
            readers = g.consumer_layers(b)
            if len(readers) != 1 or readers[0].type != "Reshape":
                return fail(layer, "the axis is unknown: no traced op (X.pnnx.param) and output "
                                   f"{b!r} is not read by exactly one Reshape that drops an axis")
            expr = readers[0].params.get(6)
            if not isinstance(expr, str) or not _DROP_RE.match(expr) or \
                    readers[0].params.get(12, 233) != 233:
                return fail(layer, f"the axis is unknown: no traced op (X.pnnx.param) and the "
                                   f"Reshape {readers[0].name!r} after output {b!r} does not drop "
                                   f"just the outermost axis (6={expr!r})")
            kept.add(expr.count(",") + 1)
        if len(kept) != 1:
            return fail(layer, "the Reshapes after the outputs keep different ranks")
        rank = kept.pop() + 1
        hint = self._input_extent(g, layer, rank)
        if hint is not None and hint != k:
            return fail(layer, f"the outermost axis has {hint} elements (Input shape hint) but "
                               f"the Slice has {k} outputs")
        return matched(layer, axis=0, sizes=[-233] * k, how=f"{k} outputs, each reshaped to "
                       f"rank {rank - 1} (an unbind of the outermost axis of a rank-{rank} blob)",
                       apply=self._apply_paramless)

    def _input_extent(self, g: Graph, layer: Layer, rank: int) -> int | None:
        p = g.producer(layer.inputs[0])
        if p is None or p.type != "Input":
            return None
        pid = {1: 0, 2: 1, 3: 2, 4: 2}[rank]
        v = p.params.get(pid)
        return v if isinstance(v, int) and v > 0 else None

    def _apply_paramless(self, g: Graph, m: Match, result: PassResult) -> None:
        layer: Layer = m.layer
        before = " ".join(layer.params.tokens()) or "(no params)"
        layer.set(0, Ints(m["sizes"]))
        layer.set(1, m["axis"])
        result.changes.append(Change(layer.name, f"slices + axis from {m['how']}", before,
                                     " ".join(layer.params.tokens()), layer.source_line))
        result.modified = True

    # ------------------------------------------------------------------ 2./3. batch axis
    def _match_batch(self, g: Graph, layer: Layer, op: _traced.PnnxOp | None, why: str) -> Match:
        if op is None:
            return fail(layer, "which dim is pnnx's batch axis, and the rank, come only from "
                               "the traced op: give X.pnnx.param (--pnnx)")
        shape = op.in_shape
        dims = op.ints("dim")
        if shape is None or dims is None or len(dims) != 1:
            return fail(layer, f"pnnx op {op.name!r} has no single dim= or no traced shape")
        rank = len(shape)
        b = dims[0] % rank
        if rank > 4:
            return fail(layer, f"rank {rank} cannot hold the batch axis as a real axis")
        k = len(layer.outputs)
        unbind = layer.type.endswith("unbind") or slice_kind(layer) == "unbind"
        if unbind:
            sizes = [-233] * k
            if shape[b] is not None and shape[b] != k:
                return fail(layer, f"{k} outputs but the unbound dim has {shape[b]} elements")
        else:
            sizes = None
            idx = layer.params.get_ints(2)
            sl = layer.params.get_ints(0)
            if shape[b] is None:
                return fail(layer, "the sliced batch dim is dynamic")
            if idx:
                pts = [0] + [i % shape[b] if i < 0 else i for i in idx] + [shape[b]]
                sizes = [pts[i + 1] - pts[i] for i in range(len(pts) - 1)]
            elif sl:
                fixed = [s if s != -233 else None for s in sl]
                sizes = _torch_split_sizes(op, shape[b], k) if None in fixed else \
                    [s for s in fixed if s is not None]
            if not sizes or len(sizes) != k:
                return fail(layer, "cannot recover the sizes of the parts")
            if any(s != 1 for s in sizes):
                return fail(layer, f"parts of sizes {sizes} along the batch axis: a part larger "
                                   f"than 1 would stay on ncnn's batch axis")
        # the readers of the parts
        drops: dict[str, Layer] = {}
        for out in layer.outputs:
            for r in g.consumer_layers(out):
                if r.params.get(12, 233) != 233:
                    if r.type == "Reshape" and r.params.get(12) == 0 and \
                            r.params.get(13, 233) == 233 and r.params.get(6) == "0n" and unbind:
                        drops[out] = r
                        continue
                    return fail(layer, f"part {out!r} feeds {r.type} {r.name!r}, which reads it "
                                       f"with a batch axis (12={r.params.get(12)})")
        # the element of an unbind of the batch axis b: the dims after b (pnnx gives it the
        # next dim as its own batch axis and reads it with `Reshape 12=0 6="0n"`)
        return matched(layer, b=b, rank=rank, sizes=sizes, drops=drops, unbind=unbind,
                       how=f"pnnx op {op.name!r} (line {op.line}): batch dim {b} of {_fmt(shape)}",
                       apply=self._apply_batch)

    def _apply_batch(self, g: Graph, m: Match, result: PassResult) -> None:
        layer: Layer = m.layer
        b, rank = m["b"], m["rank"]
        line = layer.source_line
        name = layer.name
        src = layer.inputs[0]
        outs = list(layer.outputs)
        before = f"{layer.type} " + (" ".join(layer.params.tokens()) or "(no params)")
        # ncnn dims of the blob without its batch axis, innermost first, then n outermost
        keep = "".join("," + _DIMS[i] for i in range(rank - 1))
        expr = ("0" + keep[1:].replace(",", ",0") if rank > 1 else "")
        expr = (expr + "," if expr else "") + "0n"
        mid = g.unique_blob_name(f"{name}_unbatched")
        mover = g.add_layer("Reshape", g.unique_layer_name(f"{name}_unbatch"), [src], [mid],
                            {12: b, 13: 233, 6: expr}, before=layer)
        sl = g.replace_layer(layer, "Slice", name, inputs=[mid],
                             outputs=[g.unique_blob_name(f"{o}_part") for o in outs],
                             params={0: Ints(m["sizes"] if m["unbind"] else m["sizes"]), 1: 0})
        drop = ",".join("0" + _DIMS[i] for i in range(rank - 1)) if rank > 1 else "1"
        removed = []
        prev = sl
        for i, (part, out) in enumerate(zip(sl.outputs, outs)):
            r = m["drops"].get(out)
            target = out
            if r is not None:
                target = r.outputs[0]
                g.remove_layer(r)
                removed.append(r.name)
            prev = g.add_layer("Reshape", g.unique_layer_name(f"{name}_part{i}"), [part],
                               [target], {6: drop}, after=prev)
        after = (f"Reshape {mover.name} 12={b} 13=233 6=\"{expr}\" + Slice "
                 f"{' '.join(sl.params.tokens())} + {len(outs)} Reshape 6=\"{drop}\"")
        if removed:
            after += f"; removed {', '.join(removed)} (read the part on the batch axis)"
        result.changes.append(Change(name, f"{m['how']}", before, after, line))
        result.modified = True


def _torch_split_sizes(op: _traced.PnnxOp, extent: int, k: int) -> list[int] | None:
    t = op.type.split(".")[-1]
    if t == "chunk":
        n = (op.ints("chunks") or [k])[0]
        step = -(-extent // n)
        sizes = []
        left = extent
        while left > 0:
            sizes.append(min(step, left))
            left -= step
        return sizes if len(sizes) == k else None
    if t in ("tensor_split", "split"):
        idx = op.ints("indices")
        if idx:
            pts = [0] + [i % extent if i < 0 else min(i, extent) for i in idx] + [extent]
            return [pts[i + 1] - pts[i] for i in range(len(pts) - 1)]
        sec = op.ints("sections") or op.ints("split_size_or_sections")
        if sec and len(sec) == 1 and t == "tensor_split":
            n = sec[0]
            return [extent // n + (1 if i < extent % n else 0) for i in range(n)]
        if sec and len(sec) == k:
            return sec
        if sec and len(sec) == 1:
            step = sec[0]
            return [min(step, extent - i) for i in range(0, extent, step)]
    return None


def _fmt(shape) -> str:
    return "(" + ",".join("?" if s is None else str(s) for s in shape) + ")"
