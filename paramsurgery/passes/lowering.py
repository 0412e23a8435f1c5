"""The lowering rules' machinery (`Site`, `Rule`, `Rules`, `rule`) and the base
rules: each rule rewrites one converter leftover into ncnn layers at a `Site`. The rule
modules (`lower_layout`, `lower_values`, `lower_masks`) build on this one; `lower.py` is the
pass that applies them all."""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Sequence, TypeGuard

import numpy as np

from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.values import FLT_MAX
from paramsurgery.formats.pnnx_traced import Op, op_named
from paramsurgery.core.match import MatchFailure
from paramsurgery.core.ncnn import BinaryOpType, UnaryOpType

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import PnnxGraph

# the op codes the lowerings emit, as plain ints (a param value is written with str())
ADD, SUB, MUL, DIV, MAX, MIN = (int(BinaryOpType.ADD), int(BinaryOpType.SUB), int(BinaryOpType.MUL),
                                int(BinaryOpType.DIV), int(BinaryOpType.MAX), int(BinaryOpType.MIN))
ABS, NEG, TRUNC = int(UnaryOpType.ABS), int(UnaryOpType.NEG), int(UnaryOpType.TRUNC)
# rows of a MemoryData table a rule crops to a run-time extent (ones, positions): 128 KiB of
# float32, so a lowering is exact for extents up to it
TABLE = 32768


# ============================================================================ rule plumbing

@dataclass
class Step:
    type: str
    inputs: list[str]
    params: dict[int, object]
    hint: str
    out: str
    weights: dict | None = None  # role -> values, for a new MemoryData


@dataclass
class Site:
    """One leftover layer being lowered: its bottoms, pnnx's op, and the layers emitted."""

    g: Graph
    layer: Layer
    pnnx: PnnxGraph | None
    traced_path: str | None
    steps: list[Step] = field(default_factory=list)
    shared: dict = field(default_factory=dict)  # one run's analyses and facts, by rule modules

    # ------------------------------------------------------------------ reading
    def input(self, slot: int) -> str:
        if slot >= len(self.layer.inputs):
            raise MatchFailure.declined(f"has {len(self.layer.inputs)} bottoms, expected more than {slot}")
        return self.layer.inputs[slot]

    def op(self) -> "Op":
        """pnnx's op for this layer (pnnx keeps a leftover's name in the ncnn graph)."""
        return op_named(self.traced(), self.layer, self.traced_path)

    def traced(self) -> PnnxGraph:
        """pnnx's graph (X.pnnx.param); declines when it was not given."""
        if self.pnnx is None:
            raise MatchFailure.declined("needs pnnx's traced op (X.pnnx.param; --pnnx): pnnx drops a "
                           "leftover's arguments and shapes from the ncnn graph")
        return self.pnnx

    def param(self, key: str, default: object = None) -> object:
        return self.op().param(key, default)

    def constant(self, slot: int) -> object:
        """The value of a constant `pnnx.Expression` feeding bottom `slot` (through Splits)."""
        blob = self.input(slot)
        prod = self.g.producer(self.g.above_splits(blob))
        if prod is None or prod.type != "pnnx.Expression" or prod.inputs:
            raise MatchFailure.declined(f"bottom {slot} ({blob!r}) is a tensor, not a constant")
        if self.pnnx is None:
            raise MatchFailure.declined(f"bottom {slot} is the constant pnnx.Expression {prod.name!r}, "
                           f"whose value pnnx keeps only in X.pnnx.param (--pnnx)")
        from paramsurgery.formats.pnnx_param import parse_value

        op = self.pnnx.op_by_name(prod.name)
        if op is not None and op.type == "pnnx.Expression":
            text = op.params.get("expr")
            value = parse_value(text) if text is not None else None
            if text is None or not (value is None or isinstance(value, (int, float))):
                raise MatchFailure.declined(f"pnnx.Expression {prod.name!r} computes {text!r}, not a "
                               f"constant")
            return value
        raise MatchFailure.declined(f"{self.traced_path} has no pnnx.Expression named {prod.name!r}")

    def is_constant(self, slot: int) -> bool:
        prod = self.g.producer(self.g.above_splits(self.input(slot)))
        return prod is not None and prod.type == "pnnx.Expression" and not prod.inputs

    def number(self, slot: int, what: str) -> float:
        v = self.constant(slot)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise MatchFailure.declined(f"{what} is {v!r}, not a number")
        return v

    def shape(self, slot: int) -> tuple | None:
        op = self.op()
        if slot >= len(op.inputs):
            return None
        operand = self.traced().operand(op.inputs[slot])
        return operand.shape if operand is not None else None

    def known_shape(self, slot: int) -> tuple:
        """The traced shape of bottom `slot`; declines when pnnx recorded none."""
        shape = self.shape(slot)
        if shape is None:
            raise MatchFailure.declined("pnnx recorded no shape for the operand")
        return shape

    def same_shape(self, *slots: int) -> None:
        """Element-wise only: every listed operand has the same traced shape."""
        shapes = [shape for shape in (self.shape(s) for s in slots) if shape is not None]
        if len(shapes) != len(slots):
            raise MatchFailure.declined("pnnx recorded no shape for an operand")
        if len(set(shapes)) != 1:
            txt = ", ".join("(" + ",".join("?" if d is None else str(d) for d in s) + ")"
                            for s in shapes)
            raise MatchFailure.declined(f"broadcasts ({txt}): torch's and ncnn's BinaryOp broadcasting "
                           f"differ, so it is not lowered")

    def axis(self, dim: object, slot: int = 0) -> int:
        """torch dim of bottom `slot` → a negative ncnn axis."""
        d, rank = checked_dim(dim, self.shape(slot))
        if d == 0:
            raise MatchFailure.declined("works along dim 0, which may be pnnx's batch axis (ncnn's n): "
                           "ncnn layers cannot address it")
        return d - rank

    # ------------------------------------------------------------------ emitting
    def emit(self, type: str, inputs: Sequence[str], params: dict | None = None,
             hint: str | None = None, weights: dict | None = None) -> str:
        out = f"%{len(self.steps)}"
        self.steps.append(Step(type, list(inputs), dict(params or {}),
                               hint or type.lower(), out, weights))
        return out

    def binary(self, op: int, a: str, b: str | None = None, scalar: float | None = None,
               hint: str | None = None) -> str:
        name = BinaryOpType(op).name.lower()
        if b is None:
            return self.emit("BinaryOp", [a], {0: int(op), 1: 1, 2: float(np.float32(scalar))},
                             hint or name)
        return self.emit("BinaryOp", [a, b], {0: int(op)}, hint or name)


