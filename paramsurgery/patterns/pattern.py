"""Matching a rule's pattern (`rule_file.RewriteRule`) in a graph.

A match is anchored at the pattern's last layer and grows upwards along the bottoms: each
bottom blob is followed above ncnn's `Split` copies (so a pattern never spells a Split and a
value read three times in the pattern is one blob), and the producer there must be the
pattern layer that writes that blob. BinaryOp add/mul/max/min may match their two bottoms in
either order. The search is a worklist with explicit backtracking states: no recursion.

Every candidate either matches (`Binding`) or fails with a `MatchFailure` saying where and
why, and how many pattern layers it had matched; `Explain` keeps each rule's best near-miss.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from paramsurgery.core.layer_params import param_default
from paramsurgery.core.match import MatchFailure, MatchStatus
from paramsurgery.core.ncnn import BinaryOpType
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.patterns.match import above_splits, readers_through_splits

if TYPE_CHECKING:
    from paramsurgery.patterns.rule_file import LayerLine, RewriteRule

# BinaryOp op types whose two operands commute
COMMUTATIVE_BINARY = (BinaryOpType.ADD, BinaryOpType.MUL, BinaryOpType.MAX, BinaryOpType.MIN)
REL_TOL = 1e-6


@dataclass
class Binding:
    """A match: pattern label → graph layer, pattern blob → graph blob (above Splits)."""

    layers: dict[str, Layer]
    blobs: dict[str, str]

    def layer_ids(self) -> set[int]:
        return {layer.id for layer in self.layers.values()}


@dataclass
class _State:
    layers: dict[str, Layer]
    blobs: dict[str, str]
    todo: list[str]

    def fork(self) -> "_State":
        return _State(dict(self.layers), dict(self.blobs), list(self.todo))


@dataclass
class Matcher:
    """A compiled pattern: which pattern layer writes each blob, the anchor."""

    rule: "RewriteRule"
    writer: dict[str, tuple[str, int]] = field(init=False)  # pattern blob -> (label, top slot)
    by_label: dict[str, "LayerLine"] = field(init=False)

    def __post_init__(self) -> None:
        self.by_label = {lay.label: lay for lay in self.rule.pattern}
        self.writer = {t: (lay.label, k) for lay in self.rule.pattern for k, t in enumerate(lay.tops)}

    @property
    def anchor(self) -> "LayerLine":
        return self.rule.pattern[-1]

    def candidates(self, g: Graph) -> list[Layer]:
        return g.by_type(self.anchor.type)

    def match_at(self, g: Graph, root: Layer) -> Binding | MatchFailure:
        why = layer_mismatch(self.anchor, root)
        if why is not None:
            return MatchFailure(root.name, why)
        best = MatchFailure(root.name, "no candidate")
        stack = [_State({self.anchor.label: root}, {}, [self.anchor.label])]
        while stack:
            state = stack.pop()
            if not state.todo:
                done = self._finish(g, state)
                if isinstance(done, Binding):
                    return done
                best = _better(best, done)
                continue
            label = state.todo.pop()
            pl, layer = self.by_label[label], state.layers[label]
            orders = [list(range(len(pl.bottoms)))]
            if pl.type == "BinaryOp" and len(pl.bottoms) == 2 and \
                    _eff(layer, 0) in COMMUTATIVE_BINARY:
                orders.append([1, 0])
            grown = []
            for order in orders:
                nxt = state.fork()
                failure = self._bind_bottoms(g, nxt, pl, layer, order)
                if failure is None:
                    grown.append(nxt)
                else:
                    best = _better(best, failure)
            stack.extend(reversed(grown))  # the written order is tried first
        return best

    def _bind_bottoms(self, g: Graph, st: _State, pl: "LayerLine", layer: Layer,
                      order: list[int]) -> MatchFailure | None:
        for i, pb in enumerate(pl.bottoms):
            gb, _ = above_splits(g, layer.inputs[order[i]])
            bound = st.blobs.get(pb)
            if bound is not None and bound != gb:
                return MatchFailure(layer.name, f"{pb} is {bound!r} at one reader and "
                                    f"{gb!r} at another", matched=len(st.layers))
            st.blobs[pb] = gb
            if pb not in self.writer:
                continue  # a captured input: anything may write it
            qlabel, slot = self.writer[pb]
            ps = g.producer_slot(gb)
            if ps is None:
                return MatchFailure(layer.name, f"{gb!r} ({pb}) is a graph input, not "
                                    f"written by {self.by_label[qlabel].type}", matched=len(st.layers))
            producer, pslot = ps
            have = st.layers.get(qlabel)
            if have is not None:
                if have.id != producer.id or pslot != slot:
                    return MatchFailure(layer.name, f"{pb} comes from {producer.name}, "
                                        f"not from the {qlabel} already matched", matched=len(st.layers))
                continue
            if any(other.id == producer.id for other in st.layers.values()):
                return MatchFailure(producer.name, f"{producer.name} would stand for two "
                                    f"pattern layers", matched=len(st.layers))
            why = layer_mismatch(self.by_label[qlabel], producer)
            if why is None and pslot != slot:
                why = f"{pb} is its top {pslot}, the pattern reads top {slot}"
            if why is not None:
                return MatchFailure(producer.name, why, matched=len(st.layers),
                                    near=producer.type == self.by_label[qlabel].type)
            st.layers[qlabel] = producer
            st.todo.append(qlabel)
        return None

    def _finish(self, g: Graph, st: _State) -> Binding | MatchFailure:
        n = len(st.layers)
        ids = {layer.id for layer in st.layers.values()}
        for label, pl in self.by_label.items():
            layer = st.layers.get(label)
            if layer is None:
                return MatchFailure("", f"pattern layer {label} is not above the "
                                    f"last one", matched=n)
            for pt, gt in zip(pl.tops, layer.outputs):
                st.blobs[pt] = gt
                if pt.startswith("%"):
                    continue
                readers, _ = readers_through_splits(g, gt)
                outside = [r.name for r, _slot in readers if r.id not in ids]
                if outside or not readers:  # no reader at all: it is (or feeds) an output
                    who = ", ".join(outside[:3]) or "the graph's outputs"
                    return MatchFailure(layer.name, f"{pt} ({gt!r}) is also read "
                                        f"outside the pattern (by {who}): capture it as %{pt} to "
                                        f"keep it", status=MatchStatus.CHECK_FAILED, matched=n)
        binding = Binding(st.layers, st.blobs)
        for cond in self.rule.where:
            try:
                ok = bool(evaluate(cond.tree, binding))
            except (TypeError, ValueError, ZeroDivisionError, KeyError) as exc:
                return MatchFailure(self.anchor.label, f"condition {cond.text!r}: {exc}",
                                    status=MatchStatus.CHECK_FAILED, matched=n)
            if not ok:
                return MatchFailure(st.layers[self.anchor.label].name, f"condition {cond.text!r} is false",
                                    status=MatchStatus.CHECK_FAILED, matched=n)
        return binding


def find_matches(g: Graph, rule: "RewriteRule") -> tuple[list[Binding], MatchFailure | None]:
    """Every non-overlapping match of the rule (in file order of their last layer), and the
    best near-miss when there is none."""
    m = Matcher(rule)
    used: set[int] = set()
    out: list[Binding] = []
    best: MatchFailure | None = None
    for root in m.candidates(g):
        if root.id in used:
            continue
        got = m.match_at(g, root)
        if isinstance(got, Binding):
            ids = got.layer_ids()
            if ids & used:
                continue
            used |= ids
            out.append(got)
        else:
            best = got if best is None else _better(best, got)
    if best is None and not out:
        best = MatchFailure("", f"no {m.anchor.type} layer in the graph")
    return out, (None if out else best)


def _better(a: MatchFailure, b: MatchFailure) -> MatchFailure:
    """The nearer miss: more pattern layers matched; on a tie, one that got past matching to
    a check, then one that stopped at a layer of the right type."""
    def rank(f: MatchFailure) -> tuple[int, bool, bool]:
        return f.matched, f.status is not MatchStatus.NO_MATCH, f.near
    return b if rank(b) > rank(a) else a


def layer_mismatch(pl: "LayerLine", layer: Layer) -> str | None:
    """Why `layer` is not the pattern layer `pl` (None: it is)."""
    if layer.type != pl.type:
        return f"{layer.name} is {layer.type}, the pattern wants {pl.type}"
    if len(layer.inputs) != len(pl.bottoms) or len(layer.outputs) != len(pl.tops):
        return (f"{layer.name} has {len(layer.inputs)} bottom(s) and {len(layer.outputs)} top(s), "
                f"the pattern {len(pl.bottoms)} and {len(pl.tops)}")
    for pid, want in pl.params.items():
        have = _eff(layer, pid)
        if not same_value(have, want.python):
            return f"{layer.name} has {pid}={_show(have)}, the pattern {pid}={_show(want.python)}"
    if not pl.open_params:
        listed = set(pl.params) | pl.wildcards
        for pid in layer.params:
            if pid in listed:
                continue
            default = param_default(pl.type, pid, {k: v.python for k, v in pl.params.items()})
            have = layer.params.get(pid)
            if not same_value(have, default):
                return (f"{layer.name} sets {pid}={_show(have)}, which the pattern leaves at its "
                        f"default ({_show(default)}); list it or end the line with *")
    return None


def _eff(layer: Layer, pid: int) -> Any:
    """The value ncnn reads for param `pid` (the default when the file does not set it)."""
    v = layer.params.get(pid)
    return v if v is not None else param_default(layer.type, pid, layer.params)


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        xs = list(a) if isinstance(a, (list, tuple)) else ([] if a is None else [a])
        ys = list(b) if isinstance(b, (list, tuple)) else ([] if b is None else [b])
        return len(xs) == len(ys) and all(same_value(x, y) for x, y in zip(xs, ys))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if a == b:
            return True
        return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=1e-12)
    return a == b


def _show(v: Any) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, float):
        return f"{v:.7g}"
    if isinstance(v, (list, tuple)):
        return ",".join(_show(x) for x in v)
    return str(v)


def evaluate(tree: ast.expr, binding: Binding) -> Any:
    """A `where` condition over `label[pid]` (checked at parse time to be of the allowed
    forms), evaluated with an explicit stack of pending nodes."""
    values: dict[int, Any] = {}
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, expanded = stack.pop()
        kids = _children(node)
        if not expanded and kids:
            stack.append((node, True))
            stack.extend((k, False) for k in kids)
            continue
        values[id(node)] = _apply(node, [values[id(k)] for k in kids], binding)
    return values[id(tree)]


def _children(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Subscript):
        return []  # label[pid]: read as a whole
    if isinstance(node, ast.Call):
        return list(node.args)
    if isinstance(node, ast.Compare):
        return [node.left, *node.comparators]
    if isinstance(node, ast.BoolOp):
        return list(node.values)
    if isinstance(node, ast.BinOp):
        return [node.left, node.right]
    if isinstance(node, ast.UnaryOp):
        return [node.operand]
    if isinstance(node, (ast.Tuple, ast.List)):
        return list(node.elts)
    return []


def _apply(node: ast.AST, args: list[Any], binding: Binding) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Subscript):
        label = node.value.id if isinstance(node.value, ast.Name) else ""
        if not isinstance(node.slice, ast.Constant) or not isinstance(node.slice.value, int):
            raise ValueError("write label[pid] with an integer pid")
        layer = binding.layers[label]
        return _eff(layer, node.slice.value)
    if isinstance(node, ast.Name):
        raise ValueError(f"{node.id} alone has no value: write {node.id}[pid]")
    if isinstance(node, ast.Call):
        fn = abs if isinstance(node.func, ast.Name) and node.func.id == "abs" else len
        return fn(args[0])
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(args)
    if isinstance(node, ast.UnaryOp):
        return {ast.Not: lambda x: not x, ast.USub: lambda x: -x,
                ast.UAdd: lambda x: +x}[type(node.op)](args[0])
    if isinstance(node, ast.BinOp):
        a, b = args
        return {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                ast.Div: lambda: a / b}[type(node.op)]()
    if isinstance(node, ast.BoolOp):
        return all(args) if isinstance(node.op, ast.And) else any(args)
    if isinstance(node, ast.Compare):
        left = args[0]
        for op, right in zip(node.ops, args[1:]):
            if not _compare(op, left, right):
                return False
            left = right
        return True
    raise ValueError(f"{type(node).__name__} is not allowed")


def _compare(op: ast.cmpop, a: Any, b: Any) -> bool:
    if isinstance(op, ast.Eq):
        return same_value(a, b)
    if isinstance(op, ast.NotEq):
        return not same_value(a, b)
    if isinstance(op, ast.In):
        return any(same_value(a, x) for x in b)
    if isinstance(op, ast.NotIn):
        return not any(same_value(a, x) for x in b)
    if isinstance(op, ast.Lt):
        return a < b
    if isinstance(op, ast.LtE):
        return a <= b
    if isinstance(op, ast.Gt):
        return a > b
    return a >= b
