"""Lowering rules for length masks: integer comparisons, `masked_fill` with a mask decided
at every length, `expand` that only names the input's own extents, `repeat` of a unit dim
up to a tensor's extent.

Composed into `lower`'s default rules (`paramsurgery.passes.lower.RULES`).

- Comparisons (`lt`, `le`, `gt`, `ge`, `eq`, `ne`) of operands *proven integer-valued*
  (`integral`: positions from `arange`, extents, 0/1 masks, integer constants, and what
  sums, differences, crops and reshapes make of them) are exact in float32 arithmetic:
  for integers a, b, `a < b` is `b - a >= 1`, so `lt(a, b) = Clip(b - a, 0, 1)`,
  `le(a, b) = Clip(b - a + 1, 0, 1)`, `eq(a, b) = Clip(1 - |a - b|, 0, 1)`,
  `ne(a, b) = Clip(|a - b|, 0, 1)` (gt/ge swap the operands). The result is the 0/1 float
  ncnn uses for torch's bool. Magnitudes are below 2**24 (positions and extents are bounded
  by `ARANGE_TABLE`; constants are checked), so every difference is exact. Operands of the
  same traced shape, or one of a single element (broadcasting a scalar is the same in
  torch and ncnn); a constant pnnx folded from the trace is refused, naming it.
- Value bounds (`bounds`): lowered comparisons record the range of their result as
  symbolic bounds in the shape analysis' symbols (an `arange` over an extent E holds
  `[start, start + E - 1]`, an extent holds `[E, E]`); a comparison whose bounds decide it
  at every length (`arange(T) < T`: `T - (T - 1) >= 1`) records the constant result.
- `masked_fill(x, mask, v)`: ncnn has no select, and `x*(1-m) + v*m` is NaN where x is
  inf; it is lowered only where the mask is proven all false at every length (the layer
  is then the identity) and refused otherwise, with the reason.
- `Tensor.expand(x, sizes)` that only prepends unit dims and names the input's own
  extents (`-1`, a static size equal to the traced one, or the same shape arithmetic as
  the input's extent) is the identity; a pnnx batch `Reshape` (`12=0 13=233 6="0n"`) that
  pnnx put on a 1-D input computed in the graph (which holds its elements in `w`, not in
  ncnn's `n`) is looked through.
- `Tensor.repeat(x, sizes)` repeating one unit dim up to a tensor's run-time extent
  (`repeat(1, 1, seq_len)`, ECAPA): `x * ones`, ones a MemoryData table cropped to that
  extent (multiplying by 1 is exact, inf and NaN included). A static count of a unit dim
  uses a ones table of that size.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from paramsurgery.core.layer_types import ELEMENT_MOVING
from paramsurgery.core.match import MatchFailure
from paramsurgery.core.ncnn import BinaryOpType, ReductionOpType, UnaryOpType
from paramsurgery.analysis.shapes.affine import Affine as Sym
from paramsurgery.core.values import FLT_MAX
from paramsurgery.analysis.frozen_extent import folded_value, is_folded
from paramsurgery.analysis.int_affine import Affine, NotAffine, ShapeArith
from paramsurgery.passes.lowering import (ABS, ADD, MAX, MIN, MUL, NEG, SUB, TABLE, TRUNC, Rule,
                                          Rules, Site, rule)
from paramsurgery.passes.lower_layout import ncnn_axis

_MASKS: list[Rule] = []
RSUB = int(BinaryOpType.RSUB)  # b - a
FLOOR, CEIL, ROUND = int(UnaryOpType.FLOOR), int(UnaryOpType.CEIL), int(UnaryOpType.ROUND)
# reductions whose result stays an integer on integer operands
INTEGER_REDUCTIONS = (ReductionOpType.SUM, ReductionOpType.ASUM, ReductionOpType.MAX, ReductionOpType.MIN,
                      ReductionOpType.PROD)
EXACT_INT = 2 ** 24  # float32 holds every integer below this

_CASTS = ("Tensor.to", "Tensor.long", "Tensor.int", "Tensor.float", "Tensor.double",
          "aten::to")
COMPARISONS = {"torch.lt": "lt", "Tensor.lt": "lt", "torch.le": "le", "Tensor.le": "le",
               "torch.gt": "gt", "Tensor.gt": "gt", "torch.ge": "ge", "Tensor.ge": "ge",
               "torch.eq": "eq", "Tensor.eq": "eq", "torch.ne": "ne", "Tensor.ne": "ne"}
Bounds = tuple  # (lo, hi): int | shapes Affine


# ============================================================================ shared analyses

def facts(s: Site) -> dict:
    """Value bounds recorded during this run of `lower`, by blob."""
    return s.shared.setdefault("facts", {})


def shape_map(s: Site):  # noqa: ANN201 - ShapeMap
    """The static shape analysis of the graph with the inputs' dynamic dims as symbols
    (computed once per run, on first use)."""
    if "shapes" not in s.shared:
        from paramsurgery.analysis.shapes import infer_shapes

        ev = s.shared.get("evidence")
        s.shared["shapes"] = infer_shapes(s.g, ev.inputshape if ev is not None else None)
    return s.shared["shapes"]


def extent(s: Site, blob: str, axis: int) -> object | None:
    """The size of ncnn axis `axis` (negative) of `blob` in the shape analysis' symbols."""
    shape = shape_map(s).known(s.g.above_splits(blob))
    if shape is None or -axis > len(shape):
        return None
    return shape[axis]


