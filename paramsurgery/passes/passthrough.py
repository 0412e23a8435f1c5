"""Remove layers that pass their input through unchanged (`paramsurgery remove-passthrough`).

What per-model patchers delete by string surgery (ncnn_llm's "remove no-op `Tensor.to`",
`remove_ncnn_passthrough_tensor_to.py`), done on the IR: every reader of the layer's top
reads its bottom instead (`Graph.bypass`); a top that is a graph output keeps its name (the
bottom takes it over).

A layer is removed only when it provably does not change the data ncnn holds:

| type | passthrough when |
|---|---|
| `Tensor.to` (and `Tensor.float`, `.double`, `.long`, ...) | pnnx's traced dtypes (`X.pnnx.param`) show a cast that keeps ncnn's values: float → f32/f64 (ncnn floats are fp32), int → i32/i64 (ncnn holds ids as int32), or no dtype change |
| `Tensor.contiguous`, `Tensor.clone`, `torch.clone`, `Tensor.detach`, `nn.Identity`, `aten::alias`, ... | always (1 → 1) |
| `Noop` | always (bottom i → top i) |
| `Dropout` | `0=scale` is 1 (ncnn multiplies by it) |
| `nn.Dropout*` modules; `F.dropout*` | at inference; `F.dropout` only with `training=False` in the traced op |
| `Split` | it has a single top |

Refused, naming the layer: casts that change values (int ↔ float: ncnn has no such
conversion and keeps the int32 bit patterns an `Embed` reads; float → f16/bf16 rounds;
int → i8/i16 truncates; bool), a `Dropout` that scales, a `Tensor.to` whose dtypes are
unknown (no `.pnnx.param`), and a removal that would rename a graph input or output.
`partial` removes the provable ones and lists the rest instead of refusing.
"""

from __future__ import annotations

import os
from dataclasses import KW_ONLY
from typing import Callable, Sequence

from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.formats.pnnx_param import Op, PnnxGraph
from paramsurgery.core.layer_types import is_converter_leftover
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import Pass, PassResult, RepairContext
from paramsurgery.core.match import MatchFailure

CAST_TYPES = ("Tensor.to", "Tensor.type", "Tensor.float", "Tensor.double", "Tensor.half",
              "Tensor.long", "Tensor.int", "Tensor.bfloat16", "aten::to")
IDENTITY_TYPES = ("nn.Identity", "Tensor.contiguous", "Tensor.clone", "torch.clone",
                  "Tensor.detach", "torch.detach", "aten::clone", "aten::contiguous",
                  "aten::detach", "aten::alias")
DROPOUT_MODULES = ("nn.Dropout", "nn.Dropout1d", "nn.Dropout2d", "nn.Dropout3d",
                   "nn.AlphaDropout", "nn.FeatureAlphaDropout")
DROPOUT_FUNCTIONS = ("F.dropout", "F.dropout1d", "F.dropout2d", "F.dropout3d",
                     "F.alpha_dropout", "F.feature_alpha_dropout")

FLOATS = ("f16", "bf16", "f32", "f64")
INTS = ("i8", "u8", "i16", "i32", "i64")


def cast_verdict(din: str | None, dout: str | None) -> str:
    """Why a cast from `din` to `dout` keeps the values ncnn holds; raises MatchFailure."""
    if not din or not dout:
        raise MatchFailure(None, "pnnx recorded no dtype for its input or output")
    if din == dout:
        return f"{din} -> {dout}: no dtype change"
    if din in FLOATS and dout in ("f32", "f64"):
        return f"{din} -> {dout}: ncnn holds floats as fp32 either way"
    if din in INTS and dout in ("i32", "i64"):
        return f"{din} -> {dout}: ncnn holds ids as int32 either way"
    if din in FLOATS and dout in ("f16", "bf16"):
        raise MatchFailure(None, f"{din} -> {dout} rounds the values to {dout} (torch does, ncnn "
                            f"would not)")
    if din in INTS and dout in INTS:
        raise MatchFailure(None, f"{din} -> {dout} truncates the values")
    if din in INTS and dout in FLOATS:
        raise MatchFailure(None, f"{din} -> {dout} converts ints to floats; ncnn has no such "
                            f"conversion (it would pass the int32 bit patterns on as floats)")
    if din in FLOATS and dout in INTS:
        raise MatchFailure(None, f"{din} -> {dout} converts floats to ints; ncnn has no such "
                            f"conversion (an Embed after it would read the float bits as "
                            f"int32 ids)")
    raise MatchFailure(None, f"{din} -> {dout} changes the values")


