"""ncnn blob ↔ pnnx operand: which tensor of pnnx's traced graph an ncnn blob holds.

pnnx renumbers operands when it writes the ncnn graph, fuses some patterns (Eltwise
weighted sums, Gemm + bias, RoPE, SDPA, GELU / LayerNorm expansions) and adds layers of
its own (`Split` copies, `_ncnnreshape` Reshapes), so blobs are paired with operands by
structure. Two strengths, one implementation:

- `map_blobs` (static, used by lint's conformance rules): graph inputs (`in0` ↔ first
  `pnnx.Input`), graph outputs (`out0` ↔ first output of `pnnx.Output`, tuples expanded),
  and the tops of layers paired with pnnx ops kind by kind in order (the k-th
  Convolution1D with the k-th `nn.Conv1d`), only for kinds whose counts agree on both
  sides; a top is followed through the `_ncnnreshape` Reshapes pnnx adds around it.
- `Aligner` (used by compare, which has both sides' values): walks the ncnn graph in
  order from those anchors. A layer's top is paired with, in turn, its static anchor, the
  output of a one-to-one pnnx op of a matching kind reading the operands its bottoms hold,
  or - for fusions - an operand downstream of them (the fusion's boundary). Every
  candidate is checked against the values; a one-to-one partner is kept even when the
  values disagree (that is a divergence), a boundary guess only when they agree (an
  intermediate of a fusion has no operand). Split tops pair with their bottom's operand,
  MemoryData with the `pnnx.Attribute` of the same name.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import Op, Operand, PnnxGraph
    from paramsurgery.ir.graph import Graph
    from paramsurgery.ir.layer import Layer
    from paramsurgery.verify.compare.layout import Error


def input_key(b: str) -> tuple[int, str]:
    """Sort key putting pnnx's `in0`, `in1`, … first, in number order."""
    m = re.fullmatch(r"in([0-9]+)", b)
    return (int(m.group(1)), b) if m else (1 << 30, b)


def ordered_outputs(graph: "Graph") -> list[str]:
    """Graph outputs, pnnx's `out0`, `out1`, … in number order."""
    outs = list(graph.outputs)
    if outs and all(re.fullmatch(r"out[0-9]+", b) for b in outs):
        outs.sort(key=lambda b: int(b[3:]))
    return outs


# pnnx op type -> ncnn layer types it becomes (1:1 conversions)
ANCHORS: dict[str, tuple[str, ...]] = {
    "nn.Linear": ("Gemm", "InnerProduct"),
    "nn.Conv1d": ("Convolution1D", "ConvolutionDepthWise1D"),
    "nn.Conv2d": ("Convolution", "ConvolutionDepthWise"),
    "nn.Conv3d": ("Convolution3D", "ConvolutionDepthWise3D"),
    "nn.ConvTranspose1d": ("Deconvolution1D", "DeconvolutionDepthWise1D"),
    "nn.ConvTranspose2d": ("Deconvolution", "DeconvolutionDepthWise"),
    "nn.Embedding": ("Embed",),
    "nn.LayerNorm": ("LayerNorm",),
    "nn.RMSNorm": ("RMSNorm",),
    "nn.GroupNorm": ("GroupNorm",),
    "nn.BatchNorm1d": ("BatchNorm",),
    "nn.BatchNorm2d": ("BatchNorm",),
    "F.scaled_dot_product_attention": ("SDPA",),
    "nn.MultiheadAttention": ("MultiHeadAttention",),
    "torch.chunk": ("Slice",),
    "torch.tensor_split": ("Slice",),
    "torch.split": ("Slice",),
    "Tensor.split": ("Slice",),
    "torch.cat": ("Concat",),
    "F.pad": ("Padding", "Crop"),
    "torch.transpose": ("Permute",),
    "torch.permute": ("Permute",),
    "Tensor.permute": ("Permute",),
    "torch.unsqueeze": ("ExpandDims",),
    "torch.squeeze": ("Squeeze",),
    "F.silu": ("Swish",),
    "nn.SiLU": ("Swish",),
    "F.gelu": ("GELU",),
    "nn.GELU": ("GELU",),
    "nn.ReLU": ("ReLU",),
    "F.relu": ("ReLU",),
    "nn.ELU": ("ELU",),
    "nn.Sigmoid": ("Sigmoid",),
    "F.sigmoid": ("Sigmoid",),
    "nn.Tanh": ("TanH",),
    "F.softmax": ("Softmax",),
    "torch.matmul": ("MatMul",),
    "torch.sum": ("Reduction",), "torch.mean": ("Reduction",),
}