def canonical(s: Site, form: Affine) -> object | None:
    """An `int_affine` form over `size(x, d)` symbols → a dim in the shape analysis'
    symbols (None when a size is not known there or a coefficient is fractional)."""
    if form.const.denominator != 1:
        return None
    total: object = int(form.const)
    for sym, coef in form.coefs:
        if sym[0] != "size" or coef.denominator != 1 or sym[3] is None:
            return None
        _, blob, dim, traced = sym
        d = extent(s, blob, dim - len(traced))
        if d is None:
            return None
        total = total + int(coef) * d  # type: ignore[operator]
    return total


def _ge(x: object, k: int) -> bool:
    """x >= k for every value of the symbols (decided only when x is a number)."""
    return isinstance(x, int) and x >= k


def bounds(s: Site, blob: str) -> Bounds | None:
    """Recorded bounds of `blob`, through layout-only layers and bypassed casts."""
    known = facts(s)
    b = blob
    for _ in range(64):  # a chain of layout layers, never a cycle
        if b in known:
            return known[b]
        prod = s.g.producer(b)
        value = folded_value(prod) if prod is not None and not is_folded(prod) else None
        if value is not None and value == round(value) and abs(value) < EXACT_INT:
            return (int(value), int(value))  # a one-element integer constant
        if prod is None or prod.type not in ELEMENT_MOVING + _CASTS or not prod.inputs:
            return None
        b = prod.inputs[0]
    return None


