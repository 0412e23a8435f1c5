"""Which blob of the reference graph holds the same tensor as a blob of the target graph
(ncnn vs ncnn), for graphs that differ by an edit or a pass.

In order of trust:
1. `name`: the same blob name, produced in both graphs;
2. `structure`: a layer of the same name and type in both, tops paired by slot (a pass
   renamed the blob but kept the layer);
3. `dataflow`: a layer of the same type reading the paired images of this layer's
   bottoms, in the same order (a pass renamed both);
4. `split`: a Split's top is a copy of its bottom, so it pairs with the bottom's image
   (a pass added or removed a consumer and with it a Split).
Blobs nothing pins down stay unmatched; a pass that removed a layer removes its blob.
"""

from __future__ import annotations

from paramsurgery.ir.graph import Graph


def match_graphs(target: Graph, reference: Graph,
                 different: frozenset[str] = frozenset()) -> dict[str, tuple[str, str]]:
    """target blob → (reference blob, how), for every target blob with a counterpart.
    `different`: target blobs known to hold other values than the reference's blob of the
    same name (inputs a pass repacked): never paired, so nothing downstream pairs through
    them either."""
    ref_produced = {b for layer in reference for b in layer.outputs}
    taken: set[str] = set()
    out: dict[str, tuple[str, str]] = {}

    def pair(blob: str, ref_blob: str, how: str) -> None:
        out[blob] = (ref_blob, how)
        taken.add(ref_blob)

    for layer in target:
        for b in layer.outputs:
            if b in ref_produced and b not in different:
                pair(b, b, "name")
    by_flow: dict[tuple[str, tuple[str, ...]], list] = {}
    for layer in reference:
        by_flow.setdefault((layer.type, layer.inputs), []).append(layer)
    for layer in target:
        todo = [i for i, b in enumerate(layer.outputs) if b not in out and b not in different]
        if not todo:
            continue
        twin = reference.find(layer.name)
        how = "structure"
        if twin is None or twin.type != layer.type or len(twin.outputs) != len(layer.outputs):
            twin, how = None, "dataflow"
            images = tuple(out.get(b, (None,))[0] for b in layer.inputs)
            if layer.inputs and all(images):
                cands = by_flow.get((layer.type, images), [])  # type: ignore[arg-type]
                twin = next((c for c in cands if len(c.outputs) == len(layer.outputs)
                             and not any(t in taken for t in c.outputs)), None)
        if twin is not None:
            for i in todo:
                if twin.outputs[i] not in taken:
                    pair(layer.outputs[i], twin.outputs[i], how)
            continue
        if layer.type == "Split" and layer.inputs and layer.inputs[0] in out:
            src = out[layer.inputs[0]][0]
            for i in todo:
                out[layer.outputs[i]] = (src, "split")
    return out
