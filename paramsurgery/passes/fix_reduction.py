"""Repair Reductions whose axes pnnx dropped (`paramsurgery fix-reduction`).

pnnx removes every reduced dim that is its inferred batch axis (pnnx-bugs.md case 4). For
`torch.stack(parts, 0).sum(0)` over parts that carry that batch axis it writes

    Concat     stack_0 K 1 p1 .. pK s 0=-233
    Reduction  sum_3   1 1 s out0 0=0 1=0 -23303=0 4=0 5=1

`Concat 0=-233` yields an empty Mat and the Reduction on it dies with SIGFPE; with empty
axes and `1=0` a Reduction on valid data is the identity. Both ops together mean "combine
the K parts element-wise", which is what the rewrite writes:

    Eltwise    sum_3   K 1 p1 .. pK out0 0=1                      (sum)
    Eltwise    sum_3   K 1 p1 .. pK out0 0=1 -23301=K,1/K,..      (mean; coeff 2= folded in)
    Eltwise 0=2 (max), 0=0 (prod); BinaryOp 0=5 chain (min)

or, with `style="binaryop"`, a chain of BinaryOps (plus a scalar multiply for a mean).
The Concat becomes dead and is removed.

A Reduction with empty axes and `1=0` that is not fed by such a Concat is rewritten only
when its intended axes are provable: the traced shapes of pnnx's own IR
(`model.pnnx.param`) show every reduced dim had size 1, so the reduction is the identity and
the layer is bypassed. Otherwise (a reduction across pnnx's batch axis of size > 1, no
traced shapes, a reduction op that is not element-wise) the pass refuses and says what it
would need.
"""

from __future__ import annotations

from dataclasses import KW_ONLY
from typing import Sequence

from paramsurgery.core.ncnn import BinaryOpType, EltwiseOpType, ReductionOpType
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.values import Floats
from paramsurgery.formats import pnnx_traced as _traced
from paramsurgery.core.changes import Change
from paramsurgery.passes.options import loaded_ops
from paramsurgery.passes.base import Pass, PassResult, RepairContext, keep_or_refuse
from paramsurgery.core.match import Match, MatchFailure, fail, matched

R = ReductionOpType
OP_NAMES = {op.value: op.name for op in ReductionOpType}
ELEMENTWISE_OPS = (R.SUM, R.MEAN, R.MAX, R.MIN, R.PROD)  # combine K equal-shape parts element-wise
# the Eltwise op for each reduction it can stand for (a mean is a sum with coefficients)
ELTWISE_FOR = {R.SUM: EltwiseOpType.SUM, R.MEAN: EltwiseOpType.SUM, R.MAX: EltwiseOpType.MAX,
               R.PROD: EltwiseOpType.PROD}
# the BinaryOp that folds the parts pairwise for each reduction
BINARY_FOR = {R.SUM: BinaryOpType.ADD, R.MEAN: BinaryOpType.ADD, R.MAX: BinaryOpType.MAX,
              R.MIN: BinaryOpType.MIN, R.PROD: BinaryOpType.MUL}
TORCH_REDUCE = {"torch.sum": R.SUM, "torch.mean": R.MEAN, "torch.amax": R.MAX, "torch.max": R.MAX,
                "torch.amin": R.MIN, "torch.min": R.MIN, "torch.prod": R.PROD}


def has_empty_axes(layer: Layer) -> bool:
    """A Reduction that reduces nothing: `reduce_all=0` and no axes (absent or `-23303=0`)."""
    if layer.type != "Reduction":
        return False
    if layer.params.get(1, 1) != 0:
        return False
    axes = layer.params.get(3)
    return not axes


def batch_concat(g: Graph, layer: Layer) -> Layer | None:
    """The `Concat 0=-233` feeding `layer`, if any."""
    if not layer.inputs:
        return None
    p = g.producer(layer.inputs[0])
    if p is not None and p.type == "Concat" and p.params.get(0, 0) == -233:
        return p
    return None