def integral(s: Site, blob: str) -> str | None:
    """None when every value of `blob` is proven an integer below 2**24 in magnitude;
    otherwise why not (worklist over producers)."""
    op_by_name = s.pnnx.op_by_name if s.pnnx is not None else (lambda name: None)
    # blobs an earlier walk of this run proved integral: comparisons sharing ancestors do
    # not walk them again (a refusal is not kept: rewrites may still prove it later)
    proven: set[str] = s.shared.setdefault("integral_blobs", set())
    work, seen = [blob], set()
    while work:
        b = work.pop()
        if b in seen or b in proven:
            continue
        seen.add(b)
        if b in facts(s):
            continue
        prod = s.g.producer(b)
        if prod is None or prod.type == "Input":
            return f"{b!r} is a graph input (its values are not known to be integers)"
        t = prod.type
        if t in ("Crop", "Reshape") and prod.inputs:
            work.append(prod.inputs[0])  # further bottoms only give the shape
        elif t in ELEMENT_MOVING:
            work.extend(prod.inputs)
        elif t == "MemoryData":
            if not prod.weights:
                return f"MemoryData {prod.name!r} has no weights loaded (--bin)"
            if is_folded(prod):
                return (f"{b!r} is {prod.name!r}, a constant pnnx folded from the first "
                        f"trace")
            v = np.concatenate([w.array().reshape(-1) for w in prod.weights])
            if not (np.all(np.isfinite(v)) and np.all(v == np.round(v))
                    and np.all(np.abs(v) < EXACT_INT)):
                return f"MemoryData {prod.name!r} holds values that are not small integers"
        elif t == "Clip":
            lo, hi = _num(prod.params.get(0, -FLT_MAX)), _num(prod.params.get(1, FLT_MAX))
            if not all(abs(x) >= FLT_MAX or x == round(x) for x in (lo, hi)):
                return f"Clip {prod.name!r} has a fractional bound"
            work.extend(prod.inputs)
        elif t == "BinaryOp":
            if prod.params.get(0, 0) not in (ADD, SUB, MUL, MAX, MIN, RSUB):
                return f"BinaryOp {prod.name!r} (op {prod.params.get(0, 0)}) can leave the integers"
            if prod.params.get(1, 0):
                k = _num(prod.params.get(2, 0.0))
                if k != round(k):
                    return f"BinaryOp {prod.name!r} has the fractional scalar {k:g}"
            work.extend(prod.inputs)
        elif t == "UnaryOp":
            u = prod.params.get(0, 0)
            if u in (FLOOR, CEIL, ROUND, TRUNC):
                continue
            if u not in (ABS, NEG):
                return f"UnaryOp {prod.name!r} (op {u}) can leave the integers"
            work.extend(prod.inputs)
        elif t == "Reduction" and prod.params.get(0, 0) in INTEGER_REDUCTIONS:
            work.extend(prod.inputs)
        elif t in COMPARISONS or t == "torch.arange":
            op = op_by_name(prod.name)
            if t == "torch.arange" and op is not None and not all(
                    isinstance(op.param(k, 0), int) or op.param(k, 0) is None
                    for k in ("start", "step")):
                return f"torch.arange {prod.name!r} has a fractional start or step"
        elif t in _CASTS:
            work.extend(prod.inputs[:1])
        else:
            return f"{b!r} is computed by {t} {prod.name!r}"
    proven |= seen
    return None


# ============================================================================ the rules

def _operands(s: Site) -> tuple[str, str | None, float | None]:
    """(a, b blob or None, b number or None) of a binary comparison."""
    op = s.op()
    a = op.arg_names.get("input")
    a_slot = op.inputs.index(a) if a in op.inputs else 0
    if len(s.layer.inputs) >= 2:
        return s.input(a_slot), s.input(1 - a_slot), None
    other = op.param("other")
    if isinstance(other, bool) or not isinstance(other, (int, float)):
        raise MatchFailure.declined(f"other={other!r} is not a number")
    return s.input(0), None, float(other)


def _num(v: object) -> float:
    """A numeric param as a float (NaN for anything else: never an integer)."""
    return float(v) if isinstance(v, (int, float)) else float("nan")


def _refuse_folded(s: Site, blobs: list[str]) -> None:
    for b in blobs:
        prod = s.g.producer(s.g.above_splits(b))
        if prod is not None and is_folded(prod):
            value = folded_value(prod)
            shown = f" = {value:g}" if value is not None else ""
            ev = s.shared.get("evidence")
            why = s.shared.get("folds_kept", {}).get(prod.name) or (
                ev.missing if ev is not None and ev.missing else "what pnnx computed it from "
                "is not known")
            raise MatchFailure.declined(f"compares with {prod.name!r}{shown}, a constant pnnx folded from "
                           f"the first trace (e.g. `lengths * x.shape[-1]`): in a dynamic "
                           f"export the mask is frozen at the traced length; {why}")