def map_blobs(graph: "Graph", pnnx: "PnnxGraph") -> dict[str, "Operand"]:
    """ncnn blob → pnnx operand for every blob the structure pins down (see the module doc)."""
    out: dict[str, "Operand"] = {}
    ins = list(graph.inputs)
    p_ins = pnnx.inputs
    if len(ins) == len(p_ins):
        for b, o in zip(sorted(ins, key=input_key), p_ins):
            out[b] = o
    outs = ordered_outputs(graph)
    p_outs = pnnx.outputs
    if len(outs) == len(p_outs):
        for b, o in zip(outs, p_outs):
            out[b] = o
    # group pnnx types that share ncnn types into one class (Slice <- chunk/tensor_split/…)
    classes: dict[frozenset, list[str]] = {}
    for ptype, ntypes in ANCHORS.items():
        classes.setdefault(frozenset(ntypes), []).append(ptype)
    for ntype_set, ptypes in classes.items():
        p_ops = [op for op in pnnx.ops if op.type in ptypes]
        n_layers = [lay for lay in graph.by_type(*sorted(ntype_set))
                    if "_ncnnreshape" not in lay.name]
        if not p_ops or len(p_ops) != len(n_layers):
            continue
        for lay, op in zip(n_layers, p_ops):
            if len(lay.outputs) != len(op.outputs):
                continue
            for b, o_name in zip(lay.outputs, op.outputs):
                b = follow_ncnnreshape(graph, b)
                operand = pnnx.operands.get(o_name)
                if operand is not None and b not in out:
                    out[b] = operand
    return out


def follow_ncnnreshape(graph: "Graph", blob: str) -> str:
    """The blob after the `<name>_ncnnreshape` Reshapes pnnx put behind a layer's top."""
    for _ in range(8):
        readers = graph.consumer_layers(blob)
        if len(readers) == 1 and readers[0].type == "Reshape" and \
                "_ncnnreshape" in readers[0].name and readers[0].outputs:
            blob = readers[0].outputs[0]
        else:
            break
    return blob


