"""ncnn's shape expressions (`6="0w,-1,*(0h,2)"` on Reshape, `19=`/`20=` on Crop) evaluated
on symbolic shapes: prefix operators, `Nw/Nh/Nd/Nc` = a dim of bottom N, integer literals.
Evaluated like ncnn's expression.cpp: tokens split at `( ) ,`, scanned right to left with
a stack (no recursion). An operator whose result is not affine gives None."""

from __future__ import annotations

import re
from collections.abc import Sequence

from paramsurgery.analysis.shapes.affine import MaybeDim, add, dmax, floordiv, mul, sub
from paramsurgery.analysis.shapes.shapemap import Shape

_BINARY = ("+", "-", "*", "//", "max", "min")
_SEPARATORS = re.compile(r"[(),]")


def _tokens(expr: str) -> list[str]:
    return [t.strip() for t in _SEPARATORS.split(expr) if t.strip()]


def _binary(op: str, a: MaybeDim, b: MaybeDim) -> MaybeDim:
    if op == "+":
        return add(a, b)
    if op == "-":
        return sub(a, b)
    if op == "*":
        return mul(a, b)
    if op == "//":
        if isinstance(b, int) and b > 0:
            return floordiv(a, b)
        return None
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b) if op == "max" else min(a, b)
    if op == "max":
        return dmax(a, b) if 1 in (a, b) or a == b else None
    return a if a == b else None


def eval_shape_expr(expr: str, ins: Sequence) -> list[MaybeDim] | None:
    """The list an expression evaluates to (innermost axis first, as ncnn lists w, h, d, c),
    or None when it cannot be evaluated on these input shapes."""
    stack: list[MaybeDim] = []
    for t in reversed(_tokens(expr)):
        if len(t) == 2 and t[0].isdigit() and t[1] in "whdc":
            i = int(t[0])
            if i >= len(ins) or ins[i] is None:
                return None
            stack.append(ncnn_axes(ins[i]).get(t[1], 1))
        elif t in _BINARY:
            if len(stack) < 2:
                return None
            a, b = stack.pop(), stack.pop()
            stack.append(_binary(t, a, b))
        elif t == "neg":
            if not stack:
                return None
            a = stack.pop()
            stack.append(mul(a, -1))
        else:
            try:
                stack.append(int(t))
            except ValueError:
                return None
    out = list(reversed(stack))
    return None if any(v is None for v in out) else out


AXIS_NAMES = {1: "w", 2: "hw", 3: "chw", 4: "cdhw"}  # ncnn's axis of each numpy axis, by rank


def ncnn_axes(x: Shape) -> dict[str, MaybeDim]:
    names = AXIS_NAMES.get(len(x), "")
    return dict(zip(names, x)) | {k: 1 for k in "whdc" if k not in names}
