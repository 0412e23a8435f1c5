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

from dataclasses import dataclass

import numpy as np

from paramsurgery.core.match import MatchFailure
from paramsurgery.core.changes import Change
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.patterns.match import readers_through_splits

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
    rows = b.positions(query, "q", True)         # (Tq, 1): i + 1
    cols = b.positions(key, "k", False)          # (1, Tk): j + 1
    diff = b.add("BinaryOp", "ahead", [cols, rows], {0: 1})  # (Tq, Tk): j - i
    step = b.add("Clip", "step", [diff], {0: 0.0, 1: 1.0})
    if cm.rank == 2:
        b.add("BinaryOp", "value", [step], {0: 2, 1: 1, 2: cm.value}, out=top)
    else:
        b.to_rank(b.add("BinaryOp", "value", [step], {0: 2, 1: 1, 2: cm.value}), cm.rank)
    b.finish()
    after = f"{cm.value:g} where col > row, by the lengths of {query!r}, {key!r}"
    return Change(name, f"causal mask ({cm.side}×{cm.side}, proven from its values, read by "
                        f"{', '.join(r.name for r in cm.readers)})", before, after, line)


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


class CausalMaskPass(Pass, name="causal-mask", tag="causalmask",
                     summary="a causal mask pnnx folded at the traced length (MemoryData, 0 on/below the "
                             "diagonal, one large negative value above) → the mask built from the reading "
                             "SDPA's run-time query/key lengths (needs --bin)"):
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
        for cm in proven:
            result.changes.append(rebuild(g, cm))
        result.modified = bool(proven)
        if not proven:
            result.notes.append("no causal mask constant found")
        return result