# ncnn type -> pnnx op types that become exactly that layer (beyond ANCHORS)
ONE_TO_ONE_EXTRA: dict[str, tuple[str, ...]] = {
    "BinaryOp": ("torch.add", "torch.sub", "torch.mul", "torch.div", "torch.pow",
                 "torch.maximum", "torch.minimum", "torch.atan2", "torch.remainder",
                 "torch.floor_divide"),
    "UnaryOp": ("torch.neg", "torch.abs", "torch.exp", "torch.log", "torch.sqrt", "torch.rsqrt",
                "torch.sin", "torch.cos", "torch.tan", "torch.floor", "torch.ceil",
                "torch.square", "torch.reciprocal", "torch.round", "torch.trunc",
                "torch.log10", "torch.asin", "torch.acos", "torch.atan", "torch.tanh"),
    "Reshape": ("Tensor.reshape", "Tensor.view", "torch.reshape", "torch.flatten",
                "Tensor.flatten"),
    "Crop": ("Tensor.slice", "torch.narrow", "Tensor.select", "torch.select"),
    "Slice": ("torch.unbind", "Tensor.chunk", "torch.tensor_split"),
    "Concat": ("torch.stack",),
    "Clip": ("torch.clamp", "nn.Hardtanh", "F.hardtanh"),
    "Softmax": ("nn.Softmax", "torch.softmax", "Tensor.softmax"),
    "Reduction": ("torch.amax", "torch.amin", "torch.prod", "torch.max", "torch.min",
                  "torch.logsumexp", "torch.norm"),
    "Padding": ("nn.ConstantPad1d", "nn.ConstantPad2d", "nn.ReflectionPad1d",
                "nn.ReflectionPad2d", "nn.ReplicationPad1d", "nn.ReplicationPad2d",
                "nn.ZeroPad2d"),
    "Gemm": ("F.linear", "torch.addmm"),
    "InnerProduct": ("F.linear",),
    "MatMul": ("torch.bmm", "Tensor.matmul"),
    "LayerNorm": ("F.layer_norm",),
    "RMSNorm": ("F.rms_norm",),
    "GroupNorm": ("F.group_norm",),
    "Embed": ("F.embedding",),
    "Swish": ("torch.nn.functional.silu",),
    "TanH": ("F.tanh", "torch.tanh"),
    "Sigmoid": ("torch.sigmoid",),
    "ELU": ("F.elu",),
    "Convolution1D": ("F.conv1d",), "Convolution": ("F.conv2d",),
    "ConvolutionDepthWise1D": ("F.conv1d", "nn.Conv1d"),
    "Deconvolution1D": ("F.conv_transpose1d",),
    "ExpandDims": ("Tensor.unsqueeze",),
    "Squeeze": ("Tensor.squeeze",),
    "Permute": ("Tensor.transpose",),
    "HardSigmoid": ("F.hardsigmoid", "nn.Hardsigmoid"),
    "HardSwish": ("F.hardswish", "nn.Hardswish"),
    "Mish": ("F.mish", "nn.Mish"),
    "PReLU": ("nn.PReLU", "F.prelu"),
    "ReLU": ("nn.LeakyReLU", "F.leaky_relu", "nn.ReLU6", "F.relu6"),
    "Dropout": ("nn.Dropout", "F.dropout"),
    "Pooling": ("nn.MaxPool2d", "nn.AvgPool2d", "F.max_pool2d", "F.avg_pool2d",
                "nn.AdaptiveAvgPool2d", "F.adaptive_avg_pool2d"),
    "Pooling1D": ("nn.MaxPool1d", "nn.AvgPool1d", "F.max_pool1d", "F.avg_pool1d",
                  "nn.AdaptiveAvgPool1d", "F.adaptive_avg_pool1d"),
    "Interp": ("F.interpolate", "nn.Upsample"),
    "Flatten": ("torch.flatten",),
    "CumulativeSum": ("torch.cumsum",),
}

# expression operators that each become one BinaryOp / UnaryOp
_EXPR_OP = re.compile(r"([A-Za-z_][A-Za-z_0-9]*)\(")


def _one_to_one_table() -> dict[str, frozenset[str]]:
    table: dict[str, set[str]] = {}
    for ptype, ntypes in ANCHORS.items():
        for n in ntypes:
            table.setdefault(n, set()).add(ptype)
    for n, ptypes in ONE_TO_ONE_EXTRA.items():
        table.setdefault(n, set()).update(ptypes)
    return {n: frozenset(p) for n, p in table.items()}


ONE_TO_ONE = _one_to_one_table()


def is_one_to_one(layer_type: str, op: "Op") -> bool:
    """Does pnnx convert `op` into exactly one layer of `layer_type`? (An expression with
    one operator is one BinaryOp/UnaryOp; a longer one expands into several layers.)"""
    if op.type == "pnnx.Expression":
        expr = op.params.get("expr", "")
        return layer_type in ("BinaryOp", "UnaryOp") and len(_EXPR_OP.findall(expr)) == 1
    return op.type in ONE_TO_ONE.get(layer_type, ())


# a judge: the error of the blob that just arrived against an operand (None: not captured)
Judge = Callable[[str, bool], "Error | None"]