class FixReduction(Pass, name="fix-reduction", repair_order=50, tag="fixred",
                   summary="stack + Reduction with dropped axes (Concat 0=-233, -23303=0) → element-wise "
                           "sum/mean; identity Reductions bypassed when traced shapes prove it"):
    @classmethod
    def for_fix(cls, ctx: RepairContext, asked: bool) -> "FixReduction | None":
        return cls(traced=ctx.traced_ops) if asked else None

    _: KW_ONLY
    style: str = "eltwise"
    traced: Sequence[_traced.PnnxOp] | None = None  # pnnx's ops (read by the command / fix)
    partial: bool = False

    def __post_init__(self) -> None:
        if self.style not in ("eltwise", "binaryop"):
            raise ValueError(f"style must be 'eltwise' or 'binaryop', got {self.style!r}")
        object.__setattr__(self, "traced", loaded_ops("FixReduction(traced=...)", self.traced))

    # ------------------------------------------------------------------ matching
    def _match_stack(self, g: Graph, red: Layer) -> Match:
        concat = batch_concat(g, red)
        if concat is None:
            return fail(red, "its input does not come from a Concat 0=-233 (stack on pnnx's "
                             "batch axis)")
        op = red.params.get(0, 0)
        if not isinstance(op, int) or op not in ELEMENTWISE_OPS:
            name = OP_NAMES.get(op, "?") if isinstance(op, int) else "?"
            return fail(red, f"operation {op} ({name}) of a stacked axis is not "
                             f"an element-wise combination of the parts (only SUM, MEAN, MAX, "
                             f"MIN, PROD are)")
        coeff = red.params.get_float(2, 1.0)
        if coeff != 1.0 and op not in (0, 3):
            return fail(red, f"coeff 2={coeff} with {OP_NAMES[op]} has no element-wise form")
        if red.params.get(4, 0) != 0:
            return fail(red, "keepdims 4=1: the output keeps a size-1 stacked axis whose place "
                             "in ncnn's layout the graph does not say")
        readers = g.consumer_layers(concat.outputs[0])
        if readers != [red]:
            return fail(red, f"Concat {concat.name!r} has other readers "
                             f"({', '.join(r.name for r in readers if r is not red)})")
        if not concat.inputs:
            return fail(red, f"Concat {concat.name!r} has no bottoms")
        return matched(red, concat=concat, parts=list(concat.inputs), op=op, coeff=coeff)

    def _match_lone(self, g: Graph, red: Layer, aligned: dict[int, _traced.PnnxOp] | None,
                    align_error: str | None) -> Match:
        if aligned is None:
            return fail(red, "not fed by Concat 0=-233, and its intended axes are unknown: the "
                             "ncnn graph does not say which axis pnnx dropped (give the traced "
                             "shapes: --pnnx model.pnnx.param)")
        if align_error:
            return fail(red, align_error)
        op = aligned.get(red.id)
        if op is None:
            return fail(red, "no pnnx op lines up with it in the .pnnx.param")
        dims = op.ints("dim")
        shape = op.in_shape
        if dims is None or shape is None:
            return fail(red, f"pnnx op {op.name!r} (line {op.line}) has no dim= or no traced "
                             f"input shape")
        rank = len(shape)
        dims = sorted({d % rank for d in dims}) if rank else dims
        sizes = [shape[d] for d in dims]
        if all(s == 1 for s in sizes):
            if red.params.get_float(2, 1.0) != 1.0:
                return fail(red, "reduces size-1 dims but scales by coeff 2≠1")
            return matched(red, op=op, dims=dims, shape=shape)
        shown = ", ".join(f"dim {d} of size {'?' if s is None else s}" for d, s in zip(dims, sizes))
        return fail(red, f"pnnx op {op.name!r} (line {op.line}) reduces {shown} of "
                         f"{_fmt_shape(shape)}, which pnnx made ncnn's batch axis; ncnn cannot "
                         f"reduce across the batch axis (re-export with stack(parts, 1).sum(1) "
                         f"or a non-batch layout, pnnx-bugs.md case 4)")

    def _align(self, g: Graph, reds: list[Layer]) -> tuple[dict[int, _traced.PnnxOp] | None, str | None]:
        ops = self.traced
        if ops is None:
            return None, None
        def agree(layer: Layer, op: _traced.PnnxOp) -> str | None:
            if layer.params.get(0, 0) == TORCH_REDUCE[op.type]:
                return None
            return (f"Reduction {layer.name!r} is operation {layer.params.get(0, 0)} but the "
                    f"matching pnnx op {op.name!r} is {op.type}")

        try:
            return _traced.align(g.by_type("Reduction"), _traced.ops_of(ops, tuple(TORCH_REDUCE)),
                                 what="Reductions", op_what="reduction ops", agree=agree), None
        except MatchFailure as exc:
            return {}, f"cannot line it up with pnnx's IR: {exc}"

    # ------------------------------------------------------------------ run
    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        cands = [r for r in g.by_type("Reduction") if has_empty_axes(r)]
        if not cands:
            result.notes.append("no Reduction with empty axes and 1=0")
            return result
        aligned, align_error = (None, None)
        if any(batch_concat(g, r) is None for r in cands):
            aligned, align_error = self._align(g, cands)
        refused: list[MatchFailure] = []
        for red in cands:
            m = self._match_stack(g, red)
            if m:
                self._rewrite_stack(g, m, result)
                continue
            if batch_concat(g, red) is not None:
                refused.append(MatchFailure(red.name, m.reason, line=red.source_line))
                continue
            m2 = self._match_lone(g, red, aligned, align_error)
            if m2:
                self._rewrite_identity(g, m2, result)
            else:
                refused.append(MatchFailure(red.name, m2.reason, line=red.source_line))
        keep_or_refuse(self.name, result, refused, partial=self.partial, what="Reduction(s)")
        return result

    def _rewrite_stack(self, g: Graph, m: Match, result: PassResult) -> None:
        red: Layer = m.layer
        concat: Layer = m["concat"]
        parts: list[str] = m["parts"]
        op, coeff = m["op"], m["coeff"]
        k = len(parts)
        line = red.source_line
        before = f"Concat {concat.name} 0=-233 + Reduction {' '.join(red.params.tokens())}"
        out = red.outputs[0]
        name = red.name
        g.remove_layer(concat)
        if k == 1 and op in ELEMENTWISE_OPS and coeff == 1.0:
            g.replace_layer(red, "Noop", name, inputs=parts, outputs=[out])
            after = "Noop (one part)"
        elif self.style == "eltwise" and op in ELTWISE_FOR:
            params: dict = {0: int(ELTWISE_FOR[op])}
            scale = coeff / k if op == R.MEAN else coeff
            if op in (R.SUM, R.MEAN) and scale != 1.0:
                params[1] = Floats([scale] * k)
            new = g.replace_layer(red, "Eltwise", name, inputs=parts, outputs=[out], params=params)
            after = "Eltwise " + " ".join(new.params.tokens())
        else:
            after = self._binary_chain(g, red, parts, op, coeff)
        result.changes.append(Change(name, f"stack of {k} parts + {OP_NAMES[op]}", before, after,
                                     line))
        result.modified = True

    def _binary_chain(self, g: Graph, red: Layer, parts: list[str], op: int,
                      coeff: float) -> str:
        bop = int(BINARY_FOR[ReductionOpType(op)])
        out = red.outputs[0]
        name = red.name
        scale = coeff / len(parts) if op == R.MEAN else coeff
        need_scale = op in (R.SUM, R.MEAN) and scale != 1.0
        g.remove_layer(red)
        acc = parts[0]
        steps = []
        for i, p in enumerate(parts[1:], start=1):
            last = i == len(parts) - 1 and not need_scale
            top = out if last else g.unique_blob_name(f"{name}_acc{i}")
            g.add_layer("BinaryOp", name if last else g.unique_layer_name(f"{name}_add{i}"),
                        [acc, p], [top], {0: bop})
            steps.append(f"BinaryOp 0={bop}")
            acc = top
        if need_scale:
            g.add_layer("BinaryOp", name, [acc], [out], {0: int(BinaryOpType.MUL), 1: 1, 2: float(scale)})
            steps.append(f"BinaryOp 0={int(BinaryOpType.MUL)} 1=1 2={scale:g}")
        return f"{len(steps)} BinaryOps ({', '.join(steps[-2:])})"

    def _rewrite_identity(self, g: Graph, m: Match, result: PassResult) -> None:
        red: Layer = m.layer
        line = red.source_line
        before = "Reduction " + " ".join(red.params.tokens())
        g.bypass(red)
        dims = ", ".join(str(d) for d in m["dims"])
        result.changes.append(Change(red.name, f"identity Reduction removed (pnnx op "
                                     f"{m['op'].name!r} reduces size-1 dim(s) {dims} of "
                                     f"{_fmt_shape(m['shape'])})", before, "bypassed", line))
        result.modified = True


def _fmt_shape(shape) -> str:
    return "(" + ",".join("?" if s is None else str(s) for s in shape) + ")"
