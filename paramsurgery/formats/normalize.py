"""Canonical pnnx layout for a whole graph (what `paramsurgery fmt` writes)."""

from __future__ import annotations

from paramsurgery.ir.graph import Graph


def normalize(g: Graph) -> Graph:
    """Re-render every layer line and param in pnnx's style, drop blank lines and recompute
    the header. Values keep their kind; floats are respelled with pnnx's float_to_string
    (same float32 value)."""
    for layer in g:
        layer.params.normalize()
        layer.origin = None  # pnnx's layout: no blank lines, "\n" line ends
        layer._mark_edited()
    g.source.header = b""
    g.source.trailer = b""
    g.mark_modified()
    return g
