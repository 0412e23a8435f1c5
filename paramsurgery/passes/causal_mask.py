"""`causal-mask`: a causal attention mask pnnx folded at the traced length → the same mask
built from the run-time lengths by ncnn layers.

A static export of an HF decoder (`torch.full((T, T), finfo.min).triu(1)`, HF's own
`causal_mask`, eager or SDPA attention) holds the mask as `MemoryData
pnnx_fold_attention_mask 0=T 1=T [2=1]`: right at the traced T only. The constant is proven
causal from its values — 0 on and below the diagonal, one value v ≤ -1e4 (or -inf) above it,
square — and every reader must be an SDPA's mask input (`5=1`). It is then rebuilt from the
reading SDPA's own query and key lengths (`Tq`, `Tk`):

    Crop q → (1, Tq, 1) → Reshape (Tq, 1) → ×0 +1 → CumulativeSum(h)      i + 1
    Crop k → (1, Tk, 1) → Reshape (1, Tk) → ×0 +1 → CumulativeSum(w)      j + 1
    (j + 1) - (i + 1) → Clip [0, 1] → × v [→ Reshape to the constant's rank]

which is v where j > i and 0 elsewhere: the constant itself at the traced lengths, the
causal mask of the same kind at every other length (no length bound, no table). When the
shapes are known (dynamize's walk) the query and key lengths must follow the input length
and equal the constant's side at the traced length. Anything else (a mask read by other
layers, values that are not causal, a 1×1 mask) is refused naming the layer.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paramsurgery.analysis.shape_expr import reshape_dims
from paramsurgery.core.match import MatchFailure
from paramsurgery.core.ncnn import NO_BATCH
from paramsurgery.core.changes import Change
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.formats.pnnx_param import find_pnnx_param
from paramsurgery.passes.base import Pass, PassResult, RepairContext
from paramsurgery.passes.options import option
from paramsurgery.patterns.match import readers_through_splits

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import Op, PnnxGraph

MASK_FLOOR = -1e4  # a masked score: at most this (HF: finfo.min; older code -1e4, -inf)
DIMS = (0, 1, 11, 2)  # MemoryData w, h, d, c


@dataclass
class CausalMask:
    """A proven causal constant: its layer, the value above the diagonal, its side, its
    numpy rank, and the SDPA layers that read it (query and key blobs: the run-time
    lengths)."""

    layer: Layer
    value: float
    side: int
    rank: int
    readers: list[Layer]

    @property
    def query(self) -> str:
        return self.readers[0].inputs[0]

    @property
    def key(self) -> str:
        return self.readers[0].inputs[1]


def memory_shape(layer: Layer) -> tuple[int, ...]:
    """The numpy shape of a MemoryData (c, d, h, w without the absent ones)."""
    dims = [layer.params.get(pid, 0) for pid in (2, 11, 1, 0)]
    return tuple(d for d in dims if isinstance(d, int) and d)


def causal_value(arr: np.ndarray) -> tuple[float | None, str]:
    """(v, "") when `arr` (..., n, n) is 0 on and below the diagonal and one value v ≤
    -1e4 above it; (None, why) otherwise."""
    if arr.ndim < 2 or arr.shape[-1] != arr.shape[-2] or any(d != 1 for d in arr.shape[:-2]):
        return None, f"its shape {tuple(arr.shape)} is not one square (T, T) matrix"
    n = arr.shape[-1]
    if n < 2:
        return None, "a 1×1 mask has no entry above the diagonal to tell causal from zeros"
    m = arr.reshape(n, n)
    upper = np.triu(np.ones((n, n), dtype=bool), 1)
    below = m[~upper]
    if np.any(below != 0):
        i, j = np.argwhere((m != 0) & ~upper)[0]
        return None, f"entry [{i}, {j}] on or below the diagonal is {float(m[i, j]):g}, not 0"
    above = m[upper]
    v = float(above[0])
    if np.any(above != above[0]):
        return None, "the entries above the diagonal are not all one value"
    if not v <= MASK_FLOOR:
        return None, f"the value above the diagonal is {v!r}, not a masking value (≤ -1e4)"
    return v, ""


def sdpa_readers(g: Graph, layer: Layer) -> tuple[list[Layer], str]:
    """The SDPA layers reading `layer`'s top as their mask (through Splits), first in file
    order first; ([], why) when a reader is anything else."""
    readers, _ = readers_through_splits(g, layer.outputs[0])
    if not readers:
        return [], "nothing reads it"
    sdpas = []
    for r, slot in readers:
        if r.type != "SDPA" or slot != 3 or r.params.get(5, 0) != 1 or r.params.get(7, 0):
            return [], (f"read by {r.type} {r.name!r} (bottom {slot}): only an SDPA's mask "
                        f"input (5=1, no cache) is rebuilt from the run-time lengths")
        sdpas.append(r)
    pos = g.position()
    sdpas.sort(key=lambda r: pos[r.id])  # the first in file order gives the lengths
    return sdpas, ""


def prove_causal(g: Graph, layer: Layer) -> CausalMask:
    """The causal mask `layer` (a MemoryData) holds and its SDPA readers, or PassRefused
    naming the layer and why."""
    if layer.type != "MemoryData" or len(layer.outputs) != 1:
        raise PassRefused(f"{layer.name}: not a MemoryData constant", line=layer.source_line)
    sdpas, why = sdpa_readers(g, layer)
    if not sdpas:
        raise PassRefused(f"{layer.name}: {why}", line=layer.source_line)
    if not layer.weights or not len(layer.weights):
        raise PassRefused(f"{layer.name}: the values of MemoryData {layer.name!r} are needed to "
                          f"prove it a causal mask: give --bin", line=layer.source_line)
    shape = memory_shape(layer)
    arr = layer.weights[0].array().reshape(shape)
    v, why = causal_value(arr)
    if v is None:
        raise PassRefused(f"{layer.name}: not proven a causal mask: {why}", line=layer.source_line)
    return CausalMask(layer, v, shape[-1], len(shape), sdpas)


class LengthBuilder:
    """Adds a chain of layers that computes a value from run-time lengths, writing `top`
    (the blob a constant wrote, so its readers and Splits stay): named after `name`, placed
    before `anchor` and re-sorted by `finish`."""

    def __init__(self, g: Graph, top: str, name: str, anchor: Layer) -> None:
        self.g, self.top, self.name = g, top, name
        self.prev = _before(g, anchor)

    def add(self, type_: str, suffix: str, ins: list[str], params: dict,
            out: str | None = None) -> str:
        g = self.g
        blob = out or g.unique_blob_name(f"{self.top}_{suffix}")
        lname = g.unique_layer_name(f"{self.name}_{suffix}")
        self.prev = g.add_layer(type_, lname, ins, [blob], params, after=self.prev) \
            if self.prev is not None else g.add_layer(type_, lname, ins, [blob], params)
        return blob

    def positions(self, src: str, tag: str, column: bool) -> str:
        """p + 1 for p = 0 .. h-1, `src`'s h (a 3-D blob): a column (h, 1) or a row (1, h)."""
        one = self.add("Crop", f"{tag}1", [src], {9: [0, 0], 10: [1, 1], 11: [0, 2]})
        vec = self.add("Reshape", f"{tag}v", [one], {0: 1, 1: -1} if column else {0: -1, 1: 1})
        zero = self.add("BinaryOp", f"{tag}0", [vec], {0: 2, 1: 1, 2: 0.0})
        ones = self.add("BinaryOp", f"{tag}ones", [zero], {0: 0, 1: 1, 2: 1.0})
        return self.add("CumulativeSum", f"{tag}pos", [ones], {0: 0 if column else 1})

    def to_rank(self, blob: str, rank: int) -> None:
        """Write `blob` (2-D) to `top` with the constant's rank 3 or 4 (leading axes of 1)."""
        assert rank in (3, 4)  # a 2-D value is written to `top` by its last layer
        self.add("Reshape", "rank", [blob], {0: 0, 1: 0, 2: 1} if rank == 3 else
                 {0: 0, 1: 0, 11: 1, 2: 1}, out=self.top)

    def finish(self) -> None:
        self.g.toposort()
        self.g.insert_splits()


