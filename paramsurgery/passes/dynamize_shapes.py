"""`dynamize` from one static trace: the traced length is a symbol in the shape analysis.

A static export bakes its traced length T0 into params. With pnnx's IR next to the file
(the traced input shapes) and a length to run at (a reference whose inputs differ from the
traced ones only in T0's places), the inputs' length dims become the
symbol `T` and one walk over the layers in file order (the static shape rules of
`paramsurgery.analysis.shapes`, no rescans) proves each baked value shape-derived before rewriting
it, so the layers after it see the symbolic shapes too:

- Gemm `7/8/9` (constantM/N/K) of an operand whose extent is `a·T+b` → `0` (runtime size;
  only a hint for a non-constant operand);
- Reshape dims whose element count is `a·T+b`: the one dim that can be inferred (`-1`) with
  an integer result at every T (the others' product divides `a` and `b`); none or several →
  refused (several: T equal to a head count; a `--pair` export tells them apart);
- Crop numpy-mode bounds on an axis of extent `L(T)`: an end is taken at its distance from
  the end (`e - L(T0)`, `-233` at the end), a start kept; checked at the end against the
  reference's output shapes (a literal bound would give other lengths), else refused;
- a MemoryData position table (rows = T0) read by RotaryEmbed: proven a cos/sin table with
  row p at position p (`cos(p·θ)`, `sin(p·θ)`), cropped at run time to the input's length:
  exact for T ≤ T0 (the traced rows; `--pair` gives a longer table);
- a MemoryData (T0, T0) read as SDPA masks: proven a causal mask from its values and
  rebuilt from the SDPA's run-time query/key lengths (`causal_mask.py`); any other
  MemoryData holding T0 → refused, naming it;
- a param equal to T0 on a Gemm/Reshape/Crop/Slice whose input shape is not known there →
  refused (it could be length-derived).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from paramsurgery.core.errors import PassRefused
from paramsurgery.core.values import int_list
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.analysis.shapes.affine import Affine, MaybeDim, div, evaluate, product
from paramsurgery.analysis.shapes.exprs import eval_shape_expr
from paramsurgery.analysis.shapes.rules import infer_layer
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import PassResult
from paramsurgery.passes.causal_mask import CausalMask, prove_causal, rebuild

SYMBOL = "T"
RESHAPE_DIMS = {0: "w", 1: "h", 11: "d", 2: "c"}
NUMPY_AXIS = {"w": -1, "h": -2, "d": -3, "c": -4}
LENGTH_CARRIERS = ("Gemm", "Reshape", "Crop", "Slice")  # params that can bake a length
TABLE_ATOL = 2e-5  # float32 cos/sin of p·θ recomputed in float64: a few ulp apart


@dataclass
class LengthSpec:
    """The symbolic inputs of one static trace: numpy shapes fed to ncnn (the length dims as
    `T`), the batch count of inputs fed with a batch axis, the traced length, and what the
    graph's outputs must measure at the target length (torch shapes, from the reference)."""

    inputs: dict[str, tuple]
    batch: dict[str, int]
    traced_len: int
    target_len: int | None = None
    outputs: dict[str, tuple] = field(default_factory=dict)
    source: str = ""


def length_change(traced: Sequence[tuple | None], ref: Sequence[tuple]) -> tuple[int, int] | None:
    """(T0, T1) when the reference's input shapes are the traced ones with the one size T0
    replaced by T1 in some places (a length to run at); None otherwise."""
    if len(traced) != len(ref):
        return None
    diffs = set()
    for shape, r in zip(traced, ref):
        if shape is None or len(shape) != len(r) or any(d is None for d in shape):
            return None
        diffs |= {(a, b) for a, b in zip(shape, r) if a != b}
    return diffs.pop() if len(diffs) == 1 else None


def _folded_tables_note(g: Graph) -> str:
    """The tables pnnx folded at the traced length that an element-wise BinaryOp adds (a
    position table, learned or interpolated): --pair extends one only when its rows are the
    pair's first rows; named with the repro cases of pnnx's fold."""
    from paramsurgery.patterns.match import readers_through_splits

    names = [m.name for m in g.by_type("MemoryData") if m.name.startswith("pnnx_fold_") and
             sum(1 for pid in (0, 1, 11, 2) if m.params.get_int(pid, 0) > 1) >= 2 and
             (rs := readers_through_splits(g, m.outputs[0])[0]) and
             all(r.type == "BinaryOp" for r, _ in rs)]
    if not names:
        return ""
    return (f"; pnnx also folded {', '.join(names[:3])} at the traced length (a position "
            f"table: --pair extends it only when its rows are the pair's first rows, and "
            f"inputshape2= keeps it whole; pnnx's fold: paramsurgery repro issue "
            f"folded-position-table, folded-interpolated-table)")


def spec_from_reference(g: Graph, traced_inputs: Sequence[tuple[tuple, int | None]],
                        ref_inputs: Sequence[tuple], ref_outputs: Sequence[tuple],
                        source: str) -> LengthSpec | None:
    """The spec when the reference's input shapes are the traced ones with one size T0
    replaced by another T1 (None when they are equal or differ otherwise: nothing to
    dynamize, or not a length). `traced_inputs`: (torch shape, batch axis) per graph input
    in order."""
    change = length_change([s for s, _ in traced_inputs], ref_inputs)
    if change is None or len(traced_inputs) != len(g.inputs):
        return None
    t0, t1 = change
    syms = [tuple(Affine.symbol(SYMBOL) if a != b else a for a, b in zip(shape, ref))
            for (shape, _), ref in zip(traced_inputs, ref_inputs)]
    spec = _spec(g, syms, [b for _, b in traced_inputs], t0, source)
    spec.target_len = t1
    spec.outputs = {blob: tuple(s) for blob, s in zip(sorted(g.outputs, key=_num), ref_outputs)}
    return spec


