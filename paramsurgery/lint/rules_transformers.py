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