def _same_or_scalar(s: Site) -> None:
    shapes = [s.shape(i) for i in range(len(s.op().inputs))]
    if any(sh is None for sh in shapes):
        raise MatchFailure.declined("pnnx recorded no shape for an operand")
    if len(shapes) < 2 or len(set(shapes)) == 1:
        return
    if any(sh is not None and all(n == 1 for n in sh) for sh in shapes):
        return  # one element: broadcast alike in torch and ncnn
    raise MatchFailure.declined("broadcasts tensors of different shapes: torch's and ncnn's BinaryOp "
                   "broadcasting differ, so it is not lowered")


def _decide(kind: str, a: Bounds | None, b: Bounds | None) -> Bounds:
    """Bounds of the 0/1 result from the operands' bounds."""
    if a is None or b is None:
        return (0, 1)
    if kind in ("gt", "ge"):
        a, b = b, a
        kind = "lt" if kind == "gt" else "le"
    lo_a, hi_a = a
    lo_b, hi_b = b
    if kind in ("lt", "le"):
        gap = 1 if kind == "lt" else 0  # a < b  <=>  b - a >= 1 (integers)
        if _ge(_sub(lo_b, hi_a), gap):
            return (1, 1)
        if _ge(_sub(lo_a, hi_b), 1 - gap):
            return (0, 0)
        return (0, 1)
    apart = _ge(_sub(lo_a, hi_b), 1) or _ge(_sub(lo_b, hi_a), 1)
    same = isinstance(_sub(hi_a, lo_b), int) and _sub(hi_a, lo_b) == 0 and \
        _sub(lo_a, hi_b) == 0
    if kind == "eq":
        return (0, 0) if apart else (1, 1) if same else (0, 1)
    return (1, 1) if apart else (0, 0) if same else (0, 1)


def _sub(x: object, y: object) -> object:
    r = x - y  # type: ignore[operator]
    return r.const if isinstance(r, Sym) and not r.terms else r


# lt(a,b) = Clip(b-a, 0, 1); le = Clip(b-a+1, 0, 1); eq = Clip(1-|a-b|, 0, 1);
# ne = Clip(|a-b|, 0, 1); gt/ge swap: exact on integer-valued operands
@rule(*COMPARISONS, doc="on integer-valued operands: lt = Clip(b-a,0,1), le = Clip(b-a+1,0,1), "
      "eq = Clip(1-|a-b|,0,1), ne = Clip(|a-b|,0,1), gt/ge swapped", into=_MASKS)
def compare(s: Site) -> str:
    kind = COMPARISONS[s.layer.type]
    a, b, k = _operands(s)
    _refuse_folded(s, [a] + ([b] if b is not None else []))
    _same_or_scalar(s)
    for blob in [a] + ([b] if b is not None else []):
        why = integral(s, blob)
        if why is not None:
            raise MatchFailure.declined(f"an operand is not proven integer-valued ({why}): a float "
                           f"comparison has no exact ncnn form")
    if k is not None and (k != round(k) or abs(k) >= EXACT_INT):
        raise MatchFailure.declined(f"compares with {k:g}, not a small integer")
    ba = bounds(s, a)
    bb = (int(k), int(k)) if k is not None else bounds(s, b)  # type: ignore[arg-type]
    if kind in ("gt", "ge"):
        a_, b_ = (b, a) if b is not None else (a, None)
        swapped = True
    else:
        a_, b_, swapped = a, b, False

    def diff(x: str, y: str | None, neg_scalar: bool) -> str:
        """x - y (y a blob), or x - k / k - x for the scalar."""
        if y is not None:
            return s.binary(SUB, x, y)
        if neg_scalar:
            return s.emit("BinaryOp", [x], {0: RSUB, 1: 1, 2: _num(k)}, "rsub")
        return s.binary(SUB, x, scalar=k)

    if kind in ("lt", "le", "gt", "ge"):
        if b_ is None:   # scalar: lt(a, k) = k - a; gt(a, k) = a - k
            d = diff(a_, None, neg_scalar=not swapped)
        else:
            d = diff(b_, a_, neg_scalar=False)
        if kind in ("le", "ge"):
            d = s.binary(ADD, d, scalar=1.0)
    else:
        d = a if b is None and k == 0 else diff(a, b, neg_scalar=False)
        d = s.emit("UnaryOp", [d], {0: ABS}, "abs")
        if kind == "eq":
            d = s.emit("BinaryOp", [d], {0: RSUB, 1: 1, 2: 1.0}, "rsub")
    out = s.emit("Clip", [d], {0: 0.0, 1: 1.0}, "clip")
    facts(s)[s.layer.outputs[0]] = _decide(kind, ba, bb)
    return out


