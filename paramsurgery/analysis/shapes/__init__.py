"""Shapes: every blob's shape on any ncnn graph, as one shared analysis.

`infer_shapes(g, inputshape)` (also `paramsurgery.infer_shapes`) combines the user's input shapes,
the static rules (`static.py`, linear, computed once), the file's `-23330` hints and, when
asked, ncnn itself as the oracle (`oracle.py`: runs in a child process at a few values of
each symbol, fits affine forms). Shapes are in the numpy order of the array fed to
`ncnn.Mat`: ncnn's (w, h, c) is `[c, h, w]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from paramsurgery.analysis.shapes.affine import Affine, Dim, MaybeDim, parse_dim
from paramsurgery.analysis.shapes.shapemap import ShapeMap
from paramsurgery.analysis.shapes.spec import (InputShapes, inputshape_from_args,
                                               parse_inputshape)

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable

    from paramsurgery.ir.graph import Graph

__all__ = [
    "Affine",
    "Dim",
    "InputShapes",
    "MaybeDim",
    "ShapeMap",
    "infer_shapes",
    "inputshape_from_args",
    "parse_dim",
    "parse_inputshape",
]


def infer_shapes(g: Graph, inputshape: Mapping[str, tuple] | str | list[str] | None = None,
                 *, oracle: bool = False, bin: str | os.PathLike | None = None,
                 use_hints: bool = True, values: Mapping[str, list[int]] | None = None,
                 timeout: float = 600.0, layers: "Iterable[int] | None" = None) -> ShapeMap:
    """Every blob's shape. `inputshape`: `{"in0": ("T", 1024)}` (strings are parsed) or
    `--inputshape` specs. `oracle=True` runs ncnn (weights from `bin`, zeros otherwise)
    and returns its shapes, fitted as affine forms in the symbols, cross-checked against
    the static ones (disagreements are listed in `notes`). `layers` (static only): the
    shapes of just these layers' tops, computed from their ancestors alone (a neighbourhood
    of a large graph: `view --around`)."""
    from paramsurgery.core.collector import paused_gc
    from paramsurgery.analysis.shapes.static import ancestors, propagate

    shapes = normalize_inputshape(inputshape)
    if layers is not None and oracle:
        raise ValueError("infer_shapes: layers= is for the static analysis (the oracle runs "
                         "the whole graph)")
    with paused_gc():  # one object per blob and param: keep the collector out (linear time)
        # a neighbourhood late in a long chain has most of the graph as ancestors: past a
        # third, the walk would cost more than it saves
        only = ancestors(g, layers, limit=len(g) // 3) if layers is not None else None
        if only is None:
            # the whole graph's static shapes: one analysis per edit version and input
            # shapes, shared by every pass, lint rule and command that asks (the result is
            # read-only for callers)
            key = f"shapes:{use_hints}:{sorted((k, repr(v)) for k, v in shapes.items())!r}"
            static = g.analysis(key, lambda gr: propagate(gr, shapes, use_hints=use_hints))
        else:
            static = propagate(g, shapes, use_hints=use_hints, only=only)
    if not oracle:
        return static
    from paramsurgery.analysis.shapes.oracle import oracle_shapes

    return oracle_shapes(g, shapes, static=static, bin=bin, values=values, timeout=timeout)


def normalize_inputshape(inputshape: Mapping[str, tuple] | str | list[str] | None) \
        -> InputShapes:
    if inputshape is None:
        return {}
    if isinstance(inputshape, (str, list)):
        return parse_inputshape(inputshape)
    out: InputShapes = {}
    for k, v in inputshape.items():
        out[k] = tuple(parse_dim(d) if isinstance(d, str) else d for d in v)
    return out