def _num(blob: str) -> tuple:
    digits = "".join(ch for ch in blob if ch.isdigit())
    return (int(digits) if digits else 0, blob)


def _spec(g: Graph, torch_shapes: list[tuple], batch_axes: list[int | None], t0: int,
          source: str) -> LengthSpec:
    inputs: dict[str, tuple] = {}
    batch: dict[str, int] = {}
    for blob, shape, b in zip(sorted(g.inputs, key=_num), torch_shapes, batch_axes):
        if b is None:  # pnnx's default: a leading 1 is the batch axis
            b = 0 if len(shape) >= 2 and shape[0] == 1 else None
        if b is not None:
            n = shape[b]
            if not isinstance(n, int):
                raise PassRefused(f"input {blob!r}: its batch axis {b} carries the length")
            batch[blob] = n
            shape = shape[:b] + shape[b + 1:]
        inputs[blob] = tuple(shape)
    return LengthSpec(inputs, batch, t0, source=source)


def batch_axes(g: Graph) -> dict[str, int]:
    """The batch axis a graph input is read with (`Reshape 12=b` right after it, as
    fix-slice writes for pnnx's batch-axis splits)."""
    out = {}
    for blob in g.inputs:
        for c in g.consumer_layers(blob):
            b = c.params.get(12)
            if c.type == "Reshape" and isinstance(b, int) and b != 233:
                out[blob] = b
    return out


# =========================================================================== the walk