# masked_fill(x, m, v) = x where m is proven all false at every length
@rule("Tensor.masked_fill", "aten::masked_fill", doc="identity where the mask is proven all "
      "false at every length (else declined: ncnn has no select)", into=_MASKS)
def masked_fill(s: Site) -> str:
    op = s.op()
    x_name, m_name = op.arg_names.get("input"), op.arg_names.get("mask")
    if x_name not in op.inputs or m_name not in op.inputs:
        raise MatchFailure.declined("pnnx recorded no $input/$mask operands")
    x, m = s.input(op.inputs.index(x_name)), s.input(op.inputs.index(m_name))
    b = bounds(s, m)
    if b == (0, 0):
        return x
    why = "its mask is not proven constant" if b is None or b == (0, 1) else \
        "its mask is all true (a fill of every element)"
    raise MatchFailure.declined(f"{why}: ncnn has no select layer (x*(1-m) + v*m is NaN where x is inf); "
                   f"pass the mask as an additive input")




def zero_one(s: Site, blob: str) -> str | None:
    """None when every value of `blob` is proven 0 or 1: a MemoryData holding only 0/1 (a
    bool table, `fix-bool-table`'s float32 form) seen through layers that only move, copy or
    crop values; otherwise why not."""
    work, seen = [blob], set()
    while work:
        b = work.pop()
        if b in seen:
            continue
        seen.add(b)
        prod = s.g.producer(b)
        if prod is None or prod.type == "Input":
            return f"{b!r} is a graph input (its values are not known to be 0/1)"
        if prod.type in ("Crop", "Reshape") and prod.inputs:
            work.append(prod.inputs[0])  # further bottoms only give the shape
        elif prod.type in ELEMENT_MOVING:
            work.extend(prod.inputs)
        elif prod.type == "MemoryData":
            if not prod.weights or not len(prod.weights):
                return f"MemoryData {prod.name!r} has no weights loaded (--bin)"
            v = prod.weights[0].array().reshape(-1)
            if not np.all((v == 0) | (v == 1)):
                return f"MemoryData {prod.name!r} holds values other than 0 and 1"
        else:
            return f"{b!r} is computed by {prod.type} {prod.name!r} (not proven 0/1)"
    return None


def _where_operands(s: Site) -> tuple[str, str, str]:
    """(condition, input, other) blobs: by pnnx's argument names when its IR is given, else
    in torch.where's order, which pnnx's ncnn writer keeps for the bottoms."""
    if len(s.layer.inputs) != 3:
        raise MatchFailure.declined(f"has {len(s.layer.inputs)} bottoms: a scalar input/other "
                                    f"(pnnx keeps it only in its IR)")
    if s.pnnx is None:
        return s.input(0), s.input(1), s.input(2)
    op = s.op()
    slots = [op.inputs.index(op.arg_names[k]) if op.arg_names.get(k) in op.inputs else None
             for k in ("condition", "input", "other")]
    if None in slots or sorted(slots) != [0, 1, 2]:  # type: ignore[type-var]
        raise MatchFailure.declined("pnnx recorded no $condition/$input/$other operands")
    return s.input(slots[0]), s.input(slots[1]), s.input(slots[2])  # type: ignore[arg-type]


