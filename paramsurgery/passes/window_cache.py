"""A sliding-window attention cache of fixed size (`paramsurgery add-window-cache --window W`).

For attention over a sliding window of W keys (a streaming codec's transformer: Qwen3-TTS's
12 Hz codec decoder, window 72), a constant-cost stream needs each step to see exactly the
last W-1 keys/values before its own. ncnn's native SDPA kv cache (`add-kvcache`, 7=1) cannot
do that: in ncnn 1.0.20261020 it is a Mat with spare capacity that SDPA grows in place, in a
backend-private layout, so a cache the host crops to the window comes back wrong or NaN at
the next step (measured on the tiny Qwen3-TTS codec: rel 0.02 to NaN); it only grows, and
attention cost grows with it.

This pass instead makes every SDPA (q, k, v, mask; no native cache) read

    Concat(window_k_in_i, k) / Concat(window_v_in_i, v)     (axis 1: the rows)

where `window_{k,v}_in_i` are new graph inputs of shape (heads, W-1, head_dim) (plain Mats;
the keys as the SDPA reads them, i.e. already rotated), and the concatenations are exposed
as outputs `window_{k,v}_out_i` of (heads, W-1+T, head_dim) rows. The host's contract
(printed as a contract change): feed W-1 rows of zeros before the stream starts, keep the
last W-1 rows of each `window_*_out_i` as the next step's `window_*_in_i`, and give a mask of
(T, W-1+T) columns that hides the cache rows before the stream start and the rows older
than the window. A `Crop` of the mask to the key length (HF's `mask[..., :kv]`, a 2-input
reference crop reading the current keys) is re-pointed at the concatenated keys. Every
input of the result has a shape set by the step length alone.

Refused, naming the layer: a window below 2, an SDPA that is not (q, k, v, mask) or that
already carries a native cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from paramsurgery.core.changes import Change
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.passes.options import option


@dataclass
class WindowSlot:
    """One SDPA's window cache: its inputs, outputs and the blobs the concatenations
    append (the step's own keys / values)."""

    sdpa: str
    k_in: str
    v_in: str
    k_out: str
    v_out: str
    k_src: str = ""
    v_src: str = ""


def add_window_cache(g: Graph, window: int) -> list[WindowSlot]:
    """Rewrite `g` in place (see the module docstring); the slots in SDPA order."""
    if window < 2:
        raise PassRefused(f"window {window}: a window cache needs window >= 2")
    slots: list[WindowSlot] = []
    inputs = g.by_type("Input")
    after = inputs[-1] if inputs else None
    for i, sdpa in enumerate(g.by_type("SDPA")):
        if len(sdpa.inputs) != 4 or sdpa.params.get(7, 0) != 0:
            raise PassRefused(f"{sdpa.name}: expected q, k, v, mask and no kv cache "
                              f"({len(sdpa.inputs)} bottoms, 7={sdpa.params.get(7, 0)})",
                              line=sdpa.source_line)
        slot = WindowSlot(sdpa.name, f"window_k_in_{i}", f"window_v_in_{i}",
                          f"window_k_out_{i}", f"window_v_out_{i}")
        k, mask = sdpa.inputs[1], sdpa.inputs[3]
        # the mask crop reads the current keys above the Split the SDPA's k comes from
        k_top = g.above_splits(k)
        for blob_in, blob_out, slot_index in ((slot.k_in, slot.k_out, 1),
                                              (slot.v_in, slot.v_out, 2)):
            name = g.unique_layer_name(blob_in)
            after = g.add_layer("Input", name, [], [blob_in], after=after)
            src = sdpa.inputs[slot_index]
            if slot_index == 1:
                slot.k_src = src
            else:
                slot.v_src = src
            g.add_layer("Concat", g.unique_layer_name(f"window_concat_{blob_out}"),
                        [blob_in, src], [blob_out], {0: 1}, before=sdpa)
            g.set_input(sdpa, slot_index, blob_out)
        crop = g.producer(mask)
        if crop is not None and crop.type == "Crop" and len(crop.inputs) == 2 \
                and g.above_splits(crop.inputs[1]) == k_top:
            g.set_input(crop, 1, slot.k_out)
            _drop_unread_split_top(g, k_top)
        slots.append(slot)
    g.toposort()
    g.insert_splits()
    for slot in slots:     # what each Concat appends now (a Split top may have been dropped)
        slot.k_src = g.producer(slot.k_out).inputs[1]   # type: ignore[union-attr]
        slot.v_src = g.producer(slot.v_out).inputs[1]   # type: ignore[union-attr]
    return slots


def _drop_unread_split_top(g: Graph, blob: str) -> None:
    """The crop no longer reads the current keys: the Split of `blob` loses that top (and
    goes when one is left), so no unread blob is left behind."""
    split = next((c for c, _ in g.consumers(blob) if c.type == "Split"), None)
    if split is None:
        return
    tops = [b for b in split.outputs if g.consumers(b)]
    if len(tops) < len(split.outputs):
        g.set_outputs(split, tops)
        g.remove_trivial_splits()


class AddWindowCache(Pass, name="add-window-cache", tag="wincache",
                     summary="a fixed-size sliding-window cache on every SDPA (Concat of "
                             "window-1 past rows before k and v, read out): constant work per "
                             "stream step"):
    window: int = option(help="the attention window W (keys a query sees, itself included): "
                              "the cache holds W-1 rows", required=True, metavar="W")

    def run(self, g: Graph) -> PassResult:
        window = self.window
        result = PassResult(g, False)
        # what each SDPA read before (its line, k, v), for the report
        sdpas = {s.name: (s.source_line, s.inputs[1], s.inputs[2]) for s in g.by_type("SDPA")}
        if not sdpas:
            result.notes.append("no SDPA layer")
            return result
        slots = add_window_cache(g, window)
        for s in slots:
            line, k, v = sdpas[s.sdpa]
            result.changes.append(Change(s.sdpa, f"window cache of {window - 1} rows",
                                         f"k {k}, v {v}", f"k {s.k_out}, v {s.v_out}", line))
        result.modified = True
        result.data["slots"] = slots
        result.contract_changes.append(
            f"inputs window_{{k,v}}_in_i: (heads, {window - 1}, head_dim), zeros before "
            f"the stream starts; outputs window_{{k,v}}_out_i: keep their last "
            f"{window - 1} rows as the next step's inputs; the mask has "
            f"{window - 1} + T columns (cache rows before the start and older than the "
            f"window hidden)")
        return result
