"""`BinaryOp 0=6 1=1 2=n`: x to a scalar power, which ncnn 1.0.20261020 computes as
exp(n·log x): for x < 0 it returns 2.4e38 (not NaN, not x**n) even for an integer n
(measured: pow(-2, 3.0) = 2.4061436e+38 on the x86 build; torch: -8). pnnx writes it for
`x.pow(3)` / `x ** 2` / `torch.pow(x, 3.0)`, e.g. GPT-2's `gelu_new`
(`0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`). Shared by lint (PS018) and `fix-pow`.

A base is left alone when its producer can only give values ≥ 0 (ReLU, Sigmoid, Softmax,
Exp, Clip with a lower bound ≥ 0, UnaryOp abs/square/exp/sqrt): there ncnn's pow is right.
"""

from __future__ import annotations

from dataclasses import dataclass

from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.patterns.match import above_splits

POW = 6
MAX_EXPONENT = 8  # square-and-multiply up to x**8
NON_NEGATIVE = ("ReLU", "Sigmoid", "Softmax", "Exp")
NON_NEGATIVE_UNARY = (0, 4, 5, 7)  # abs, square, sqrt, exp (ncnn unaryop.h)


@dataclass
class ScalarPow:
    layer: Layer
    exponent: int


def integer_exponent(layer: Layer) -> int | None:
    """n of a `BinaryOp pow` by a scalar integer n ≥ 2 (as a float param), else None."""
    p = layer.params
    if layer.type != "BinaryOp" or p.get(0, 0) != POW or p.get(1, 0) != 1 or \
            len(layer.inputs) != 1:
        return None
    b = p.get(2, 0.0)
    if not isinstance(b, (int, float)) or b != int(b) or not 2 <= int(b) <= MAX_EXPONENT:
        return None
    return int(b)


def non_negative(g: Graph, blob: str) -> bool:
    """The producer of `blob` (above Splits) gives only values ≥ 0."""
    p = g.producer(above_splits(g, blob)[0])
    if p is None:
        return False
    if p.type in NON_NEGATIVE:
        return p.type != "ReLU" or not p.params.get(0, 0.0)  # a leaky ReLU goes negative
    if p.type == "UnaryOp":
        return p.params.get(0, 0) in NON_NEGATIVE_UNARY
    if p.type == "Clip":
        lo = p.params.get(0, -3.402823466e38)
        return isinstance(lo, (int, float)) and lo >= 0
    return False


def find_scalar_pows(g: Graph) -> list[ScalarPow]:
    """Every integer-exponent pow whose base may be negative, in file order."""
    out = []
    for layer in g.by_type("BinaryOp"):
        n = integer_exponent(layer)
        if n is not None and not non_negative(g, layer.inputs[0]):
            out.append(ScalarPow(layer, n))
    return out
