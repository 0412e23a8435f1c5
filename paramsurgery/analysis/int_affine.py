"""Integer shape arithmetic that pnnx left as `pnnx.Expression` layers, evaluated exactly.

pnnx keeps torch's arithmetic on traced sizes (`x.shape[-1]`, `math.ceil(...)`, `int(...)`)
as `pnnx.Expression` ops (`expr=ceil(add(add(sub(size(@0,2),@1),@2),1))`) that ncnn cannot
run. The value of such a chain is an *affine form* over integer-valued symbols:

- `size(@i, d)`: the run-time extent of dim `d` of bottom `i` (an integer);
- a one-element constant pnnx traced with an integer dtype (`pnnx.Attribute @data=(1)i64`,
  a `MemoryData` in the ncnn graph): an integer whatever the weights hold.

`add`, `sub`, `neg` and multiplication by a constant keep a form affine; `ceil`, `floor`,
`int`, `trunc`, `round` and integer casts are the identity on a form whose coefficients
and constant are integers (an integer combination of integers is an integer). Anything
else (a product of two symbols, a rounding of a fractional form, a float tensor) is
refused with the reason. A form whose symbols all cancel is a number the same at every
length: that is what lets a lowering turn shape-derived padding into ncnn's static
`Padding`, or an `arange(x.shape[d])` into a Crop against `x`'s extent.

Evaluation walks the producers once (worklist, no recursion) and evaluates in file order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Callable, Union

from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import PnnxGraph

Symbol = tuple  # ("size", blob, dim, traced shape) | ("const", layer name)


class NotAffine(Exception):
    """The value is not an exact integer affine form: the reason."""


@dataclass(frozen=True)
class Affine:
    const: Fraction = Fraction(0)
    coefs: tuple = ()  # sorted ((symbol, Fraction), ...), no zero coefficients

    @staticmethod
    def of(x: "int | Fraction | Symbol") -> "Affine":
        if isinstance(x, tuple):
            return Affine(Fraction(0), ((x, Fraction(1)),))
        return Affine(Fraction(x))

    def terms(self) -> dict:
        return dict(self.coefs)

    def plus(self, other: "Affine", sign: int = 1) -> "Affine":
        t = self.terms()
        for s, c in other.coefs:
            t[s] = t.get(s, Fraction(0)) + sign * c
        return Affine(self.const + sign * other.const,
                      tuple(sorted(((s, c) for s, c in t.items() if c != 0), key=repr)))

    def scaled(self, k: Fraction) -> "Affine":
        if k == 0:
            return Affine()
        return Affine(self.const * k, tuple((s, c * k) for s, c in self.coefs))

    @property
    def is_number(self) -> bool:
        return not self.coefs

    @property
    def integral(self) -> bool:
        return self.const.denominator == 1 and all(c.denominator == 1 for _, c in self.coefs)

    def __str__(self) -> str:
        parts = [f"{c}*{_sym_text(s)}" for s, c in self.coefs]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


def _sym_text(s: Symbol) -> str:
    return f"size({s[1]},{s[2]})" if s[0] == "size" else s[1]


Value = Union[Affine, list]  # a scalar form or a list of them (`[6, int(...)]`)


# ============================================================================ the expression text

def _tokens(text: str) -> list[str]:
    out, cur = [], ""
    for ch in text:
        if ch in "(),[]":
            if cur.strip():
                out.append(cur.strip())
            cur = ""
            out.append(ch)
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _number(tok: str) -> Fraction | None:
    try:
        return Fraction(int(tok))
    except ValueError:
        pass
    try:
        return Fraction(float(tok))
    except ValueError:
        return None


_ROUNDING = ("ceil", "floor", "int", "trunc", "round", "long")


def _apply(fn: str, args: list, size_of: Callable[[int, int], Affine]) -> Value:
    if fn == "size":
        if len(args) != 2 or not isinstance(args[0], tuple) or not isinstance(args[1], Affine) \
                or not args[1].is_number:
            raise NotAffine(f"size() with arguments {args!r}")
        return size_of(args[0][1], int(args[1].const))
    vals = []
    for a in args:
        if not isinstance(a, Affine):
            raise NotAffine(f"{fn}() of a tensor (@{a[1]}) or a list")
        vals.append(a)
    if fn == "add" and len(vals) == 2:
        return vals[0].plus(vals[1])
    if fn == "sub" and len(vals) == 2:
        return vals[0].plus(vals[1], -1)
    if fn == "neg" and len(vals) == 1:
        return vals[0].scaled(Fraction(-1))
    if fn == "mul" and len(vals) == 2:
        a, b = vals
        if a.is_number:
            return b.scaled(a.const)
        if b.is_number:
            return a.scaled(b.const)
        raise NotAffine(f"mul({a}, {b}) multiplies two sizes")
    if fn in ("div", "truediv") and len(vals) == 2:
        if not vals[1].is_number or vals[1].const == 0:
            raise NotAffine(f"{fn} by {vals[1]}")
        return vals[0].scaled(1 / vals[1].const)
    if fn in ("floor_divide", "remainder", "fmod") and len(vals) == 2:
        a, b = vals
        if not (a.is_number and b.is_number) or b.const == 0:
            raise NotAffine(f"{fn}({a}, {b}) depends on a size")
        q = a.const // b.const if fn != "fmod" else int(a.const / b.const)
        return Affine(Fraction(q)) if fn == "floor_divide" else Affine(a.const - q * b.const)
    if fn in _ROUNDING and len(vals) == 1:
        v = vals[0]
        if not v.integral:
            raise NotAffine(f"{fn}({v}) rounds a fractional value")
        return v
    raise NotAffine(f"{fn}() with {len(vals)} argument(s) is not integer shape arithmetic")


def evaluate(text: str, arg: Callable[[int], Value | tuple],
             size_of: Callable[[int, int], Affine]) -> Value:
    """Evaluate pnnx expression `text`; `arg(i)` gives `@i` (a Value, or ("tensor", i) for a
    tensor operand usable only inside `size()`)."""
    stack: list[list] = [[]]  # frames of collected arguments
    fns: list[str] = []
    pending: str | None = None
    for tok in _tokens(text):
        if tok == "(" or tok == "[":
            if tok == "(" and pending is None:
                raise NotAffine(f"malformed expression {text!r}")
            fns.append(pending if tok == "(" and pending is not None else "[")
            pending = None
            stack.append([])
        elif tok == ")" or tok == "]":
            if pending is not None:
                stack[-1].append(_atom(pending, arg))
                pending = None
            args = stack.pop()
            fn = fns.pop()
            stack[-1].append(list(args) if fn == "[" else _apply(fn, args, size_of))
        elif tok == ",":
            if pending is not None:
                stack[-1].append(_atom(pending, arg))
                pending = None
        else:
            pending = tok
    if pending is not None:
        stack[-1].append(_atom(pending, arg))
    if len(stack) != 1 or len(stack[0]) != 1:
        raise NotAffine(f"malformed expression {text!r}")
    return stack[0][0]


def _atom(tok: str, arg: Callable[[int], Value | tuple]):
    if tok.startswith("@") and tok[1:].isdigit():
        return arg(int(tok[1:]))
    n = _number(tok)
    if n is None:
        raise NotAffine(f"{tok!r} is not a number")
    return Affine(n)


# ============================================================================ over a graph

INT_DTYPES = ("i8", "u8", "i16", "i32", "i64", "torch.long", "torch.int", "torch.int64",
              "torch.int32")


@dataclass
class ShapeArith:
    """Evaluates blobs computed by shape arithmetic in one graph, with pnnx's traced ops."""

    g: Graph
    pnnx: PnnxGraph
    _ops: dict = field(default_factory=dict)
    reader: dict = field(default_factory=dict)  # size symbol -> the blob an Expression read

    def __post_init__(self) -> None:
        self._ops = {op.name: op for op in self.pnnx.ops}

    def root(self, blob: str) -> str:
        """The blob above any Splits (a size symbol names the tensor, not its copy)."""
        return self.g.above_splits(blob)

    def op_of(self, layer: Layer):
        op = self._ops.get(layer.name)
        return op if op is not None and (op.type == layer.type or layer.type == "MemoryData") \
            else None

    def value(self, blob: str) -> Value:
        """The exact value of `blob` as an integer affine form (or a list of them)."""
        chain: list[Layer] = []
        seen: set[str] = set()
        work = [blob]
        while work:
            b = self.root(work.pop())
            if b in seen:
                continue
            seen.add(b)
            prod = self.g.producer(b)
            if prod is None:
                raise NotAffine(f"{b!r} is a graph input, not shape arithmetic")
            if prod.type in ("pnnx.Expression", "Tensor.to"):
                chain.append(prod)
                if prod.type == "Tensor.to":
                    work.extend(prod.inputs)
                else:
                    op = self._need_op(prod)
                    text = op.params.get("expr", "")
                    used = {int(t[1:]) for t in _tokens(text) if t.startswith("@")}
                    for i in used - self._size_only(text):
                        work.append(prod.inputs[i])
            elif prod.type == "MemoryData":
                chain.append(prod)
            else:
                raise NotAffine(f"{b!r} is computed by {prod.type} {prod.name!r}, not by shape "
                                f"arithmetic")
        pos = self.g.position()
        values: dict[str, Value] = {}
        for layer in sorted(chain, key=lambda lay: pos[lay.id]):
            values[layer.outputs[0]] = self._eval_layer(layer, values)
        return values[self.root(blob)]

    @staticmethod
    def _size_only(text: str) -> set[int]:
        """Operands used only as the first argument of size(): their values are not needed."""
        toks = _tokens(text)
        in_size, other = set(), set()
        for i, t in enumerate(toks):
            if t.startswith("@") and t[1:].isdigit():
                if i >= 2 and toks[i - 1] == "(" and toks[i - 2] == "size":
                    in_size.add(int(t[1:]))
                else:
                    other.add(int(t[1:]))
        return in_size - other

    def _need_op(self, layer: Layer):
        op = self.op_of(layer)
        if op is None:
            raise NotAffine(f"{self.pnnx.path or 'X.pnnx.param'} has no op named {layer.name!r}")
        return op

    def _eval_layer(self, layer: Layer, values: dict[str, Value]) -> Value:
        if layer.type == "MemoryData":
            op = self._ops.get(layer.name)
            dtype = None
            if op is not None and op.outputs:
                operand = self.pnnx.operand(op.outputs[0])
                dtype = operand.dtype if operand is not None else None
            if dtype not in INT_DTYPES:
                raise NotAffine(f"MemoryData {layer.name!r} is not traced as an integer "
                                f"constant ({dtype or 'no dtype recorded'})")
            return Affine.of(("const", layer.name))
        op = self._need_op(layer)
        if layer.type == "Tensor.to":
            v = values[self.root(layer.inputs[0])]
            dtype = str(op.param("dtype", ""))
            if dtype in INT_DTYPES and isinstance(v, Affine) and not v.integral:
                raise NotAffine(f"{layer.name!r} casts the fractional {v} to {dtype}")
            return v

        def arg(i: int):
            b = self.root(layer.inputs[i])
            return values[b] if b in values else ("tensor", i)

        def size_of(i: int, d: int) -> Affine:
            b = self.root(layer.inputs[i])
            operand = self.pnnx.operand(op.inputs[i]) if i < len(op.inputs) else None
            rank = len(operand.shape) if operand is not None and operand.shape else None
            if d < 0:
                if rank is None:
                    raise NotAffine(f"size(@{i},{d}) of a tensor of unknown rank")
                d += rank
            sym = ("size", b, d, tuple(operand.shape) if operand and operand.shape else None)
            self.reader[sym] = layer.inputs[i]
            return Affine.of(sym)

        return evaluate(op.params.get("expr", ""), arg, size_of)