class _Ctx:
    def __init__(self, traced: "PnnxGraph | str | os.PathLike | None") -> None:
        self.traced = traced
        self._pnnx: PnnxGraph | None = None

    @property
    def pnnx(self) -> "PnnxGraph | None":
        """pnnx's IR as given (parsed by the command or `fix`), a path read on the first
        candidate that needs it."""
        if self._pnnx is None and self.traced is not None:
            from paramsurgery.formats.pnnx_param import pnnx_graph

            self._pnnx = pnnx_graph(self.traced)
        return self._pnnx

    def op(self, layer: Layer, why: str) -> "Op":
        """pnnx's op for a leftover layer (pnnx keeps leftover names in the ncnn graph)."""
        if self.pnnx is None:
            raise MatchFailure(layer, f"{why} only in pnnx's IR, which pnnx drops from the ncnn "
                                 f"graph: give X.pnnx.param (--pnnx)")
        op = self.pnnx.op_by_name(layer.name)  # indexed once, not a scan per leftover
        if op is not None:
            return op
        raise MatchFailure(layer, f"{why} only in pnnx's IR, and {self.pnnx.path} has no op "
                             f"named {layer.name!r}")


def _writer(g: Graph, blob: str) -> str:
    p = g.producer(blob)
    return repr(p.name) if p is not None else "no layer"


def _cast(ctx: _Ctx, layer: Layer) -> str:
    op = ctx.op(layer, "its dtypes are")
    pn = ctx.pnnx
    assert pn is not None  # ctx.op found the op in it
    src = op.arg_names.get("input") or (op.inputs[0] if op.inputs else None)
    src_operand = pn.operand(src) if src else None
    out_operand = pn.operand(op.outputs[0]) if op.outputs else None
    din = src_operand.dtype if src_operand else None
    dout = out_operand.dtype if out_operand else None
    try:
        return "cast " + cast_verdict(din, dout)
    except MatchFailure as exc:
        readers = _readers(layer)
        raise MatchFailure(layer, f"{exc}{readers}") from None


def _readers(layer: Layer) -> str:
    g = layer.graph
    if g is None or not layer.outputs:
        return ""
    names = [f"{c.type} {c.name!r}" for c in g.consumer_layers(layer.outputs[0])]
    return f"; read by {', '.join(names)}" if names else ""


def _identity(ctx: _Ctx, layer: Layer) -> str:
    return f"{layer.type} returns its input"


def _noop(ctx: _Ctx, layer: Layer) -> str:
    return "Noop passes bottom i to top i"


def _dropout(ctx: _Ctx, layer: Layer) -> str:
    scale = layer.params.get(0, 1.0)
    if scale != 1.0:
        raise MatchFailure(layer, f"ncnn's Dropout multiplies by its 0=scale ({scale})")
    return "Dropout with scale 1"


def _dropout_module(ctx: _Ctx, layer: Layer) -> str:
    return f"{layer.type} at inference"


def _dropout_function(ctx: _Ctx, layer: Layer) -> str:
    op = ctx.op(layer, "whether it runs in training mode is")
    if op.param("training", None) is not False:
        raise MatchFailure(layer, f"traced with training="
                             f"{op.params.get('training', '<not recorded>')} (it drops values)")
    return f"{layer.type} with training=False"


def _split(ctx: _Ctx, layer: Layer) -> str:
    return "Split with one top"


CHECKS: dict[str, Callable[[_Ctx, Layer], str]] = {
    **{t: _cast for t in CAST_TYPES},
    **{t: _identity for t in IDENTITY_TYPES},
    "Noop": _noop,
    "Dropout": _dropout,
    **{t: _dropout_module for t in DROPOUT_MODULES},
    **{t: _dropout_function for t in DROPOUT_FUNCTIONS},
    "Split": _split,
}


# what `paramsurgery fix` removes: the converter leftovers (ncnn's own Noop, Dropout and
# 1-top Split load and run as they are)
LEFTOVERS = tuple(t for t in CHECKS if is_converter_leftover(t))


