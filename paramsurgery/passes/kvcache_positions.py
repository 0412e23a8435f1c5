"""Token positions counted from a run-time length, made right under a kv cache.

`causal-mask` and the position tables `fix` computes (RoPE cos/sin) count the tokens of
the call from a blob's h with the chain `LengthBuilder.positions` writes:

    Crop src → (1, h, 1) → Reshape (h, 1) | (1, h) → ×0 +1 → CumulativeSum      1 .. h

Without a cache h is the sequence, so this is `p + 1` for every position p. After
add-kvcache the call holds only the new tokens, which sit at past .. past + T - 1 (past =
the h of a cache input blob — the v cache's: kvcache.py says why not the k cache's), and an
SDPA's keys are past + T long. So:

- the *key* positions of a causal mask (the columns: the chain counting the reading SDPA's
  keys) must count 1 .. past + T: the ones are widened to past + T (`Interp` with size
  expression `+(0w,1h)` over the cache) before the CumulativeSum;
- every other count (the mask's rows, RoPE's positions) must be past + 1 .. past + T: the
  same widened count, cropped to its last T entries (`Crop 19="1h" 20="0w"`).

With an empty cache (the prefill: ncnn's `Mat()`, h = 0) both are the chain's own value.
A chain whose h is not provably the sequence of the call (its source is not the q/k of an
SDPA or the input of a RotaryEmbed, through Splits) is refused naming its Crop.

`lower`'s arange over a run-time extent (pnnx's dynamic export: RoPE positions
`torch.arange(x.shape[1])`) is a table 0, 1, .. cropped to the extent of a blob,
`Crop table ref 19="0" 20="1h" 21="0"`. When `ref` is the tokens of the call (a graph
input — the ids or embeddings — or an SDPA's q/k, a RotaryEmbed's input) the positions are
past .. past + T - 1 under a cache: `Crop table ref cache 19="2h" 20="+(1h,2h)"`. An
arange table cropped to any other blob is refused naming the Crop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paramsurgery.core.changes import Change
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer

WIDEN = "+(0w,1h)"      # the call's T (bottom 0's w) plus the past (bottom 1: the v cache)


@dataclass
class PositionChain:
    """One count of a blob's h: its layers (Crop … CumulativeSum), the counted blob (above
    Splits), whether it is a column (h, 1), and the 1-valued vector it sums."""

    crop: Layer
    reshape: Layer
    cumsum: Layer
    ones: str
    src: str
    column: bool

    @property
    def top(self) -> str:
        return self.cumsum.outputs[0]


def _only_reader(g: Graph, blob: str, layer: Layer) -> bool:
    return [c.id for c, _ in g.consumers(blob)] == [layer.id]


def _scalar_op(layer: Layer | None, op: int, value: float) -> bool:
    if layer is None or layer.type != "BinaryOp" or len(layer.inputs) != 1:
        return False
    b = layer.params.get(2, 0.0)
    return layer.params.get(0, 0) == op and layer.params.get(1, 0) == 1 and \
        isinstance(b, (int, float)) and float(b) == value


def position_chain(g: Graph, cumsum: Layer) -> PositionChain | None:
    """The count `cumsum` ends, None when it is not `LengthBuilder.positions`' chain."""
    if cumsum.type != "CumulativeSum" or len(cumsum.inputs) != 1:
        return None
    ones = g.producer(cumsum.inputs[0])
    if not _scalar_op(ones, 0, 1.0) or not _only_reader(g, cumsum.inputs[0], cumsum):
        return None
    assert ones is not None
    zero = g.producer(ones.inputs[0])
    if not _scalar_op(zero, 2, 0.0) or not _only_reader(g, ones.inputs[0], ones):
        return None
    assert zero is not None
    vec = g.producer(zero.inputs[0])
    if vec is None or vec.type != "Reshape" or not _only_reader(g, zero.inputs[0], zero):
        return None
    shape = (vec.params.get(0, 0), vec.params.get(1, 0))
    axis = cumsum.params.get(0, 0)
    column = shape == (1, -1) and axis == 0
    if not column and not (shape == (-1, 1) and axis == 1):
        return None
    crop = g.producer(vec.inputs[0])
    if crop is None or crop.type != "Crop" or len(crop.inputs) != 1 or \
            not _only_reader(g, vec.inputs[0], vec):
        return None
    span = [crop.params.get(k) for k in (9, 10, 11)]
    if [list(v) if isinstance(v, list) else v for v in span] != [[0, 0], [1, 1], [0, 2]]:
        return None
    return PositionChain(crop, vec, cumsum, cumsum.inputs[0], g.above_splits(crop.inputs[0]),
                         column)