def rebuild(g: Graph, cm: CausalMask) -> Change:
    """Replace the constant by the mask built from the first reader's query/key lengths
    (the same blob name, so every reader and Split is kept); the graph is re-sorted."""
    layer = cm.layer
    top, name, line = layer.outputs[0], layer.name, layer.source_line
    before = " ".join([layer.type, *layer.params.tokens()])
    query, key = cm.query, cm.key
    g.remove_layer(layer)  # first: the builder starts after the layer before the reader,
    b = LengthBuilder(g, top, name, g.layer(cm.readers[0]))  # which may be this constant
    _build(b, query, key, cm.value, cm.rank)
    b.finish()
    after = f"{cm.value:g} where col > row, by the lengths of {query!r}, {key!r}"
    return Change(name, f"causal mask ({cm.side}×{cm.side}, proven from its values, read by "
                        f"{', '.join(r.name for r in cm.readers)})", before, after, line)


def _build(b: "LengthBuilder", query: str, key: str, value: float, rank: int) -> None:
    """v where col > row over (h(query), h(key)), written to the builder's top with `rank`."""
    top = b.top
    rows = b.positions(query, "q", True)         # (Tq, 1): i + 1
    cols = b.positions(key, "k", False)          # (1, Tk): j + 1
    diff = b.add("BinaryOp", "ahead", [cols, rows], {0: 1})  # (Tq, Tk): j - i
    step = b.add("Clip", "step", [diff], {0: 0.0, 1: 1.0})
    if rank == 2:
        b.add("BinaryOp", "value", [step], {0: 2, 1: 1, 2: value}, out=top)
    else:
        b.to_rank(b.add("BinaryOp", "value", [step], {0: 2, 1: 1, 2: value}), rank)


