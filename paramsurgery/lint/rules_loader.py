"""PS112: ncnn's own loader as a lint rule.

Whatever our reader and the other rules think of a file, ncnn's `Net::load_param` decides
whether it loads. This rule asks it, in a child process (the loader may crash), and turns
each message it prints into a finding on the line it is about, so lint is never silent on
a file ncnn rejects: a Pooling without a kernel, a one-blob layer given two bottoms, a
feature mask given as an array, counts past ncnn's limits, ... (and a crash or hang of
the loader itself)."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Iterator

from paramsurgery.runtime import loader as ncnn_loader
from paramsurgery.lint.registry import ERROR, Hit, rule
from paramsurgery.formats.param_text import dump_bytes

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph
    from paramsurgery.ir.layer import Layer
    from paramsurgery.lint.context import LintContext

_UNKNOWN_TYPE = re.compile(r"layer (.+) not exists or registered")


@rule("PS112", "ncnn-rejects", ERROR, "ncnn's own loader rejects the file")
def ncnn_rejects(ctx: "LintContext") -> Iterator[Hit]:
    """Loads the file with ncnn's `Net::load_param` in a child process and reports every
    message it prints, on the layer it names (`layer load_param 3 p failed` → the 4th layer's
    line), or on the header for header messages. A crash or hang of the loader is reported
    too. This is the oracle for the grammar and for each layer's own `load_param` checks
    (a Pooling without `1=kernel`, a Reduction with axes but no `5=1`, ...): lint is never
    silent where ncnn rejects. Needs the `ncnn` Python module; without it nothing is
    reported, and `--no-run` (no child processes) skips it. When another rule reports an
    error on the same line, that finding stands for this one. Fix: whatever ncnn's message
    says; most have a rule of their own that explains more."""
    if ctx.options.run is False or not ncnn_loader.available():
        return
    g = ctx.graph
    data = _file_bytes(ctx)
    verdict = ncnn_loader.load_verdicts([data], timeout=ctx.options.timeout)[0]
    if not verdict.rejects:
        return
    messages = list(verdict.messages) or [verdict.message]
    if verdict.status in ("crashed", "hung"):
        messages = [verdict.message + (f" (after: {'; '.join(verdict.messages)})"
                                       if verdict.messages else "")]
    # the layer-specific message first: "ParamDict load_param 3 r failed" follows the detail
    layer, line = None, None
    for msg in messages:
        layer = _layer_named_by(g, msg)
        if layer is not None:
            break
    if layer is None:
        line = _header_line(g) if any(ncnn_loader.is_header_message(m) for m in messages) \
            else _last_line(g)
    yield Hit(layer, f"ncnn's loader rejects this file: {'; '.join(messages)}", line=line)


def _file_bytes(ctx: "LintContext") -> bytes:
    """The file as ncnn would read it: the bytes on disk when the graph is unedited."""
    g = ctx.graph
    path = ctx.path
    if path and not g.modified and os.path.isfile(path):
        from paramsurgery.core.fs import read_bytes

        return read_bytes(path)
    if g.source is not None and g.source.format == "param.bin":
        from paramsurgery.formats.param_bin import write_param_bin

        return write_param_bin(g)
    return dump_bytes(g)


def _layer_named_by(g: "Graph", message: str) -> "Layer | None":
    if g.modified:
        return None  # ncnn's indexes are file positions
    idx = ncnn_loader.layer_index_of(message)
    layers = g.layers
    if idx is not None and 0 <= idx < len(layers):
        return layers[idx]
    m = _UNKNOWN_TYPE.search(message)
    if m:
        return next((lay for lay in layers if lay.type == m.group(1)), None)
    return None


def _header_line(g: "Graph") -> int:
    header = g.source.header if g.source is not None else b""
    return max(1, header.rstrip(b"\r\n").count(b"\n") + 1) if header else 1


def _last_line(g: "Graph") -> int | None:
    layers = g.layers
    if layers and layers[-1].source_line:
        return layers[-1].source_line
    return _header_line(g)