class ShapeDynamize:
    """One walk over `g` (mutated in place: the pass runs on a copy), rewriting each
    baked length it proves shape-derived; PassRefused names the layer and what would let it
    proceed."""

    def __init__(self, spec: LengthSpec, *, fallback: str = "--pair OTHER.param",
                 pair: Graph | None = None) -> None:
        self.spec = spec
        self.fallback = fallback
        self.pair = pair  # another export: longer position tables
        self.env = {SYMBOL: spec.traced_len}
        self.shapes: dict[str, tuple | None] = {}
        self.changes: list[Change] = []
        self.crops: list[str] = []
        self.bounded: list[str] = []
        self._roles: dict[int, tuple[Layer, int, np.ndarray]] = {}

    # ------------------------------------------------------------------ helpers
    def _at(self, d: MaybeDim) -> int | None:
        return evaluate(d, self.env) if isinstance(d, Affine) else d

    def _refuse(self, layer: Layer, why: str) -> PassRefused:
        return PassRefused(f"{layer.name}: {why}; give {self.fallback} (the same model traced "
                           f"at another length) to prove it")

    def _change(self, layer: Layer, what: str, before: object, after: object) -> None:
        self.changes.append(Change(layer.name, what, before, after, layer.source_line))

    # ------------------------------------------------------------------ run
    def run(self, g: Graph) -> PassResult:
        self._drop_zero_masks(g)
        tables: list[Layer] = []
        masks: list[CausalMask] = []  # folded causal masks: checked after the walk
        unknown: list[str] = []  # a traced-length value where the shapes are not known
        for layer in list(g):
            ins = [self.shapes.get(b) for b in layer.inputs]
            if layer.type in LENGTH_CARRIERS and any(i is None for i in ins) and \
                    self._holds_traced_len(layer):
                unknown.append(layer.name)
            if layer.type == "Gemm":
                self._gemm(layer, ins)
            elif layer.type == "Reshape":
                self._reshape(layer, ins)
            elif layer.type == "Crop":
                self._crop(layer, ins)
            elif layer.type == "MemoryData" and self._table_rows(layer) is not None:
                tables.append(layer)
            elif layer.type == "MemoryData" and self._holds_traced_len(layer):
                masks.append(self._mask(g, layer))
            outs = self._infer(layer, ins)
            if tables and tables[-1] is layer:
                outs = self._symbolic_rows(g, layer, outs)
            for i, blob in enumerate(layer.outputs):
                if blob in self.spec.inputs:
                    self.shapes[blob] = self.spec.inputs[blob]
                else:
                    self.shapes[blob] = outs[i] if outs is not None and i < len(outs) else None
        if unknown:
            shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more"
                                              if len(unknown) > 5 else "")
            raise PassRefused(f"{shown}: a param equals the traced length "
                              f"{self.spec.traced_len} but the shape analysis does not know "
                              f"the input's shape there, so it cannot tell whether it is "
                              f"length-derived; give {self.fallback} (the same model traced "
                              f"at another length) or --traced-len with --layers")
        for cm in masks:
            self._check_mask_lengths(cm)
        proven = [self._table(g, layer) for layer in tables]  # all before any rewrite
        self._roles = {layer.id: table_role(g, layer, letter)
                       for layer, letter, _, kind in proven if kind == "rope"}
        for cm in masks:
            self.changes.append(rebuild(g, cm))
        learned: list[str] = []
        for layer, letter, ref, kind in proven:
            if kind == "rope":
                self._extend_and_crop(g, layer, letter, ref)
            elif self._learned(g, layer, letter, ref, kind):
                learned.append(layer.name)
        if tables:
            g.insert_splits()
            _in_order(g)
        self._check_outputs(g)
        self._check_followed(g)
        if learned:
            self.bounded.append(self._check_learned(g, learned))
        result = PassResult(g, bool(self.changes), list(self.changes))
        result.notes.extend(self.bounded)
        result.data["length_spec"] = self.spec
        return result

    def _drop_zero_masks(self, g: Graph) -> None:
        """An all-zero additive mask folded at the traced length (`learned_tables.zero_masks`)
        goes: softmax(s + 0) = softmax(s) at every length."""
        from paramsurgery.passes.learned_tables import drop_mask, zero_masks

        for mask, readers, splits in zero_masks(g, self.spec.traced_len):
            before = " ".join(mask.params.tokens())
            names = ", ".join(r.name for r in readers)
            self._change(mask, f"all-zero attention mask traced at {self.spec.traced_len}: "
                               f"dropped from {names} (5=0; adding 0 before softmax changes "
                               f"nothing at any length)", before, "removed")
            drop_mask(g, mask, readers, splits)

    def _mask(self, g: Graph, layer: Layer) -> CausalMask:
        """A MemoryData holding the traced length that is not a position table: proven a
        causal mask (rebuilt from the run-time lengths), else refused."""
        try:
            return prove_causal(g, layer)
        except PassRefused as exc:
            why = exc.message.split(": ", 1)[-1]
            raise PassRefused(f"{layer.name}: MemoryData with the traced length "
                              f"{self.spec.traced_len} in its shape, neither a position table "
                              f"(read by RotaryEmbed) nor a causal mask ({why}): a constant "
                              f"right at the traced length only; make it an input of the "
                              f"export{_upstream_mask_hint(layer)}",
                              line=layer.source_line) from None

    def _check_mask_lengths(self, cm: CausalMask) -> None:
        """The reading SDPAs' query and key lengths follow the input length and equal the
        mask's side at the traced length."""
        for sdpa in cm.readers:
            for what, blob in (("query", sdpa.inputs[0]), ("key", sdpa.inputs[1])):
                shape = self.shapes.get(blob)
                d = shape[-2] if shape is not None and len(shape) >= 2 else None
                if not isinstance(d, Affine) or self._at(d) != cm.side:
                    raise self._refuse(cm.layer, f"a causal mask of side {cm.side} read by "
                                                 f"{sdpa.name}, whose {what} length ({blob!r}: "
                                                 f"{d}) is not known to be the input length "
                                                 f"(= {cm.side} at the trace)")

    def _holds_traced_len(self, layer: Layer) -> bool:
        t0 = self.spec.traced_len
        for _, v in layer.params.items():
            if v == t0 or (isinstance(v, (list, tuple)) and t0 in v):
                return True
        return False

    def _infer(self, layer: Layer, ins: list) -> list | None:
        expr = layer.params.get(6) if layer.type == "Reshape" else None
        if isinstance(expr, str) and "n" in expr:
            # a Reshape that moves ncnn's batch axis (fix-slice): `0n` is the input's count
            n = self.spec.batch.get(layer.inputs[0])
            if n is None:
                return None
            target = eval_shape_expr(expr.replace("0n", str(n)), ins)
            return None if target is None else [tuple(reversed(target))]
        return infer_layer(layer, ins)

    # ------------------------------------------------------------------ Gemm
    def _gemm(self, layer: Layer, ins: list) -> None:
        p = layer.params
        const_a, const_b = p.get(4, 0), p.get(5, 0)
        a = ins[0] if not const_a and ins else None
        b = ins[1 if not const_a else 0] if not const_b and len(ins) > (0 if const_a else 1) \
            else None
        ta, tb = p.get(2, 0), p.get(3, 0)
        ext = {7: (a[-1] if ta else a[0]) if a and len(a) in (2, 3) else None,
               9: (a[0] if ta else a[-1]) if a and len(a) in (2, 3) else
               ((b[-1] if tb else b[0]) if b and len(b) in (2, 3) else None),
               8: (b[0] if tb else b[-1]) if b and len(b) in (2, 3) else None}
        for pid in (7, 8, 9):
            v = p.get(pid, 0)
            d = ext[pid]
            if not v or not isinstance(d, Affine):
                continue
            if self._at(d) != v:
                raise self._refuse(layer, f"Gemm {pid}={v} but its operand measures {d} = "
                                          f"{self._at(d)} at the traced length")
            layer.set(pid, 0)
            self._change(layer, f"{pid} (runtime size (0): the operand measures {d})", v, 0)

    # ------------------------------------------------------------------ Reshape
    def _reshape(self, layer: Layer, ins: list) -> None:
        from paramsurgery.analysis.shapes.exprs import ncnn_axes as _ncnn_axes

        x = ins[0] if ins else None
        if x is None or layer.params.get(6) not in (None, ""):
            return
        total = product(x)
        if not isinstance(total, Affine):
            return
        dims: dict[int, int] = {}
        for pid in RESHAPE_DIMS:
            v = layer.params.get(pid)
            if isinstance(v, int) and v != -233:
                dims[pid] = v
        if any(v == -1 for v in dims.values()):
            return
        axes = _ncnn_axes(x)  # a 0 copies the input's extent on that axis
        resolved = {pid: (axes.get(RESHAPE_DIMS[pid], 1) if v == 0 else v)
                    for pid, v in dims.items()}
        if product(list(resolved.values())) == total:
            return
        fits = []
        for pid, v in dims.items():
            if v == 0:
                continue
            others = product([w for q, w in resolved.items() if q != pid])
            inferred = div(total, others) if isinstance(others, int) else None
            if isinstance(inferred, Affine) and self._at(inferred) == v:
                fits.append((pid, inferred))
        if len(fits) == 1:
            pid, inferred = fits[0]
            layer.set(pid, -1)
            self._change(layer, f"{pid}({RESHAPE_DIMS[pid]}) (inferred (-1): the input's "
                                f"{total} elements make it {inferred})", dims[pid], -1)
            return
        shown = ", ".join(f"{RESHAPE_DIMS[q]}={dims[q]}" for q, _ in fits) or "none"
        what = "ambiguous: several dims" if fits else "no single dim"
        raise self._refuse(layer, f"the input has {total} elements and {what} can be "
                                  f"inferred with an integer size at every length "
                                  f"(candidates: {shown})")

    # ------------------------------------------------------------------ Crop
    def _crop(self, layer: Layer, ins: list) -> None:
        x = ins[0] if ins else None
        ends = int_params(layer, 10)
        if x is None or not ends:
            return
        axes = int_params(layer, 11) or list(range(len(x)))
        new_ends = list(ends)
        for i, ax in enumerate(axes):
            ax = ax + len(x) if ax < 0 else ax
            L = x[ax] if 0 <= ax < len(x) else None
            if not isinstance(L, Affine) or i >= len(ends):
                continue
            e = ends[i]
            if e <= 0 or e == 233:
                continue
            L0 = self._at(L)
            if L0 is None or e > L0:
                raise self._refuse(layer, f"the Crop end {e} lies beyond its input's extent "
                                          f"{L} = {L0} at the traced length")
            new_ends[i] = -233 if e == L0 else e - L0
            how = "to the end" if e == L0 else "relative to the end"
            self._change(layer, f"10[{i}] ({how}: input extent {L} = {L0})", e, new_ends[i])
            self.crops.append(layer.name)
        if new_ends != ends:
            layer.set(10, new_ends)

    def _check_outputs(self, g: Graph) -> None:
        """The Crop ends were taken at their distance from the end (one trace cannot tell a
        literal): the outputs must then measure what the reference measures."""
        from paramsurgery.formats.pnnx_reference import shape_matches

        if not self.crops:
            return
        t1 = self.spec.target_len
        if t1 is None or not self.spec.outputs:
            names = ", ".join(sorted(set(self.crops)))
            raise PassRefused(f"{names}: Crop ends taken at their distance from the end, "
                              f"which one trace cannot tell from a literal end: give a "
                              f"reference at another length (X.ref.npz next to the file, or "
                              f"--reference) or {self.fallback}")
        env = {SYMBOL: t1}
        for blob, want in self.spec.outputs.items():
            got = self.shapes.get(blob)
            if got is None:
                raise PassRefused(f"output {blob!r}: its shape is not known symbolically, so "
                                  f"the Crop ends ({', '.join(sorted(set(self.crops)))}) cannot "
                                  f"be checked; give {self.fallback}")
            at = [evaluate(d, env) if isinstance(d, Affine) else d for d in got]
            if not shape_matches(at, want):
                raise PassRefused(f"output {blob!r} would measure {tuple(at)} at T={t1}, the "
                                  f"reference {tuple(want)}: a Crop end among "
                                  f"{', '.join(sorted(set(self.crops)))} is not a distance "
                                  f"from the end; give {self.fallback}")

    def _check_followed(self, g: Graph) -> None:
        """With a reference at another length, every output must measure what the reference
        measures there, symbolically: a length the shape analysis lost on the way (a
        strided conv, a table of another size) leaves values it could not rewrite, so the
        graph would be wrong at that length; refused, naming the layer where it was lost."""
        from paramsurgery.formats.pnnx_reference import shape_matches

        t1 = self.spec.target_len
        if t1 is None or not self.spec.outputs:
            return
        env = {SYMBOL: t1}
        for blob, want in self.spec.outputs.items():
            got = self.shapes.get(blob)
            at = None if got is None else [evaluate(d, env) if isinstance(d, Affine) else d
                                           for d in got]
            if at is not None and all(isinstance(d, int) for d in at) and \
                    shape_matches(at, want):
                continue
            lost = self._where_lost(g)
            where = f"{lost.type} {lost.name!r} (line {lost.source_line})" if lost else \
                "a layer the shape rules do not cover"
            measured = "is not known" if at is None else f"would be {tuple(at)}"
            raise PassRefused(f"output {blob!r}: at T={t1} it {measured}, the reference "
                              f"{tuple(want)}: the shape analysis loses the length at {where}, "
                              f"so values after it cannot be proven length-derived; give "
                              f"{self.fallback} (the same model traced at another length), "
                              f"or export with pnnx inputshape2= (a second input shape: pnnx "
                              f"then writes the length-dependent sizes itself)"
                              + _folded_tables_note(g),
                              line=lost.source_line if lost else None)

    def _where_lost(self, g: Graph) -> Layer | None:
        """The first layer whose inputs have affine shapes and an output does not."""
        def known(shape: tuple | None) -> bool:
            return shape is not None and all(isinstance(d, (int, Affine)) for d in shape)

        for layer in g:
            if layer.type == "Input" or not all(known(self.shapes.get(b)) for b in layer.inputs):
                continue
            if not all(known(self.shapes.get(b)) for b in layer.outputs):
                return layer
        return None

    # ------------------------------------------------------------------ position tables
    def _table_rows(self, layer: Layer) -> str | None:
        """The ncnn axis letter of a MemoryData dim equal to the traced length."""
        hits = [RESHAPE_DIMS[pid] for pid in (0, 1, 11, 2)
                if layer.params.get(pid) == self.spec.traced_len]
        return hits[0] if len(hits) == 1 else None

    def _readers(self, g: Graph, layer: Layer) -> list[tuple[Layer, int]]:
        work, out, seen = [layer.outputs[0]], [], set()
        while work:
            blob = work.pop()
            if blob in seen:  # a Split reading its own output: stop, do not loop
                continue
            seen.add(blob)
            for c in g.consumer_layers(blob):
                if c.type == "Split":
                    work.extend(c.outputs)
                else:
                    out.append((c, [g.above_splits(b) for b in c.inputs].index(
                        layer.outputs[0])))
        return out

    def _elementwise_readers(self, g: Graph, layer: Layer) -> list[tuple[Layer, str]] | None:
        """(reader, the other operand) when every reader combines the table element-wise
        with one other blob (BinaryOp); else None."""
        from paramsurgery.passes.learned_tables import ELEMENTWISE

        out = []
        for r, _slot in self._readers(g, layer):
            others = [b for b in r.inputs if g.above_splits(b) != layer.outputs[0]]
            if r.type not in ELEMENTWISE or len(r.inputs) != 2 or len(others) != 1:
                return None
            out.append((r, others[0]))
        return out or None

    def _symbolic_rows(self, g: Graph, layer: Layer, outs: list | None) -> list | None:
        """A table read only element-wise is cropped to the length (or broadcast) by the
        rewrite: the walk sees its length dim as the symbol, so what follows stays known."""
        letter = self._table_rows(layer)
        if not outs or outs[0] is None or letter is None or \
                self._elementwise_readers(g, layer) is None:
            return outs
        shape = list(outs[0])
        ax = len(shape) + NUMPY_AXIS[letter]
        if not 0 <= ax < len(shape) or shape[ax] != self.spec.traced_len:
            return outs
        shape[ax] = Affine.symbol(SYMBOL)
        return [tuple(shape)] + list(outs[1:])

    def _table(self, g: Graph, layer: Layer) -> tuple[Layer, str, str, str]:
        letter = self._table_rows(layer)
        assert letter is not None  # run() keeps only tables with one length dim
        readers = self._readers(g, layer)
        elementwise = self._elementwise_readers(g, layer)
        if elementwise is not None:
            return self._learned_plan(layer, letter, elementwise)
        if not readers or any(r.type != "RotaryEmbed" or slot not in (1, 2)
                              for r, slot in readers):
            raise self._refuse(layer, f"MemoryData {letter}={self.spec.traced_len} is a "
                                      f"constant traced at one length and no rule proves it "
                                      f"a position table (its readers are neither RotaryEmbed "
                                      f"cos/sin inputs nor element-wise BinaryOps)")
        rope, slot = readers[0]
        cos_blob, sin_blob = (g.above_splits(b) for b in rope.inputs[1:3])
        cos_l, sin_l = g.producer(cos_blob), g.producer(sin_blob)
        why = _rope_table_check(cos_l, sin_l, letter)
        if why:
            raise self._refuse(layer, f"not proven a position table: {why}")
        ref = rope.inputs[0]
        ref_shape = self.shapes.get(ref)
        if ref_shape is None or not isinstance(ref_shape[NUMPY_AXIS[letter]], Affine):
            raise self._refuse(layer, f"the {letter} of {ref!r} (what {rope.name} rotates) is "
                                      f"not known to follow the length")
        return layer, letter, ref, "rope"

    # ------------------------------------------------------------------ learned tables
    def _learned_plan(self, layer: Layer, letter: str,
                      readers: list[tuple[Layer, str]]) -> tuple[Layer, str, str, str]:
        """A table added (BinaryOp) to a blob whose same axis is the length: uniform rows or
        a learned table of positions (`learned_tables.py`)."""
        from paramsurgery.passes.learned_tables import UPSTREAM, uniform_rows

        t0 = self.spec.traced_len
        reader, ref = readers[0]
        for r, other in readers:
            shape = self.shapes.get(other)
            ax = None if shape is None else len(shape) + NUMPY_AXIS[letter]
            d = shape[ax] if shape is not None and ax is not None and 0 <= ax < len(shape) \
                else None
            if not isinstance(d, Affine) or self._at(d) != t0:
                raise self._refuse(layer, f"MemoryData {letter}={t0} is added by {r.name} to "
                                          f"{other!r}, whose {letter} is not known to be the "
                                          f"length ({d if d is not None else '?'})")
        if not layer.weights or not len(layer.weights):
            raise PassRefused(f"{layer.name}: MemoryData {letter}={t0}, a table traced at one "
                              f"length: its rows are needed to tell a uniform table from a "
                              f"learned one; give --bin")
        values = layer.weights[0].array().reshape(_table_shape(layer))
        ax = values.ndim + NUMPY_AXIS[letter]
        if uniform_rows(values, ax):
            return layer, letter, ref, "uniform"
        t1 = self.spec.target_len
        if self.pair is None and t1 is not None and t1 > t0:
            raise PassRefused(f"{layer.name}: a learned position table of {t0} rows (added "
                              f"by {reader.name}) has no rows for T={t1}, the reference's "
                              f"length: give {self.fallback} (the same model traced at "
                              f"{t1} or more: its longer table, with its .bin) or a reference "
                              f"at a length up to {t0}, {UPSTREAM}", line=layer.source_line)
        return layer, letter, ref, "learned"

    def _learned(self, g: Graph, layer: Layer, letter: str, ref: str, kind: str) -> bool:
        """Rewrite one table; True when the rewrite needs the numeric check."""
        from paramsurgery.passes.learned_tables import UPSTREAM, shrink_to_row

        t0 = self.spec.traced_len
        before = " ".join(layer.params.tokens())
        pid = {v: k for k, v in RESHAPE_DIMS.items()}[letter]
        if kind == "uniform":
            values = layer.weights[0].array().reshape(_table_shape(layer))
            shrink_to_row(layer, pid, values, values.ndim + NUMPY_AXIS[letter])
            self._change(layer, f"uniform table (its {t0} rows are one row): that row, "
                                f"broadcast over the length by its readers; exact at every "
                                f"length", before, " ".join(layer.params.tokens()))
            return False
        rows = self._longer_table(layer, letter)
        n = t0 if rows is None else rows
        t1 = self.spec.target_len
        if t1 is not None and t1 > n:
            raise PassRefused(f"{layer.name}: a learned position table of {n} rows (the paired "
                              f"export's) has no rows for T={t1}, the reference's length: give "
                              f"--pair with an export traced at {t1} or more (its longer table), "
                              f"{UPSTREAM}", line=layer.source_line)
        _crop_rows_to(g, layer, letter, ref)
        src = "" if rows is None else f"the paired export's {rows} rows (its first {t0} equal " \
                                      f"these), "
        self._change(layer, f"learned position table (row p = position p): {src}cropped to the "
                            f"run-time {letter} of {ref!r}; exact for lengths up to {n}",
                     before, " ".join(layer.params.tokens()) + f" + Crop to {ref}")
        self.bounded.append(f"{layer.name}: a learned position table of {n} rows: the result is "
                            f"exact for lengths up to {n}"
                            + (f" ({self.fallback} extends it)" if rows is None else ""))
        return True

    def _check_learned(self, g: Graph, learned: list[str]) -> str:
        from paramsurgery.passes.learned_tables import check_reference

        ref = self.spec.source
        if not ref or not os.path.isfile(ref) or not g.layer(learned[0]).weights:
            raise PassRefused(f"{', '.join(learned)}: a learned table cropped to the length is "
                              f"proven only against a reference at another length (X.ref.npz "
                              f"next to the file, or --reference) with the weights (--bin)")
        return ", ".join(learned) + ": " + check_reference(
            g, ref, learned, self.spec.target_len, self.spec.traced_len)

    def _extend_and_crop(self, g: Graph, layer: Layer, letter: str, ref: str) -> None:
        t0 = self.spec.traced_len
        before = " ".join(layer.params.tokens())
        rows = self._longer_table(layer, letter)
        target = self.spec.target_len
        if rows is None and target is not None and target > t0:
            # the reference runs past the traced rows: cos/sin of p·θ computed at run time
            self._change(layer, *computed_table(g, layer, letter, ref, self._roles[layer.id]))
            return
        _crop_rows_to(g, layer, letter, ref)
        if rows is None:
            self._change(layer, f"position table (cos/sin of p·θ, row p = position p): "
                                f"cropped to the run-time {letter} of {ref!r}; exact for "
                                f"lengths up to {t0}", before, before + f" + Crop to {ref}")
            self.bounded.append(f"{layer.name}: a position table of {t0} rows: the result is "
                                f"exact for lengths up to {t0} ({self.fallback} extends it)")
        else:
            self._change(layer, f"position table (cos/sin of p·θ, row p = position p): the "
                                f"paired export's {rows} rows (its first {t0} equal these), "
                                f"cropped to the run-time {letter} of {ref!r}; exact for "
                                f"lengths up to {rows}", before,
                         " ".join(layer.params.tokens()) + f" + Crop to {ref}")

    def _longer_table(self, layer: Layer, letter: str) -> int | None:
        """Take the pair's table when it is longer and starts with this one's rows (its
        row count), else None."""
        from paramsurgery.formats.weights import set_weights

        if self.pair is None:
            return None
        other = self.pair.find(layer.name)
        if other is None:
            return None
        pid = {v: k for k, v in RESHAPE_DIMS.items()}[letter]
        rows = other.params.get(pid)
        if other.type != "MemoryData" or not other.weights or not isinstance(rows, int) or \
                rows <= self.spec.traced_len:
            return None
        shape, other_shape = _table_shape(layer), _table_shape(other)
        ax = len(shape) + NUMPY_AXIS[letter]
        if len(other_shape) != len(shape):
            return None
        mine = layer.weights[0].array().reshape(shape)
        theirs = other.weights[0].array().reshape(other_shape)
        if not np.array_equal(np.take(theirs, range(shape[ax]), axis=ax), mine):
            return None
        layer.set(pid, rows)
        set_weights(layer, {"data": theirs.reshape(-1).copy()})
        return rows