def position_chains(g: Graph) -> list[PositionChain]:
    return [c for c in (position_chain(g, cs) for cs in g.by_type("CumulativeSum")) if c]


def token_blobs(g: Graph) -> set[str]:
    """Blobs whose h is the tokens of the call: every SDPA's q and k and every
    RotaryEmbed's input (above Splits)."""
    out: set[str] = set()
    for layer in g.by_type("SDPA"):
        out.update(g.above_splits(b) for b in layer.inputs[:2])
    for layer in g.by_type("RotaryEmbed"):
        out.add(g.above_splits(layer.inputs[0]))
    return out


def key_chains(g: Graph, chains: list[PositionChain]) -> dict[int, str]:
    """{cumsum id: SDPA name} for the chains that are a causal mask's key positions:
    `(cols - rows) → Clip → × v → [Reshape] →` the mask of SDPAs whose keys `cols` counts
    (the structure `causal-mask` builds)."""
    tops = {c.top: c for c in chains}
    out: dict[int, str] = {}
    for c in chains:
        readers = g.consumers(c.top)
        if len(readers) != 1 or readers[0][1] != 0:
            continue
        sub = readers[0][0]
        if sub.type != "BinaryOp" or sub.params.get(0, 0) != 1 or len(sub.inputs) != 2 or \
                sub.inputs[1] not in tops:
            continue
        blob = sub.outputs[0]
        for want in ("Clip", "BinaryOp", "Reshape"):
            nxt = g.consumers(blob)
            if len(nxt) != 1 or nxt[0][0].type != want:
                break
            blob = nxt[0][0].outputs[0]
        from paramsurgery.patterns.match import readers_through_splits

        sdpas = [r for r, slot in readers_through_splits(g, blob)[0]
                 if r.type == "SDPA" and slot == 3]
        own = [s for s in sdpas if g.above_splits(s.inputs[1]) == c.src]
        if own:
            out[c.cumsum.id] = own[0].name
    return out


def check_chains(g: Graph, chains: list[PositionChain]) -> None:
    """Refuse a count whose h add-kvcache cannot prove is the tokens of the call."""
    tokens = token_blobs(g)
    for c in chains:
        if c.src not in tokens:
            raise PassRefused(f"{c.crop.name}: counts positions from the h of {c.src!r}, which "
                              f"is not an SDPA's query/key or a RotaryEmbed's input: add-kvcache "
                              f"cannot tell it counts the tokens of the call (under a cache they "
                              f"start at the past length); feed the positions as an input",
                              line=c.crop.source_line)


def widen(g: Graph, c: PositionChain, cache: str, keys: bool) -> Change:
    """Rewrite one count for a cache whose past is `cache`'s h: 1 .. past + T (`keys`),
    past + 1 .. past + T otherwise; the count's top keeps its name (its readers stay)."""
    name, top, line = c.cumsum.name, c.top, c.cumsum.source_line
    before = f"1 .. h({c.src})"
    ones = c.ones
    if c.column:  # the widening is along w: count a row
        ones = _add(g, "Reshape", f"{name}_row", [ones], {0: -1, 1: 1}, c.cumsum)
    wide = _add(g, "Interp", f"{name}_past", [ones, cache], {0: 1, 9: WIDEN}, c.cumsum)
    g.remove_layer(c.cumsum)
    if keys:
        _add(g, "CumulativeSum", name, [wide], {0: 1}, None, out=top)
        after = f"1 .. past + h({c.src}) (past: the h of {cache!r})"
    else:
        count = _add(g, "CumulativeSum", name, [wide], {0: 1}, None)
        last = _add(g, "Crop", f"{name}_new", [count, cache],
                    {19: "1h", 20: "0w", 21: "1"}, None, out=None if c.column else top)
        if c.column:
            _add(g, "Reshape", f"{name}_col", [last], {0: 1, 1: -1}, None, out=top)
        after = f"past + 1 .. past + h({c.src}) (past: the h of {cache!r})"
    return Change(name, "token positions under the kv cache" + (" (a causal mask's keys)"
                  if keys else ""), before, after, line)


