"""Static shape propagation: one pass over the layers in file order (ncnn requires it to be
topological), one rule per layer type (`rules.py`), no recursion, no rescans. Sources:
`--inputshape` (any blob, Input or not), the Input layers' own params / `-23330` hints,
and `-23330` hints as a fallback and a cross-check for the layers no rule covers."""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping

from paramsurgery.ir.graph import Graph
from paramsurgery.analysis.shapes.hints import read_hints, set_hint
from paramsurgery.analysis.shapes.rules import infer_layer
from paramsurgery.analysis.shapes.shapemap import Shape, ShapeMap


def propagate(g: Graph, inputshape: Mapping[str, Shape] | None = None, *,
              use_hints: bool = True, stale: "set[int] | None" = None,
              only: "Container[int] | None" = None) -> ShapeMap:
    """Shapes of every blob of `g` the static rules can tell. `inputshape` fixes blobs
    (usually the Input tops) and overrides what the Input layers say; `-23330` hints are
    used where no rule answers and cross-checked where one does (disagreements are noted),
    but only while the inputs are the ones the hints were written for. `stale`: ids of
    layers whose hints must not be trusted (a pass changed them or what they read).
    `only`: ids of the layers to compute (closed under producers, see `ancestors`: the
    shapes of their tops are exactly those of the whole-graph run); others are skipped."""
    given = dict(inputshape or {})
    result = ShapeMap()
    shapes, source, origin = result.shapes, result.source, result.channel_origin
    hints_valid = use_hints
    # hints describe the run at the Input layers' own shapes: an override makes them stale
    if given and use_hints:
        for layer in g.by_type("Input"):
            own = read_hints(layer)
            for blob, hinted in zip(layer.outputs, own or ()):
                if blob in given and hinted is not None and tuple(given[blob]) != hinted:
                    hints_valid = False
    for layer in g:
        if only is not None and layer.id not in only:
            continue
        ins = [shapes.get(b) for b in layer._inputs]
        outs = infer_layer(layer, ins)
        own_hints = read_hints(layer) if use_hints and (stale is None or layer.id not in stale) \
            else None
        tops = layer._outputs
        for slot, blob in enumerate(tops):
            if blob in given:
                shapes[blob] = tuple(given[blob])
                source[blob] = "input"
                origin[blob] = layer.id
                continue
            s = outs[slot] if outs is not None and slot < len(outs) else None
            h = own_hints[slot] if own_hints is not None and slot < len(own_hints) else None
            if layer._type == "Input" and h is not None and hints_valid:
                s = h
            if s is not None:
                if h is not None and hints_valid and _disagree(s, h):
                    result.hint_conflicts.append((layer.id, blob, h, s))
                    result.notes.append(f"{layer.name}: the -23330 hint of {blob!r} says "
                                        f"{ShapeMap.format_shape(h)}, the static rules "
                                        f"{ShapeMap.format_shape(s)}")
                shapes[blob] = s
                source[blob] = "input" if layer._type == "Input" else "static"
            elif h is not None and hints_valid:
                shapes[blob] = h
                source[blob] = "hint"
            else:
                continue
            src0 = ins[0] if ins else None
            s = shapes[blob]
            if src0 is not None and len(src0) == len(s) and s and src0[0] == s[0] \
                    and s[0] is not None and layer._inputs[0] in origin:
                origin[blob] = origin[layer._inputs[0]]
            else:
                origin[blob] = layer.id
    return result


def _disagree(a: Shape, b: Shape) -> bool:
    if len(a) != len(b):
        return True
    return any(x is not None and y is not None and x != y for x, y in zip(a, b))


def ancestors(g: Graph, layer_ids: Iterable[int], limit: int | None = None) -> set[int] | None:
    """`layer_ids` and every layer they read from, transitively (iteratively: one visit per
    layer, no recursion): what the shapes of these layers' tops depend on. None once more
    than `limit` layers are reached (computing the whole graph then costs about as much)."""
    producers, layers = g._producers, g._layers
    seen = set(layer_ids)
    todo = list(seen)
    while todo:
        for blob in layers[todo.pop()]._inputs:
            p = producers.get(blob)
            if p and p[0][0] not in seen:
                seen.add(p[0][0])
                todo.append(p[0][0])
        if limit is not None and len(seen) > limit:
            return None
    return seen


def refresh_after(g, before: dict[int, str]) -> list[str]:
    """After an edit: every layer that changed (or is new), and every layer downstream of
    one, gets its `-23330` hint recomputed from the static rules, or removed when its
    shape is no longer known. Returns the names of the layers whose hint changed."""
    dirty: set[int] = set()
    work: list[int] = []
    for layer in g:
        if before.get(layer.id) != layer.render():
            dirty.add(layer.id)
            work.append(layer.id)
    consumers = g._consumers
    while work:
        layer = g.layer(work.pop())
        for b in layer.outputs:
            for c, _ in consumers.get(b, ()):
                if c not in dirty:
                    dirty.add(c)
                    work.append(c)
    if not dirty:
        return []
    shapes = propagate(g, stale=dirty)
    changed = []
    for lid in dirty:
        layer = g.layer(lid)
        if read_hints(layer) is None or layer.type == "Input":
            continue
        if set_hint(layer, [shapes.known(b) for b in layer.outputs]):
            changed.append(layer.name)
    return changed
