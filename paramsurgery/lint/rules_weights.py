"""PS2xx: weights. With `--bin` the `.bin` is cut into per-layer blobs with the weight
schemas of `paramsurgery.formats.weights` (exact byte accounting); `weight_data_size` checks need
only the `.param`."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property
from typing import TYPE_CHECKING

from paramsurgery.core.errors import BinLayoutError
from paramsurgery.lint.registry import ERROR, WARNING, Hit, rule
from paramsurgery.lint.rules_layers import _int

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph
    from paramsurgery.ir.layer import Layer
    from paramsurgery.lint.context import LintContext


class _BinCheck:
    """One `attach_weights` of the lint's `--bin` on a copy of the graph (the caller's graph
    is not touched)."""

    def __init__(self, ctx: LintContext) -> None:
        self.ctx = ctx
        self.error: BinLayoutError | None = None
        self.graph: Graph | None = None
        self.trailing = 0
        self.size = 0

    @cached_property
    def done(self) -> _BinCheck:
        from paramsurgery.formats.weights import attach_weights

        g = self.ctx.graph.copy()
        try:
            attach_weights(g, self.ctx.bin, allow_trailing=True)
        except BinLayoutError as exc:
            self.error = exc
            return self
        except OSError as exc:
            self.error = BinLayoutError(f"cannot read the weights: {exc.strerror or exc}",
                                        file=self.ctx.bin)
            return self
        self.graph = g
        wf = g.weights
        self.size = getattr(wf, "size", 0)
        self.trailing = self.size - getattr(wf, "consumed", self.size)
        return self


def _bin(ctx: LintContext) -> _BinCheck:
    b = ctx.extra.get("bin_check")
    if b is None:
        b = ctx.extra["bin_check"] = _BinCheck(ctx)
    return b.done


@rule("PS201", "bin-layout", ERROR, "the .bin does not match what the .param makes ncnn read",
      needs=("bin",))
def bin_layout(ctx: LintContext) -> Iterator[Hit]:
    """The `.bin` is cut layer by layer with the weight schema of each layer type (the
    reads of its `load_model`, checked read for read against the ncnn wheel): a file that
    ends early ("ModelBin read … failed", ncnn's `load_model` returns -1), a tag ncnn does
    not know (the data would be read as a 256-entry lookup table), or params that make a
    weight empty are reported at the first layer where the bytes stop adding up."""
    b = _bin(ctx)
    if b.error is None:
        return
    exc = b.error
    layer = None
    if exc.line is not None:
        for cand in ctx.layers:
            if cand.source_line == exc.line:
                layer = cand
                break
    yield Hit(layer, exc.message, line=exc.line if layer is None else None)


@rule("PS202", "bin-trailing-bytes", WARNING, "bytes left in the .bin after the last weight",
      needs=("bin",))
def bin_trailing(ctx: LintContext) -> Iterator[Hit]:
    """ncnn ignores bytes after the last weight it reads, so the graph loads; but with
    `opt.use_mapped_model_loading` the consumed size must equal the file size, and extra
    bytes usually mean the `.param` lost a weighted layer or a weight size shrank."""
    b = _bin(ctx)
    if b.error is None and b.trailing > 0:
        yield Hit(None, f"{b.trailing} bytes left in {ctx.bin} after the last weight (of "
                        f"{b.size}): ncnn ignores them, mapped loading rejects them", line=2)


@rule("PS204", "no-weight-schema", WARNING,
      "a layer of a type without a weight schema before weighted layers", needs=("bin",))
def no_weight_schema(ctx: LintContext) -> Iterator[Hit]:
    """A `.bin` has no index: it can only be cut by knowing how many bytes each layer reads.
    Layers of types paramsurgery has no schema for (custom layers, converter leftovers) are
    taken to read nothing; when weighted layers follow, their offsets depend on that
    assumption. Register a schema (`paramsurgery.formats.weights.register_schema`) for custom
    types that have weights."""
    b = _bin(ctx)
    g = b.graph
    if g is None:
        return
    pending: list = []
    for layer in g:
        lw = layer.weights
        if lw is None:
            continue
        if getattr(lw, "assumed", False):
            pending.append(layer)
        elif len(lw) and pending:
            for p in pending:
                yield Hit(ctx.graph.layer(p.id), f"{p.type} {p.name!r} has no weight schema "
                                                 f"and was taken to read nothing from the .bin; "
                                                 f"the offsets of the weighted layers after it "
                                                 f"(first {layer.name!r}) rely on that")
            pending = []


# --------------------------------------------------------------------------- weight sizes

_CONV_KERNEL = {  # type -> kernel param ids (w, h, d) and group param id (None: no groups)
    "Convolution": ((1, 11), None), "ConvolutionDepthWise": ((1, 11), 7),
    "Convolution1D": ((1,), None), "ConvolutionDepthWise1D": ((1,), 7),
    "Convolution3D": ((1, 11, 21), None), "ConvolutionDepthWise3D": ((1, 11, 21), 7),
    "Deconvolution": ((1, 11), None), "DeconvolutionDepthWise": ((1, 11), 7),
    "Deconvolution1D": ((1,), None), "DeconvolutionDepthWise1D": ((1,), 7),
    "Deconvolution3D": ((1, 11, 21), None), "DeconvolutionDepthWise3D": ((1, 11, 21), 7),
}
_DYNAMIC_WEIGHT = {"Deconvolution": 28, "Deconvolution1D": 28, "DeconvolutionDepthWise": 28,
                   "DeconvolutionDepthWise1D": 28}
# layers whose output has the channel count of their first input

def _kernel(layer: Layer, ids: tuple[int, ...]) -> int:
    kw = _int(layer, 1, 0)
    k = kw
    if len(ids) > 1:
        k *= _int(layer, 11, kw)
    if len(ids) > 2:
        k *= _int(layer, 21, kw)
    return k


def _in_channels(ctx: LintContext, layer: Layer) -> tuple[int, Layer] | None:
    """The channel count of `layer`'s first input and the layer that set it, from the
    shared static shape analysis (computed once per lint); None when unknown."""
    if not layer.inputs:
        return None
    shapes = ctx.shapes
    blob = layer.inputs[0]
    c = shapes.channels(blob)
    if c is None or c <= 0:
        return None
    src = shapes.channel_origin.get(blob)
    return (c, ctx.graph.layer(src)) if src is not None else None


@rule("PS203", "weight-data-size", ERROR,
      "weight_data_size disagrees with the kernel dims / table size")
def weight_data_size(ctx: LintContext) -> Iterator[Hit]:
    """`weight_data_size` (param 6 of convolutions, 2 of InnerProduct and
    MultiHeadAttention, 3 of Embed) is how many weights `load_model` reads; the layer's
    forward indexes them with its other params:

    - Convolution*/Deconvolution*: `num_output × in_channels/group × kernel` — a size that
      is not a multiple of `num_output × kernel` is rejected by the wheel's load_param, and
      when the input's channel count is known from a conv-like producer the size must match
      it exactly;
    - Embed: exactly `num_output × input_dim` (rows are read by id);
    - InnerProduct: a positive multiple of num_output; MultiHeadAttention: a multiple of
      embed_dim.

    A mismatch shifts every later weight in the `.bin` or reads past the table."""
    g = ctx.graph
    for t, (kids, gid) in _CONV_KERNEL.items():
        for layer in g.by_type(t):
            if _int(layer, _DYNAMIC_WEIGHT.get(t, 19), 0):
                continue
            n, wds = _int(layer, 0, 0), _int(layer, 6, 0)
            maxk = _kernel(layer, kids)
            per = n * maxk
            if per <= 0 or wds <= 0:
                yield Hit(layer, f"{t} {layer.name!r} has num_output={n}, kernel {maxk}, "
                                 f"weight_data_size={wds}: ncnn's load_param rejects it")
                continue
            if wds % per:
                yield Hit(layer, f"{t} {layer.name!r} weight_data_size {wds} is not a multiple "
                                 f"of num_output × kernel = {n} × {maxk}")
                continue
            group = _int(layer, gid, 1) if gid is not None else 1
            known = _in_channels(ctx, layer)
            if known is None or group <= 0:
                continue
            cin, src = known
            if cin % group:
                continue
            want = n * (cin // group) * maxk
            if t.startswith("Deconvolution") and gid is not None:
                want = (n // group) * cin * maxk if n % group == 0 else want
            if wds != want:
                yield Hit(layer, f"{t} {layer.name!r} weight_data_size {wds} disagrees with its "
                                 f"input: {src.type} {src.name!r} gives {cin} channels, so "
                                 f"num_output {n} × {cin}/{group} × kernel {maxk} = {want}")
    for layer in g.by_type("Embed"):
        n, dim, wds = _int(layer, 0, 0), _int(layer, 1, 0), _int(layer, 3, 0)
        if wds != n * dim:
            yield Hit(layer, f"Embed {layer.name!r} weight_data_size {wds} != num_output × "
                             f"input_dim = {n} × {dim}")
    for layer in g.by_type("InnerProduct"):
        n, wds = _int(layer, 0, 0), _int(layer, 2, 0)
        if n <= 0 or wds <= 0 or wds % n:
            yield Hit(layer, f"InnerProduct {layer.name!r} weight_data_size {wds} is not a "
                             f"positive multiple of num_output {n}")
    for layer in g.by_type("MultiHeadAttention"):
        e, wds = _int(layer, 0, 0), _int(layer, 2, 0)
        if e <= 0 or wds <= 0 or wds % e:
            yield Hit(layer, f"MultiHeadAttention {layer.name!r} weight_data_size {wds} is not "
                             f"a positive multiple of embed_dim {e}")