def _before(g: Graph, layer: Layer) -> Layer | None:
    order = g.layers
    i = next(k for k, x in enumerate(order) if x.id == layer.id)
    return order[i - 1] if i > 0 else None


def square_constants(g: Graph) -> list[Layer]:
    """MemoryData layers shaped like one (T, T) matrix (T ≥ 2): the candidates."""
    out = []
    for m in g.by_type("MemoryData"):
        shape = memory_shape(m)
        if len(shape) >= 2 and shape[-1] == shape[-2] >= 2 and all(d == 1 for d in shape[:-2]):
            out.append(m)
    return out


# ============================================================================ built in-graph

TRIU_TYPES = ("aten::triu", "torch.triu", "Tensor.triu")
FULL_TYPES = ("torch.full",)
# HF's crop of the mask to the key length (`mask[..., :k.shape[-2]]`): ncnn's form, and the
# torch form pnnx writes under a dynamic export (bottom 1 the (B, H, T, D) key: dim 2 is T)
KEY_LENGTH_ENDS = ("1h", "size(@1,2)")
_SIZE = re.compile(r"^size\(@0,(-?\d+)\)$")


@dataclass
class BuiltMask:
    """`triu(full((S, S), v), 1)` built in the graph from the input's length (pnnx's
    dynamic export of an HF decoder), proven to reach only SDPA mask inputs; `layers`:
    what computes it and carries it to the SDPAs (all removed), `readers`: the SDPAs."""

    triu: Layer
    value: float
    size: str  # pnnx's size expression, e.g. [size(@0,1),size(@0,1)]
    layers: list[Layer]
    readers: list[Layer]


def _pnnx_op(pnnx: "PnnxGraph", layer: Layer, what: str) -> "Op":
    op = pnnx.op_by_name(layer.name)
    if op is None or op.type != layer.type:
        raise MatchFailure(layer, f"{pnnx.path or 'the .pnnx.param'} has no {layer.type} named "
                                  f"{layer.name!r}: its {what} is not known")
    return op


def _fill_value(op: "Op") -> float | None:
    v = op.param("fill_value")
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(str(v))  # pnnx writes -inf as a word
    except ValueError:
        return None


