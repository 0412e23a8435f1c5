"""The one Split canonicaliser: after a rewrite, each blob read by several layers gets exactly
one `Split` with a top per reader (ncnn needs it in light mode), and Splits left with one
reader, none, or feeding other Splits are dissolved."""

from __future__ import annotations

from typing import Iterable

from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer


def resplit(g: Graph, blobs: Iterable[str], outputs_before: Iterable[str] = ()) -> None:
    """Canonical Splits below each of `blobs` (a source: a blob some non-Split layer writes,
    or a graph input). A Split top that was a graph output before the edit
    (`outputs_before`) stays one; tops the edit left unread go."""
    keep = set(outputs_before)
    for source in dict.fromkeys(blobs):
        if g.producer(source) is None and source not in g.inputs:
            continue
        producer = g.producer(source)
        if producer is not None and producer.type == "Split":
            continue  # not a source: its own source is canonicalised instead
        leaves: list[tuple[Layer, int]] = []
        splits: list[Layer] = []
        work = [source]
        while work:  # down through Split copies
            blob = work.pop()
            for layer, slot in g.consumers(blob):
                if layer.type == "Split":
                    splits.append(layer)
                    work.extend(layer.outputs)
                else:
                    leaves.append((layer, slot))
        kept_outputs = [t for s in splits for t in s.outputs if t in keep and not g.consumers(t)]
        for s in splits:
            g.remove_layer(s)
        for layer, slot in leaves:
            g.set_input(layer, slot, source)
        readers = list(dict.fromkeys(layer.id for layer, _ in leaves))
        slot_of = {lid: i for i, lid in enumerate(readers)}
        if len(readers) + len(kept_outputs) < 2:
            continue
        anchor = g.producer(source)
        split = g.add_layer("Split", g.unique_layer_name(f"splitncnn_{source}"), [source], [],
                            None, after=anchor)
        tops: list[str] = []
        for i in range(len(readers)):
            top = g.unique_blob_name(f"{source}_splitncnn_{i}")
            while top in tops:
                top = g.unique_blob_name(top + "_")
            tops.append(top)
        g.set_outputs(split, tops + kept_outputs)
        for (layer, slot) in leaves:
            g.set_input(layer, slot, tops[slot_of[layer.id]])
