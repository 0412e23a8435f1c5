"""Rules for what pnnx writes for Hugging Face transformers that ncnn then computes wrong:
a tied lm_head read as table-times-itself (PS017), a scalar integer pow on a base that may
be negative (PS018)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from paramsurgery.lint.registry import ERROR, Hit, rule

if TYPE_CHECKING:
    from paramsurgery.lint.context import LintContext


@rule("PS017", "tied-linear-as-table", ERROR,
      "a Linear whose weight is a graph tensor (tied lm_head) written as the table times its "
      "own copy plus the hidden states", fix_pass="fix-tied-linear")
def tied_linear_as_table(ctx: "LintContext") -> Iterator[Hit]:
    """pnnx 20261020 keeps a tied head (`lm_head.weight is wte.weight`, GPT-2, Gemma) as
    `nn.Linear 2 1 <table> <hidden>` in its IR and writes for ncnn an `InnerProduct` whose
    input is the table (`MemoryData`, V×C) and a `BinaryOp add` of the hidden states as if
    they were a bias: the output is (V, V) = W·Wᵀ + h, not the logits h·Wᵀ (PS401 at the
    traced shapes). `paramsurgery fix-tied-linear` makes it one InnerProduct of the hidden
    states with the table as weight (needs --bin)."""
    from paramsurgery.patterns.tied_linear import find_tied_linears

    for s in find_tied_linears(ctx.graph):
        yield Hit(s.fc, f"InnerProduct {s.fc.name!r} reads the table {s.table.name!r} as its "
                        f"input and BinaryOp {s.add.name!r} adds the hidden states "
                        f"{s.hidden!r} as a bias: a tied Linear, computed as W·Wᵀ + h "
                        f"instead of h·Wᵀ")


@rule("PS018", "pow-negative-base", ERROR,
      "BinaryOp pow by a scalar integer on a base that may be negative (ncnn: exp(n·log x), "
      "2.4e38 for x < 0)", fix_pass="fix-pow")
def pow_negative_base(ctx: "LintContext") -> Iterator[Hit]:
    """ncnn 1.0.20261020 computes `BinaryOp 0=6` (pow) as exp(b·log a): a negative base
    gives 2.4e38 even for an integer exponent (pow(-2, 3.0); torch: -8). pnnx writes it for
    `x.pow(3)` / `x ** 2`, e.g. GPT-2's tanh GELU (`gelu_new`), whose inputs are negative
    half the time: the output is wrong at every length. A base only ReLU/Sigmoid/Softmax/Exp/
    abs/square/sqrt/a non-negative Clip can give is not reported. `paramsurgery fix-pow`
    writes x**n as products (UnaryOp square + BinaryOp mul)."""
    from paramsurgery.patterns.pow_scalar import find_scalar_pows

    for s in find_scalar_pows(ctx.graph):
        yield Hit(s.layer, f"BinaryOp {s.layer.name!r} raises {s.layer.inputs[0]!r} to the "
                           f"power {s.exponent}: ncnn's pow is wrong for a negative base")


@rule("PS019", "lossy-reshape", ERROR,
      "a Reshape to static dims whose input has another element count at the traced shapes "
      "(pnnx's broadcast helper with 1 for a dynamic dim)", fix_pass="fix-lossy-reshape",
      needs=("pnnx",))
def lossy_reshape(ctx: "LintContext") -> Iterator[Hit]:
    """ncnn's Reshape to fixed dims keeps the first elements of a larger input without an
    error. pnnx 20261020 writes one as `<op>_ncnnreshape<k>`, the broadcast helper of a
    `BinaryOp` operand whose traced shape has a dynamic dim, with 1 for that dim: Whisper's
    `embed_positions.weight[:T]` added to the hidden states becomes `Crop` to T, then
    `Reshape 0=32 1=1`: every position gets row 0 (the dynamic export is wrong at every length,
    its traced one too). Checked at pnnx's traced input shapes (its `X_ncnn.py` or static
    `X.pnnx.param`). `paramsurgery fix-lossy-reshape` infers that dim (-1) when every other
    dim equals the input's."""
    from paramsurgery.patterns.lossy_reshape import find_lossy_reshapes, traced_inputshape

    if ctx.pnnx is None:
        return
    shapes = traced_inputshape(ctx.pnnx, ctx.pnnx.path, ctx.graph)
    if shapes is None:
        return
    for s in find_lossy_reshapes(ctx.graph, shapes):
        yield Hit(s.layer, s.describe() + ": ncnn drops or invents elements")


@rule("PS020", "bool-memorydata", ERROR,
      "a MemoryData with pnnx's bool load type (21=3): ncnn has no such load type and the "
      "graph does not load", fix_pass="fix-bool-table")
def bool_memorydata(ctx: "LintContext") -> Iterator[Hit]:
    """pnnx 20261020 writes a bool tensor it folded (GPT-2's eager causal mask, the
    `bias` buffer) as `MemoryData ... 21=3` with one byte per value: ncnn's ModelBin has
    load types 0 (tagged) and 1 (raw float32) only ("ModelBin load type 3 not implemented"),
    so `load_model` fails. `paramsurgery fix-bool-table` (needs --bin) writes the values as
    float32 0/1, what ncnn's layers read a torch bool as."""
    from paramsurgery.formats.weights.binfile import PNNX_BOOL_LOAD_TYPE

    for layer in ctx.layers:
        if layer.type == "MemoryData" and layer.params.get(21, 1) == PNNX_BOOL_LOAD_TYPE:
            yield Hit(layer, f"MemoryData {layer.name!r} has load type 21={PNNX_BOOL_LOAD_TYPE} "
                             f"(pnnx's bool, one byte per value): ncnn fails to load it "
                             f"(\"ModelBin load type 3 not implemented\")")