def checked_dim(dim: object, shape: tuple | None) -> tuple[int, int]:
    """(dim in 0..rank-1, rank) of a torch dim of an operand with traced `shape`."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise MatchFailure.declined(f"dim {dim!r} is not an int")
    if shape is None:
        raise MatchFailure.declined("pnnx recorded no shape for the operand (its rank is needed)")
    rank = len(shape)
    if not -rank <= dim < rank:
        raise MatchFailure.declined(f"dim {dim} out of range for rank {rank}")
    return dim % rank, rank


def _as_float(v: object, what: str) -> float:
    """A numeric pnnx param as a float (pnnx writes inf/nan as words, kept as strings by
    parse_value: `float` reads them); declines on anything else (a tuple, other words)."""
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
    raise MatchFailure.declined(f"{what}={v!r} is not a number")


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class Rule:
    name: str
    types: tuple[str, ...]
    doc: str  # the algebra, one line
    fn: Callable[[Site], str]


class Rules(tuple):
    """An ordered set of rules; compose with `+`, narrow with `.only` / `.without`."""

    def __add__(self, other: Iterable[Rule]) -> "Rules":  # type: ignore[override]
        return Rules(tuple(self) + tuple(other))

    def only(self, names: Iterable[str]) -> "Rules":
        names = list(names)
        unknown = [n for n in names if n not in self.names()]
        if unknown:
            raise PassRefused(f"unknown rule(s) {', '.join(unknown)} (known: "
                              f"{', '.join(self.names())})")
        return Rules(r for r in self if r.name in names)

    def without(self, names: Iterable[str]) -> "Rules":
        names = set(names)
        return Rules(r for r in self if r.name not in names)

    def names(self) -> list[str]:
        return [r.name for r in self]

    def for_type(self, t: str) -> Rule | None:
        for r in self:
            if t in r.types:
                return r
        return None


_RULES: list[Rule] = []


def rule(*types: str, doc: str, into: list[Rule] | None = None
         ) -> Callable[[Callable[[Site], str]], Callable[[Site], str]]:
    """Register `fn` as the rule for `types` (in this module's set, or in `into`: the list
    a rule module composes into its own `Rules`)."""
    def deco(fn: Callable[[Site], str]) -> Callable[[Site], str]:
        (_RULES if into is None else into).append(Rule(fn.__name__, tuple(types), doc, fn))
        return fn
    return deco


# ============================================================================ the rules

def _add_combined(s: Site, op: int) -> str:
    """s + (value*a) op b: addcmul (op MUL) and addcdiv (op DIV)."""
    v = s.number(3, "value")
    s.same_shape(0, 1, 2)
    t = s.input(1) if v == 1 else s.binary(MUL, s.input(1), scalar=v)
    return s.binary(ADD, s.input(0), s.binary(op, t, s.input(2)))


# addcmul(s, a, b, value) = s + (value*a)*b     (ATen: self + value * t1 * t2)
@rule("aten::addcmul", doc="s + (value*a)*b")
def addcmul(s: Site) -> str:
    return _add_combined(s, MUL)


# addcdiv(s, a, b, value) = s + (value*a)/b     (ATen: self + value * t1 / t2)
@rule("aten::addcdiv", doc="s + (value*a)/b")
def addcdiv(s: Site) -> str:
    return _add_combined(s, DIV)


# lerp(s, e, w) = |w| < 0.5 ? s + w*(e-s) : e - (e-s)*(1-w)   (ATen LerpKernel; scalar w only)
@rule("aten::lerp", doc="|w| < 0.5 ? s + w*(e-s) : e - (e-s)*(1-w), scalar w")
def lerp(s: Site) -> str:
    if not s.is_constant(2):
        raise MatchFailure.declined("the weight is a tensor: torch picks the formula per element "
                       "(|w| < 0.5) and ncnn has no select layer")
    w = s.number(2, "weight")
    s.same_shape(0, 1)
    d = s.binary(SUB, s.input(1), s.input(0))
    if abs(w) < 0.5:
        return s.binary(ADD, s.input(0), s.binary(MUL, d, scalar=w))
    return s.binary(SUB, s.input(1), s.binary(MUL, d, scalar=float(np.float32(1) - np.float32(w))))


# frac(x) = x - trunc(x)     (ATen: self - std::trunc(self))
@rule("aten::frac", doc="x - trunc(x)")
def frac(s: Site) -> str:
    x = s.input(0)
    return s.binary(SUB, x, s.emit("UnaryOp", [x], {0: TRUNC}, "trunc"))


# clamp_min(x, lo) = Clip(lo, FLT_MAX) for a constant lo, max(x, lo) for a tensor
@rule("aten::clamp_min", doc="Clip(lo, FLT_MAX) | max(x, lo)")
def clamp_min(s: Site) -> str:
    if s.is_constant(1):
        return s.emit("Clip", [s.input(0)], {0: s.number(1, "min"), 1: FLT_MAX}, "clip")
    s.same_shape(0, 1)
    return s.binary(MAX, s.input(0), s.input(1))


# clamp_max(x, hi) = Clip(-FLT_MAX, hi) for a constant hi, min(x, hi) for a tensor
@rule("aten::clamp_max", doc="Clip(-FLT_MAX, hi) | min(x, hi)")
def clamp_max(s: Site) -> str:
    if s.is_constant(1):
        return s.emit("Clip", [s.input(0)], {0: -FLT_MAX, 1: s.number(1, "max")}, "clip")
    s.same_shape(0, 1)
    return s.binary(MIN, s.input(0), s.input(1))


# clamp(x, min=t, max=u) with tensor bounds = min(max(x, t), u)   (ATen clamp: min(max(x, lo), hi))
@rule("torch.clamp", "Tensor.clamp", doc="min(max(x, lo), hi), tensor bounds")
def clamp(s: Site) -> str:
    op = s.op()
    slot = {name: op.inputs.index(blob) for name, blob in op.arg_names.items()
            if blob in op.inputs}
    x = s.input(slot.get("input", 0))
    lo = op.param("min", None)
    hi = op.param("max", None)
    s.same_shape(*[slot[k] for k in ("input", "min", "max") if k in slot])
    if "min" in slot:
        x = s.binary(MAX, x, s.input(slot["min"]))
    elif lo is not None:
        x = s.emit("Clip", [x], {0: _as_float(lo, "min"), 1: FLT_MAX}, "clip")
    if "max" in slot:
        x = s.binary(MIN, x, s.input(slot["max"]))
    elif hi is not None:
        x = s.emit("Clip", [x], {0: -FLT_MAX, 1: _as_float(hi, "max")}, "clip")
    if not s.steps:
        raise MatchFailure.declined("clamp without bounds")
    return x


# softsign(x) = x / (|x| + 1)     (torch.nn.functional.softsign)
@rule("F.softsign", doc="x / (|x| + 1)")
def softsign(s: Site) -> str:
    x = s.input(0)
    return s.binary(DIV, x, s.binary(ADD, s.emit("UnaryOp", [x], {0: ABS}, "abs"), scalar=1.0))


# tanhshrink(x) = x - tanh(x)     (torch.nn.functional.tanhshrink)
@rule("F.tanhshrink", doc="x - tanh(x)")
def tanhshrink(s: Site) -> str:
    x = s.input(0)
    return s.binary(SUB, x, s.emit("TanH", [x], {}, "tanh"))


# deg2rad(x) = x * float(pi/180); rad2deg(x) = x * float(180/pi)   (ATen: self * M_PI_180)
@rule("aten::deg2rad", "aten::rad2deg", doc="x * float(pi/180) | x * float(180/pi)")
def deg2rad(s: Site) -> str:
    k = np.pi / 180 if s.layer.type == "aten::deg2rad" else 180 / np.pi
    return s.binary(MUL, s.input(0), scalar=k)


# rrelu(x) at inference = leaky_relu(x, (lower+upper)/2)     (ATen rrelu_with_noise, eval)
@rule("F.rrelu", doc="leaky_relu(x, (lower+upper)/2), training=False")
def rrelu(s: Site) -> str:
    if s.param("training", False) is not False:
        raise MatchFailure.declined("training=True: the slope is random")
    lower, upper = s.param("lower", 1.0 / 8), s.param("upper", 1.0 / 3)
    slope = (_as_float(lower, "lower") + _as_float(upper, "upper")) / 2
    return s.emit("ReLU", [s.input(0)], {0: slope}, "relu")


# softmin(x, dim) = softmax(-x, dim)     (torch.nn.functional.softmin)
@rule("F.softmin", doc="softmax(-x, dim)")
def softmin(s: Site) -> str:
    axis = s.axis(s.param("dim"))
    neg = s.emit("UnaryOp", [s.input(0)], {0: NEG}, "neg")
    return s.emit("Softmax", [neg], {0: axis, 1: 1}, "softmax")


# narrow(x, dim, start, length) = x[start:start+length] along dim   (static start/length)
@rule("torch.narrow", "Tensor.narrow", doc="Crop [start, start+length) along dim")
def narrow(s: Site) -> str:
    if len(s.layer.inputs) != 1:
        raise MatchFailure.declined("start or length is computed at run time (an extra bottom): Crop "
                       "needs them as numbers")
    start, length = s.param("start"), s.param("length")
    if not (_is_int(start) and _is_int(length)):
        raise MatchFailure.declined(f"start={start!r} length={length!r} are not static ints")
    axis = s.axis(s.param("dim"))
    if start < 0:
        size = s.known_shape(0)[axis]
        if size is None:
            raise MatchFailure.declined("negative start on a dynamic dim")
        start += size
    if start < 0 or length < 0:
        raise MatchFailure.declined(f"start={start} length={length} out of range")
    return s.emit("Crop", [s.input(0)], {9: [start], 10: [start + length], 11: [axis]}, "crop")


# mT(x) = x.transpose(-2, -1) = Permute 0=1 (swaps w and h for 2-D, 3-D and 4-D blobs)
@rule("aten::mT", doc="Permute 0=1 (swap the two innermost dims)")
def mT(s: Site) -> str:
    s.axis(-2)  # declines when dim -2 is dim 0 (rank 2: possibly pnnx's batch axis)
    if len(s.known_shape(0)) > 5:
        raise MatchFailure.declined(f"rank {len(s.known_shape(0))}: ncnn blobs have at most 4 dims")
    return s.emit("Permute", [s.input(0)], {0: 1}, "permute")


# ---------------------------------------------------------------- known, not exact

def _declines(reason: str) -> Callable[[Site], str]:
    def fn(s: Site) -> str:
        raise MatchFailure.declined(reason)
    return fn


_NOT_EXACT = [
    ("exp2", ("aten::exp2",), "ncnn has no exp2; pow(2, x) / exp(x*ln 2) round differently"),
    ("hypot", ("aten::hypot",), "sqrt(a*a + b*b) overflows and underflows where hypot does not"),
    ("fmax", ("aten::fmax", "aten::fmin"), "fmax/fmin ignore NaN; ncnn's max/min propagate it"),
    ("erfc", ("aten::erfc",), "1 - erf(x) loses every digit where erfc(x) is small"),
    ("xlogy", ("aten::xlogy",), "xlogy(0, y) is 0 even where log(y) is -inf or NaN; "
                                "x*log(y) is NaN there"),
    ("sign_ops", ("aten::copysign", "aten::heaviside"), "ncnn has no sign-bit or select op"),
    # (torch.where with a 0/1 mask and finfo.min: lower_masks.where)
    ("select", ("F.threshold",),
     "ncnn has no select layer (x*mask + y*(1-mask) is NaN where x or y is inf)"),
    ("float_power", ("aten::float_power",), "computes in float64; ncnn computes in float32"),
    ("softplus", ("F.softplus",), "ncnn's Softplus has no beta/threshold (log(1+exp(x)) only)"),
    ("full_like", ("torch.full_like", "torch.zeros_like", "torch.ones_like"),
     "0*x + c is NaN where x is inf or NaN"),
]
for _name, _types, _why in _NOT_EXACT:
    _RULES.append(Rule(_name, _types, f"declined: {_why}", _declines(_why)))

BASE_RULES = Rules(_RULES)