def _add(g: Graph, type_: str, name: str, ins: list[str], params: dict,
         before: Layer | None, out: str | None = None) -> str:
    blob = out or g.unique_blob_name(name)
    lname = name if g.find(name) is None else g.unique_layer_name(name)
    if before is not None:
        g.add_layer(type_, lname, ins, [blob], params, before=before)
    else:
        g.add_layer(type_, lname, ins, [blob], params)
    return blob


# ============================================================================ arange tables

ARANGE_ENDS = ("1h", "1w")  # lower's arange cropped to the extent of a 2-D / 1-D blob


@dataclass
class TableCount:
    """`Crop table ref 19="0" 20="1X" 21="0"` over a MemoryData holding 0, 1, 2, ..: the
    positions 0 .. X(ref) - 1 (`lower`'s arange over a run-time extent)."""

    crop: Layer
    ref: str  # above Splits
    letter: str


def table_counts(g: Graph) -> list[TableCount]:
    out = []
    for crop in g.by_type("Crop"):
        if len(crop.inputs) != 2 or str(crop.params.get(19)) != "0" or \
                str(crop.params.get(20)) not in ARANGE_ENDS or str(crop.params.get(21)) != "0":
            continue
        table = g.producer(g.above_splits(crop.inputs[0]))
        if table is None or table.type != "MemoryData" or not table.weights or \
                table.params.get(1, 0) or table.params.get(2, 0):
            continue
        values = table.weights[0].array().reshape(-1)
        if values.size < 2:
            continue
        ids = values.view(np.int32) if values.dtype == np.float32 else values
        # float positions, or int32 bit patterns (positions an Embed reads as ids)
        if not (np.array_equal(values, np.arange(values.size, dtype=values.dtype)) or
                np.array_equal(ids, np.arange(values.size, dtype=ids.dtype))):
            continue
        out.append(TableCount(crop, g.above_splits(crop.inputs[1]), str(crop.params.get(20))[1]))
    return out


def check_table_counts(g: Graph, counts: list[TableCount], cache_inputs: set[str]) -> None:
    """Refuse an arange table cropped to a blob whose extent is not the tokens of the call."""
    tokens = token_blobs(g) | {b for b in g.inputs if b not in cache_inputs}
    for c in counts:
        if c.ref not in tokens:
            raise PassRefused(f"{c.crop.name}: counts positions 0 .. {c.letter}({c.ref!r}) - 1, "
                              f"and {c.ref!r} is not a graph input, an SDPA's query/key or a "
                              f"RotaryEmbed's input: add-kvcache cannot tell it counts the "
                              f"tokens of the call (under a cache they start at the past "
                              f"length); feed the positions as an input",
                              line=c.crop.source_line)


def widen_table(g: Graph, c: TableCount, cache: str) -> Change:
    """0 .. T-1 → past .. past + T - 1 (past: the h of `cache`), with two-bottom layers only
    (ncnn's Crop evaluates its expressions against bottoms 0 and 1): the count's width
    widened by the past (`Interp` to `+(0w,1h)`, as `widen` does), the table cropped to it,
    then its last T entries; the readers of the count read those."""
    crop = c.crop
    top, name = crop.outputs[0], crop.name
    out = g.unique_blob_name(f"{top}_past")
    g.replace_uses(top, out)
    row = _add(g, "Reshape", f"{name}_row", [top], {0: -1, 1: 1}, None)
    wide = _add(g, "Interp", f"{name}_wide", [row, cache], {0: 1, 9: WIDEN}, None)
    count = _add(g, "Crop", f"{name}_all", [crop.inputs[0], wide],
                 {19: "0", 20: "1w", 21: "0"}, None)
    _add(g, "Crop", f"{name}_new", [count, cache], {19: "1h", 20: "0w", 21: "0"}, None, out=out)
    return Change(name, "token positions under the kv cache (an arange table)",
                  f"0 .. {c.letter}({c.ref}) - 1",
                  f"past .. past + {c.letter}({c.ref}) - 1 (past: the h of {cache!r})",
                  crop.source_line)
