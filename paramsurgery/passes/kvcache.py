"""Add ncnn's native kv cache to every attention layer (`paramsurgery add-kvcache`).

SDPA (src/layer/sdpa.cpp): bottoms `q k v [mask]` become `q k v [mask] past_k past_v`, tops
`out` become `out k_cache v_cache`, and `7=1`; the cache holds k/v after RoPE, concatenated
along the sequence. MultiHeadAttention (src/layer/multiheadattention.cpp,
resolve_bottom_blob_index): the two cache bottoms are appended after every other bottom and
two tops after the output; self-attention appends the new tokens to the cache,
cross-attention (q and k from different bottoms) computes k/v once and reuses the cache.

The cache inputs come from one `Input` layer (ncnn's docs and benchmark LLM params) or one
`Input` per blob (`split_inputs`), placed after the last existing `Input`. Blob names follow
ncnn's docs (`cache_k_in_{i}` / `cache_k_out_{i}`) or ncnn's benchmark LLM params
(`cache_k{i}` / `out_cache_k{i}`); `i` is the layer's ordinal among all attention layers in
file order, so names are stable whatever `only`/`skip` select. A layer that already has a
cache (`7=1`) is left alone, which makes the pass idempotent.

HF's crop of the mask to the key length (`Crop mask k 20="1h"`) is widened to past + current
(`Crop mask k v_cache 20="+(1h,2h)"`: the cache's h is the past length). The past is read
from the *v* cache: ncnn's x86 SDPA keeps the k cache transposed in a buffer its Mat header
does not describe, so a Split of it (which packs a 3-D blob whose c is a multiple of 4)
copies it by the header and corrupts it — measured: the first cached step off by ~2
with 4 kv heads, right with 2; the v cache keeps rows of (head_dim) and survives the copy;
a mask computed from the current q/k in any other way is refused, naming the layer
(`mask_crop`). Token positions
counted from a run-time length (a causal mask `causal-mask` built, RoPE tables `fix`
computed) are rewritten to count from the past (kvcache_positions.py); their Crops of q/k
are then no reason to refuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from paramsurgery.analysis.contracts import arity
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import Pass, PassResult, check_selection
from paramsurgery.passes.options import option
from paramsurgery.passes.kvcache_positions import (check_chains, check_table_counts, key_chains,
                                                   position_chains, table_counts, widen,
                                                   widen_table)
from paramsurgery.patterns.match import InputAncestry, readers_through_splits
from paramsurgery.core.match import Match, MatchFailure, fail, matched

ATTENTION_TYPES = ("SDPA", "MultiHeadAttention")

NAMINGS = {
    # style: (k_in, v_in, k_out, v_out, single input layer name)
    "ncnn-docs": ("cache_k_in_{i}", "cache_v_in_{i}", "cache_k_out_{i}", "cache_v_out_{i}",
                  "kv_cache_in"),
    "ncnn-llm": ("cache_k{i}", "cache_v{i}", "out_cache_k{i}", "out_cache_v{i}", "kv_cache"),
}


HAS_CACHE = "has-cache"  # Match.kind: the layer already has a kv cache (7=1)


@dataclass
class CacheSlot:
    """The cache blobs of one attention layer."""

    layer: str
    index: int
    k_in: str
    v_in: str
    k_out: str
    v_out: str


def cache_slots(g: Graph) -> list[CacheSlot]:
    """The cache blobs of every attention layer that has `7=1`, in file order: the inputs
    above the Splits that share them (a mask Crop reads the past length from the v cache)."""
    slots = []
    for i, layer in enumerate(g.by_type(*ATTENTION_TYPES)):
        if layer.params.get(7, 0) == 1 and len(layer.inputs) >= 2 and len(layer.outputs) >= 3:
            slots.append(CacheSlot(layer.name, i, g.above_splits(layer.inputs[-2]),
                                   g.above_splits(layer.inputs[-1]), layer.outputs[1],
                                   layer.outputs[2]))
    return slots


KEY_LENGTH_CROP = "1h"  # HF's attention_mask[..., :key_states.shape[-2]] as pnnx writes it
PAST_AND_KEY = "+(1h,2h)"  # the same end over the past (the v cache's h) and the new keys


@dataclass
class MaskCrop:
    """HF's crop of an SDPA's mask to its key length (`Crop mask k 20="1h"` on the last
    axis), which a cache must widen to past + current."""

    crop: Layer
    sdpa: Layer


def mask_crop(g: Graph, sdpa: Layer, ancestry: InputAncestry,
              counted: frozenset[int] = frozenset()) -> MaskCrop | None:
    """The Crop of `sdpa`'s mask to its key length, None when the mask needs none (a graph
    input, or built from graph inputs only); PassRefused naming the layer when the mask
    depends on the current key or query length in a way a cache would break. `counted`:
    the Crops of position counts that add-kvcache rewrites to count from the past (what
    they read is not walked)."""
    from paramsurgery.patterns.match import visit_once

    if not sdpa.params.get(5, 0) or len(sdpa.inputs) < 4:
        return None
    q, k = (g.above_splits(b) for b in sdpa.inputs[:2])
    mask = g.above_splits(sdpa.inputs[3])
    prod = g.producer(mask)
    found = None
    if prod is not None and prod.type == "Crop" and len(prod.inputs) == 2 and \
            g.above_splits(prod.inputs[1]) == k:
        ends, axes = prod.params.get(20), prod.params.get(21)
        readers, _ = readers_through_splits(g, mask)
        if ends != KEY_LENGTH_CROP or prod.params.get(19) not in ("0", None) or \
                str(axes) not in ("-1", str(_mask_last_axis(g, prod.inputs[0]))):
            raise PassRefused(f"{prod.name}: the mask of {sdpa.name} is cropped against its "
                              f"keys ({k!r}) by 19={prod.params.get(19)!r} 20={ends!r} "
                              f"21={axes!r}, not HF's crop to the key length on the last axis "
                              f"(20=\"1h\"): with a cache the keys are past + current and "
                              f"add-kvcache has no rule for this crop", line=prod.source_line)
        if any(r.id != sdpa.id for r, _ in readers):
            other = next(r for r, _ in readers if r.id != sdpa.id)
            raise PassRefused(f"{prod.name}: the mask cropped to {sdpa.name}'s key length is "
                              f"also read by {other.type} {other.name!r}; add-kvcache widens "
                              f"it to {sdpa.name}'s past + current keys only",
                              line=prod.source_line)
        found = MaskCrop(prod, sdpa)
        start = [prod.inputs[0]]
    else:
        start = [mask]
    # what else the mask is computed from: the current q or k (their lengths) breaks a cache
    def up(b: str) -> list[str]:
        p = g.producer(b)
        return list(p.inputs) if p is not None and p.id not in counted else []

    above = {blob: g.producer(blob) for blob in visit_once(start, up)}
    for blob in (q, k):
        if blob in above:
            what = "query" if blob == q else "key"
            reader = next((lay for lay in above.values() if lay is not None and lay.type !=
                           "Split" and any(g.above_splits(b) == blob for b in lay.inputs)), None)
            raise PassRefused(f"{sdpa.name}: its mask is computed from its current {what} "
                              f"{blob!r} (read by {reader.name if reader else '?'}), which after "
                              f"add-kvcache holds only the new positions: the mask would not "
                              f"cover the past; feed the mask as an input (the kv form: an "
                              f"additive mask of (T, past + T))", line=sdpa.source_line)
    return found


def _mask_last_axis(g: Graph, blob: str) -> int:
    """The numpy index of the last axis of `blob` (a graph input's rank from its Input
    layer is unknown to ncnn: -1 when not known)."""
    from paramsurgery.analysis.shapes import infer_shapes

    try:
        shape = infer_shapes(g).shape_of(blob)
    except Exception:  # noqa: BLE001 - no shape known: only -1 and 2 (3-D mask) qualify
        shape = None
    return len(shape) - 1 if shape else 2


def widen_mask_crop(g: Graph, mc: MaskCrop, cache: str) -> Change:
    """`Crop mask k 20="1h"` → `Crop mask k cache 20="+(1h,2h)"`: the keys' length is the
    past (the cache's h: the v cache's, see the module doc) plus the new keys."""
    crop = mc.crop
    before = f"{len(crop.inputs)} bottoms, 20={crop.params.get(20)}"
    g.set_inputs(crop, list(crop.inputs) + [cache])
    crop.set(20, PAST_AND_KEY)
    return Change(crop.name, f"mask crop to {mc.sdpa.name}'s key length: past + current "
                             f"(the cache {cache!r} holds the past)", before,
                  f"3 bottoms (+{cache}), 20={PAST_AND_KEY}", crop.source_line)


class AddKVCache(Pass, name="add-kvcache",
                 summary="add ncnn's native kv cache to SDPA / MultiHeadAttention layers (7=1)"):
    naming: str = option(default="ncnn-docs", choices=tuple(NAMINGS),
                         help="cache blob names: cache_k_in_{i}/cache_k_out_{i} (ncnn docs, "
                              "default) or cache_k{i}/out_cache_k{i} (ncnn benchmark LLM "
                              "params, ncnn_llm)")
    split_inputs: bool = option(default=False,
                                help="one Input layer per cache blob instead of one for all")
    # default: the naming's own (kv_cache_in, kv_cache)
    input_name: str | None = option(default=None, help="name of the cache Input layer")
    only: frozenset[str] = option(default=frozenset(), many=True, metavar="NAME",
                                  help="only these attention layers")
    skip: frozenset[str] = option(default=frozenset(), many=True, metavar="NAME",
                                  help="leave these attention layers alone")
    dynamic_gemm: bool = option(default=False, help="Gemm 7=constantM -> 7=0 where A is an "
                                                    "input (dynamic sequence length)")

    def __post_init__(self) -> None:
        if self.naming not in NAMINGS:
            raise PassRefused(f"unknown naming {self.naming!r} (choose from "
                              f"{', '.join(NAMINGS)})")
        # normalised once (the instance is frozen): a list given by the Python API -> a set
        object.__setattr__(self, "only", frozenset(self.only))
        object.__setattr__(self, "skip", frozenset(self.skip))

    # ------------------------------------------------------------------ matching
    def match(self, g: Graph, layer: Layer, ancestry: InputAncestry) -> Match:
        p = layer.params
        if p.get(7, 0) == 1:
            return fail(layer, "already has a kv cache (7=1)", kind=HAS_CACHE)
        if self.only and layer.name not in self.only:
            return fail(layer, "not selected by --only")
        if layer.name in self.skip:
            return fail(layer, "excluded by --skip")
        if len(layer.outputs) != 1:
            return fail(layer, f"has {len(layer.outputs)} tops; an attention layer without "
                               f"cache has exactly 1")
        mask = p.get(5, 0)
        n_in = len(layer.inputs)
        lo, hi, _ = arity(layer.type, p) or (1, 3, 1)  # ncnn's contract table (PS113)
        if layer.type == "SDPA":
            want = lo
            if n_in != want:
                return fail(layer, f"has {n_in} bottoms but 5={mask} means {want} "
                                   f"(q k v{' mask' if mask else ''})")
            q, k, v = layer.inputs[:3]
            dq, dk, dv = ancestry(q), ancestry(k), ancestry(v)
            foreign = (dk | dv) - dq
            if foreign:
                return fail(layer, f"not self-attention: k/v depend on graph input(s) "
                                   f"{', '.join(sorted(foreign))} that q does not; SDPA's cache "
                                   f"appends k/v every step, which is wrong for cross-attention")
            if not (dq & dk):
                return fail(layer, "not self-attention: q and k share no graph input")
            return matched(layer, mode="self")
        # MultiHeadAttention: the bottom count picks the mode (resolve_bottom_blob_index)
        if not lo <= n_in <= hi:
            return fail(layer, f"has {n_in} bottoms, which 5={mask} does not explain")
        mode = "self" if n_in - (1 if mask else 0) == 1 else "cross"
        return matched(layer, mode=mode)

    # ------------------------------------------------------------------ rewrite
    def run(self, g: Graph) -> PassResult:
        attention = g.by_type(*ATTENTION_TYPES)
        result = PassResult(g, False)
        check_selection(attention, self.only | self.skip, "attention",
                        types="SDPA or MultiHeadAttention")
        ancestry = InputAncestry(g)
        k_in_f, v_in_f, k_out_f, v_out_f, _ = NAMINGS[self.naming]
        todo: list[tuple[Layer, int, Match]] = []
        missed: list[Match] = []
        for i, layer in enumerate(attention):
            m = self.match(g, layer, ancestry)
            if m:
                todo.append((layer, i, m))
            else:
                missed.append(m)
                result.skipped.append(MatchFailure(layer.name, m.reason, line=layer.source_line))
        slots: list[CacheSlot] = []
        for layer, i, _m in todo:
            names = [f.format(i=i) for f in (k_in_f, v_in_f, k_out_f, v_out_f)]
            taken = [n for n in names if g.has_blob(n)]
            if taken:
                raise PassRefused(f"cannot name the cache of {layer.name!r}: blob(s) "
                                  f"{', '.join(taken)} already exist (choose another --naming)")
            slots.append(CacheSlot(layer.name, i, *names))
        if not slots:
            if missed and all(m.kind == HAS_CACHE for m in missed):
                result.notes.append("every attention layer already has a kv cache")
            result.data["slots"] = cache_slots(g)
            self._gemm(g, result)
            return result

        chains = position_chains(g)
        if chains:
            check_chains(g, chains)
            left = next((m for m in missed if m.kind != HAS_CACHE), None)
            if left is not None:
                raise PassRefused(f"{left.layer.name}: left without a cache ({left.reason}), but the "
                                  f"token positions counted by {chains[0].crop.name} feed every "
                                  f"layer: they would count from the past for some layers only; "
                                  f"cache every attention layer (no --only/--skip)")
        tables = table_counts(g)
        if tables:
            check_table_counts(g, tables, set())
            left = next((m for m in missed if m.kind != HAS_CACHE), None)
            if left is not None:
                raise PassRefused(f"{left.layer.name}: left without a cache ({left.reason}), but the "
                                  f"token positions counted by {tables[0].crop.name} feed every "
                                  f"layer; cache every attention layer (no --only/--skip)")
        keys = key_chains(g, chains)
        counted = frozenset(c.crop.id for c in chains) | frozenset(t.crop.id for t in tables)
        crops = {layer.id: mask_crop(g, layer, ancestry, counted) for layer, _, _ in todo
                 if layer.type == "SDPA"}
        for slot, (layer, _, m) in zip(slots, todo):
            before_in, before_out = len(layer.inputs), len(layer.outputs)
            g.set_inputs(layer, list(layer.inputs) + [slot.k_in, slot.v_in])
            g.set_outputs(layer, list(layer.outputs) + [slot.k_out, slot.v_out])
            layer.set(7, 1)
            result.changes.append(Change(layer.name, "bottoms/tops", f"{before_in} {before_out}",
                                         f"{before_in + 2} {before_out + 2} (+{slot.k_in} "
                                         f"{slot.v_in} / +{slot.k_out} {slot.v_out}), 7=1",
                                         layer.source_line))
            if m.captures.get("mode") == "cross":
                result.notes.append(f"{layer.name}: cross-attention; ncnn computes k/v on the "
                                    f"first call and reuses the cached k/v afterwards")
        self._add_inputs(g, slots, result)
        by_name = {s.layer: s for s in slots}
        for c in chains:
            slot = by_name.get(keys.get(c.cumsum.id, ""), slots[0])
            result.changes.append(widen(g, c, slot.v_in, c.cumsum.id in keys))
        for t in tables:
            result.changes.append(widen_table(g, t, slots[0].v_in))
        widened = bool(chains or tables)
        for slot, (layer, _, _m) in zip(slots, todo):
            mc = crops.get(layer.id)
            if mc is not None:
                result.changes.append(widen_mask_crop(g, mc, slot.v_in))
                widened = True
        if widened:
            g.toposort()  # the Crop reads the cache Input
            g.insert_splits()  # the v cache is read by the Crop(s) and the SDPA
        self._gemm(g, result)
        result.modified = True
        result.data["slots"] = cache_slots(g)
        return result

    def _add_inputs(self, g: Graph, slots: list[CacheSlot], result: PassResult) -> None:
        blobs = [b for s in slots for b in (s.k_in, s.v_in)]
        inputs = g.by_type("Input")
        after = inputs[-1] if inputs else None
        if self.split_inputs:
            for b in blobs:
                name = g.unique_layer_name(b)
                after = g.add_layer("Input", name, [], [b], after=after) if after is not None \
                    else g.add_layer("Input", name, [], [b])
            result.changes.append(Change("Input", f"added {len(blobs)} Input layers, one per "
                                                  f"cache blob"))
            return
        input_name = self.input_name or NAMINGS[self.naming][4]
        existing = g.find(input_name)
        if existing is not None and existing.type == "Input":
            g.set_outputs(existing, list(existing.outputs) + blobs)
            result.changes.append(Change(existing.name, "tops", len(existing.outputs) - len(blobs),
                                         len(existing.outputs), existing.source_line))
            return
        name = g.unique_layer_name(input_name)
        if after is not None:
            g.add_layer("Input", name, [], blobs, after=after)
        else:
            g.add_layer("Input", name, [], blobs)
        result.changes.append(Change(name, f"added Input with {len(blobs)} cache blobs"))

    def _gemm(self, g: Graph, result: PassResult) -> None:
        if not self.dynamic_gemm:
            return
        for layer in g.by_type("Gemm"):
            m = layer.params.get(7, 0)
            if m and not layer.params.get(4, 0):  # constantM is only a hint when A is an input
                layer.set(7, 0)
                result.changes.append(Change(layer.name, "7 (constantM)", m, 0, layer.source_line))
                result.modified = True