class RemovePassthrough(Pass, name="remove-passthrough", repair_order=30,
                        summary="bypass layers that pass data through unchanged (no-op casts, clone, "
                                "Identity, Noop, Dropout, 1-top Split)"):
    @classmethod
    def claims(cls, layer: Layer) -> bool:
        return layer.type in LEFTOVERS

    @classmethod
    def for_fix(cls, ctx: RepairContext, asked: bool) -> "RemovePassthrough | None":
        return cls(LEFTOVERS, traced=ctx.pnnx, partial=True) if asked else None

    types: Sequence[str] = ()  # default: every type CHECKS knows
    _: KW_ONLY
    # pnnx's IR (X.pnnx.param, parsed by the command or `fix`; a path is read on the first
    # candidate that needs it)
    traced: "PnnxGraph | str | os.PathLike | None" = None
    partial: bool = False

    def __post_init__(self) -> None:
        unknown = [t for t in self.types if t not in CHECKS]
        if unknown:
            raise PassRefused(f"not a passthrough type: {', '.join(unknown)} (known: "
                              f"{', '.join(CHECKS)})")
        object.__setattr__(self, "types", tuple(self.types) or tuple(CHECKS))

    def _structure(self, g: Graph, layer: Layer) -> str | None:
        """None when the layer has a passthrough shape, else why it is not a candidate."""
        n_in, n_out = len(layer.inputs), len(layer.outputs)
        if layer.type == "Split":
            return None if n_in == 1 and n_out == 1 else f"Split with {n_out} tops (a real fan-out)"
        if layer.type == "Noop":
            return None if n_in == n_out >= 1 else f"Noop with {n_in} bottoms and {n_out} tops"
        if n_in != 1 or n_out != 1:
            return f"{n_in} bottoms and {n_out} tops (a passthrough has 1 and 1)"
        return None

    def run(self, g: Graph) -> PassResult:
        ctx = _Ctx(self.traced)
        result = PassResult(g, False)
        todo: list[tuple[Layer, str]] = []
        refused: list[tuple[Layer, str]] = []
        for layer in g.by_type(*self.types):
            shape = self._structure(g, layer)
            if shape is not None:
                if layer.type == "Noop":
                    result.skipped.append(MatchFailure(layer.name, shape, line=layer.source_line))
                elif layer.type != "Split":
                    refused.append((layer, shape))
                continue
            try:
                todo.append((layer, CHECKS[layer.type](ctx, layer)))
            except MatchFailure as exc:
                refused.append((layer, str(exc)))
        if refused and not self.partial:
            raise PassRefused(self._refusal(refused), file=refused[0][0].source_file,
                              line=refused[0][0].source_line)
        for layer, why in refused:
            result.skipped.append(MatchFailure(layer.name, f"kept: {why}", line=layer.source_line))
        for layer, why in todo:
            self._remove(g, layer, why, result)
        if not todo:
            result.notes.append("no passthrough layer" if not refused else
                                "no provable passthrough layer")
        return result

    @staticmethod
    def _refusal(refused: list[tuple[Layer, str]]) -> str:
        first, why = refused[0]
        more = "".join(f"\n  {lay.where()}: {lay.type} {lay.name!r}: {w}" for lay, w in refused[1:])
        return (f"{first.type} {first.name!r} is not a passthrough: {why}{more}\n"
                f"(nothing written; --partial removes the provable ones and keeps these)")

    def _remove(self, g: Graph, layer: Layer, why: str, result: PassResult) -> None:
        line = layer.source_line
        for top, bottom in zip(layer.outputs, layer.inputs):
            if g.consumers(top):
                continue
            # `top` is a graph output: the bottom must be able to take its name over
            prod = g.producer(bottom)
            if prod is None or prod.type == "Input":
                raise PassRefused(f"removing {layer.type} {layer.name!r} would turn graph input "
                                  f"{bottom!r} into graph output {top!r}; keep it",
                                  file=layer.source_file, line=line)
            others = [c for c in g.consumer_layers(bottom) if c is not layer]
            if others:
                raise PassRefused(f"removing {layer.type} {layer.name!r} would rename graph "
                                  f"output {top!r} ({bottom!r} is also read by "
                                  f"{others[0].name!r}); keep it",
                                  file=layer.source_file, line=line)
        rewire = []
        for top, bottom in zip(layer.outputs, layer.inputs):
            rewire.append(f"readers of {top} read {bottom}" if g.consumers(top) else
                          f"output {top} is now written by {_writer(g, bottom)}")
        g.bypass(layer)
        result.changes.append(Change(layer.name, f"{layer.type} removed ({why}); "
                                                 f"{', '.join(rewire)}", line=line))
        result.modified = True
