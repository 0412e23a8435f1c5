"""`fix-pow`: `BinaryOp pow` by a scalar integer n (2..8) on a base that may be negative
becomes multiplications, which ncnn computes right for every sign (lint PS018; detection:
`patterns/pow_scalar.py`; ncnn's pow is exp(n·log x): 2.4e38 for x < 0).

    BinaryOp p 1 1 x y 0=6 1=1 2=3.0
    UnaryOp  p_sq  1 1 x s 0=4          # x²  (ncnn's square)
    BinaryOp p     2 1 s x y 0=2        # x²·x

Square-and-multiply: x² by `UnaryOp 0=4`, each further bit one `BinaryOp mul`; the last
layer keeps the name and the top. The result is x**n up to float32 rounding of the
products (torch's pow rounds once; x**3 differs by at most 1 ulp per product). A base that
can only be ≥ 0 (ReLU, Sigmoid, Exp, ...) is left alone (ncnn's pow is right there).
"""

from __future__ import annotations


from paramsurgery.core.match import MatchFailure
from paramsurgery.core.changes import Change
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.patterns.pow_scalar import find_scalar_pows, integer_exponent


class FixPow(Pass, name="fix-pow", tag="pow", repair_order=48,
             summary="BinaryOp pow by a scalar integer (ncnn: exp(n·log x), wrong for x < 0) -> UnaryOp "
                     "square + BinaryOp mul"):
    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        sites = find_scalar_pows(g)
        todo = {s.layer.id for s in sites}
        for layer in g.by_type("BinaryOp"):
            if integer_exponent(layer) is not None and layer.id not in todo:
                result.skipped.append(MatchFailure(layer.name, "its base is never negative (ncnn's "
                                                       "pow is right there)", line=layer.source_line))
        for s in sites:
            layer, n = s.layer, s.exponent
            x, y, name, line = layer.inputs[0], layer.outputs[0], layer.name, layer.source_line
            before = f"BinaryOp {name} 0=6 1=1 2={layer.params.get(2)}"
            steps = _plan(n)
            # build the chain before the pow, then the pow's slot takes the last step
            cur, spelled = x, []
            prev = g.layer(name)
            made: list[str] = []
            for i, (kind, a, b) in enumerate(steps):
                last = i == len(steps) - 1
                top = y if last else g.unique_blob_name(f"{name}_p{i}")
                ins = [_blob(a, x, made), _blob(b, x, made)] if kind == "mul" else \
                    [_blob(a, x, made)]
                if last:
                    new = g.replace_layer(prev, "BinaryOp" if kind == "mul" else "UnaryOp",
                                          name, inputs=ins, outputs=[top],
                                          params={0: 2} if kind == "mul" else {0: 4})
                else:
                    new = g.add_layer("BinaryOp" if kind == "mul" else "UnaryOp",
                                      g.unique_layer_name(f"{name}_p{i}"), ins, [top],
                                      {0: 2} if kind == "mul" else {0: 4}, before=prev)
                made.append(top)
                cur = top
                spelled.append(f"{new.type} {new.name} {' '.join(ins)} -> {top}")
            assert cur == y
            result.changes.append(Change(name, f"pow by {n} as products (ncnn's pow is wrong "
                                               f"for a negative base)", before,
                                         "; ".join(spelled), line))
            result.modified = True
        if result.modified:
            g.insert_splits()
        else:
            result.notes.append("no integer pow on a base that may be negative")
        return result


def _plan(n: int) -> list[tuple[str, int, int]]:
    """Steps computing x**n: ("sq", i, -) squares value i, ("mul", i, j) multiplies values i
    and j; value -1 is x, value k the k-th step's result."""
    steps: list[tuple[str, int, int]] = []
    bits = bin(n)[3:]  # after the leading 1: square, then multiply by x for each 1 bit
    cur = -1
    for bit in bits:
        steps.append(("sq", cur, cur))
        cur = len(steps) - 1
        if bit == "1":
            steps.append(("mul", cur, -1))
            cur = len(steps) - 1
    return steps


def _blob(i: int, x: str, made: list[str]) -> str:
    return x if i < 0 else made[i]