def prove_built(g: Graph, triu: Layer, pnnx: "PnnxGraph | None") -> BuiltMask:
    """The in-graph causal mask ending in `triu`, or MatchFailure naming the layer and why.

    Proven from pnnx's IR (the ncnn graph drops every value): `triu`'s diagonal is 1,
    its input is `torch.full(size, v)` with v <= -1e4 read only by it, `size` is the
    square `[size(@0,d), size(@0,d)]` of a dynamic dim of a graph input; every path from
    it reaches an SDPA's mask input (`5=1`, no cache) through Splits, ExpandDims adding
    leading unit dims, and HF's crop to that SDPA's key length. Torch's mask is then
    v where col > row over (S, min(S, Tk)), broadcast over the leading dims, with S = Tq
    (the query rows it is added to): what `_build` computes from the SDPA's own q and k."""
    if pnnx is None:
        raise MatchFailure(triu, f"{triu.type} {triu.name!r} builds a mask whose values pnnx "
                                 f"keeps only in X.pnnx.param: give --pnnx (or keep it next "
                                 f"to the input)")
    layers: list[Layer] = [triu]
    op = _pnnx_op(pnnx, triu, "diagonal")
    if len(triu.inputs) == 2:
        diag_layer = g.producer(g.above_splits(triu.inputs[1]))
        if diag_layer is None or diag_layer.type != "pnnx.Expression" or diag_layer.inputs:
            raise MatchFailure(triu, "its diagonal is computed at run time, not a constant")
        diag = _pnnx_op(pnnx, diag_layer, "value").param("expr")
        if len(g.consumers(diag_layer.outputs[0])) == 1:
            layers.append(diag_layer)
    elif len(triu.inputs) == 1:
        diag = op.param("diagonal", 0)
    else:
        raise MatchFailure(triu, f"has {len(triu.inputs)} bottoms")
    if diag != 1 or isinstance(diag, bool):
        raise MatchFailure(triu, f"diagonal={diag!r}: only triu(..., 1) (0 on the diagonal, "
                                 f"HF's causal mask) is rebuilt")
    full = g.producer(triu.inputs[0])
    if full is None or full.type not in FULL_TYPES:
        what = f"{full.type} {full.name!r}" if full is not None else "nothing"
        raise MatchFailure(triu, f"its input comes from {what}, not torch.full")
    if len(g.consumers(triu.inputs[0])) != 1:
        raise MatchFailure(full, f"torch.full {full.name!r} is also read by other layers")
    v = _fill_value(_pnnx_op(pnnx, full, "fill value"))
    if v is None or not v <= MASK_FLOOR:
        raise MatchFailure(full, f"torch.full {full.name!r} fills {v!r}, not a masking value "
                                 f"(<= -1e4)")
    dtype = _pnnx_op(pnnx, full, "dtype").param("dtype")
    if dtype not in (None, "torch.float", "torch.float32"):
        raise MatchFailure(full, f"torch.full {full.name!r} has dtype {dtype}, not float32")
    layers.append(full)
    size_layer = g.producer(full.inputs[0]) if len(full.inputs) == 1 else None
    if size_layer is None or size_layer.type != "pnnx.Expression" or len(size_layer.inputs) != 1:
        raise MatchFailure(full, f"torch.full {full.name!r}: its size is not one pnnx.Expression "
                                 f"on the input's shape")
    size_op = _pnnx_op(pnnx, size_layer, "expression")
    size = str(size_op.params.get("expr", ""))
    parts = re.findall(r"size\(@\d+,-?\d+\)|[^,\[\]]+", size) if size.startswith("[") else []
    m = _SIZE.match(parts[0]) if len(parts) == 2 and parts[0] == parts[1] else None
    if m is None:
        raise MatchFailure(size_layer, f"the size {size!r} of torch.full {full.name!r} is not "
                                       f"[size(@0,d),size(@0,d)] (a square mask of one length)")
    src = size_op.inputs[0] if size_op.inputs else None
    shape = size_op.shape(src) if src is not None else None
    d = int(m.group(1))
    producer = next((o for o in pnnx.ops if src in o.outputs), None)
    if shape is None or not -len(shape) <= d < len(shape) or shape[d] is not None or \
            producer is None or producer.type != "pnnx.Input":
        raise MatchFailure(size_layer, f"the size {size!r} of torch.full {full.name!r} is not a "
                                       f"dynamic dim of a graph input (the sequence length)")
    if len(g.consumers(size_layer.outputs[0])) == 1:
        layers.append(size_layer)
    readers = _mask_readers(g, triu.outputs[0], 2, None, layers)
    pos = g.position()
    readers.sort(key=lambda r: pos[r.id])
    return BuiltMask(triu, v, size, layers, readers)