def _rope_table_check(cos_l: Layer | None, sin_l: Layer | None, letter: str) -> str | None:
    """None when (cos, sin) are MemoryData tables with row p = (cos(p·θ_k), sin(p·θ_k))."""
    if cos_l is None or sin_l is None or cos_l.type != "MemoryData" or \
            sin_l.type != "MemoryData":
        return "its RotaryEmbed's cos/sin inputs are not both MemoryData tables"
    if not cos_l.weights or not sin_l.weights:
        return "the weights are needed to check the table (--bin)"
    shape = _table_shape(cos_l)
    if shape != _table_shape(sin_l):
        return "the cos and sin tables differ in shape"
    c = cos_l.weights[0].array().reshape(shape).astype(np.float64)
    s = sin_l.weights[0].array().reshape(shape).astype(np.float64)
    ax = len(shape) + NUMPY_AXIS[letter]
    c, s = np.moveaxis(c, ax, 0), np.moveaxis(s, ax, 0)
    if c.shape[0] < 2:
        return "fewer than 2 rows"
    theta = np.arctan2(s[1], c[1])
    p = np.arange(c.shape[0], dtype=np.float64).reshape((-1,) + (1,) * (c.ndim - 1))
    err = max(float(np.abs(np.cos(p * theta) - c).max()),
              float(np.abs(np.sin(p * theta) - s).max()))
    if err > TABLE_ATOL:
        return f"its rows are not cos/sin of p·θ (max error {err:.1e})"
    return None


