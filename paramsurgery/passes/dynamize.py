"""Make a graph traced at one length run at any length (`paramsurgery dynamize`).

A static export carries its traced length T in params: Crop absolute ends, Reshape dims,
Gemm `7=` constantM, MemoryData shapes. Two ways to find them:

- `--traced-len T`: every value equal to T in a length-carrying param (Reshape dims, Gemm
  M/N/K hints, Crop starts/ends on the length axis, Slice sizes, MemoryData shapes). A
  Reshape that holds T twice (T equal to a head count, ...) is ambiguous and refused unless
  `--layers NAME:PARAM` says which one to take.
- `--pair other.param` (the same model traced at another length): every value that differs
  between the two is length-derived; it is fitted as `a + b·T` (when the lengths are known)
  and rewritten; a differing value no rule covers is refused.

Rewrites: Reshape dim → `-1` (one per Reshape); Gemm `7/8/9` → `0` (hints when the operand
is not constant); Crop numpy-mode start/end → relative to its input's extent (negative,
`-233` for "to the end"), which needs the traced extent of the Crop's input from pnnx's own
IR (`X.pnnx.param` next to `X.ncnn.param`, or `--pnnx`); a MemoryData traced at T is
refused (a constant baked at one length; make it an input). Every rewritten value is
reported: layer, param, before → after.
"""

from __future__ import annotations

import os
from dataclasses import KW_ONLY, dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from paramsurgery.core.match import MatchFailure
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.values import Kind, int_list
from paramsurgery.formats import pnnx_traced as _traced
from paramsurgery.passes.causal_mask import CausalMask, memory_shape, prove_causal, rebuild
from paramsurgery.passes.dynamize_shapes import computed_table, int_params
from paramsurgery.passes.base import (TRACED_LEN, Deferred, FixInput, Pass, PassResult,
                                      RepairContext)
from paramsurgery.passes.options import internal, loaded_ops, option
from paramsurgery.core.changes import Change
from paramsurgery.analysis.shapes import infer_shapes

if TYPE_CHECKING:
    from paramsurgery.passes.dynamize_shapes import LengthSpec

RESHAPE_DIMS = {0: "w", 1: "h", 11: "d", 2: "c"}
AXIS_PARAM = {"w": 0, "h": 1, "d": 11, "c": 2}
SLICE_OPS = ("Tensor.slice",)


# why a paired table cannot extend this one (its traced rows are not the pair's first rows)
NOT_A_PREFIX = "its rows are not the first rows of the paired table"


@dataclass
class _Site:
    layer: Layer
    pid: int
    index: int | None  # element of an array param
    value: int
    other: int | None = None  # the value in the paired export

    @property
    def key(self) -> str:
        return f"{self.layer.name}:{self.pid}" + ("" if self.index is None else f"[{self.index}]")


# a planned rewrite: the site, its new value, how it was derived
Plan = tuple[_Site, int, str]


def _crop_index(layer: Layer, s: _Site) -> int:
    """The element of Crop's starts/ends array a site changes (9=/10= are arrays)."""
    if s.index is None:
        raise PassRefused(f"{layer.name}: Crop param {s.pid} is a scalar, not an array")
    return s.index