def _mask_readers(g: Graph, blob: str, rank: int, key: str | None,
                  layers: list[Layer]) -> list[Layer]:
    """The SDPAs `blob` (a torch rank-`rank` mask) reaches, collecting the layers on the way;
    `key`: the key blob a crop on the way cropped it to (its SDPA must read that key)."""
    out: list[Layer] = []
    work = [(blob, rank, key)]
    seen: set[tuple[str, int, str | None]] = set()  # each blob once (a cycle ends the walk)
    while work:
        item = work.pop()
        if item in seen:
            continue
        seen.add(item)
        b, r, k = item
        readers = g.consumers(b)
        if not readers:
            raise MatchFailure(g.producer(b), f"the mask blob {b!r} is a graph output")
        for layer, slot in readers:
            if layer.type == "Split":
                layers.append(layer)
                work.extend((t, r, k) for t in layer.outputs)
            elif layer.type == "ExpandDims" and slot == 0:
                axes = _axes(layer.params.get(3))
                new = r + len(axes)
                if not axes or any(not 0 <= a <= new - 3 for a in axes):
                    raise MatchFailure(layer, f"ExpandDims {layer.name!r} adds axes {axes} to the "
                                              f"mask: only leading unit dims (a broadcast over "
                                              f"batch/heads) keep it a (Tq, Tk) mask")
                layers.append(layer)
                work.append((layer.outputs[0], new, k))
            elif layer.type == "Crop" and slot == 0 and len(layer.inputs) == 2:
                ends, starts = layer.params.get(20), layer.params.get(19)
                axes_ = str(layer.params.get(21, ""))
                last = {"-1", str(r - 1), str(r - 2) if r >= 3 else "-1"}
                if k is not None or str(ends) not in KEY_LENGTH_ENDS or \
                        str(starts) not in ("0", "None") or axes_ not in last:
                    raise MatchFailure(layer, f"Crop {layer.name!r} crops the mask by "
                                              f"19={starts!r} 20={ends!r} 21={axes_!r}: not "
                                              f"HF's crop to the key length on the last axis")
                layers.append(layer)
                work.append((layer.outputs[0], r, g.above_splits(layer.inputs[1])))
            elif layer.type == "SDPA" and slot == 3 and layer.params.get(5, 0) == 1 and \
                    not layer.params.get(7, 0):
                if k is not None and k not in _key_views(g, layer.inputs[1]):
                    raise MatchFailure(layer, f"SDPA {layer.name!r} reads the mask cropped to the "
                                              f"length of {k!r}, not of its own key")
                if layer not in out:
                    out.append(layer)
            else:
                raise MatchFailure(layer, f"the mask is read by {layer.type} {layer.name!r} "
                                          f"(bottom {slot}): only an SDPA's mask input (5=1, "
                                          f"no cache) is rebuilt from the run-time lengths")
    return out


def _key_views(g: Graph, key: str) -> list[str]:
    """The blobs an SDPA's key is a view of with the same length h: through Splits and
    Reshapes that keep h (`6="D,0h,H"`, no batch axis: the SDPA's [D, T, H] of a 4-D
    [D, T, H, 1] key, which HF's mask crop reads: GPT-NeoX's dynamic export)."""
    out = [g.above_splits(key)]
    for _ in range(8):
        p = g.producer(out[-1])
        if p is None or p.type != "Reshape" or not p.inputs or \
                p.params.get(12, NO_BATCH) != NO_BATCH or p.params.get(13, NO_BATCH) != NO_BATCH:
            break
        dims = reshape_dims(p)
        if not dims or len(dims) < 2 or dims[1] != "0h":
            break
        out.append(g.above_splits(p.inputs[0]))
    return out