def _theta(cos_l: Layer, sin_l: Layer, letter: str) -> np.ndarray:
    """θ per column of a proven cos/sin table (float32, as torch's inv_freq)."""
    shape = _table_shape(cos_l)
    ax = len(shape) + NUMPY_AXIS[letter]
    c = np.moveaxis(cos_l.weights[0].array().reshape(shape).astype(np.float64), ax, 0)
    s = np.moveaxis(sin_l.weights[0].array().reshape(shape).astype(np.float64), ax, 0)
    return np.arctan2(s[1], c[1]).reshape(-1).astype(np.float32)


def table_role(g: Graph, layer: Layer, letter: str) -> tuple[Layer, int, np.ndarray]:
    """(the RotaryEmbed reading a proven table, its slot: 1 cos / 2 sin, θ), read before
    any table is rewritten."""
    rope, slot = next((r, i) for r, i in (
        (c, [g.above_splits(b) for b in c.inputs].index(layer.outputs[0]))
        for c in _readers_through(g, layer)) if i in (1, 2))
    cos_l, sin_l = (g.producer(g.above_splits(b)) for b in rope.inputs[1:3])
    assert cos_l is not None and sin_l is not None  # proven by _table
    return rope, slot, _theta(cos_l, sin_l, letter)


def computed_table(g: Graph, layer: Layer, letter: str, ref: str,
                    role: tuple[Layer, int, np.ndarray]) -> tuple[str, str, str]:
    """Replace a proven cos/sin position table (its rows on the h axis) by cos/sin(p·θ)
    computed from the run-time h of `ref` (float32 p·θ, as torch computes it), after
    checking that this recomputation gives the traced rows; (what, before, after)."""
    from paramsurgery.formats.weights import set_weights
    from paramsurgery.passes.causal_mask import LengthBuilder

    rope, slot, theta = role
    shape = _table_shape(layer)
    if letter != "h" or len(shape) < 2 or shape[-2] != layer.params.get(1):
        raise PassRefused(f"{layer.name}: a position table whose rows are not its h axis has no "
                          f"run-time form here; give --pair OTHER.param", line=layer.source_line)
    fn = np.cos if slot == 1 else np.sin
    p = np.arange(shape[-2], dtype=np.float32)[:, None]
    want = layer.weights[0].array().reshape(shape[-2], shape[-1]).astype(np.float64)
    err = float(np.abs(fn((p * theta[None, :]).astype(np.float32).astype(np.float64)) - want).max())
    if err > TABLE_ATOL:
        raise PassRefused(f"{layer.name}: cos/sin of p·θ in float32 do not give the traced rows "
                          f"(max error {err:.1e}); give --pair OTHER.param", line=layer.source_line)
    top, name = layer.outputs[0], layer.name
    before = " ".join(layer.params.tokens())
    b = LengthBuilder(g, top, name, rope)
    g.remove_layer(layer)
    pos1 = b.positions(ref, "p", True)                               # (T, 1): p + 1
    pos = b.add("BinaryOp", "p", [pos1], {0: 1, 1: 1, 2: 1.0})       # p
    th = b.add("MemoryData", "theta", [], {0: int(theta.size), 1: 1})
    set_weights(g.producer(th), {"data": theta})  # type: ignore[arg-type]
    angle = b.add("BinaryOp", "angle", [pos, th], {0: 2})            # (T, D): p·θ
    kind = "cos" if slot == 1 else "sin"
    if len(shape) == 2:
        b.add("UnaryOp", kind, [angle], {0: 10 if slot == 1 else 9}, out=top)
    else:
        b.to_rank(b.add("UnaryOp", kind, [angle], {0: 10 if slot == 1 else 9}), len(shape))
    b.finish()
    return (f"position table ({kind} of p·θ, proven on its {shape[-2]} traced rows, max error "
            f"{err:.1e}): computed from the run-time h of {ref!r}, right at every length",
            before, f"{kind}(p·θ), θ = {theta.size} values, p from {ref!r}")


