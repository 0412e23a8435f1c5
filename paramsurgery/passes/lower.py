"""Lower pnnx leftovers that have an exact ncnn equivalent (`paramsurgery lower`).

pnnx 20261020 leaves some common torch ops unconverted (`aten::addcmul`, `aten::lerp`,
`aten::frac`, `F.softsign`, `torch.narrow`, ...): ncnn cannot load the graph. Each rule below
rewrites one such op into the ncnn layers that compute the same formula, op for op, as torch's
own definition (the ATen kernel or `torch.nn.functional`). Rules are data: one small function
per rule, with its algebra as a one-line comment, collected in `RULES`; rule sets compose
with `+` and narrow with `.only(...)` / `.without(...)`.

- Scalars pnnx passes as a constant `pnnx.Expression` (addcmul's `value`, lerp's `weight`,
  clamp_min's bound) have their value only in `X.pnnx.param` (pnnx drops `expr=` from the
  ncnn line); the constant, and the Split that fans it out, are removed once unread.
- Element-wise rules need operands of the same traced shape (pnnx's shapes in
  `X.pnnx.param`): torch broadcasting and ncnn's BinaryOp broadcasting differ, so a
  broadcasting op is declined.
- Dims are given to ncnn as negative axes (unaffected by pnnx dropping a leading batch
  axis); dim 0 is declined (it may be pnnx's batch axis, which ncnn layers cannot address).
- Declining rules document leftovers that have no exact ncnn equivalent (exp2, hypot, fmax,
  erfc, where/masked_fill, ...) with the reason.

The results agree with torch up to float rounding of the same operations: torch's vectorised
CPU kernels fuse some multiply-adds (addcmul, lerp), ncnn rounds each op (≤ 1-2 ulp).
A rule that declines makes the pass refuse (nothing written) unless `partial`; leftovers no
rule knows are listed as notes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Sequence, TypeGuard

import numpy as np

from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.layer_types import is_converter_leftover
from paramsurgery.core.values import FLT_MAX
from paramsurgery.passes.shared_tables import share_added_tables
from paramsurgery.passes.base import TRACED_LEN, Change, Pass, PassResult, RepairContext, Skip, register
from paramsurgery.formats.pnnx_traced import Op, op_named
from paramsurgery.patterns.match import NoMatch

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import PnnxGraph

# ncnn BinaryOp 0= / UnaryOp 0= op types (src/layer/binaryop.h, unaryop.h)
ADD, SUB, MUL, DIV, MAX, MIN = 0, 1, 2, 3, 4, 5
ABS, NEG, TRUNC = 0, 1, 19
# rows of a MemoryData table a rule crops to a run-time extent (ones, positions): 128 KiB of
# float32, so a lowering is exact for extents up to it
TABLE = 32768


class Declined(NoMatch):
    """A rule that knows the op but cannot lower this instance exactly: the reason (a
    NoMatch, so --explain words it as every pass does)."""

    def __init__(self, reason: str, layer: Layer | None = None) -> None:
        super().__init__(layer, reason)


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
            raise Declined(f"has {len(self.layer.inputs)} bottoms, expected more than {slot}")
        return self.layer.inputs[slot]

    def op(self) -> "Op":
        """pnnx's op for this layer (pnnx keeps a leftover's name in the ncnn graph)."""
        return op_named(self.traced(), self.layer, self.traced_path)

    def traced(self) -> PnnxGraph:
        """pnnx's graph (X.pnnx.param); declines when it was not given."""
        if self.pnnx is None:
            raise Declined("needs pnnx's traced op (X.pnnx.param; --pnnx): pnnx drops a "
                           "leftover's arguments and shapes from the ncnn graph")
        return self.pnnx

    def param(self, key: str, default: object = None) -> object:
        return self.op().param(key, default)

    def constant(self, slot: int) -> object:
        """The value of a constant `pnnx.Expression` feeding bottom `slot` (through Splits)."""
        blob = self.input(slot)
        prod = self.g.producer(self.g.above_splits(blob))
        if prod is None or prod.type != "pnnx.Expression" or prod.inputs:
            raise Declined(f"bottom {slot} ({blob!r}) is a tensor, not a constant")
        if self.pnnx is None:
            raise Declined(f"bottom {slot} is the constant pnnx.Expression {prod.name!r}, "
                           f"whose value pnnx keeps only in X.pnnx.param (--pnnx)")
        from paramsurgery.formats.pnnx_param import parse_value

        op = self.pnnx.op_by_name(prod.name)
        if op is not None and op.type == "pnnx.Expression":
            text = op.params.get("expr")
            value = parse_value(text) if text is not None else None
            if text is None or not (value is None or isinstance(value, (int, float))):
                raise Declined(f"pnnx.Expression {prod.name!r} computes {text!r}, not a "
                               f"constant")
            return value
        raise Declined(f"{self.traced_path} has no pnnx.Expression named {prod.name!r}")

    def is_constant(self, slot: int) -> bool:
        prod = self.g.producer(self.g.above_splits(self.input(slot)))
        return prod is not None and prod.type == "pnnx.Expression" and not prod.inputs

    def number(self, slot: int, what: str) -> float:
        v = self.constant(slot)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise Declined(f"{what} is {v!r}, not a number")
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
            raise Declined("pnnx recorded no shape for the operand")
        return shape

    def same_shape(self, *slots: int) -> None:
        """Element-wise only: every listed operand has the same traced shape."""
        shapes = [shape for shape in (self.shape(s) for s in slots) if shape is not None]
        if len(shapes) != len(slots):
            raise Declined("pnnx recorded no shape for an operand")
        if len(set(shapes)) != 1:
            txt = ", ".join("(" + ",".join("?" if d is None else str(d) for d in s) + ")"
                            for s in shapes)
            raise Declined(f"broadcasts ({txt}): torch's and ncnn's BinaryOp broadcasting "
                           f"differ, so it is not lowered")

    def axis(self, dim: object, slot: int = 0) -> int:
        """torch dim of bottom `slot` → a negative ncnn axis."""
        d, rank = checked_dim(dim, self.shape(slot))
        if d == 0:
            raise Declined("works along dim 0, which may be pnnx's batch axis (ncnn's n): "
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
        names = {ADD: "add", SUB: "sub", MUL: "mul", DIV: "div", MAX: "max", MIN: "min"}
        if b is None:
            return self.emit("BinaryOp", [a], {0: op, 1: 1, 2: float(np.float32(scalar))},
                             hint or names[op])
        return self.emit("BinaryOp", [a, b], {0: op}, hint or names[op])


def checked_dim(dim: object, shape: tuple | None) -> tuple[int, int]:
    """(dim in 0..rank-1, rank) of a torch dim of an operand with traced `shape`."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise Declined(f"dim {dim!r} is not an int")
    if shape is None:
        raise Declined("pnnx recorded no shape for the operand (its rank is needed)")
    rank = len(shape)
    if not -rank <= dim < rank:
        raise Declined(f"dim {dim} out of range for rank {rank}")
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
    raise Declined(f"{what}={v!r} is not a number")


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
        raise Declined("the weight is a tensor: torch picks the formula per element "
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
        raise Declined("clamp without bounds")
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
        raise Declined("training=True: the slope is random")
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
        raise Declined("start or length is computed at run time (an extra bottom): Crop "
                       "needs them as numbers")
    start, length = s.param("start"), s.param("length")
    if not (_is_int(start) and _is_int(length)):
        raise Declined(f"start={start!r} length={length!r} are not static ints")
    axis = s.axis(s.param("dim"))
    if start < 0:
        size = s.known_shape(0)[axis]
        if size is None:
            raise Declined("negative start on a dynamic dim")
        start += size
    if start < 0 or length < 0:
        raise Declined(f"start={start} length={length} out of range")
    return s.emit("Crop", [s.input(0)], {9: [start], 10: [start + length], 11: [axis]}, "crop")


# mT(x) = x.transpose(-2, -1) = Permute 0=1 (swaps w and h for 2-D, 3-D and 4-D blobs)
@rule("aten::mT", doc="Permute 0=1 (swap the two innermost dims)")
def mT(s: Site) -> str:
    s.axis(-2)  # declines when dim -2 is dim 0 (rank 2: possibly pnnx's batch axis)
    if len(s.known_shape(0)) > 5:
        raise Declined(f"rank {len(s.known_shape(0))}: ncnn blobs have at most 4 dims")
    return s.emit("Permute", [s.input(0)], {0: 1}, "permute")


# ---------------------------------------------------------------- known, not exact

def _declines(reason: str) -> Callable[[Site], str]:
    def fn(s: Site) -> str:
        raise Declined(reason)
    return fn


_NOT_EXACT = [
    ("exp2", ("aten::exp2",), "ncnn has no exp2; pow(2, x) / exp(x*ln 2) round differently"),
    ("hypot", ("aten::hypot",), "sqrt(a*a + b*b) overflows and underflows where hypot does not"),
    ("fmax", ("aten::fmax", "aten::fmin"), "fmax/fmin ignore NaN; ncnn's max/min propagate it"),
    ("erfc", ("aten::erfc",), "1 - erf(x) loses every digit where erfc(x) is small"),
    ("xlogy", ("aten::xlogy",), "xlogy(0, y) is 0 even where log(y) is -inf or NaN; "
                                "x*log(y) is NaN there"),
    ("sign_ops", ("aten::copysign", "aten::heaviside"), "ncnn has no sign-bit or select op"),
    ("select", ("torch.where", "F.threshold", "aten::where"),
     "ncnn has no select layer (x*mask + y*(1-mask) is NaN where x or y is inf)"),
    ("float_power", ("aten::float_power",), "computes in float64; ncnn computes in float32"),
    ("softplus", ("F.softplus",), "ncnn's Softplus has no beta/threshold (log(1+exp(x)) only)"),
    ("full_like", ("torch.full_like", "torch.zeros_like", "torch.ones_like"),
     "0*x + c is NaN where x is inf or NaN"),
]
for _name, _types, _why in _NOT_EXACT:
    _RULES.append(Rule(_name, _types, f"declined: {_why}", _declines(_why)))

_BASE_RULES = Rules(_RULES)
_DEFAULT: list[Rules] = []


def default_rules() -> Rules:
    """This module's rules + the rule modules built on it (`lower_layout`: slices, slice
    assignment, padding; `lower_values`: arange, casts; `lower_masks`: comparisons,
    masked_fill, expand, repeat). Composed on first use, so a rule module can import this
    one first."""
    if not _DEFAULT:
        from paramsurgery.passes.lower_layout import LAYOUT_RULES
        from paramsurgery.passes.lower_masks import MASK_RULES
        from paramsurgery.passes.lower_values import VALUE_RULES

        _DEFAULT.append(_BASE_RULES + LAYOUT_RULES + VALUE_RULES + MASK_RULES)
    return _DEFAULT[0]


def __getattr__(name: str) -> Rules:  # `from paramsurgery.passes.lower import RULES`
    if name == "RULES":
        return default_rules()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ============================================================================ the pass

@register
class Lower(Pass):
    name = "lower"
    summary = "rewrite pnnx leftovers with an exact ncnn equivalent (addcmul, lerp, frac, " \
              "clamp_min, softsign, narrow, ...) into ncnn layers"
    repair_order = 20

    @classmethod
    def claims(cls, layer: Layer) -> bool:
        r = default_rules().for_type(layer.type)
        return r is not None and not r.doc.startswith("declined:")

    fix_inputs = (TRACED_LEN,)

    @classmethod
    def for_fix(cls, ctx: RepairContext, asked: bool) -> "Lower | None":
        return cls(traced=ctx.traced, partial=True, traced_len=ctx.option("traced_len")) \
            if asked else None

    def __init__(self, rules: Iterable[Rule] | None = None, *,
                 traced: str | os.PathLike | None = None, partial: bool = False,
                 traced_len: int | None = None) -> None:
        self.rules = Rules(rules) if rules is not None else default_rules()
        self.traced = os.fspath(traced) if traced is not None else None
        self.partial = partial
        self.traced_len = traced_len  # evidence for frozen_extent when X_ncnn.py is absent

    def run(self, g: Graph) -> PassResult:
        pnnx = None
        if self.traced is not None:
            from paramsurgery.formats.pnnx_param import read_pnnx_param

            pnnx = read_pnnx_param(self.traced)
        result = PassResult(g, False)
        declined: list[tuple[Layer, Rule, str]] = []
        unknown: dict[str, list[str]] = {}
        lowered = 0
        shared: dict = {}
        existing = {layer.id for layer in g}  # what the pass adds may share tables
        if pnnx is not None:
            lowered += self._thaw(g, pnnx, shared, result)
        for layer in list(g):
            if layer.graph is not g:
                continue  # removed by an earlier rewrite (a pruned constant)
            r = self.rules.for_type(layer.type)
            if r is None:
                if is_converter_leftover(layer.type) and layer.type != "pnnx.Expression":
                    unknown.setdefault(layer.type, []).append(layer.name)
                continue
            site = Site(g, layer, pnnx, self.traced, shared=shared)
            try:
                if len(layer.outputs) != 1:
                    raise Declined(f"has {len(layer.outputs)} tops")
                out = r.fn(site)
                bypass = not site.steps and (out in layer.inputs or g.has_blob(out))
                if not bypass and (not site.steps or out != site.steps[-1].out):
                    raise Declined("the rule produced no layer")
            except NoMatch as exc:  # a rule's Declined, or a shared walk's NoMatch
                declined.append((layer, r, str(exc)))
                continue
            if bypass:
                self._bypass(g, site, r, out, result)
            else:
                self._apply(g, site, r, result)
            lowered += 1
        # a leftover declined on its own may have been removed with a later rewrite's
        # operands (a cast inside a computed pad): only what is still there counts
        declined = [(lay, rr, w) for lay, rr, w in declined if lay.graph is g]
        if declined and not self.partial:
            first, r, why = declined[0]
            more = "".join(f"\n  {lay.where()}: {lay.type} {lay.name!r} ({rr.name}): {w}"
                           for lay, rr, w in declined[1:])
            raise PassRefused(f"{first.type} {first.name!r} ({r.name}): {why}{more}\n"
                              f"(nothing written; --partial lowers the rest and keeps these)",
                              file=first.source_file, line=first.source_line)
        for layer, r, why in declined:
            result.skipped.append(Skip(layer.name, f"{layer.type} kept ({r.name}): {why}",
                                       layer.source_line))
        for t, names in unknown.items():
            result.notes.append(f"no rule for {t} ({', '.join(names[:3])}"
                                f"{', ...' if len(names) > 3 else ''})")
        if not lowered and not declined:
            result.notes.insert(0, "no leftover a rule lowers")
        if result.modified:
            result.changes += share_added_tables(g, existing)
            g.insert_splits()  # rules may read a blob another layer reads (an extent's tensor)
        return result

    def _thaw(self, g: Graph, pnnx: object, shared: dict, result: PassResult) -> int:
        """Constants pnnx folded at the first trace that are the traced length: computed
        from the input instead (`frozen_extent`), before any rule reads them."""
        from paramsurgery.analysis.frozen_extent import thaw, trace_evidence
        from paramsurgery.passes.lower_values import ARANGE_TABLE

        ev = trace_evidence(pnnx, self.traced, self.traced_len)
        shared["evidence"] = ev
        changes, kept = thaw(g, pnnx, ev, shared.setdefault("facts", {}), ARANGE_TABLE)
        shared["folds_kept"] = kept  # why: named when a rule meets one of them
        result.changes.extend(changes)
        result.notes.extend(f"{name} kept: {why}" for name, why in kept.items())
        if changes:
            result.modified = True
        return len(changes)

    def _bypass(self, g: Graph, site: Site, r: Rule, keep: str, result: PassResult) -> None:
        """The rule proved the layer returns bottom `keep` unchanged: its readers read that."""
        layer = site.layer
        line = layer.source_line
        before = f"{layer.type}({', '.join(layer.inputs)})"
        old_inputs = list(layer.inputs)
        top = layer.outputs[0]
        if not g.consumers(top):
            raise PassRefused(f"{layer.type} {layer.name!r} passes {keep!r} through, but its top "
                              f"{top!r} is a graph output; keep it", file=layer.source_file,
                              line=line)
        g.replace_uses(top, keep)
        g.remove_layer(layer)
        removed = []
        for b in old_inputs:
            removed.extend(_prune(g, b))
        result.changes.append(Change(layer.name, f"{r.name} [{r.doc}]", before,
                                     f"readers read {keep}", line))
        if removed:
            result.changes.append(Change(layer.name, f"removed unread {', '.join(removed)}",
                                         line=line))
        result.modified = True

    def _apply(self, g: Graph, site: Site, r: Rule, result: PassResult) -> None:
        layer = site.layer
        line = layer.source_line
        before = f"{layer.type}({', '.join(layer.inputs)})"
        old_inputs = list(layer.inputs)
        steps = site.steps
        # readers (distinct steps) of every blob, to give fan-outs their Splits
        readers: dict[str, list[int]] = {}
        for i, st in enumerate(steps):
            for b in dict.fromkeys(st.inputs):
                readers.setdefault(b, []).append(i)
        names: dict[str, str] = {}  # placeholder -> blob name
        copy_for: dict[tuple[str, int], str] = {}

        def fan_out(blob: str, real: str) -> None:
            users = readers.get(blob, [])
            if len(users) < 2:
                return
            outs = [g.unique_blob_name(f"{real}_{layer.name}_{k}") for k in range(len(users))]
            # unique_blob_name only sees blobs already in the graph; keep these distinct
            for k in range(1, len(outs)):
                while outs[k] in outs[:k]:
                    outs[k] = g.unique_blob_name(outs[k] + "_")
            g.add_layer("Split", g.unique_layer_name(f"{layer.name}_split"), [real], outs,
                        before=layer)
            for k, u in enumerate(users):
                copy_for[(blob, u)] = outs[k]

        for b in readers:
            if not b.startswith("%"):
                fan_out(b, b)
        added = []
        for i, st in enumerate(steps):
            ins = [copy_for.get((b, i), names.get(b, b)) for b in st.inputs]
            if i == len(steps) - 1:
                new = g.replace_layer(layer, st.type, layer.name, inputs=ins,
                                      outputs=[layer.outputs[0]], params=st.params)
            else:
                out = g.unique_blob_name(f"{layer.name}_{st.hint}")
                new = g.add_layer(st.type, g.unique_layer_name(f"{layer.name}_{st.hint}"), ins,
                                  [out], st.params, before=layer)
                if st.weights is not None and g.weights is not None:
                    from paramsurgery.formats.weights import set_weights

                    set_weights(new, st.weights)
                names[st.out] = out
                fan_out(st.out, out)
            added.append(f"{new.type} {new.name}")
        removed = []
        for b in old_inputs:
            removed.extend(_prune(g, b))
        after = ", ".join(added)
        result.changes.append(Change(layer.name, f"{r.name} [{r.doc}]", before, after, line))
        if removed:
            result.changes.append(Change(layer.name, f"removed unread {', '.join(removed)}",
                                         line=line))
        result.modified = True


def _prune(g: Graph, blob: str) -> list[str]:
    """Remove what only fed `blob` now that nobody reads it: a Split's unread tops (the Split
    itself when none or one is left) and a constant `pnnx.Expression`."""
    removed: list[str] = []
    work = [blob]
    while work:
        b = work.pop()
        if g.consumers(b):
            continue
        prod = g.producer(b)
        if prod is None:
            continue
        if prod.type == "Split":
            keep = [t for t in prod.outputs if g.consumers(t)]
            if len(keep) >= 2:
                g.set_outputs(prod, keep)
            elif len(keep) == 1:
                g.set_outputs(prod, keep)
                g.bypass(prod)
                removed.append(prod.name)
            else:
                src = prod.inputs[0]
                g.remove_layer(prod)
                removed.append(prod.name)
                work.append(src)
        elif prod.type == "pnnx.Expression" and not prod.inputs and \
                not any(g.consumers(t) for t in prod.outputs):
            g.remove_layer(prod)
            removed.append(prod.name)
        elif prod.type in _PRUNABLE and not any(g.consumers(t) for t in prod.outputs):
            # what only computed a lowered op's operands: shape arithmetic, casts, constants
            work.extend(prod.inputs)
            g.remove_layer(prod)
            removed.append(prod.name)
    return removed


_PRUNABLE = ("pnnx.Expression", "Tensor.to", "MemoryData", "torch.arange", "Tensor.size",
             "aten::size",
             # what computed a mask a rule proved constant (masked_fill's, now unread)
             "Reshape", "ExpandDims", "Squeeze", "Crop", "Clip", "BinaryOp", "UnaryOp",
             "Reduction")