def _axes(v: object) -> list[int]:
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v]
    return [int(v)] if isinstance(v, int) else []


def rebuild_built(g: Graph, bm: BuiltMask) -> Change:
    """Each reading SDPA gets its own mask, built from its own query/key lengths (what
    torch computes at every length it runs); the in-graph construction is removed."""
    triu = bm.triu
    name, line = triu.name, triu.source_line
    for sdpa in bm.readers:
        top = g.unique_blob_name(f"{sdpa.name}_causal_mask")
        g.set_input(sdpa, 3, top)
        b = LengthBuilder(g, top, g.unique_layer_name(f"{sdpa.name}_mask"), sdpa)
        _build(b, sdpa.inputs[0], sdpa.inputs[1], bm.value, 3)
    removed = g.remove_dead([x for x in bm.layers if x.graph is g])
    g.toposort()
    g.insert_splits()
    before = f"triu(full({bm.size}, {bm.value:g}), 1) and {len(removed)} layers to the SDPAs"
    after = (f"{bm.value:g} where col > row, by each SDPA's query/key lengths "
             f"({', '.join(r.name for r in bm.readers)})")
    return Change(name, "causal mask built in the graph (torch.full/triu, from pnnx's IR)",
                  before, after, line)


# repair_order 15: after fold-gqa (which rewires the key-length crops), before lower
class CausalMaskPass(Pass, name="causal-mask", tag="causalmask", repair_order=15,
                     summary="a causal mask pnnx folded at the traced length (MemoryData, 0 on/below the "
                             "diagonal, one large negative value above; needs --bin), or built in the "
                             "graph from the input's length (torch.full/triu of a dynamic export; values "
                             "from X.pnnx.param) → the mask built from the reading SDPA's run-time "
                             "query/key lengths"):
    # pnnx's IR: a path (the command's --pnnx, read only when a mask is built in the graph)
    # or the graph `fix` parsed once for the run
    traced: "PnnxGraph | str | os.PathLike | None" = option(
        default=None, flag="--pnnx", metavar="PNNX_PARAM", beside_input=find_pnnx_param,
        help="pnnx's X.pnnx.param (default: next to the input): the fill value and diagonal "
             "of a mask built in the graph")

    @classmethod
    def claims(cls, layer: Layer) -> bool:
        return layer.type in TRIU_TYPES + FULL_TYPES

    @classmethod
    def for_fix(cls, ctx: RepairContext, asked: bool) -> "CausalMaskPass | None":
        return cls(ctx.pnnx) if asked else None

    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        proven = []
        for m in square_constants(g):
            if not sdpa_readers(g, m)[0]:
                result.skipped.append(MatchFailure(m.name, sdpa_readers(g, m)[1], line=m.source_line))
                continue
            try:  # read as an SDPA mask: its values decide (without them: refused)
                proven.append(prove_causal(g, m))
            except PassRefused as exc:
                if m.weights is None or not len(m.weights):
                    raise
                result.skipped.append(MatchFailure(m.name, exc.message.split(": ", 1)[-1],
                                                   line=m.source_line))
        built = []
        trius = [t for t in g if t.type in TRIU_TYPES]
        if trius:
            from paramsurgery.formats.pnnx_param import pnnx_graph

            pnnx = pnnx_graph(self.traced)
            for t in trius:
                try:
                    built.append(prove_built(g, t, pnnx))
                except MatchFailure as exc:
                    at = exc.layer or t.name
                    result.skipped.append(MatchFailure(
                        at, exc.reason if at == t.name else f"(the mask of {t.name}) {exc.reason}",
                        line=exc.line if exc.line is not None else t.source_line))
        for cm in proven:
            result.changes.append(rebuild(g, cm))
        for bm in built:
            result.changes.append(rebuild_built(g, bm))
        if built:  # fix proves these against a reference next to the input by default
            result.data["length_derived"] = [bm.triu.name for bm in built]
        result.modified = bool(proven or built)
        if not proven and not built:
            result.notes.append("no causal mask constant found" + (
                "; no in-graph causal mask proven" if trius else ""))
        return result