def _readers_through(g: Graph, layer: Layer) -> list[Layer]:
    from paramsurgery.patterns.match import readers_through_splits

    return [r for r, _ in readers_through_splits(g, layer.outputs[0])[0]]


def _table_shape(layer: Layer) -> tuple[int, ...]:
    dims = [layer.params.get(pid, 0) for pid in (2, 11, 1, 0)]
    return tuple(d for d in dims if isinstance(d, int) and d)


def _crop_rows_to(g: Graph, layer: Layer, letter: str, ref: str) -> None:
    """Read `layer`'s table through a Crop to the run-time `letter` extent of `ref`, right
    after the table (the caller restores topological order when `ref` is written later)."""
    top = layer.outputs[0]
    shape = _table_shape(layer)
    ax = len(shape) + NUMPY_AXIS[letter]
    out = g.unique_blob_name(f"{top}_rows")
    g.replace_uses(top, out)
    g.add_layer("Crop", g.unique_layer_name(f"{layer.name}_rows"), [top, ref], [out],
                {19: "0", 20: f"1{letter}", 21: str(ax)}, after=layer)


def _in_order(g: Graph) -> None:
    """Toposort (stable) only when a Crop read a blob written after its table."""
    seen: set[str] = set(g.inputs)
    for x in g:
        if any(b not in seen and g.producer(b) is not None for b in x.inputs):
            g.toposort()
            return
        seen.update(x.outputs)