def _scalar_table(s: Site, blob: str) -> float | None:
    """The value of a one-element MemoryData `blob` reads (through Splits), else None."""
    prod = s.g.producer(s.g.above_splits(blob))
    if prod is None or prod.type != "MemoryData" or not prod.weights or not len(prod.weights):
        return None
    v = prod.weights[0].array().reshape(-1)
    return float(v[0]) if v.size == 1 else None


# where(m, x, c) for a 0/1 mask m and c the lowest float32 (HF's `torch.finfo(dtype).min`,
# GPT-2's eager `mask_value`): (2m - 1)·FLT_MAX is +FLT_MAX where m is 1 and -FLT_MAX where
# it is 0 (each step exact: 2m - 1 is ±1), and min(x, +FLT_MAX) = x, min(x, -FLT_MAX) =
# -FLT_MAX = c for every finite x; only x = ±inf or NaN could differ (torch's where passes
# them through or replaces them, min does not)
@rule("torch.where", "aten::where", doc="where(m, x, c) for m proven 0/1 and c = -FLT_MAX "
      "(HF's finfo.min): min(x, (2m-1)·FLT_MAX), exact for every finite x (else declined: "
      "ncnn has no select)", into=_MASKS)
def where(s: Site) -> str:
    cond, x, other = _where_operands(s)
    why = zero_one(s, cond)
    if why is not None:
        raise MatchFailure.declined(f"its condition is not proven 0/1 ({why}): ncnn has no "
                                    f"select layer (x*m + y*(1-m) is NaN where x or y is inf)")
    c = _scalar_table(s, other)
    if c is None or np.float32(c) != np.float32(-FLT_MAX):
        shown = "not a one-element constant" if c is None else f"{c:g}"
        raise MatchFailure.declined(f"its other value is {shown}, not -FLT_MAX (the lowest "
                                    f"float32, where min(x, ±FLT_MAX) selects exactly): ncnn "
                                    f"has no select layer")
    h = s.binary(MUL, cond, scalar=2.0, hint="where_sign")
    h = s.binary(SUB, h, scalar=1.0, hint="where_sign")
    h = s.binary(MUL, h, scalar=FLT_MAX, hint="where_bound")
    return s.binary(MIN, x, h, hint="where")


def _shape_and_sizes(s: Site, what: str) -> tuple[tuple, list]:
    """The traced input shape of expand/repeat and its sizes as exact forms (a static param
    or shape arithmetic)."""
    shape = s.shape(0)
    if shape is None:
        raise MatchFailure.declined("pnnx recorded no shape for the input")
    op = s.op()
    static = op.param("sizes")
    if isinstance(static, tuple) and all(isinstance(v, int) for v in static):
        return tuple(shape), [Affine(Fraction(v)) for v in static]
    if len(s.layer.inputs) != 2:
        raise MatchFailure.declined(f"pnnx recorded no static {what} and the layer has no {what} bottom")
    try:
        value = ShapeArith(s.g, s.traced()).value(s.layer.inputs[1])
    except NotAffine as exc:
        raise MatchFailure.declined(f"the {what} are not exact shape arithmetic: {exc}") from None
    forms = value if isinstance(value, list) else [value]
    if not all(isinstance(f, Affine) and f.integral for f in forms):
        raise MatchFailure.declined(f"{what} {', '.join(map(str, forms))} are not integer forms")
    return tuple(shape), forms


