"""Structural invariants of an ncnn graph (ncnn-format.md §1.2, §9). One linear pass over the
layers; each finding says what ncnn would do with the graph.

Codes are shared with `paramsurgery lint` (PS1xx = graph structure)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .findings import ERROR, INFO, WARNING, Finding

if TYPE_CHECKING:
    from .graph import Graph

HEADER_LAYERS = "PS101"
HEADER_BLOBS = "PS102"
DUPLICATE_TOP = "PS103"
DANGLING_BOTTOM = "PS104"
ORDER = "PS105"
FANOUT_WITHOUT_SPLIT = "PS106"
TRIVIAL_SPLIT = "PS107"
INPUT_WITH_BOTTOMS = "PS108"
EMPTY_GRAPH = "PS109"
IGNORED_LINES = "PS110"


def validate_graph(g: "Graph") -> list[Finding]:
    out: list[Finding] = []
    src = g.source
    layers = g.layers
    if not layers:
        out.append(Finding(EMPTY_GRAPH, ERROR, "the graph has no layers: ncnn rejects "
                           "layer_count <= 0"))
        return out

    def f(code: str, sev: str, msg: str, layer=None, fix: str | None = None) -> None:  # noqa: ANN001
        out.append(Finding(code, sev, msg, layer.name if layer is not None else None,
                           layer.source_line if layer is not None else None,
                           layer.source_file if layer is not None else None, fix))

    # ---- header (only meaningful for the file as read: a changed graph gets new counts)
    if not g.modified and src.declared_layers is not None:
        n = len(layers)
        if src.declared_layers < n:
            ignored = layers[src.declared_layers:]
            names = ", ".join(repr(x.name) for x in ignored[:3])
            f(HEADER_LAYERS, WARNING,
              f"header declares {src.declared_layers} layers but the file has {n}: ncnn "
              f"silently ignores the last {n - src.declared_layers} ({names})", ignored[0],
              "paramsurgery fmt (recomputes the header)")
        elif src.declared_layers > n:
            f(HEADER_LAYERS, ERROR,
              f"header declares {src.declared_layers} layers but the file has only {n}: ncnn "
              f"fails with 'parse layer_type failed'", None, "paramsurgery fmt")
        if src.declared_blobs is not None:
            loaded = layers[: src.declared_layers]
            used: set[str] = set()
            for layer in loaded:
                used.update(layer._inputs)
                used.update(layer._outputs)
            if src.declared_blobs < len(used):
                f(HEADER_BLOBS, ERROR,
                  f"header declares {src.declared_blobs} blobs but the layers ncnn loads use "
                  f"{len(used)}: ncnn fails with 'too many blobs'", None, "paramsurgery fmt")
    if src.ignored_lines:
        out.append(Finding(IGNORED_LINES, WARNING,
                           f"{src.ignored_lines} unparsable line(s) after the declared layers "
                           f"are ignored by ncnn", file=src.path))

    # ---- blobs: producers, order, readers
    produced_at: dict[str, int] = {}
    first_producer: dict[str, object] = {}
    readers: dict[str, list] = {}
    for i, layer in enumerate(layers):
        if layer._type == "Input" and layer._inputs:
            f(INPUT_WITH_BOTTOMS, ERROR, f"Input layer {layer.name!r} has bottoms "
              f"({', '.join(layer._inputs)}): ncnn never feeds them", layer)
        seen_here: set[str] = set()
        for b in layer._inputs:
            if b in seen_here:
                continue  # one layer reading a blob twice is fine
            seen_here.add(b)
            lst = readers.get(b)
            if lst is None:
                readers[b] = [(i, layer)]
            else:
                lst.append((i, layer))
        for b in layer._outputs:
            if b in produced_at:
                f(DUPLICATE_TOP, ERROR,
                  f"blob {b!r} is written by {first_producer[b].name!r} and again by "
                  f"{layer.name!r}: ncnn resolves the name to the first writer", layer)
            else:
                produced_at[b] = i
                first_producer[b] = layer
        if layer._type == "Split" and len(layer._outputs) == 1:
            f(TRIVIAL_SPLIT, INFO, f"Split {layer.name!r} has a single top; it can be removed",
              layer, "Graph.remove_trivial_splits()")

    for b, rs in readers.items():
        p = produced_at.get(b)
        if p is None:
            i, layer = rs[0]
            f(DANGLING_BOTTOM, ERROR,
              f"layer {layer.name!r} reads blob {b!r}, which no layer writes: ncnn loads the "
              f"graph and crashes at run time ('invalid layer index -1')", layer)
            continue
        for i, layer in rs:
            if i <= p and layer is not first_producer[b]:
                f(ORDER, ERROR,
                  f"layer {layer.name!r} reads blob {b!r} before {first_producer[b].name!r} "
                  f"writes it (layers must be in topological order)", layer,
                  "Graph.toposort()")
            elif layer is first_producer[b]:
                f(ORDER, ERROR, f"layer {layer.name!r} reads its own top {b!r} (a cycle)", layer)
        if len(rs) > 1:
            names = ", ".join(repr(x.name) for _, x in rs[:4])
            f(FANOUT_WITHOUT_SPLIT, ERROR,
              f"blob {b!r} is read by {len(rs)} layers ({names}) without a Split: ncnn's "
              f"light mode frees it after the first read and the second reader crashes",
              rs[1][1], "Graph.insert_splits()")
    return out