def traced_input_shapes(ops: Sequence, g: Graph) -> list[tuple[tuple, int | None]] | None:
    """(torch shape, batch axis) of each graph input from pnnx's static IR; None when the
    IR is dynamic or does not list them."""
    ins = [op for op in ops if op.type == "pnnx.Input"]
    axes = batch_axes(g)
    order = sorted(g.inputs, key=_num)
    out = []
    for blob, op in zip(order, ins):
        shape = op.out_shape
        if not shape or any(d is None for d in shape):
            return None
        out.append((tuple(shape), axes.get(blob)))
    return out if len(out) == len(order) else None


def blob_keyed_reference(path: str, g: Graph) -> dict[str, np.ndarray]:
    """A reference at another length as blob-keyed arrays for `g` (its dynamized graph):
    `input_*` / `output_*` paired with the inputs / outputs in order (pnnx's traced shapes
    no longer fit them), plus `batch_index_<blob>` for each input read with a batch axis
    (`Reshape 12=b`, fix-slice's)."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    if any(k in g.inputs for k in arrays):  # already keyed by blob
        out = dict(arrays)
    else:
        ins = [k for k in arrays if k.startswith("input_")]
        outs = [k for k in arrays if k.startswith("output_")]
        out = {blob: arrays[key] for blob, key in zip(sorted(g.inputs, key=_num), ins)}
        out.update({blob: arrays[key] for blob, key in zip(sorted(g.outputs, key=_num), outs)})
    for blob, b in batch_axes(g).items():
        out.setdefault(f"batch_index_{blob}", np.asarray(b))
    return out


def reference_shapes(path: str) -> tuple[list[tuple], list[tuple]] | None:
    """(input shapes, output shapes) of a reference, in graph order: `in0`, `in1`, … /
    `out0`, … keys (blob names), else fixtures-style `input_*` / `output_*` keys in file
    order."""
    import re
    import zipfile

    try:
        with np.load(path) as data:
            shapes = {k: tuple(data[k].shape) for k in data.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return None
    blobs_in = sorted((k for k in shapes if re.fullmatch(r"in\d+", k)), key=_num)
    blobs_out = sorted((k for k in shapes if re.fullmatch(r"out\d+", k)), key=_num)
    if blobs_in:
        return [shapes[k] for k in blobs_in], [shapes[k] for k in blobs_out]
    ins = [s for k, s in shapes.items() if k.startswith("input_")]
    outs = [s for k, s in shapes.items() if k.startswith("output_")]
    return (ins, outs) if ins else None


def int_params(layer: Layer, pid: int) -> list[int] | None:
    """Param `pid` as a list of ints (an int: a list of one); None when absent or not ints."""
    v = layer.params.value(pid)
    return None if v is None else int_list(v)


def _upstream_mask_hint(layer: Layer) -> str:
    """What would let a 0/1 mask table through (pnnx's bool, e.g. GPT-2's eager `bias`
    buffer sliced to the traced length, then `where(mask, scores, finfo.min)`): the two
    exports of the same model that dynamize can make right at every length."""
    if not layer.weights or not len(layer.weights):
        return ""
    v = layer.weights[0].array().reshape(-1)
    if not v.size or not np.all((v == 0) | (v == 1)):
        return ""
    return (" (a 0/1 mask, e.g. HF's eager attention's causal `bias` buffer cut at the "
            "traced length: export with attn_implementation=\"sdpa\", whose additive mask "
            "dynamize rebuilds from the lengths, or with pnnx inputshape2=, which keeps the "
            "whole buffer and crops it at run time)")