def _input_extents(s: Site, blob: str, traced: tuple) -> list:
    """The run-time extents of the dims of expand's input: static traced sizes, or the
    extent a lowered arange recorded."""
    out: list = [n for n in traced]
    if None in out:
        rec = s.shared.get("extents", {}).get(s.g.above_splits(blob))
        dyn = [d for d, n in enumerate(traced) if n is None]
        if rec is None and len(dyn) == 1:
            rec = _cropped_extent(s, blob, dyn[0] - len(traced))
            if rec is not None:
                out[dyn[0]] = rec
                return out
        if rec is None or len(traced) != 1:
            raise MatchFailure.declined("the input has a dynamic dim whose extent is not known (only "
                           "a lowered arange's is)")
        out = [rec]
    return out


def _cropped_extent(s: Site, blob: str, axis: int) -> object | None:
    """E when `blob` is a static table of extent L >= 2 along ncnn `axis` cropped from 0 to
    a run-time extent E (pnnx's `table[:, :x.size(1)]`: `Crop table x 20="1h"`): the crop
    holds min(L, E) there, which is E wherever torch's expand of that dim to E runs (a dim
    of size L != 1 is never broadcast: torch refuses E > L)."""
    from paramsurgery.analysis.shapes.exprs import eval_shape_expr

    prod = s.g.producer(s.g.above_splits(blob))
    if prod is None or prod.type != "Crop" or len(prod.inputs) != 2:
        return None
    p = prod.params
    starts, ends, axes = p.get(19), p.get(20), p.get(21)
    if not isinstance(ends, str) or str(starts) not in ("0", "None") or not isinstance(axes, str):
        return None
    sm = shape_map(s)
    data, ref = sm.known(s.g.above_splits(prod.inputs[0])), \
        sm.known(s.g.above_splits(prod.inputs[1]))
    if data is None or ref is None:
        return None
    got_ends, got_axes = eval_shape_expr(ends, [data, ref]), eval_shape_expr(axes, [data, ref])
    if got_ends is None or got_axes is None or len(got_ends) != 1 or got_axes != [axis % len(data)] \
            and got_axes != [axis]:
        return None
    L, e = data[axis], got_ends[0]
    if not isinstance(L, int) or L < 2 or isinstance(e, int):
        return None
    return e


# expand(x, [1, ..., E]) with E the input's own extent = x (ncnn drops the unit dims)
@rule("Tensor.expand", "aten::expand", doc="identity when it only prepends unit dims and names "
      "the input's own extents", into=_MASKS)
def expand(s: Site) -> str:
    shape, sizes = _shape_and_sizes(s, "sizes")
    lead = len(sizes) - len(shape)
    if lead < 0:
        raise MatchFailure.declined(f"{len(sizes)} sizes for a rank-{len(shape)} input")
    if any(not (f.is_number and f.const == 1) for f in sizes[:lead]):
        raise MatchFailure.declined("a new leading dim is not 1 (a broadcast copy)")
    src = _through_batch_reshape(s, s.input(0))
    have = _input_extents(s, src, tuple(shape))
    for d, (f, n) in enumerate(zip(sizes[lead:], have)):
        if f.is_number and f.const == -1:
            continue
        want = int(f.const) if f.is_number else canonical(s, f)
        if want is None or not (want == n):
            raise MatchFailure.declined(f"dim {d}: size {f} is not proven equal to the input's extent "
                           f"({n}): a broadcast copy")
    return src


def _through_batch_reshape(s: Site, blob: str) -> str:
    """Look through pnnx's `Reshape 12=0 13=233 6="0n"` on a 1-D tensor computed in the
    graph: such a tensor holds its elements in w, so the Reshape (which reads them from
    ncnn's n) would keep one; without it the elements are already where they belong."""
    prod = s.g.producer(blob)
    if prod is None or prod.type != "Reshape":
        return blob
    p = prod.params
    if p.get(12, 233) == 233 and p.get(13, 233) == 233:
        return blob
    if (p.get(12), p.get(13), str(p.get(6, ""))) != (0, 233, "0n") or \
            s.g.above_splits(prod.inputs[0]) not in s.shared.get("extents", {}):
        raise MatchFailure.declined(f"reads Reshape {prod.name!r}, which moves pnnx's batch axis "
                       f"(12/13) of a tensor not known to be a 1-D one computed in the graph")
    return prod.inputs[0]