class Dynamize(Pass, name="dynamize", repair_order=60,
               summary="rewrite a traced length baked into Crop/Reshape/Gemm params into relative forms"):
    fix_inputs = (
        TRACED_LEN,
        FixInput("--pair", "the same model exported at another length: proves what one "
                 "trace cannot (the fallback when the single-trace rewrite refuses)",
                 metavar="OTHER_PARAM"),
        FixInput("--pair-bin", "the weights of --pair (default with --bin: OTHER.bin next "
                 "to it)", metavar="OTHER_BIN"),
        FixInput("--pair-pnnx", "pnnx's IR of --pair (default: next to it)",
                 metavar="OTHER_PNNX_PARAM"),
    )

    @classmethod
    def for_fix(cls, ctx: RepairContext, asked: bool) -> "Dynamize | None":
        """Runs when a length to run at is known: a reference whose inputs differ from the
        static trace (pnnx's IR next to the file) in the traced length's places, then the
        traced length is a symbol of the shape analysis; `--traced-len`; `--pair` (also the
        fallback of the single-trace rewrite)."""
        from paramsurgery.passes.dynamize_shapes import length_change, reference_shapes

        traced_len, pair_path = ctx.option("traced_len"), ctx.option("pair")
        reference = None
        if ctx.reference and ctx.traced_ops is not None:
            ref = reference_shapes(ctx.reference)
            traced = [op.out_shape for op in ctx.traced_ops if op.type == "pnnx.Input"]
            if ref is not None and length_change(traced, ref[0]) is not None:
                reference = (ref[0], ref[1], ctx.reference)
        if reference is None and traced_len is None and pair_path is None:
            if asked:
                raise PassRefused("a finding calls for dynamize, which needs a length to run "
                                  "at: --traced-len T, --pair OTHER.param, or a reference at "
                                  "another length (X.ref.npz next to the file) with pnnx's IR "
                                  "(X.pnnx.param)")
            return None
        pair_traced = ctx.ops_at(ctx.option("pair_pnnx") or _traced.companion_pnnx(pair_path))
        pair = Deferred(lambda: cls._fix_pair(ctx, pair_path)) if pair_path is not None \
            else None
        return cls(traced_len, pair=pair, traced=ctx.traced_ops, reference=reference,
                   pair_traced=pair_traced)

    @staticmethod
    def _fix_pair(ctx: RepairContext, path: str) -> Graph:
        """The pair as `fix` sees it: loaded with its weights (`--pair-bin`, or the .bin next
        to it when the input has `--bin`), after the repairs already applied to the input."""
        bin_path = ctx.option("pair_bin")
        if bin_path is None and ctx.bin is not None:
            sibling = os.path.splitext(os.fspath(path))[0] + ".bin"
            bin_path = sibling if os.path.exists(sibling) else None
        pnnx = ctx.option("pair_pnnx") or _traced.companion_pnnx(path)
        pnnx = os.fspath(pnnx) if pnnx is not None else None
        return ctx.load_other(os.fspath(path), bin_path, pnnx)

    traced_len: int | None = option(default=None, metavar="T",
                                    help="the length the graph was traced at")
    _: KW_ONLY
    # the same model exported at another length: the loaded graph (the command loads it;
    # `fix` hands a `Deferred`, resolved by the pass manager when the pass runs, so the pair
    # is repaired like the input by the passes before this one)
    pair: "Graph | Deferred | None" = internal(default=None)
    pair_len: int | None = option(
        default=None, metavar="T2",
        help="the length OTHER_PARAM was traced at (for the a + b·T report; inferred from "
             "the .pnnx.param inputs when possible)")
    axis: int | None = option(
        default=None, metavar="DIM",
        help="torch dim of the inputs that carries the length, counted from the end (-1 = "
             "last); default: the one input dim equal to T")
    reshape_axes: tuple[str, ...] = option(
        default=(), many=True, choices=("w", "h", "d", "c"), metavar="AXIS",
        help="only rewrite Reshape dims on these ncnn axes (w h d c)")
    layers: tuple[str, ...] = option(
        default=(), many=True, metavar="NAME[:PARAM]",
        help="only rewrite these layers (and params); resolves ambiguous occurrences")
    traced: "Sequence[_traced.PnnxOp] | None" = internal(default=None)  # pnnx's ops of the input
    pair_traced: "Sequence[_traced.PnnxOp] | None" = internal(default=None)  # and of the pair
    pair_path: str | None = internal(default=None)  # names the pair in messages only
    inputshape: "Mapping[str, tuple] | None" = internal(default=None)  # the traced input shapes
    spec: "LengthSpec | None" = internal(default=None)  # one static trace, its length a symbol
    reference: tuple[list, list, str] | None = internal(default=None)  # (inputs, outputs, path) elsewhere

    def __post_init__(self) -> None:
        if self.traced_len is None and self.pair is None and self.spec is None and \
                self.reference is None:
            raise PassRefused("dynamize needs --traced-len T or --pair OTHER.param")
        # files are read by the command or `fix` (the pass gets graphs and pnnx's ops)
        for what in ("pair", "traced", "pair_traced"):
            if isinstance(getattr(self, what), (str, os.PathLike)):
                raise TypeError(f"Dynamize({what}=...): give the loaded graph / pnnx's ops "
                                f"(formats.io.load, formats.pnnx_traced.load_traced), not a "
                                f"path: a pass reads no file")
        for what in ("traced", "pair_traced"):
            object.__setattr__(self, what, loaded_ops(f"Dynamize({what}=...)",
                                                      getattr(self, what)))
        object.__setattr__(self, "reshape_axes", tuple(self.reshape_axes or ()))
        object.__setattr__(self, "layers", tuple(self.layers or ()))
        if self.pair_path is not None:
            object.__setattr__(self, "pair_path", os.fspath(self.pair_path))

    def run(self, g: Graph) -> PassResult:
        if isinstance(self.pair, Deferred):
            raise TypeError("Dynamize(pair=Deferred(...)): the pass manager resolves it "
                            "(passes.base.resolved) before the pass runs")
        return _Run(self).run(g)


