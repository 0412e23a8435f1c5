"""Structural invariants of an ncnn graph (ncnn-format.md §1.2, §9). One linear pass over the
layers; each finding says what ncnn would do with the graph.

Codes are shared with `paramsurgery lint` (PS1xx = graph structure)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from paramsurgery.core.collector import paused_gc
from paramsurgery.core.findings import ERROR, INFO, WARNING, Finding

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph

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
# a layer's run-time contract (paramsurgery.analysis.contracts): bottoms/tops, params
LAYER_ARITY = "PS113"
PARAM_CONSISTENCY = "PS114"


def validate(g: "Graph") -> list[Finding]:
    """Every structural invariant ncnn relies on. Computed once per edit version (lint reuses
    the result of an earlier call)."""
    def compute(graph: "Graph") -> tuple[tuple, list[Finding]]:
        with paused_gc():
            return _source_counts(graph), validate_graph(graph)

    counts, findings = g.analysis("validate", compute)
    if counts != _source_counts(g):  # the header facts changed without an edit
        g._analyses.pop("validate", None)
        counts, findings = g.analysis("validate", compute)
    return list(findings)


def _source_counts(g: "Graph") -> tuple:
    src = g.source
    return id(src), src.declared_layers, src.declared_blobs, src.ignored_lines


def validate_graph(g: "Graph") -> list[Finding]:
    out: list[Finding] = []
    src = g.source
    if not len(g):
        out.append(Finding(EMPTY_GRAPH, ERROR, "the graph has no layers: ncnn rejects "
                           "layer_count <= 0"))
        return out

    def f(code: str, sev: str, msg: str, layer=None, fix: str | None = None) -> None:
        out.append(Finding(code, sev, msg, layer.name if layer is not None else None,
                           layer.source_line if layer is not None else None,
                           layer.source_file if layer is not None else None, fix))

    # ---- header (only meaningful for the file as read: a changed graph gets new counts)
    if not g.modified and src.declared_layers is not None:
        n = len(g)
        if src.declared_layers < n:
            ignored = g.layers[src.declared_layers:]
            names = ", ".join(repr(x.name) for x in ignored[:3])
            f(HEADER_LAYERS, WARNING,
              f"header declares {src.declared_layers} layers but the file has {n}: ncnn "
              f"silently ignores the last {n - src.declared_layers} ({names})", ignored[0],
              "raise the header's layer count by hand if they are meant to load (fmt keeps "
              "what ncnn reads)")
        elif src.declared_layers > n:
            f(HEADER_LAYERS, ERROR,
              f"header declares {src.declared_layers} layers but the file has only {n}: ncnn "
              f"fails with 'parse layer_type failed'", None, "paramsurgery fmt")
        if src.declared_blobs is not None:
            if src.declared_layers >= n:
                n_used = g.blob_count()  # ncnn loads every layer: the graph's own count
            else:  # only the declared layers are loaded: count their blobs as ncnn does
                from paramsurgery.ir.graph import count_ncnn_blobs

                n_used = count_ncnn_blobs(g.layers[: src.declared_layers])
            if src.declared_blobs < n_used:
                f(HEADER_BLOBS, ERROR,
                  f"header declares {src.declared_blobs} blobs but the layers ncnn loads use "
                  f"{n_used}: ncnn fails with 'too many blobs'", None, "paramsurgery fmt")
    if src.ignored_lines:
        out.append(Finding(IGNORED_LINES, WARNING,
                           f"{src.ignored_lines} unparsable line(s) after the declared layers "
                           f"are ignored by ncnn", file=src.path))

    # ---- blobs, from the graph's indexes (one pass over blobs, no rescans)
    layer_of = g._layers
    pos = g._key  # order keys increase along the file order
    producers = g._producers
    for layer in g.by_type("Input"):
        if layer._inputs:
            f(INPUT_WITH_BOTTOMS, ERROR, f"Input layer {layer.name!r} has bottoms "
              f"({', '.join(layer._inputs)}): ncnn never feeds them", layer)
    for layer in g.by_type("Split"):
        if len(layer._outputs) == 1:
            f(TRIVIAL_SPLIT, INFO, f"Split {layer.name!r} has a single top; it can be removed",
              layer, "Graph.remove_trivial_splits()")
    for b, prods in producers.items():
        if len(prods) > 1:
            first = layer_of[min(prods, key=lambda p: pos[p[0]])[0]]
            for lid, _ in sorted(prods, key=lambda p: pos[p[0]])[1:]:
                f(DUPLICATE_TOP, ERROR,
                  f"blob {b!r} is written by {first.name!r} and again by "
                  f"{layer_of[lid].name!r}: ncnn resolves the name to the first writer",
                  layer_of[lid])
    in_order = g._ids_in_order  # then ids compare like positions: skip the lookups
    for b, cons in g._consumers.items():
        prods = producers.get(b) or []
        if len(cons) == 1 and len(prods) == 1 and \
                (cons[0][0] > prods[0][0] if in_order else pos[cons[0][0]] > pos[prods[0][0]]):
            continue  # the common case: one writer, one reader, in order
        if not prods:
            layer = layer_of[min(cons, key=lambda c: pos[c[0]])[0]]
            f(DANGLING_BOTTOM, ERROR,
              f"layer {layer.name!r} reads blob {b!r}, which no layer writes: ncnn loads the "
              f"graph and crashes at run time ('invalid layer index -1')", layer)
            continue
        p_lid = min(prods, key=lambda p: pos[p[0]])[0] if len(prods) > 1 else prods[0][0]
        p_pos = pos[p_lid]
        readers = {lid for lid, _ in cons}
        for lid in sorted(readers, key=pos.__getitem__):
            if lid == p_lid:
                f(ORDER, ERROR, f"layer {layer_of[lid].name!r} reads its own top {b!r} (a cycle)",
                  layer_of[lid])
            elif pos[lid] < p_pos:
                f(ORDER, ERROR,
                  f"layer {layer_of[lid].name!r} reads blob {b!r} before "
                  f"{layer_of[p_lid].name!r} writes it (layers must be in topological order)",
                  layer_of[lid], "Graph.toposort()")
        if len(readers) > 1:
            ordered = sorted(readers, key=pos.__getitem__)
            names = ", ".join(repr(layer_of[x].name) for x in ordered[:4])
            f(FANOUT_WITHOUT_SPLIT, ERROR,
              f"blob {b!r} is read by {len(readers)} layers ({names}) without a Split: ncnn's "
              f"light mode frees it after the first read and the second reader crashes",
              layer_of[ordered[1]], "Graph.insert_splits()")
    # ---- each layer's run-time contract (the table set-param, insert and the passes read)
    from paramsurgery.analysis.contracts import contract_findings

    out.extend(contract_findings(g))
    out.sort(key=lambda x: (x.line if x.line is not None else -1))
    return out
