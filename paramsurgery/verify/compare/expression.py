"""Values inside one pnnx op that ncnn computes as layers of their own, so the blobs between
them can be compared too although no pnnx operand holds them:

- `pnnx.Expression`: ncnn expands `add(mul(@0,@1),@2)` into one BinaryOp/UnaryOp per
  operator; `subterm_values` evaluates every inner term from the captured operands (numpy,
  torch's type promotion for the common cases);
- a conv with `padding_mode` reflect / replicate / circular: ncnn pads in a `Padding` layer
  first; `conv_padding_terms` is that padded input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Union, cast

import numpy as np

_TOKEN = re.compile(r"\s*(?:(@[0-9]+)|([A-Za-z_][A-Za-z_0-9]*)\(|"
                    r"([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)|(\()|(\))|(,))")


@dataclass
class Term:
    func: str
    args: list["Node"]
    text: str


Node = Union[Term, int, float, str]  # Term, operand slot (int via "@k" -> str), constant


def parse(expr: str) -> Node:
    """`add(mul(@0,2),@1)` → a tree of Terms; `@k` → "@k"; numbers → float/int.
    Raises ValueError on text it does not understand."""
    pos = 0

    def node() -> Node:
        nonlocal pos
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"bad expression at {expr[pos:]!r}")
        start = pos
        pos = m.end()
        if m.group(1):
            return m.group(1)
        if m.group(3):
            t = m.group(3)
            return float(t) if any(c in t for c in ".eE") else int(t)
        if m.group(2):
            args: list[Node] = []
            while True:
                args.append(node())
                m2 = _TOKEN.match(expr, pos)
                if m2 is None:
                    raise ValueError(f"bad expression at {expr[pos:]!r}")
                pos = m2.end()
                if m2.group(5):
                    break
                if not m2.group(6):
                    raise ValueError(f"expected ',' or ')' at {expr[m2.start():]!r}")
            return Term(m.group(2), args, expr[start:pos].strip())
        raise ValueError(f"bad expression at {expr[start:]!r}")

    tree = node()
    if expr[pos:].strip():
        raise ValueError(f"trailing text {expr[pos:]!r}")
    return tree


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.true_divide(a, b).astype(np.result_type(a, b, np.float32))


_FUNCS: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div,
    "pow": np.power, "neg": np.negative, "abs": np.abs, "sqrt": np.sqrt,
    "rsqrt": lambda a: 1 / np.sqrt(a), "exp": np.exp, "log": np.log, "log10": np.log10,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "atan2": np.arctan2, "floor": np.floor, "ceil": np.ceil,
    "round": np.round, "trunc": np.trunc, "sign": np.sign, "square": np.square,
    "reciprocal": lambda a: 1 / a, "maximum": np.maximum, "minimum": np.minimum,
    "max": np.maximum, "min": np.minimum, "floor_divide": np.floor_divide,
    "remainder": np.remainder, "fmod": np.fmod, "tanh": np.tanh, "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
}


def subterm_values(expr: str, inputs: list[np.ndarray | None]) -> list[tuple[str, np.ndarray]]:
    """(term text, value) for every inner term of `expr` (the whole expression excluded),
    innermost first; terms that read an unknown input or use a function not handled here
    are left out."""
    try:
        tree = parse(expr)
    except ValueError:
        return []
    out: list[tuple[str, np.ndarray]] = []
    # iterative post-order walk: (node, visited?)
    stack: list[tuple[Node, bool]] = [(tree, False)]
    values: dict[int, np.ndarray | None] = {}
    while stack:
        nd, done = stack.pop()
        if not isinstance(nd, Term):
            continue
        if not done:
            stack.append((nd, True))
            for a in reversed(nd.args):
                stack.append((a, False))
            continue
        args: list[Any] = []
        for a in nd.args:
            if isinstance(a, Term):
                args.append(values.get(id(a)))
            elif isinstance(a, str):
                k = int(a[1:])
                args.append(inputs[k] if k < len(inputs) else None)
            else:
                args.append(np.float32(a) if isinstance(a, float) else a)
        f = _FUNCS.get(nd.func)
        if f is None or any(x is None for x in args):
            values[id(nd)] = None
            continue
        with np.errstate(all="ignore"):
            v = np.asarray(f(*args))
        if v.dtype == np.float64:
            v = v.astype(np.float32)
        values[id(nd)] = v
        if nd is not tree:
            out.append((nd.text, v))
    return out


_PAD_MODES = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def conv_padding_terms(op, inputs: list[np.ndarray | None]) -> list[tuple[str, np.ndarray]]:
    """("pad", padded input) of a Conv1d/2d/3d whose padding mode is not zeros (pnnx writes
    the Padding layer even for padding 0: then it is a copy)."""
    mode = _PAD_MODES.get(str(op.params.get("padding_mode", "zeros")))
    pad = op.param("padding")
    if mode is None or not inputs or inputs[0] is None or not isinstance(pad, tuple):
        return []
    x = inputs[0]
    if not op.type.startswith("nn.Conv") or x.ndim < len(pad):
        return []
    widths = [(0, 0)] * (x.ndim - len(pad)) + [(int(p), int(p)) for p in pad]
    return [("pad", np.pad(x, widths, mode=cast(Any, mode)))]  # a str, not the stub's Literal
