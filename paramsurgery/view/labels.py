"""What a picture says about a layer and a blob: the box text (type, name, the params that
differ from ncnn's defaults, weight bytes and dtype) and the shape of each blob when it is
known (the shapes analysis, `paramsurgery.analysis.shapes`, then pnnx's traced shapes from the
`X.pnnx.param` beside the graph)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from paramsurgery.core.layer_params import param_default, param_info
from paramsurgery.core.layer_types import is_converter_leftover, is_ncnn_layer

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph
    from paramsurgery.ir.layer import Layer
    from paramsurgery.analysis.shapes import ShapeMap

SHAPE_HINTS = 30  # the generic `-23330=` param: top shape hints (net.cpp)
MAX_LINE = 40  # characters of a box line; the full text is in the tooltip
PARAM_LINES = 2  # box lines for the params


def layer_kind(layer_type: str) -> str:
    """css class of a layer box: io, leftover (pnnx could not convert the op), unknown
    (not an ncnn type: a custom layer) or plain."""
    if layer_type == "Input":
        return "io"
    if is_converter_leftover(layer_type):
        return "leftover"
    if not is_ncnn_layer(layer_type):
        return "unknown"
    return "plain"


_ROWS: dict[tuple[str, str], tuple[tuple[int, str | None, str, bool], ...]] = {}


def param_rows(layer: "Layer") -> tuple[tuple[int, str | None, str, bool], ...]:
    """(id, name or None when no table knows it, value text, is ncnn's default) of every
    param, in id order; computed once per distinct (type, param line) of a drawing."""
    key = (layer.type, " ".join(layer.params.tokens()))
    rows = _ROWS.get(key)
    if rows is None:
        out = []
        for pid, value in sorted(layer.params.items()):
            info = param_info(layer.type, pid)
            default = info is not None and _same(value, param_default(layer.type, pid,
                                                                      layer.params))
            out.append((pid, info.name if info else None, _fmt(value), default))
        rows = tuple(out)
        if len(_ROWS) > 4096:
            _ROWS.clear()
        _ROWS[key] = rows
    return rows


def key_params(layer: "Layer") -> str:
    """`name=value` for every param that is not ncnn's default (shape hints left out), in
    id order."""
    return " ".join(f"{pid if name is None else name}={text}"
                    for pid, name, text, default in param_rows(layer)
                    if pid != SHAPE_HINTS and not default)


def weight_text(layer: "Layer") -> str:
    """`fp16 1.2 MB` for a layer with weights loaded; '' without."""
    lw = layer.weights
    if lw is None or not len(lw):
        return ""
    dtypes = sorted({w.dtype for w in lw})
    return f"{'/'.join(dtypes)} {human_bytes(lw.nbytes)}"


def layer_info(layer: "Layer", shapes: dict[str, str] | None = None) -> dict:
    """Everything the side panel shows of a layer, in full: type, name, each bottom and top
    with its shape, every param (id, name, value, whether it is ncnn's default), weights and
    the file line."""
    shapes = shapes or {}
    params = [[pid, name if name is not None else ("shape hints" if pid == SHAPE_HINTS
                                                   else ""), text, int(default)]
              for pid, name, text, default in param_rows(layer)]
    out: dict = {"type": layer.type, "name": layer.name,
                 "in": [[b, shapes.get(b, "")] for b in layer.inputs],
                 "out": [[b, shapes.get(b, "")] for b in layer.outputs], "params": params}
    if layer.weights is not None and len(layer.weights):
        out["weights"] = [f"{w.role} {w.dtype} {tuple(w.shape)} {w.nbytes} B"
                          for w in layer.weights]
    if layer.source_line is not None:
        out["line"] = layer.source_line
    return out


def layer_lines(layer: "Layer") -> tuple[list[str], list[str], str]:
    """The box lines, their css classes (type, name, params, weights) and the tooltip."""
    params = wrap(key_params(layer), PARAM_LINES)
    lines = [layer.type, layer.name, *params]
    classes = ["type", "name"] + ["params"] * len(params)
    wt = weight_text(layer)
    if wt:
        lines.append(wt)
        classes.append("weights")
    title = f"{layer.type} {layer.name}\n{' '.join(layer.inputs)} -> {' '.join(layer.outputs)}"
    toks = " ".join(layer.params.tokens())
    if toks:
        title += f"\n{toks}"
    if wt:
        title += "\nweights: " + ", ".join(f"{w.role} {w.dtype} {tuple(w.shape)} {w.nbytes} B"
                                           for w in layer.weights)
    if layer.source_line is not None:
        title += f"\nline {layer.source_line}"
    return lines, classes, title


def blob_shapes(graph: "Graph", pnnx_param: str | None = None, *,
                analysis: "ShapeMap | None" = None) -> dict[str, str]:
    """Blob name → shape text: `[c,h,w]` (ncnn's dims, numpy order of the Mat, symbols such
    as `T` kept) from the shapes analysis (`analysis`, default: the static one, from the
    Input layers' params, `-23330=` hints and the per-layer rules), then pnnx's traced torch
    shapes `(1,?,64)` for the blobs it leaves unknown (`pnnx_param`, default: the
    `.pnnx.param` beside the graph file, if any)."""
    from paramsurgery.analysis.shapes import infer_shapes
    from paramsurgery.analysis.shapes.affine import dim_str

    sm = analysis if analysis is not None else infer_shapes(graph)
    shapes = {blob: "[" + ",".join(dim_str(d) for d in shape) + "]"
              for blob, shape in sm.shapes.items()
              if shape is not None and any(d is not None for d in shape)}
    path = pnnx_param
    if path is None and graph.source.path:
        from paramsurgery.formats.pnnx_param import find_pnnx_param

        path = find_pnnx_param(graph.source.path)
    if path and os.path.isfile(path):
        from paramsurgery.formats.pnnx_param import read_pnnx_param
        from paramsurgery.lint.conformance import map_blobs

        try:
            traced = read_pnnx_param(path)
        except Exception:  # noqa: BLE001 - a broken companion file only costs the labels
            return shapes
        for blob, operand in map_blobs(graph, traced).items():
            if operand.shape is not None and blob not in shapes:
                shapes[blob] = operand.shape_text()
    return shapes


def human_bytes(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def wrap(text: str, lines: int, n: int = MAX_LINE) -> list[str]:
    """Words of `text` in at most `lines` lines of about `n` characters. No word is cut:
    a word longer than a line gets a line of its own, and the words that do not fit are
    counted at the end (`+3 more: click`), the side panel showing them all."""
    words = [_summarise(w, n) for w in text.split()]
    out: list[str] = []
    cur = ""
    for i, word in enumerate(words):
        if cur and len(cur) + 1 + len(word) > n:
            if len(out) == lines - 1:
                rest = len(words) - i
                out.append(f"{cur} +{rest} more: click")
                return out
            out.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    if cur:
        out.append(cur)
    return out


def _summarise(word: str, n: int) -> str:
    """A `name=v,v,...` word longer than a line as `name=[K values]` (its values are in the
    side panel and the tooltip)."""
    key, eq, val = word.partition("=")
    if len(word) <= n or not eq or "," not in val:
        return word
    return f"{key}=[{val.count(',') + 1} values]"


def clip(text: str, n: int = MAX_LINE) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _same(a: object, b: object) -> bool:
    if b is None:
        return False
    if isinstance(a, float) or isinstance(b, float):
        try:
            return float(a) == float(b)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
    return a == b


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_fmt(v) for v in value)
    return str(value)
