"""Blob shapes from ncnn itself: `view --inputshape` runs the graph once through ncnn (a child
process, `lightmode` off so every intermediate blob is kept) at the given input shapes and
labels each wire with the shape ncnn produced, in ncnn's layout (`[c,h,w]`, the batch `n`
leading when it is not 1).

The run is lint's conformance run (same input syntax, batch-axis guessing, weights: the
given `.bin`, or synthetic weights of the right layout up to lint's size limit), fetching
every blob instead of the traced ones.
"""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING

from ..errors import ParamSurgeryError

if TYPE_CHECKING:
    from ..graph import Graph


def ncnn_blob_shapes(graph: "Graph", input_shapes: str, *, bin: str | None = None,
                     timeout: float = 120.0) -> dict[str, str]:
    """Blob name → `[dims]` from one ncnn run at `input_shapes` (pnnx syntax:
    `[1,7,1024]f32,[7]i32`, inputs in in0, in1, ... order)."""
    from ..lint.conformance import Conformance, _in_key, parse_input_shapes
    from ..lint.context import LintContext, LintOptions

    where = graph.source.path
    inputs = sorted(graph.inputs, key=_in_key)
    try:
        specs = parse_input_shapes(input_shapes, inputs)
    except ValueError as exc:
        raise ParamSurgeryError(f"--inputshape: {exc}", file=where) from None
    if len(specs) != len(inputs):
        raise ParamSurgeryError(f"--inputshape gives {len(specs)} shape(s) for {len(inputs)} "
                                f"input(s) ({', '.join(inputs)})", file=where)
    try:
        import ncnn  # noqa: F401
    except ImportError:
        raise ParamSurgeryError("--inputshape needs the ncnn Python package", file=where) \
            from None
    ctx = LintContext(graph, bin=bin, input_shapes=specs,
                      options=LintOptions(run=True, timeout=timeout))
    conf = Conformance(ctx)
    why = conf.loadable()
    if why:
        raise ParamSurgeryError(f"--inputshape: ncnn cannot load the graph: {why}", file=where)
    fetch = [b for b in graph.blob_names() if graph.producer(b) is not None]
    with tempfile.TemporaryDirectory(prefix="paramsurgery-view-") as tmp:
        weights, why = conf._weights(tmp)
        if why:
            raise ParamSurgeryError(f"--inputshape: {why}", file=where)
        run = conf._run(conf._param_source(tmp), weights, "given", specs, fetch)
    if not run.ok:
        raise ParamSurgeryError(f"--inputshape: ncnn did not run the graph at "
                                f"{run.describe_inputs()}: {run.message}", file=where)
    return {b: "[" + ",".join(map(str, s)) + "]" for b, s in run.shapes.items()}