BOUNDARY_DEPTH = 8
BOUNDARY_CANDIDATES = 48


@dataclass
class Placement:
    operand: str | None
    how: str
    error: "Error | None" = None


class Aligner:
    """Pairs each ncnn top with a pnnx operand as its value arrives (see the module doc).
    `place(layer, slot, judge)` must be called in graph order."""

    def __init__(self, graph: "Graph", pnnx: "PnnxGraph", ok: Callable[["Error"], bool],
                 terms: "Callable[[Op], list[str]] | None" = None) -> None:
        """`terms(op)`: names of the inner terms of a `pnnx.Expression` whose values the
        judge knows (`expression.subterm_values`); they pair with the blobs between the
        layers an expression expands into."""
        self.terms = terms
        self.term_owner: dict[str, "Op"] = {}
        self.graph = graph
        self.pnnx = pnnx
        self.ok = ok
        self.anchors = {b: o.name for b, o in map_blobs(graph, pnnx).items()}
        self.image: dict[str, str] = {}
        # an unpaired blob (a layer pnnx added: reflect padding, an expansion step) stands
        # for the operands its producer read, so the search past it starts from them
        self.frontier: dict[str, list[str]] = {}
        self.attributes = {op.name: op.outputs[0] for op in pnnx.ops
                           if op.type == "pnnx.Attribute" and op.outputs}
        self.used_ops: set[int] = set()
        self._op_index = {id(op): i for i, op in enumerate(pnnx.ops)}

    def _record(self, blob: str, p: Placement) -> Placement:
        if p.operand is not None:
            self.image[blob] = p.operand
        return p

    def place(self, layer: "Layer", slot: int, judge: Judge) -> Placement:
        blob = layer.outputs[slot]
        if layer.type == "Input":
            o = self.anchors.get(blob)
            return self._record(blob, Placement(o, "input", judge(o, False) if o else None))
        if layer.type == "Split" and layer.inputs and layer.inputs[0] in self.image:
            o = self.image[layer.inputs[0]]
            return self._record(blob, Placement(o, "split", judge(o, False)))
        if layer.type == "Reshape" and "_ncnnreshape" in layer.name and layer.inputs and \
                layer.inputs[0] in self.image:
            o = self.image[layer.inputs[0]]
            return self._record(blob, Placement(o, "reshape", judge(o, True)))
        if layer.type == "MemoryData" and layer.name in self.attributes:
            o = self.attributes[layer.name]
            return self._record(blob, Placement(o, "attribute", judge(o, False)))
        structural: list[tuple[str, str, bool]] = []
        anchor = self.anchors.get(blob)
        if anchor is not None:
            structural.append((anchor, "anchor", _reshaped(layer)))
        known: list[str] = []
        for b in layer.inputs:
            o = self.image.get(b)
            for k in ([o] if o is not None else self.frontier.get(b, [])):
                if k not in known:
                    known.append(k)
        for op in self._one_to_one_ops(layer, known):
            if slot < len(op.outputs):
                # torch.stack becomes Concat (+ a Reshape): the same values, axes merged
                structural.append((op.outputs[slot], "op",
                                   _reshaped(layer) or op.type == "torch.stack"))
        tried: set[str] = set()
        for o, how, flat in structural:
            if o in tried:
                continue
            tried.add(o)
            err = judge(o, flat)
            if err is not None and self.ok(err):
                self._take(o)
                return self._record(blob, Placement(o, how, err))
        if layer.type in _LAYOUT_ONLY:
            # a Reshape pnnx added (around a stack, for ncnn's rank limits) holds its bottom's
            # operand in flat order
            for o in known:
                err = judge(o, True)
                if err is not None and self.ok(err):
                    return self._record(blob, Placement(o, "layout", err))
        for o in self._expression_terms(known, tried) + self._downstream(known, tried):
            err = judge(o, False)
            if err is not None and self.ok(err):
                return self._record(blob, Placement(o, "boundary", err))
        if structural and not _fused_activation(layer):
            o, how, flat = structural[0]
            self._take(o)
            return self._record(blob, Placement(o, how, judge(o, flat)))
        self.frontier[blob] = known
        return Placement(None, "unmatched")

    def _take(self, operand: str) -> None:
        od = self.pnnx.operands.get(operand)
        if od is not None and od.producer is not None:
            self.used_ops.add(id(od.producer))

    def _one_to_one_ops(self, layer: "Layer", known: list[str]) -> list["Op"]:
        """pnnx ops reading the operands this layer's bottoms hold that become exactly
        this layer: unused ones first, then pnnx order."""
        seen: dict[int, "Op"] = {}
        for o in known:
            od = self.pnnx.operands.get(o)
            if od is None:
                continue
            for op in od.consumers:
                if id(op) not in seen and is_one_to_one(layer.type, op):
                    seen[id(op)] = op
        ops = list(seen.values())
        ops.sort(key=lambda op: (id(op) in self.used_ops, self._op_index[id(op)]))
        return ops

    def _expression_terms(self, known: list[str], tried: set[str]) -> list[str]:
        """Values inside the ops reading `known` (`terms`), and the whole output of an
        expression, or of the op owning a known inner value (the conv after its padding)."""
        if self.terms is None:
            return []
        ops: dict[int, tuple["Op", bool]] = {}
        for o in known:
            owner = self.term_owner.get(o)
            if owner is not None:
                ops[id(owner)] = (owner, True)
                continue
            od = self.pnnx.operands.get(o)
            for op in od.consumers if od is not None else ():
                if id(op) not in ops:
                    ops[id(op)] = (op, op.type == "pnnx.Expression")
        out: list[str] = []
        for op, whole in ops.values():
            if whole:
                out.extend(o for o in op.outputs if o not in tried)
            for name in self.terms(op):
                self.term_owner[name] = op
                if name not in tried:
                    out.append(name)
        return out

    def _downstream(self, known: list[str], tried: set[str]) -> list[str]:
        """Operands computed from `known` within a few ops, nearest first."""
        out: list[str] = []
        seen = set(known) | tried
        starts = [self.term_owner[o].outputs[0] if o in self.term_owner else o for o in known]
        queue: deque[tuple[str, int]] = deque((o, 0) for o in starts)
        while queue and len(out) < BOUNDARY_CANDIDATES:
            o, depth = queue.popleft()
            od = self.pnnx.operands.get(o)
            if od is None or depth >= BOUNDARY_DEPTH:
                continue
            for op in od.consumers:
                if op.type in ("pnnx.Output", "prim::TupleConstruct", "prim::ListConstruct"):
                    continue
                for nxt in op.outputs:
                    if nxt not in seen:
                        seen.add(nxt)
                        out.append(nxt)
                        queue.append((nxt, depth + 1))
        return out


_LAYOUT_ONLY = ("Reshape", "Flatten", "ExpandDims", "Squeeze")

# layers that may carry a fused activation in param 9 (pnnx fuses the next ReLU/Sigmoid/...)
_ACTIVATION_PARAM = {"Convolution", "Convolution1D", "Convolution3D", "ConvolutionDepthWise",
                     "ConvolutionDepthWise1D", "ConvolutionDepthWise3D", "Deconvolution",
                     "Deconvolution1D", "Deconvolution3D", "DeconvolutionDepthWise",
                     "DeconvolutionDepthWise1D", "InnerProduct"}


def _fused_activation(layer: "Layer") -> bool:
    """A conv / InnerProduct with an activation fused in: its top is the activation's
    operand, found at the boundary, not the conv's own."""
    return layer.type in _ACTIVATION_PARAM and bool(layer.params.get(9))


def _reshaped(layer: "Layer") -> bool:
    """A Reshape's top holds its operand's values in flat order whatever the shapes say."""
    return layer.type in ("Reshape", "Flatten")
