"""Reading Reshape targets and ncnn shape expressions (`6="16,4,0h"`, `20="-(0w,3)"`) as
tokens, for passes that reason about layouts."""

from __future__ import annotations

from typing import Any, cast

from paramsurgery.ir.layer import Layer


def split_top_level(expr: str) -> list[str]:
    """Split an ncnn shape expression at its top-level commas:
    `"//(*(256,0h),15),15"` → `["//(*(256,0h),15)", "15"]`."""
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def reshape_dims(layer: Layer) -> list[str] | None:
    """A Reshape's target dims as tokens, innermost first (w, h[, d], c): from its shape
    expression `6=` when present, else from `0/1/11/2` (-233 = absent); None if unknown."""
    p = layer.params
    expr = p.get(6)
    if isinstance(expr, str) and expr:
        return split_top_level(expr)
    w, h, d, c = (p.get(pid, -233) for pid in (0, 1, 11, 2))
    if w == -233:
        return None
    if h == -233:
        return [str(w)]
    if d == -233 and c == -233:
        return [str(w), str(h)]
    if d == -233:
        return [str(w), str(h), str(c)]
    return [str(w), str(h), str(d), str(c)]


def int_or_none(tok: object) -> int | None:
    """A token as an int, None when it is an expression."""
    try:
        return int(cast(Any, tok))
    except (TypeError, ValueError):
        return None