class _Run:
    """One run of `Dynamize`: its options, the lengths inferred from the traces, and what
    the run learns as it goes (shapes, tables, RoPE roles), all discarded after it."""

    def __init__(self, opts: Dynamize) -> None:
        assert not isinstance(opts.pair, Deferred)  # resolved before the run (Dynamize.run)
        self.spec = opts.spec
        self.reference = opts.reference
        self.T = opts.traced_len
        self.T2 = opts.pair_len
        self.pair: Graph | None = opts.pair
        self.pair_path = opts.pair_path
        self.axis = opts.axis
        self.reshape_axes = set(opts.reshape_axes) if opts.reshape_axes else None
        self.layer_filter: dict[str, set[int] | None] | None = None
        if opts.layers:
            self.layer_filter = {}
            for selector in opts.layers:
                name, _, pid = selector.partition(":")
                if pid:
                    self.layer_filter.setdefault(name, set())
                    cur = self.layer_filter[name]
                    if cur is not None:
                        cur.add(int(pid))
                else:
                    self.layer_filter[name] = None
        self.traced = list(opts.traced) if opts.traced is not None else None
        self.pair_traced = list(opts.pair_traced) if opts.pair_traced is not None else None
        self.inputshape = dict(opts.inputshape or {})
        self._shapes: tuple | None = None  # (traced ShapeMap, symbolic ShapeMap), once per run
        self._tables: dict[int, tuple] = {}  # id -> (paired layer, None: uniform rows; axis, letter, ref)
        self._roles: dict[int, tuple] = {}  # RoPE table id -> (rope, slot, θ)
        self._slice_index_cache: tuple | None = None

    # ------------------------------------------------------------------ helpers
    def _selected(self, layer: Layer, pid: int) -> bool:
        if self.layer_filter is None:
            return True
        if layer.name not in self.layer_filter:
            return False
        pids = self.layer_filter[layer.name]
        return pids is None or pid in pids

    def _fit(self, v1: int, v2: int) -> str:
        if self.T is None or self.T2 is None or self.T == self.T2:
            return f"{v1} at one length, {v2} at the other"
        b = Fraction(v2 - v1, self.T2 - self.T)
        a = v1 - b * self.T
        return f"{_frac(a)} + {_frac(b)}·T"

    # ------------------------------------------------------------------ candidate sites
    def _sites_traced_len(self, g: Graph) -> tuple[list[_Site], list[MatchFailure]]:
        T = self.T
        assert T is not None  # run only with a traced length (--traced-len)
        sites: list[_Site] = []
        notes: list[MatchFailure] = []
        for layer in g:
            t = layer.type
            if t == "Reshape":
                for pid in RESHAPE_DIMS:
                    v = layer.params.get(pid)
                    if v == T and self._selected(layer, pid):
                        if self.reshape_axes and RESHAPE_DIMS[pid] not in self.reshape_axes:
                            continue
                        sites.append(_Site(layer, pid, None, T))
            elif t == "Gemm":
                for pid in (7, 8, 9):
                    if layer.params.get(pid) == T and self._selected(layer, pid):
                        sites.append(_Site(layer, pid, None, T))
            elif t == "Crop":
                # one export cannot tell `x[..., s:]` from `x[..., L-r:]`: starts are taken as
                # offsets from the beginning, positive ends as distances from the end
                vals = int_params(layer, 10) or []
                for i, v in enumerate(vals):
                    if v > 0 and self._selected(layer, 10):
                        sites.append(_Site(layer, 10, i, v))
            elif t in ("MemoryData", "Slice"):
                for pid, v in layer.params.items():
                    items = v if isinstance(v, list) else [v]
                    if any(isinstance(x, int) and x == T for x in items) and \
                            self._selected(layer, pid):
                        sites.append(_Site(layer, pid, None, T))
        return sites, notes

    def _sites_pair(self, g: Graph, h: Graph) -> list[_Site]:
        a_layers, b_layers = g.layers, h.layers
        if len(a_layers) != len(b_layers):
            raise PassRefused(f"--pair: the two exports differ in structure ({len(a_layers)} vs "
                              f"{len(b_layers)} layers); they must be the same model traced at "
                              f"two lengths")
        sites: list[_Site] = []
        for la, lb in zip(a_layers, b_layers):
            if (la.type, la.name, la.inputs, la.outputs) != (lb.type, lb.name, lb.inputs,
                                                              lb.outputs):
                raise PassRefused(f"--pair: the two exports differ in structure at layer "
                                  f"{la.name!r} ({la.type} vs {lb.type} {lb.name!r}); they must "
                                  f"be the same model traced at two lengths")
            pa, pb = dict(la.params.values_typed()), dict(lb.params.values_typed())
            for pid in sorted(set(pa) | set(pb)):
                va, vb = pa.get(pid), pb.get(pid)
                if va == vb:
                    continue
                if not self._selected(la, pid):
                    continue
                if va is None or vb is None or va.kind != vb.kind or \
                        va.kind not in (Kind.INT, Kind.INTS):
                    raise PassRefused(f"--pair: {la.name} param {pid} differs in a way no "
                                      f"length fit covers ({_show(va)} vs {_show(vb)})")
                xa, xb = int_list(va), int_list(vb)
                assert xa is not None and xb is not None  # both int or int[] (checked above)
                if va.kind is Kind.INT:
                    sites.append(_Site(la, pid, None, xa[0], xb[0]))
                else:
                    if len(xa) != len(xb):
                        raise PassRefused(f"--pair: {la.name} param {pid} has "
                                          f"{len(xa)} vs {len(xb)} elements")
                    for i, (x, y) in enumerate(zip(xa, xb)):
                        if x != y:
                            sites.append(_Site(la, pid, i, x, y))
        return sites

    # ------------------------------------------------------------------ crop extents
    def _extent(self, ops: list[_traced.PnnxOp] | None, layer: Layer, start: int | None,
                end: int | None, label: str) -> tuple[int, int]:
        """(torch dim counted from the end, traced extent) of the Crop's input on that axis,
        from the pnnx op whose start/end match."""
        if ops is None:
            blob = layer.inputs[0] if layer.inputs else "?"
            raise PassRefused(f"{layer.name}: the Crop's {label} is length-derived but the extent "
                              f"of its input {blob!r} along that axis is unknown: give the traced "
                              f"input shapes (--inputshape NAME=[d0,...], e.g. with the traced "
                              f"length {self.T}) or pnnx's IR (X.pnnx.param next to "
                              f"X.ncnn.param, or --pnnx)")
        index = self._slice_index(ops)
        found = set(index.get((start, end), ()))
        if len(found) != 1:
            why = "no" if not found else f"{len(found)} different"
            raise PassRefused(f"{layer.name}: {why} pnnx Tensor.slice op(s) in the traced IR match "
                              f"its {label} {end if end is not None else start}; cannot tell "
                              f"the extent of its input")
        return found.pop()

    def _slice_index(self, ops: list[_traced.PnnxOp]) -> dict:
        """(start, end) → {(torch dim from the end, traced extent)} of every traced slice,
        also under (None, end), (start, None) and (None, None) for partial queries: built
        once per run, so matching each Crop is a lookup, not a scan of the traced IR."""
        cached = self._slice_index_cache
        if cached is not None and cached[0] is ops:
            return cached[1]
        index: dict[tuple[int | None, int | None], set[tuple[int, int]]] = {}
        for op in _traced.ops_of(ops, SLICE_OPS):
            shape = op.in_shape
            if not shape:
                continue
            dims = op.ints("dims") or op.ints("dim") or []
            starts = op.ints("starts") or op.ints("start") or [0] * len(dims)
            given_ends = op.ints("ends") or op.ints("end")
            ends: list[int | None] = list(given_ends) if given_ends else [None] * len(dims)
            for d, s, e in zip(dims, starts, ends):
                d = d % len(shape)
                L = shape[d]
                if L is None:
                    continue
                for key in ((s, e), (None, e), (s, None), (None, None)):
                    index.setdefault(key, set()).add((d - len(shape), L))
        self._slice_index_cache = (ops, index)
        return index

    def _shape_extent(self, g: Graph, layer: Layer, index: int, label: str) \
            -> tuple[int, bool]:
        """(traced extent, whether it follows the length) of the Crop's input along the axis
        of its `index`-th start/end, from the shape analysis at `--inputshape` (and again with
        the traced length as a symbol, which tells the length axis apart)."""
        from paramsurgery.analysis.shapes.affine import Affine

        if self._shapes is None:
            symbolic = {b: tuple(Affine.symbol("T") if self._is_length(s, i) else d
                                 for i, d in enumerate(s)) for b, s in self.inputshape.items()}
            self._shapes = (infer_shapes(g, inputshape=self.inputshape),
                            infer_shapes(g, inputshape=symbolic))
        traced, sym = self._shapes
        blob = layer.inputs[0]
        shape, sshape = traced.shape_of(blob), sym.shape_of(blob)
        axes = int_params(layer, 11) or list(range(len(shape or ())))
        if shape is None or index >= len(axes):
            raise PassRefused(f"{layer.name}: the Crop's {label} is length-derived but the shape "
                              f"of its input {blob!r} is not known at --inputshape "
                              f"{_fmt_shapes(self.inputshape)}: give the shape of the input it "
                              f"comes from (--inputshape NAME=[...]) or pnnx's IR (--pnnx)")
        ax = axes[index] + (len(shape) if axes[index] < 0 else 0)
        L = shape[ax] if 0 <= ax < len(shape) else None
        if not isinstance(L, int):
            raise PassRefused(f"{layer.name}: the extent of blob {blob!r} along axis {ax} is not "
                              f"known at --inputshape {_fmt_shapes(self.inputshape)}")
        follows = sshape is not None and len(sshape) == len(shape) and \
            isinstance(sshape[ax], Affine)
        return L, follows

    def _is_length(self, shape: tuple, i: int) -> bool:
        if shape[i] != self.T:
            return False
        return self.axis is None or i - len(shape) == self.axis or i == self.axis

    def _length_axis(self) -> int | None:
        """The torch dim (from the end) of the graph inputs that carries T."""
        if self.axis is not None:
            return self.axis
        if self.traced is None:
            return None
        cands = set()
        for op in self.traced:
            if op.type == "pnnx.Input":
                shape = op.out_shape or ()
                for d, s in enumerate(shape):
                    if s == self.T:
                        cands.add(d - len(shape))
        if len(cands) != 1:
            raise PassRefused(f"cannot tell which input axis carries the traced length {self.T} "
                              f"(candidates: {sorted(cands) or 'none'}); give --axis")
        return cands.pop()

    # ------------------------------------------------------------------ run
    def run(self, g: Graph) -> PassResult:
        spec = self.spec
        if spec is None and self.reference is not None and self.traced is not None:
            from paramsurgery.passes.dynamize_shapes import spec_from_reference, traced_input_shapes

            ins = traced_input_shapes(self.traced, g)
            if ins is not None:
                spec = spec_from_reference(g, ins, *self.reference)
        if spec is not None:
            return self._run_shapes(g, spec)
        if self.T is None and self.pair is None:
            result = PassResult(g, False)
            result.notes.append("the reference's inputs do not fit the traced ones with one "
                                "length changed: nothing to dynamize")
            return result
        return self._run_sites(g)

    def _run_shapes(self, g: Graph, spec: "LengthSpec") -> PassResult:
        """One trace and the shape analysis; with a pair as well, the pair proves what the
        single trace cannot (the refusal is kept in the notes)."""
        from paramsurgery.passes.dynamize_shapes import ShapeDynamize

        fallback = f"--pair {self.pair_path}" if self.pair_path else "--pair OTHER.param"
        if self.pair is not None:  # a trial on a copy: the pass rewrites `g` in place
            try:
                ShapeDynamize(spec, fallback=fallback, pair=self.pair).run(g.copy())
            except PassRefused as exc:
                result = self._run_sites(g)
                result.notes.append(f"one trace was not enough ({exc.message}); the pair "
                                    f"proved the rewrites")
                return result
        return ShapeDynamize(spec, fallback=fallback, pair=self.pair).run(g)

    def _run_sites(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        if self.pair is not None:
            sites = self._sites_pair(g, self.pair)
            self._infer_lengths()
        else:
            sites, skips = self._sites_traced_len(g)
            result.skipped.extend(skips)
        if not sites:
            result.notes.append("no length-derived value found")
            return result
        plan: list[Plan | None] = []
        by_layer: dict[int, list[_Site]] = {}
        for s in sites:
            by_layer.setdefault(s.layer.id, []).append(s)
        length_axis = None
        tables: list[Layer] = []
        masks: list[CausalMask] = []
        computed: list[tuple[Layer, str, tuple]] = []  # RoPE tables computed at run time
        zero: list[tuple] = []  # all-zero masks folded at the traced length (dropped)
        for ss in by_layer.values():
            layer = ss[0].layer
            t = layer.type
            if t == "Reshape":
                if len(ss) > 1:
                    shown = ", ".join(f"{s.pid}({RESHAPE_DIMS[s.pid]})={s.value}" for s in ss)
                    raise PassRefused(f"{layer.name}: ambiguous: {len(ss)} dims look length-derived "
                                      f"({shown}); only one can become -1 (T may equal a head "
                                      f"count: use --pair, or --layers {layer.name}:PARAM)")
                if any(layer.params.get(p) == -1 for p in RESHAPE_DIMS):
                    raise PassRefused(f"{layer.name}: dim {ss[0].pid} is length-derived but the "
                                      f"Reshape already infers another dim (-1)")
                s = ss[0]
                if s.pid not in RESHAPE_DIMS:
                    raise PassRefused(f"{layer.name}: param {s.pid} differs; no rule for it")
                plan.append((s, -1, "inferred (-1)"))
            elif t == "Gemm":
                for s in ss:
                    const = {7: layer.params.get(4, 0), 8: layer.params.get(5, 0),
                             9: layer.params.get(4, 0) or layer.params.get(5, 0)}.get(s.pid)
                    if const is None:
                        raise PassRefused(f"{layer.name}: Gemm param {s.pid} differs; no rule "
                                          f"for it")
                    if const:
                        raise PassRefused(f"{layer.name}: Gemm {s.pid}={s.value} sizes a constant "
                                          f"operand; it cannot become dynamic")
                    plan.append((s, 0, "runtime size (0)"))
            elif t == "Crop":
                if self.pair is None and self.traced is None and self.inputshape:
                    for s in ss:
                        plan.append(self._crop_plan_shapes(g, layer, s))
                    continue
                if self.pair is None:
                    if length_axis is None:
                        length_axis = self._length_axis()
                for s in ss:
                    plan.append(self._crop_plan(layer, s, length_axis))
            elif t == "MemoryData":
                cm = self._causal_mask(g, layer)
                if cm is not None:
                    masks.append(cm)
                    continue
                zm = self._zero_mask(g, layer)
                if zm is not None:
                    zero.append(zm)
                    continue
                why = self._table_plan(g, layer, ss)
                if why is not None and self._rope_table(g, layer, ss) is not None:
                    computed.append(self._rope_table(g, layer, ss))  # type: ignore[arg-type]
                    continue
                if why is not None:
                    raise PassRefused(self._table_refusal(g, layer, ss, why),
                                      line=layer.source_line)
                tables.append(layer)
            else:
                s = ss[0]
                raise PassRefused(f"{layer.name}: {t} param {s.pid} holds a length-derived value "
                                  f"({s.value}) and dynamize has no rule for {t}")
        planned = [p for p in plan if p is not None]
        for layer in tables:
            self._apply_table(g, layer, by_layer[layer.id], result)
        if tables:
            g.insert_splits()  # the Crops read a blob other layers read too
        for cm in masks:
            result.changes.append(rebuild(g, cm))
        for mask, readers, splits in zero:
            from paramsurgery.passes.learned_tables import drop_mask

            names = ", ".join(r.name for r in readers)
            result.changes.append(Change(mask.name, f"all-zero attention mask (in both exports): "
                                         f"dropped from {names} (5=0; adding 0 before softmax "
                                         f"changes nothing at any length)",
                                         " ".join(mask.params.tokens()), "removed",
                                         mask.source_line))
            drop_mask(g, mask, readers, splits)
        for layer, ref, role in computed:
            before_line = layer.source_line
            what, before, after = computed_table(g, layer, "h", ref, role)
            result.changes.append(Change(layer.name, what, before, after, before_line))
        for s, new, how in planned:
            self._apply(s, new)
            what = f"{s.pid}" + ("" if s.index is None else f"[{s.index}]")
            extra = f", {self._fit(s.value, s.other)}" if s.other is not None else ""
            result.changes.append(Change(s.layer.name, f"{what} ({how}{extra})", s.value, new,
                                         s.layer.source_line))
        result.modified = bool(planned) or bool(tables) or bool(masks) or bool(computed) or \
            bool(zero)
        if tables:
            self._check_tables(g, tables, result)
        return result

    def _check_tables(self, g: Graph, tables: list[Layer], result: PassResult) -> None:
        """The paired tables are exact up to their rows: said in the notes, and with a
        reference next to the input the graph is run there through ncnn against it (a
        reference longer than the tables is refused, naming them)."""
        from paramsurgery.passes.learned_tables import check_reference

        for layer in tables:
            other, _ax, letter, _ref = self._tables[layer.id]
            if other is None:  # a uniform table: exact at every length
                continue
            rows = layer.params.get({v: k for k, v in RESHAPE_DIMS.items()}[letter])
            result.notes.append(f"{layer.name}: a position table of {rows} rows: the result is "
                                f"exact for lengths up to {rows}")
        if self.reference is not None and all(t.weights for t in tables):
            names = [t.name for t in tables]
            result.notes.append(", ".join(names) + ": " + check_reference(
                g, self.reference[2], names, None, self.T or 0))

    def _rope_table(self, g: Graph, layer: Layer, ss: list[_Site]) -> tuple | None:
        """(layer, the rotated blob, its role) when `layer` is a RoPE cos/sin table whose
        rows (h) are the one length-derived dim, proven cos/sin(p·θ): computed at run time
        where the pair cannot give a longer table; None otherwise."""
        from paramsurgery.passes.dynamize_shapes import _rope_table_check, table_role

        if len(ss) != 1 or ss[0].pid != 1 or not layer.weights:
            return None
        from paramsurgery.patterns.match import readers_through_splits

        readers = [r for r, _ in readers_through_splits(g, layer.outputs[0])[0]]
        if not readers or any(r.type != "RotaryEmbed" for r in readers):
            return None
        rope = readers[0]
        cos_l, sin_l = (g.producer(g.above_splits(b)) for b in rope.inputs[1:3])
        if _rope_table_check(cos_l, sin_l, "h") is not None:
            return None
        if layer.id not in self._roles:  # θ from both tables, before either is rewritten
            self._roles[layer.id] = table_role(g, layer, "h")
        return layer, rope.inputs[0], self._roles[layer.id]

    def _causal_mask(self, g: Graph, layer: Layer) -> "CausalMask | None":
        """The causal mask a MemoryData holds when its values prove it one in this export
        and (with --pair) in the paired one, its side the traced length of each; None
        otherwise (the table rules then decide)."""
        try:
            cm = prove_causal(g, layer)
        except PassRefused:
            return None
        self._infer_lengths()
        if self.T is not None and cm.side != self.T:
            return None
        other = self.pair.find(layer.name) if self.pair is not None else None
        if self.pair is None:
            return cm
        if other is None:
            return None
        if other.weights is not None and len(other.weights):  # its values prove it too
            try:
                side = prove_causal(self.pair, other).side
            except PassRefused:
                return None
        else:  # proven on this export; the pair's is the same layer, square at its length
            shape = memory_shape(other)
            side = shape[-1] if len(shape) == len(memory_shape(layer)) and \
                shape[-1] == shape[-2] else -1
        return cm if self.T2 is None or side == self.T2 else None

    def _zero_mask(self, g: Graph, layer: Layer) -> tuple | None:
        """(the mask, its SDPA readers, the Splits between) when `layer` is an all-zero
        additive mask folded at the traced length (`learned_tables.zero_masks`: BERT's padding
        mask with nothing padded) and the pair's is all zero too (when its weights are given);
        None otherwise."""
        from paramsurgery.passes.learned_tables import zero_masks

        self._infer_lengths()
        if self.T is None:
            return None
        found = next((z for z in zero_masks(g, self.T) if z[0] is layer), None)
        if found is None:
            return None
        other = self.pair.find(layer.name) if self.pair is not None else None
        if other is not None and other.weights is not None and len(other.weights) and \
                np.any(other.weights[0].array()):
            return None
        return found

    # ------------------------------------------------------------------ position tables
    def _table_refusal(self, g: Graph, layer: Layer, ss: list[_Site], why: str) -> str:
        """The refusal of a table: one read element-wise with a blob whose same axis is the
        length (a learned position table, GPT-2's `wpe`, BERT's) names its reader and what
        exports let it through; any other constant is to become an input."""
        from paramsurgery.passes.learned_tables import UPSTREAM, UPSTREAM_INTERPOLATED

        letter = RESHAPE_DIMS.get(ss[0].pid) if len(ss) == 1 else None
        ref = self._table_reference(g, layer, letter) if letter is not None else None
        head = f"{layer.name}: MemoryData {ss[0].pid}={ss[0].value}"
        if ref is None:
            return (f"{head} is a constant traced at one length (a mask or table); make it "
                    f"an input ({why})")
        upstream = UPSTREAM_INTERPOLATED if why.startswith(NOT_A_PREFIX) else UPSTREAM
        return (f"{head}, a table traced at one length added to {ref!r} (a position table, "
                f"learned or interpolated), is not proven right at other lengths: {why}; "
                f"{upstream}")

    def _table_plan(self, g: Graph, layer: Layer, ss: list[_Site]) -> str | None:
        """None when `layer` is a position-indexed table the pair proves extendable: one
        dim differs (longer in the pair), the traced rows equal the pair's first rows, and
        every reader (through Splits) combines it with a blob whose same axis is the length
        (RotaryEmbed, BinaryOp); or when its rows are all one row (BERT's token types: that
        row, broadcast, is the table at every length; the pair's values are not needed);
        else why not."""
        from paramsurgery.passes.learned_tables import uniform_rows

        if self.pair is None:
            return "--pair gives the table at a second length"
        if len(ss) != 1 or ss[0].pid not in RESHAPE_DIMS or ss[0].other is None:
            return "more than one of its dims is length-derived"
        other = self.pair.layer(layer.name)
        if layer.weights is None or not len(layer.weights):
            return "its rows are needed to compare the tables (--bin)"
        s = ss[0]
        assert s.other is not None  # checked above
        dims = [RESHAPE_DIMS[p] for p in (2, 11, 1, 0) if layer.params.get(p, 0) not in (0, -233)]
        letter = RESHAPE_DIMS[s.pid]
        shape_a = [layer.params.get(AXIS_PARAM[d]) for d in dims]
        ax = dims.index(letter)
        short = layer.weights[0].array().reshape(-1).reshape(shape_a)
        if uniform_rows(short, ax):
            return self._keep_table(g, layer, None, ax, letter)
        needed = self._rows_needed(g, s.value)
        if needed is not None and needed > s.other:
            return self._pair_too_short(needed, s.other)
        if other.weights is None or not len(other.weights):
            where = f" next to {self.pair_path}" if self.pair_path else " next to the pair"
            return (f"the paired export's rows are needed to extend it: give --pair-bin "
                    f"OTHER.bin (the pair's weights: no .bin was found{where})")
        if s.other <= s.value:
            return "the paired table is not longer"
        b = other.weights[0].array().reshape(-1)
        shape_b = [other.params.get(AXIS_PARAM[d]) for d in dims]
        other_shape = b.reshape(shape_b)
        head = np.take(other_shape, range(s.value), axis=ax)
        if not np.array_equal(head, short):
            return f"{NOT_A_PREFIX} (not position-indexed: interpolated to the traced size)"
        return self._keep_table(g, layer, other, ax, letter)

    def _rows_needed(self, g: Graph, rows: int) -> int | None:
        """The rows a table of `rows` rows at the traced length needs at the length of the
        reference next to the input (rows scale with the input's length: Whisper's conv stem
        halves it); None without a reference or when it is not one length changed."""
        from paramsurgery.passes.dynamize_shapes import length_change, traced_input_shapes

        if self.reference is None or self.traced is None:
            return None
        ins = traced_input_shapes(self.traced, g)
        change = None if ins is None else length_change([s for s, _ in ins], self.reference[0])
        if change is None or (rows * change[1]) % change[0]:
            return None
        return rows * change[1] // change[0]

    @staticmethod
    def _pair_too_short(needed: int, rows: int) -> str:
        """Why a paired table shorter than the reference needs cannot be proven (the caller
        adds the upstream fix)."""
        return (f"at the length of the reference next to the input it needs {needed} rows, "
                f"the paired export has {rows}: no row {rows} is in either file, so the pair "
                f"serves lengths up to {rows} only (provable with its weights, --pair-bin, "
                f"against a --reference at an untraced length up to {rows}); the reference's "
                f"length needs a pair traced to give {needed} rows or more in place of this one")

    def _keep_table(self, g: Graph, layer: Layer, other: Layer | None, ax: int,
                    letter: str) -> str | None:
        """Keep a table to crop at run time (from `other`'s rows, or its own uniform rows
        when None) by the length of the blob its reader combines it with; else the reason."""
        ref = self._table_reference(g, layer, letter)
        if ref is None:
            return (f"no reader combines it with a blob whose {letter} is the length "
                    f"(RotaryEmbed / BinaryOp)")
        self._tables[layer.id] = (other, ax, letter, ref)
        return None

    def _table_reference(self, g: Graph, layer: Layer, letter: str) -> str | None:
        work, readers = list(layer.outputs), []
        while work:
            for c in g.consumer_layers(work.pop()):
                if c.type == "Split":
                    work.extend(c.outputs)
                else:
                    readers.append(c)
        refs = []
        for c in readers:
            if c.type not in ("RotaryEmbed", "BinaryOp"):
                return None
            others = [b for b in c.inputs if self._root(g, b) != layer.outputs[0]]
            if not others:
                return None
            refs.append(others[0])
        return refs[0] if refs else None

    @staticmethod
    def _root(g: Graph, blob: str) -> str:
        return g.above_splits(blob)

    def _apply_table(self, g: Graph, layer: Layer, ss: list[_Site], result: PassResult) -> None:
        from paramsurgery.formats.weights import set_weights

        other, ax, letter, ref = self._tables[layer.id]
        s = ss[0]
        before = " ".join(layer.params.tokens())
        if other is None:  # uniform rows: the one row, broadcast by the readers
            from paramsurgery.passes.learned_tables import shrink_to_row

            values = layer.weights[0].array().reshape(-1)
            dims = [RESHAPE_DIMS[p] for p in (2, 11, 1, 0)
                    if layer.params.get(p, 0) not in (0, -233)]
            values = values.reshape([layer.params.get(AXIS_PARAM[d]) for d in dims])
            shrink_to_row(layer, s.pid, values, ax)
            result.changes.append(Change(layer.name, f"uniform table (its {s.value} rows are "
                                         f"one row): that row, broadcast over the length by "
                                         f"its readers; exact at every length", before,
                                         " ".join(layer.params.tokens()), layer.source_line))
            return
        layer.set(s.pid, s.other)
        set_weights(layer, {"data": other.weights[0].array().reshape(-1).copy()})
        top = layer.outputs[0]
        crop_out = g.unique_blob_name(f"{top}_rows")
        g.replace_uses(top, crop_out)
        g.add_layer("Crop", g.unique_layer_name(f"{layer.name}_rows"), [top, ref], [crop_out],
                    {19: "0", 20: f"1{letter}", 21: str(ax)}, after=layer)
        g.toposort()  # `ref` may be produced after the table
        result.changes.append(Change(layer.name, f"position table: the paired export's "
                                     f"{s.other} rows (its first {s.value} equal these), cropped "
                                     f"to the run-time {letter} of {ref!r}", before,
                                     " ".join(layer.params.tokens()), layer.source_line))
        result.notes.append(f"{layer.name}: a position table of {s.other} rows: the result is "
                            f"exact for lengths up to {s.other}")

    def _infer_lengths(self) -> None:
        if self.T is not None and self.T2 is not None:
            return
        if self.traced is None or self.pair_traced is None:
            return
        a = [op.out_shape for op in self.traced if op.type == "pnnx.Input"]
        b = [op.out_shape for op in self.pair_traced if op.type == "pnnx.Input"]
        diffs = {(x, y) for sa, sb in zip(a, b) if sa and sb and len(sa) == len(sb)
                 for x, y in zip(sa, sb) if x != y}
        if len(diffs) == 1:
            t1, t2 = diffs.pop()
            if self.T is None:
                self.T = t1
            if self.T2 is None:
                self.T2 = t2

    def _crop_plan(self, layer: Layer, s: _Site, length_axis: int | None) -> Plan | None:
        label = "end" if s.pid == 10 else "start"
        if s.value in (-233,) or (s.value < 0 and s.other is None):
            return None
        index = _crop_index(layer, s)
        starts, ends = int_params(layer, 9) or [], int_params(layer, 10) or []
        st = starts[index] if index < len(starts) else None
        en = ends[index] if index < len(ends) else None
        d, L = self._extent(self.traced, layer, st, en, label)
        if self.pair is not None:
            p = self.pair.layer(layer.name)
            starts2, ends2 = int_params(p, 9) or [], int_params(p, 10) or []
            st2 = starts2[index] if index < len(starts2) else None
            en2 = ends2[index] if index < len(ends2) else None
            d2, L2 = self._extent(self.pair_traced, p, st2, en2, label)
            assert s.other is not None  # every --pair site has the paired value
            r1, r2 = s.value - L, s.other - L2
            if r1 != r2:
                raise PassRefused(f"{layer.name}: the Crop {label} moves from {s.value} to "
                                  f"{s.other} while its input's extent moves from {L} to {L2}; "
                                  f"it is not a fixed distance from the end")
        else:
            if d != length_axis:
                return None  # a crop on an axis that does not carry the length
            r1 = s.value - L
        return _crop_from_end(layer, s, label, r1, L)

    def _crop_plan_shapes(self, g: Graph, layer: Layer, s: _Site) -> Plan | None:
        """The Crop rewrite when the traced extent comes from `--inputshape` (no pnnx IR)."""
        label = "end" if s.pid == 10 else "start"
        if s.value < 0:
            return None
        L, follows = self._shape_extent(g, layer, _crop_index(layer, s), label)
        if not follows:
            return None  # a crop on an axis that does not carry the length
        r1 = s.value - L
        return _crop_from_end(layer, s, label, r1, L)

    def _apply(self, s: _Site, new: int) -> None:
        layer = s.layer
        if s.index is None:
            layer.set(s.pid, new)
        else:
            vals = layer.params.get_ints(s.pid)
            assert vals is not None  # an indexed site is an element of an int array
            vals[s.index] = new
            layer.set(s.pid, vals)


def _fmt_shapes(shapes: Mapping[str, tuple]) -> str:
    return " ".join(f"{b}=[{','.join(str(d) for d in s)}]" for b, s in shapes.items()) or \
        "(none given)"


def _frac(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def _show(v) -> str:
    return "absent" if v is None else f"{v.kind.value} {v.python!r}"


def _crop_from_end(layer: Layer, s: "_Site", label: str, r1: int, extent: int) -> Plan:
    """The Crop rewrite for a bound `r1` elements from its input's end (`extent` long):
    -233 (to the end) at 0, the negative offset otherwise; beyond the end or an empty
    start is refused."""
    if r1 > 0:
        raise PassRefused(f"{layer.name}: the Crop {label} {s.value} lies beyond its input's "
                          f"extent {extent}")
    if r1 == 0:
        if label == "start":
            raise PassRefused(f"{layer.name}: the Crop starts at its input's end (empty)")
        return (s, -233, f"to the end (input extent {extent})")
    return (s, r1, f"relative to the end (input extent {extent})")
