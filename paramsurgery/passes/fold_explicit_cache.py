"""Fold an explicit kv cache into SDPA's native cache (`paramsurgery fold-explicit-cache`).

An exported decoder step often carries its cache by hand: a past-K input concatenated with
the current K along the sequence axis, the result feeding SDPA and leaving the graph as the
"present" K (through a Split). ncnn's SDPA does exactly that internally with `7=1`, without
the copy, and can prefill from an empty cache (a `Concat` with an empty past crashes ncnn).
The rewrite, per SDPA whose k and v both match:

    Input past_k, past_v ... Concat(past_k, k) -> [Split ->] SDPA k, present_k
    ==>  SDPA q k v [mask] past_k past_v -> out present_k present_v   7=1

The present blobs keep their names; a Concat consumed only by SDPA gets new present names
`<past>_out`. The past inputs keep their names too, but not their meaning: they now take
the opaque cache ncnn returned on the previous call (extract type 1; an empty Mat to
prefill), not plain past arrays. The result says so (`contract_changes`, and the caches in
`data["caches"]`), and `paramsurgery.verify.fold` proves the rewrite with that protocol.
"""

from __future__ import annotations

from dataclasses import dataclass

from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.core.match import Match, MatchFailure, fail, matched

SEQ_AXES = (1, -2)  # SDPA k/v are [w=D, h=seq, c=heads]: seq is axis 1 of 3


@dataclass(frozen=True)
class FoldedCache:
    """One folded SDPA's blobs: the past inputs (same names in both graphs), the explicit
    graph's Concat outputs (the plain new pasts), the folded graph's cache outputs and the
    current k/v blobs (SDPA's bottoms 1 and 2 in the folded graph)."""

    past_k: str
    past_v: str
    concat_k: str
    concat_v: str
    present_k: str
    present_v: str
    cur_k: str
    cur_v: str


class FoldExplicitCache(Pass, name="fold-explicit-cache",
                        summary="fold Concat(past, current) k/v caches into SDPA's native kv cache (7=1)"):
    def _side(self, g: Graph, sdpa: Layer, slot: int) -> Match:
        """Match the explicit cache on SDPA bottom `slot` (1 = k, 2 = v)."""
        blob = sdpa.inputs[slot]
        split = None
        prod = g.producer(blob)
        if prod is not None and prod.type == "Split":
            split = prod
            blob = prod.inputs[0]
            prod = g.producer(blob)
        if prod is None or prod.type != "Concat":
            return fail(sdpa, f"bottom {slot} is not a Concat of a past cache and the current "
                              f"value")
        if len(prod.inputs) != 2:
            return fail(sdpa, f"Concat {prod.name!r} has {len(prod.inputs)} bottoms (want past, "
                              f"current)")
        axis = prod.params.get(0, 0)
        if axis not in SEQ_AXES:
            return fail(sdpa, f"Concat {prod.name!r} joins axis {axis}, not the sequence axis "
                              f"(1 or -2 for [D, seq, heads])")
        past, cur = prod.inputs
        src = g.producer(past)
        if src is None or src.type != "Input":
            return fail(sdpa, f"the past side of {prod.name!r} ({past!r}) is not a graph input")
        readers = g.consumer_layers(past)
        if readers != [prod]:
            return fail(sdpa, f"past input {past!r} has other readers")
        presents: list[str] = []
        if split is not None:
            if g.consumer_layers(prod.outputs[0]) != [split]:
                return fail(sdpa, f"Concat {prod.name!r} output has readers besides the Split")
            for b in split.outputs:
                readers = g.consumer_layers(b)
                if readers and readers != [sdpa]:
                    return fail(sdpa, f"present blob {b!r} has readers other than SDPA")
                if not readers:
                    presents.append(b)
        else:
            if g.consumer_layers(prod.outputs[0]) != [sdpa]:
                return fail(sdpa, f"Concat {prod.name!r} output has readers besides SDPA")
        if len(presents) > 1:
            return fail(sdpa, f"the cache leaves the graph {len(presents)} times")
        return matched(sdpa, concat=prod, split=split, past=past, cur=cur,
                       present=presents[0] if presents else None)

    def run(self, g: Graph) -> PassResult:
        sdpas = g.by_type("SDPA")
        if not sdpas:
            raise PassRefused("the graph has no SDPA layer")
        result = PassResult(g, False)
        for sdpa in sdpas:
            if sdpa.params.get(7, 0) == 1:
                result.skipped.append(MatchFailure(sdpa.name, "already has a native kv cache (7=1)",
                                                   line=sdpa.source_line))
                continue
            mk, mv = self._side(g, sdpa, 1), self._side(g, sdpa, 2)
            if not (mk and mv):
                reason = mk.reason if not mk else mv.reason
                result.skipped.append(MatchFailure(sdpa.name, reason, line=sdpa.source_line))
                continue
            self._rewrite(g, sdpa, mk, mv, result)
        return result

    def _rewrite(self, g: Graph, sdpa: Layer, mk: Match, mv: Match, result: PassResult) -> None:
        line = sdpa.source_line
        ins = list(sdpa.inputs)
        presents = []
        for m in (mk, mv):
            present = m["present"]
            for layer in (m["split"], m["concat"]):
                if layer is not None:
                    g.remove_layer(layer)
            presents.append(present or g.unique_blob_name(f"{m['past']}_out"))
        ins[1], ins[2] = mk["cur"], mv["cur"]
        g.set_inputs(sdpa, ins + [mk["past"], mv["past"]])
        g.set_outputs(sdpa, [sdpa.outputs[0]] + presents)
        sdpa.set(7, 1)
        result.data.setdefault("caches", []).append(FoldedCache(
            mk["past"], mv["past"], mk["concat"].outputs[0], mv["concat"].outputs[0],
            presents[0], presents[1], mk["cur"], mv["cur"]).__dict__)
        result.contract_changes.append(
            f"inputs {mk['past']!r}, {mv['past']!r} now take the opaque cache ncnn returned "
            f"on the previous call (extract({presents[0]!r}, 1), extract({presents[1]!r}, 1); "
            f"an empty Mat to prefill), not plain past arrays; outputs {presents[0]!r}, "
            f"{presents[1]!r} are that opaque cache")
        result.changes.append(Change(sdpa.name, "explicit cache folded",
                                     f"Concat({mk['past']}, {mk['cur']}), "
                                     f"Concat({mv['past']}, {mv['cur']})",
                                     f"native cache {mk['past']} {mv['past']} -> "
                                     f"{presents[0]} {presents[1]}, 7=1", line))
        result.modified = True
