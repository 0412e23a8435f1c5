"""PS3xx: scale hazards (warnings): graphs ncnn loads but handles badly because of their
size. Both checks are one pass over the layers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from paramsurgery.lint.registry import WARNING, Hit, rule

if TYPE_CHECKING:
    from paramsurgery.lint.context import LintContext


@rule("PS301", "deep-graph", WARNING, "dependency chain longer than 30000 layers")
def deep_graph(ctx: "LintContext") -> Iterator[Hit]:
    """ncnn's `forward_layer` recurses into the producer of each bottom before running a
    layer, so extracting an output whose dependency chain is N layers long nests N calls;
    past roughly 30000 the default 8 MB thread stack overflows (SIGSEGV). Computed as the
    longest producer chain in one pass over the layers in file order. Workarounds: extract
    intermediate blobs in order (each extraction recurses only to the last computed blob),
    or run with a larger stack."""
    limit = ctx.options.depth_limit
    depth_of: dict[str, int] = {}
    deepest = 0
    at = None
    for layer in ctx.layers:
        d = 0
        for b in layer._inputs:  # not `.inputs`: no tuple per layer on a 100k-layer pass
            v = depth_of.get(b)
            if v is not None and v > d:
                d = v
        d += 1
        for b in layer._outputs:
            depth_of[b] = d
        if d > deepest:
            deepest, at = d, layer
    if deepest > limit and at is not None:
        yield Hit(at, f"the longest dependency chain is {deepest} layers (ending at "
                      f"{at.type} {at.name!r}): ncnn's recursive forward may overflow the stack "
                      f"past ~{limit}")


@rule("PS302", "many-blobs", WARNING, "more than 20000 blobs (slow load_param)")
def many_blobs(ctx: "LintContext") -> Iterator[Hit]:
    """ncnn's text `load_param` resolves every bottom with `find_blob_index_by_name`, a
    linear scan over the blobs seen so far: loading is quadratic in the blob count and takes
    seconds to minutes past ~20000 blobs. The binary `.param.bin` (ncnn2mem) addresses
    blobs by index and avoids it."""
    n = ctx.graph.blob_count()
    limit = ctx.options.blob_limit
    if n > limit:
        yield Hit(None, f"the graph has {n} blobs: ncnn's text load_param is quadratic in the "
                        f"blob count (use .param.bin for graphs past ~{limit})", line=2)
