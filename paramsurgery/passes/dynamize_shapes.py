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
        for cm in masks:
            self.changes.append(rebuild(g, cm))
        for layer, letter, ref in proven:
            self._extend_and_crop(g, layer, letter, ref)
        if tables:
            g.insert_splits()
        self._check_outputs(g)
        result = PassResult(g, bool(self.changes), list(self.changes))
        result.notes.extend(self.bounded)
        result.data["length_spec"] = self.spec
        return result

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
                              f"export", line=layer.source_line) from None

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

    def _table(self, g: Graph, layer: Layer) -> tuple[Layer, str, str]:
        letter = self._table_rows(layer)
        assert letter is not None  # run() keeps only tables with one length dim
        readers = self._readers(g, layer)
        if not readers or any(r.type != "RotaryEmbed" or slot not in (1, 2)
                              for r, slot in readers):
            raise self._refuse(layer, f"MemoryData {letter}={self.spec.traced_len} is a "
                                      f"constant traced at one length and no rule proves it "
                                      f"a position table (its readers are not RotaryEmbed "
                                      f"cos/sin inputs)")
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
        return layer, letter, ref

    def _extend_and_crop(self, g: Graph, layer: Layer, letter: str, ref: str) -> None:
        t0 = self.spec.traced_len
        before = " ".join(layer.params.tokens())
        rows = self._longer_table(layer, letter)
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


def _table_shape(layer: Layer) -> tuple[int, ...]:
    dims = [layer.params.get(pid, 0) for pid in (2, 11, 1, 0)]
    return tuple(d for d in dims if isinstance(d, int) and d)


def _crop_rows_to(g: Graph, layer: Layer, letter: str, ref: str) -> None:
    """Read `layer`'s table through a Crop to the run-time `letter` extent of `ref`."""
    top = layer.outputs[0]
    shape = _table_shape(layer)
    ax = len(shape) + NUMPY_AXIS[letter]
    out = g.unique_blob_name(f"{top}_rows")
    g.replace_uses(top, out)
    g.add_layer("Crop", g.unique_layer_name(f"{layer.name}_rows"), [top, ref], [out],
                {19: "0", 20: f"1{letter}", 21: str(ax)}, after=layer)


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