# repeat(x, [1, .., E, .., 1]) on a unit dim = x * ones (ones: a table cropped to E)
@rule("Tensor.repeat", "aten::repeat", doc="x * ones along one unit dim (ones: a MemoryData "
      "table cropped to the extent)", into=_MASKS)
def repeat(s: Site) -> str:
    shape, sizes = _shape_and_sizes(s, "repeats")
    if len(sizes) != len(shape):
        raise MatchFailure.declined(f"{len(sizes)} repeats for a rank-{len(shape)} input (new leading dims)")
    grown = [(d, f) for d, f in enumerate(sizes) if not (f.is_number and f.const == 1)]
    if len(grown) != 1:
        raise MatchFailure.declined(f"repeats {len(grown)} dims (one unit dim is lowered)")
    d, f = grown[0]
    if shape[d] != 1:
        raise MatchFailure.declined(f"repeats dim {d} of size {shape[d]}: tiling, not a broadcast")
    out_shape = list(shape)
    out_shape[d] = None
    axis = ncnn_axis(s, d, tuple(out_shape))
    if axis not in (-1, -2):
        raise MatchFailure.declined(f"repeats ncnn axis {axis} (only w and h are lowered)")
    if s.g.weights is None:
        raise MatchFailure.declined("it adds a MemoryData table to the .bin: load the weights (--bin)")
    table_shape = {0: TABLE, 1: 1} if axis == -1 else {0: 1, 1: TABLE}
    if f.is_number:
        n = int(f.const)
        if n < 1:
            raise MatchFailure.declined(f"repeat count {n}")
        dims = {0: n, 1: 1} if axis == -1 else {0: 1, 1: n}
        ones = s.emit("MemoryData", [], dims, "ones", {"data": np.ones(n, np.float32)})
        return s.binary(MUL, s.input(0), ones)
    if len(f.coefs) != 1 or f.const != 0 or f.coefs[0][1] != 1 or f.coefs[0][0][0] != "size":
        raise MatchFailure.declined(f"the count {f} is not the extent of one dim")
    sym = f.coefs[0][0]
    arith = ShapeArith(s.g, s.traced())
    arith.value(s.layer.inputs[1])  # fills arith.reader: the blob each size() read
    ref = arith.reader.get(sym)
    if ref is None:
        raise MatchFailure.declined("the blob the count is measured on is not known")
    ref_axis = ncnn_axis(s, sym[2], sym[3])
    letter = {-1: "w", -2: "h"}.get(ref_axis)
    if letter is None:
        raise MatchFailure.declined(f"the count is the extent of ncnn axis {ref_axis} of its tensor "
                       f"(only w and h are lowered)")
    table = s.emit("MemoryData", [], table_shape, "ones",
                   {"data": np.ones(TABLE, np.float32)})
    crop_axis = "1" if axis == -1 else "0"
    ones = s.emit("Crop", [table, ref], {19: "0", 20: f"1{letter}", 21: crop_axis}, "ones")
    return s.binary(MUL, s.input(0), ones)


MASK_RULES = Rules(_MASKS)


def record_positions(s: Site, top: str, start: int, ref: str, axis: int) -> None:
    """A lowered `arange(start, start + E)` with E the extent of `ref`'s ncnn `axis`: its
    values lie in [start, start + E - 1] and its one dim has extent E."""
    e = extent(s, ref, axis)
    if e is None:
        return
    facts(s)[top] = (start, start + e - 1)  # type: ignore[operator]
    s.shared.setdefault("extents", {})[top] = e
