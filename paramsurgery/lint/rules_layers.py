"""PS0xx: converter and layer problems (pnnx-bugs.md, ncnn-format.md §1.5, §1.8, §4).

Each rule reads only the layers of the types it is about (`Graph.by_type`), so the whole
family is linear in the graph size."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from paramsurgery.core.match import MatchFailure
from paramsurgery.core.ncnn import BinaryOpType, EltwiseOpType
from paramsurgery.core.layer_params import LAYER_PARAMS, param_info
from paramsurgery.core.layer_types import is_converter_leftover, is_ncnn_layer
from paramsurgery.core.values import Kind, is_mixed
from paramsurgery.lint.constructs import explain_leftover
from paramsurgery.lint.registry import ERROR, INFO, WARNING, Hit, rule

from paramsurgery.core.ncnn import NO_BATCH

if TYPE_CHECKING:
    from paramsurgery.ir.layer import Layer
    from paramsurgery.lint.context import LintContext

BATCH = -NO_BATCH  # pnnx's placeholder for "the batch axis" (and ncnn's "auto" size)


def _ints(layer: "Layer", pid: int) -> list[int] | None:
    """An int or int-array param as a list (None when absent or not ints)."""
    v = layer.params.value(pid)
    if v is None:
        return None
    if v.kind in (Kind.INT, Kind.INTS):
        return layer.params.get_ints(pid)
    return None


def _int(layer: "Layer", pid: int, default: int) -> int:
    v = layer.params.value(pid)
    return layer.params.get_int(pid) if v is not None and v.kind is Kind.INT else default


# =========================================================================== Slice

@rule("PS001", "paramless-slice", ERROR, "Slice with neither slices nor indices (SIGSEGV)",
      fix_pass="fix-slice")
def paramless_slice(ctx: "LintContext") -> Iterator[Hit]:
    """A `Slice` needs `0=slices` (`-23300=n,…`) or `2=indices` (`-23302=n,…`). Without
    either (or with an empty array, which ncnn treats as absent) ncnn loads the graph and
    then dereferences a null pointer in `Slice::forward`: SIGSEGV, no error code.

    Older pnnx (before Tencent/ncnn PR #6784) wrote such a Slice for `unbind` / `chunk` /
    `tensor_split` along its inferred batch axis ("… along batch axis is not supported" on
    stderr, then `continue` before writing the params; pnnx-bugs.md case 2e).
    `paramsurgery fix-slice` restores the slices from pnnx's traced shapes."""
    for layer in ctx.graph.by_type("Slice"):
        slices = _ints(layer, 0)
        indices = _ints(layer, 2)
        if not slices and not indices:
            yield Hit(layer, f"Slice {layer.name!r} has no slices or indices: ncnn dereferences "
                             f"a null pointer at run time (SIGSEGV; pnnx wrote it for an "
                             f"`unbind`/`chunk` along its batch axis)")


@rule("PS002", "short-slice", ERROR, "Slice with fewer slices/indices than outputs",
      fix_pass="fix-slice")
def short_slice(ctx: "LintContext") -> Iterator[Hit]:
    """`Slice` reads `slices[i]` for every top (or `indices[i-1]`/`indices[i]` for the
    split points); an array shorter than that makes ncnn read past its end (garbage sizes,
    usually a crash). The number of tops and the array length must agree: `n` slices for
    `n` tops, or at least `n-1` indices."""
    for layer in ctx.graph.by_type("Slice"):
        n = len(layer.outputs)
        indices = _ints(layer, 2)
        slices = _ints(layer, 0)
        if indices:
            if len(indices) < n - 1:
                yield Hit(layer, f"Slice {layer.name!r} has {n} outputs but only "
                                 f"{len(indices)} split indices (needs {n - 1}): ncnn reads "
                                 f"past the end of the array")
        elif slices and len(slices) < n:
            yield Hit(layer, f"Slice {layer.name!r} has {n} outputs but only {len(slices)} "
                             f"slices: ncnn reads past the end of the array")


# =========================================================================== batch axis

@rule("PS003", "batch-axis", ERROR,
      "Slice/Concat/Crop/Reduction along axis -233 (pnnx's batch axis)")
def batch_axis(ctx: "LintContext") -> Iterator[Hit]:
    """pnnx writes `-233` as the axis when the torch op works along the axis it inferred to
    be the batch axis, which ncnn keeps outside the Mat ("… along batch axis … is not
    supported" on pnnx's stderr; pnnx still returns 0):

    - `Slice 1=-233` (`codes[i:i+1]`, `tensor_split` of that axis): ncnn's `load_param`
      fails ("layer load_param … failed"; pnnx-bugs.md case 2b);
    - `Concat 0=-233` (`torch.stack(parts, 0)` over parts that carry the batch axis): ncnn
      outputs an empty Mat, and a `Reduction` on it dies with SIGFPE (case 4;
      `paramsurgery fix-reduction` turns stack+sum into one Eltwise);
    - a `-233` in Reduction axes or Crop axes.

    Fix on the torch side: stack/slice along a non-batch axis (`torch.stack(parts, 1)`,
    keep a leading 1 on int codes)."""
    g = ctx.graph
    for layer in g.by_type("Slice"):
        if _int(layer, 1, 0) == BATCH:
            yield Hit(layer, f"Slice {layer.name!r} slices along axis -233, pnnx's batch "
                             f"axis (torch: `tensor_split`/`x[i:i+1]` along the axis pnnx "
                             f"took as batch): ncnn's load_param rejects it",
                      fix="paramsurgery fix-slice", fix_pass="fix-slice")
    for layer in g.by_type("Concat"):
        if _int(layer, 0, 0) == BATCH:
            readers = ctx.through_splits(layer.outputs[0]) if layer.outputs else []
            reduced = any(r.type == "Reduction" for r in readers)
            msg = (f"Concat {layer.name!r} concatenates along axis -233, pnnx's batch axis "
                   f"(torch: `torch.stack(parts, 0)` over parts that carry it): ncnn outputs "
                   f"an empty Mat")
            if reduced:
                msg += " and the Reduction reading it dies with SIGFPE (stack + sum)"
            yield Hit(layer, msg, fix="paramsurgery fix-reduction" if reduced else None,
                      fix_pass="fix-reduction" if reduced else None)
    for layer in g.by_type("Reduction"):
        axes = _ints(layer, 3) or []
        if BATCH in axes:
            yield Hit(layer, f"Reduction {layer.name!r} reduces axis -233 (pnnx's batch "
                             f"axis): ncnn has no such axis", fix="paramsurgery fix-reduction",
                      fix_pass="fix-reduction")
    for layer in g.by_type("Crop"):
        axes = _ints(layer, 11) or []
        if BATCH in axes:
            yield Hit(layer, f"Crop {layer.name!r} crops axis -233 (pnnx's batch axis): ncnn "
                             f"has no such axis")


# =========================================================================== leftovers

@rule("PS004", "not-ncnn-layer", ERROR,
      "a layer type pnnx could not convert (pnnx.*, Tensor.*, torch.*, F.*, nn.*, aten::*, prim::*)")
def not_ncnn_layer(ctx: "LintContext") -> Iterator[Hit]:
    """pnnx writes a torch op it has no ncnn conversion for under its torch name and still
    returns 0 (it only prints "ignore <type> <name> param …" on stderr). ncnn's
    `load_param` then fails with "layer <type> not exists or registered" and the Net is
    unusable (an extractor on it segfaults).

    The message names the torch construct that usually leaves each type (pnnx-bugs.md):
    `pnnx.Expression` + `Tensor.expand` ← HF `repeat_kv` under a dynamic length
    (`paramsurgery fold-gqa`); `torch.unbind` ← unbind on pnnx's batch axis;
    `F.scaled_dot_product_attention` ← `is_causal=True`; `Tensor.slice`/`Tensor.slice_copy`
    ← interleaved M-RoPE slicing; `F.pad` ← shape-derived or replicate padding;
    `torch.arange`/`torch.full`/`aten::triu` ← masks built from the dynamic length; …"""
    from paramsurgery.patterns.claims import repair_for

    for t in ctx.graph.types():
        if is_ncnn_layer(t) or not is_converter_leftover(t):
            continue
        for layer in ctx.graph.by_type(t):
            c = explain_leftover(ctx, layer)
            msg = (f"{layer.type} {layer.name!r} is not an ncnn layer: ncnn fails to load the "
                   f"graph ('layer {layer.type} not exists or registered')")
            fix_pass = None
            if c is not None:
                msg += f"; usually from {c.construct}; workaround: {c.workaround}"
                fix_pass = c.fix_pass
            if fix_pass is None:
                fix_pass = repair_for(layer.type)  # the pass that rewrites it (lower, ...)
            yield Hit(layer, msg, fix=f"paramsurgery {fix_pass}" if fix_pass else None,
                      fix_pass=fix_pass)


@rule("PS005", "unknown-layer-type", ERROR, "a layer type ncnn does not have (custom layer)")
def unknown_layer_type(ctx: "LintContext") -> Iterator[Hit]:
    """A type that is neither one of ncnn's 110 built-in layers nor a converter leftover:
    a custom layer. ncnn loads the graph only if the application registers the type first
    (`Net.register_custom_layer`); otherwise `load_param` fails with "layer <type> not
    exists or registered". `--ignore PS005` when your application registers it."""
    for t in ctx.graph.types():
        if is_ncnn_layer(t) or is_converter_leftover(t):
            continue
        for layer in ctx.graph.by_type(t):
            yield Hit(layer, f"{layer.type} {layer.name!r} is not an ncnn layer type: ncnn "
                             f"loads the graph only if the application registers it "
                             f"(register_custom_layer)")


# =========================================================================== Reduction

@rule("PS006", "empty-reduction", ERROR,
      "Reduction with reduce_all=0 and no axes (reduces nothing)", fix_pass="fix-reduction")
def empty_reduction(ctx: "LintContext") -> Iterator[Hit]:
    """`Reduction 1=0` (reduce_all off) with an absent or empty axes array (`-23303=0`):
    on a 2-D..4-D input ncnn reduces nothing (the output is the elementwise op times
    `coeff`, i.e. the identity for SUM), on a 1-D input it reduces everything. Never what
    the model meant.

    pnnx writes it when it drops a reduction over its inferred batch axis
    (`pass_ncnn/torch_sum.cpp` "drop batch index"): `torch.stack(parts, 0).sum(0)`,
    `F.embedding(ids(K, T)).sum(0)`, `(ids + offsets[:, None])` embeddings summed over
    levels (pnnx-bugs.md cases 4, 6b). Fed by `Concat 0=-233` it dies with SIGFPE.
    `paramsurgery fix-reduction` rewrites stack+sum into an Eltwise, or bypasses a
    reduction that pnnx's traced shapes prove is over a size-1 axis."""
    g = ctx.graph
    for layer in g.by_type("Reduction"):
        if _int(layer, 1, 1) != 0:
            continue
        if _ints(layer, 3):
            continue
        msg = (f"Reduction {layer.name!r} has reduce_all=0 and no axes: ncnn reduces nothing "
               f"on a 2-D..4-D input (everything on 1-D); pnnx dropped a reduction over its "
               f"batch axis (torch: `.sum(0)`/`.mean(0)` over stacked parts or embeddings)")
        src = ctx.source_of(layer.inputs[0]) if layer.inputs else None
        if src is not None and src.type == "Concat" and _int(src, 0, 0) == BATCH:
            msg += (f"; its input is Concat {src.name!r} 0=-233 (`torch.stack(parts, 0)"
                    f".sum(0)`): SIGFPE at run time")
        yield Hit(layer, msg)


# =========================================================================== int ids

# layers that move ids around without computing on them
_ID_PRESERVING = frozenset(("Split", "Reshape", "Permute", "Crop", "Slice", "Squeeze",
                            "ExpandDims", "Flatten", "Concat", "Tile", "Noop", "Flip",
                            "CopyTo", "DeepCopy", "Padding", "Packing"))
# layers that compute in float
_FLOAT_MATH = frozenset(("BinaryOp", "UnaryOp", "Clip", "Eltwise", "Scale", "Bias", "Power",
                         "Exp", "Log", "AbsVal", "Reduction", "Threshold", "ReLU", "Sigmoid",
                         "TanH", "CumulativeSum", "Cast"))



def _describe_math(layer: "Layer") -> str:
    if layer.type == "BinaryOp":
        code = _int(layer, 0, 0)
        op = BinaryOpType(code).name.lower() if code in BinaryOpType._value2member_map_ else "op"
        if _int(layer, 1, 0):
            b = layer.params.get(2, 0.0)
            return f"{op} {b}"
        return op
    if layer.type == "Clip":
        return f"clamp({layer.params.get(0, '-FLT_MAX')}, {layer.params.get(1, 'FLT_MAX')})"
    return layer.type


@rule("PS007", "float-math-on-ids", ERROR,
      "float arithmetic (BinaryOp, Clip, UnaryOp, Eltwise, …) on the int ids an Embed reads")
def float_math_on_ids(ctx: "LintContext") -> Iterator[Hit]:
    """`Embed` reads its input as int32 bit patterns. ncnn has no integer BinaryOp, Clip,
    UnaryOp or Eltwise: they compute in float on those bits, so `ids + 5` (`BinaryOp 0=0
    1=1 2=5.0`), `ids.clamp(0, V-1)` (`Clip`), `ids + offsets[:, None]` (MemoryData +
    BinaryOp) give float bit patterns and Embed picks wrong rows (pnnx-bugs.md case 6b,
    max_abs ≈ 3). Reshape/view/flatten/transpose/slicing are fine (they move bits).

    Found by walking back from every Embed's input through layers that only move data
    (Split, Reshape, Permute, Crop, Slice, Concat, …); each blob is visited once.
    Workaround: do the index arithmetic on the host (pre-offset the ids and concatenate
    the tables into one Embed), or use one Embedding per codebook."""
    from paramsurgery.patterns.match import walk_up

    g = ctx.graph
    seen: set[str] = set()
    flagged: set[int] = set()
    for emb in g.by_type("Embed"):
        for _, p in walk_up(g, emb.inputs[:1], _ID_PRESERVING, seen):
            if p is not None and p.type in _FLOAT_MATH and p.id not in flagged:
                flagged.add(p.id)
                yield Hit(p, f"{p.type} {p.name!r} ({_describe_math(p)}) computes in float on "
                             f"the int32 ids that Embed {emb.name!r} reads: the result is float "
                             f"bits and Embed picks wrong rows (torch: `ids + k`, "
                             f"`ids.clamp(...)`, `ids + offsets` before an nn.Embedding); do the "
                             f"index arithmetic on the host")


# =========================================================================== batch n

# layers whose torch counterpart computes along an axis (contracts, reduces, convolves,
# attends): if that axis is the one in ncnn's batch n, ncnn computes per element instead
_ALONG_AXIS = frozenset((
    "MatMul", "Reduction", "Softmax", "SDPA", "MultiHeadAttention", "CumulativeSum", "ArgMax",
    "Einsum", "LSTM", "GRU", "RNN", "MVN", "InstanceNorm", "GroupNorm", "Normalize",
    "Convolution", "Convolution1D", "Convolution3D", "ConvolutionDepthWise",
    "ConvolutionDepthWise1D", "ConvolutionDepthWise3D", "Deconvolution", "Deconvolution1D",
    "Deconvolution3D", "DeconvolutionDepthWise", "DeconvolutionDepthWise1D",
    "DeconvolutionDepthWise3D", "Pooling", "Pooling1D", "Pooling3D", "StatisticsPooling",
    "F.scaled_dot_product_attention", "torch.matmul", "torch.sum", "torch.mean"))


def _mixes_batch(layer: "Layer") -> bool:
    if layer.type == "Gemm":
        return not (_int(layer, 5, 0) or _int(layer, 4, 0))  # both operands are blobs
    return layer.type in _ALONG_AXIS


def _leaves_batch(layer: "Layer") -> bool:
    return layer.type == "Reshape" and _int(layer, 13, NO_BATCH) == NO_BATCH and \
        _int(layer, 12, NO_BATCH) != NO_BATCH


@rule("PS008", "axis-into-batch", WARNING,
      "Reshape moving a tensor axis into ncnn's batch n (12=233, 13!=233)", also=(INFO,))
def axis_into_batch(ctx: "LintContext") -> Iterator[Hit]:
    """pnnx ≥ 2026-07 (Tencent/ncnn PR #6784) can move a real axis into the ncnn Mat's
    batch `n` with `Reshape 12=233 13=k` (input has no batch axis, output axis k is the
    batch). Every later layer then runs once per batch element. That is right for per-row
    work (Embed, InnerProduct, norms, elementwise ops: info) but wrong when a later layer
    was meant to compute across that axis — the 15 codec levels put into `n` and summed by
    a MatMul run once per level (pnnx-bugs.md case 7, qwen3-tts.md §10): a warning when a
    layer that computes along an axis (MatMul, two-input Gemm, Reduction, Softmax,
    SDPA/attention, convolution, pooling, …) reads the batched data before a `Reshape 13=233`
    takes the axis out of `n` again. Either way the caller reads such an output with
    `mat.numpy(batch_index=k)`.

    Check with a run against torch at a length no trace used (PS403 with a reference).
    Torch-side fix: a layout where the grouped axis is not inferred as batch (time-major
    ids, one Embed per codebook)."""
    moves = []
    for layer in ctx.graph.by_type("Reshape"):
        v12, v13 = _int(layer, 12, NO_BATCH), _int(layer, 13, NO_BATCH)
        if v12 == NO_BATCH and v13 != NO_BATCH:
            moves.append((layer, v13))
    if not moves:
        return
    # the first layer computing along an axis that each blob reaches while the data stays in
    # n: one backward pass (layers are in topological order)
    g = ctx.graph
    mixer: dict[str, "Layer | None"] = {}
    for layer in reversed(ctx.layers):
        for b in layer.outputs:
            found = None
            for c in g.consumer_layers(b):
                if _leaves_batch(c):
                    continue
                if _mixes_batch(c):
                    found = c
                else:
                    found = next((mixer.get(o) for o in c.outputs if mixer.get(o)), None)
                if found is not None:
                    break
            mixer[b] = found
    for layer, v13 in moves:
        m = next((mixer.get(b) for b in layer.outputs if mixer.get(b)), None)
        base = (f"Reshape {layer.name!r} moves output axis {v13} into ncnn's batch n "
                f"(12=233 13={v13}): later layers run once per batch element")
        if m is not None:
            yield Hit(layer, f"{base}, and {m.type} {m.name!r} reads that data: if the torch op "
                             f"worked across this axis (a matmul/sum over it), ncnn computes it "
                             f"per element instead")
        else:
            yield Hit(layer, f"{base}; only per-row layers follow (harmless), but the output "
                             f"carries that axis in n: read it with batch_index={v13}",
                      severity=INFO)


@rule("PS009", "batch-reshape-runtime", INFO,
      "Reshape 12/13 (batch axis) needs an ncnn with PR #6784 (2026-07)", default=False)
def batch_reshape_runtime(ctx: "LintContext") -> Iterator[Hit]:
    """`Reshape 12=`/`13=` (input/output batch axis) exist only in ncnn builds with
    Tencent/ncnn PR #6784 (merged 2026-07-01); older runtimes (e.g. 244f30c8 of 2026-06-25,
    pinned by the Qwen3-TTS reference port) reject the params. Reported once per graph.
    Off by default (the ncnn this project targets, 1.0.20261020, has the PR): select it
    when deploying to an older runtime."""
    n = 0
    first = None
    for layer in ctx.graph.by_type("Reshape"):
        if 12 in layer.params or 13 in layer.params:
            n += 1
            first = first or layer
    if first is not None:
        yield Hit(first, f"{n} Reshape layer(s) use 12=/13= (batch axes, first "
                         f"{first.name!r}): they need an ncnn runtime with PR #6784 (2026-07)")


@rule("PS010", "rope-input-rank", WARNING,
      "RotaryEmbed fed straight from a graph input, or SDPA heads left in ncnn's batch axis "
      "(4-D without a batch axis rotates one head)", also=(ERROR,))
def rope_input_rank(ctx: "LintContext") -> Iterator[Hit]:
    """`RotaryEmbed` rotates a 3-D `[w=head_dim, h=seq, c=heads]` blob. When pnnx infers no
    batch axis (no SDPA downstream; every input `batch_index=233`), a torch `(1, H, T, D)`
    input arrives 4-D, and RotaryEmbed handles one "head" and leaves the rest
    uninitialised (pnnx-bugs.md case 6a; wrong, varies run to run). Statically this rule can
    only see that the rotated blob is a graph input; a run (PS405) checks the rank.
    Fix: give the tables as `(1, T, D)` and make sure pnnx infers a batch axis, or write
    RoPE with half tables (not fused)."""
    yield from _heads_in_batch_axis(ctx)
    for layer in ctx.graph.by_type("RotaryEmbed"):
        if not layer.inputs:
            continue
        src = ctx.source_of(layer.inputs[0])
        if src is not None and src.type == "Input":
            yield Hit(layer, f"RotaryEmbed {layer.name!r} rotates graph input "
                             f"{layer.inputs[0]!r} directly: fed 4-D (torch (1, H, T, D) "
                             f"with batch_index=233) it rotates only the first head")


def _heads_in_batch_axis(ctx: "LintContext") -> Iterator[Hit]:
    """pnnx's dynamic export of a fused QKV keeps the heads in ncnn's batch axis
    (`patterns/batch_heads.py`): RotaryEmbed on the 4-D head split rotates one head, and an
    SDPA reading a batched head computes over the wrong axes. An error (`unbatch-heads`
    rewrites them to [D, T, H] when it proves the layout)."""
    from paramsurgery.patterns.batch_heads import plan_heads

    g = ctx.graph
    for sdpa in g.by_type("SDPA"):
        for slot in range(min(3, len(sdpa.inputs))):
            try:
                plan = plan_heads(g, sdpa.inputs[slot], {sdpa.id})
            except MatchFailure as exc:
                yield Hit(sdpa, f"SDPA {sdpa.name!r} reads its {'qkv'[slot]} heads from ncnn's "
                                f"batch axis (pnnx's dynamic export) and the rewrite is not "
                                f"proven: {exc.reason}", severity=ERROR)
                continue
            if plan is not None:
                yield Hit(sdpa, f"SDPA {sdpa.name!r} reads its {'qkv'[slot]} heads "
                                f"({plan.heads} of {plan.head_dim}, {plan.form}) in pnnx's "
                                f"batch-axis form: RotaryEmbed on it rotates one head, SDPA "
                                f"computes over the wrong axes", severity=ERROR,
                          fix_pass="unbatch-heads")


# =========================================================================== params

def _kind_problem(expected: Kind, got: Kind) -> tuple[str, str] | None:
    if expected is got:
        return None
    if expected is Kind.INT and got is Kind.FLOAT:
        return ERROR, "ncnn reads it as an int and silently uses the default instead"
    if expected is Kind.FLOAT and got is Kind.INT:
        return WARNING, ("the ncnn wheel converts it, but ncnn builds with the untyped "
                         "ParamDict read the int bits as a float (2=1 → 1.4e-45); write it "
                         "with a '.'")
    if expected.is_array and not got.is_array:
        return ERROR, "ncnn expects an array here: the layer's load_param fails"
    if not expected.is_array and got.is_array:
        return ERROR, "ncnn expects a scalar here and reads the array as the default"
    if expected is Kind.STRING:
        return ERROR, "ncnn expects a string here and treats the number as absent"
    if got is Kind.STRING:
        return ERROR, ("ncnn expects a number and keeps the default (text values like inf "
                       "and nan are read as strings)")
    if expected is Kind.INTS and got is Kind.FLOATS:
        return ERROR, "ncnn expects an int array; the float bits are read as ints"
    if expected is Kind.FLOATS and got is Kind.INTS:
        return WARNING, "ncnn expects a float array; write the elements with a '.'"
    return WARNING, f"ncnn reads {expected.noun}"


def _float_bits(vals: tuple) -> list[float] | None:
    """The float32 values of int bit patterns, when every element looks like one (what
    old converters wrote for float arrays); else None."""
    import struct

    out = []
    big = False
    for v in vals:
        if v == 0:
            out.append(0.0)
            continue
        if not -(1 << 31) <= v < (1 << 31):
            return None
        f = struct.unpack("<f", struct.pack("<i", v))[0]
        if not (1e-6 <= abs(f) <= 1e6):
            return None
        big = big or abs(v) >= (1 << 23)
        out.append(f)
    return out if big else None


@rule("PS011", "param-kind", ERROR,
      "a param written with the kind ncnn does not read (float for int, scalar for array, …)",
      also=(WARNING,))
def param_kind(ctx: "LintContext") -> Iterator[Hit]:
    """ncnn types a param by its text (`.`/`e` = float, `,` = array, a letter or `"` =
    string) and each layer reads every id with a fixed kind (layer_params.py, from every
    `load_param` of Tencent/ncnn). A mismatch is silent:

    - float where an int is read: the wheel returns the default (`BinaryOp 0=2.0` is ADD);
    - int where a float is read: the wheel converts, older ncnn reads the bits (warning);
    - scalar where an array is read (`Slice 2=4`, `Reduction 3=0`): load_param fails;
    - number where a string is read (`Crop 19=1`): treated as absent;
    - an old-style array mixing ints and floats (`-23301=2,1.0,2`): element bits are
      reinterpreted;
    - the same id twice: ncnn keeps the last (warning).

    Ids the layer does not read are PS013."""
    for group in ctx.layers_by_params:
        first = group[0]
        if first.type not in LAYER_PARAMS or not len(first.params):
            continue
        hits = list(_param_kind_hits(first))
        if hits:  # layers with the same params have the same problems (under their names)
            yield from hits
            for layer in group[1:]:
                yield from _param_kind_hits(layer)


def _param_kind_hits(layer: "Layer") -> Iterator[Hit]:
    t = layer.type
    params = layer.params
    for pid, value in params.values_typed():
        info = param_info(t, pid)
        if is_mixed(value):
            yield Hit(layer, f"{t} {layer.name!r} param {pid} mixes ints and floats in one "
                             f"array: ncnn reinterprets the bits of some elements")
            continue
        if info is None:
            continue  # PS013
        problem = _kind_problem(info.kind, value.kind)
        if problem is None:
            continue
        if info.kind is Kind.FLOAT and value.kind is Kind.INT and value.value == 0:
            continue  # int 0 and float 0.0 have the same bits: harmless everywhere
        sev, why = problem
        bits = _float_bits(tuple(value.value)) if isinstance(value.value, (list, tuple)) and \
            info.kind is Kind.FLOATS and value.kind is Kind.INTS else None
        if bits:
            floats = ", ".join(f"{x:g}" for x in bits[:4])
            why = (f"the ints are float32 bit patterns ({floats}, …): ncnn builds with the "
                   f"untyped ParamDict read those floats, a typed ParamDict may convert "
                   f"the integers instead; write the floats")
        shown = "[]" if value.kind.is_array and not value.value else value.python
        yield Hit(layer, f"{t} {layer.name!r} param {pid} ({info.name}) is written as "
                         f"{value.kind.value} {shown!r} but ncnn reads {info.kind.noun}: "
                         f"{why}", severity=sev)
    if params.has_duplicates:
        dup = sorted({d.pid for d in params._dupes})
        yield Hit(layer, f"{t} {layer.name!r} writes param(s) {', '.join(map(str, dup))} "
                         f"more than once: ncnn keeps the last", severity=WARNING)


@rule("PS012", "load-rejects-params", ERROR, "params ncnn's load_param rejects")
def load_rejects_params(ctx: "LintContext") -> Iterator[Hit]:
    """Param combinations for which a layer's `load_param` fails in the ncnn wheel
    (ncnn-format.md §1.8, measured), so the whole graph fails to load:

    - Reduction with non-empty axes but no `5=1` (fixbug0): "param is too old, please
      regenerate!";
    - Softmax with an axis other than 0 and no `1=1`;
    - MultiHeadAttention whose embed_dim is not a multiple of num_heads;
    - GroupNorm whose channels are not a multiple of the groups;
    - Gemm with a constant A/B but a zero M, N or K; Gemm quantize_term 4, 5 or 6;
    - Crop in expression mode (`19`, `20`) without `21` axes_expr: the wheel ignores the
      failed evaluation and segfaults."""
    for group in ctx.param_groups(*_LOAD_REJECTS):
        check = _LOAD_REJECTS[group[0].type]
        hits = list(check(group[0]))
        if hits:  # the same params fail the same way in every layer of the group
            yield from hits
            for layer in group[1:]:
                yield from check(layer)


def _reduction_rejected(layer: "Layer") -> Iterator[Hit]:
    if _ints(layer, 3) and _int(layer, 5, 0) != 1:
        yield Hit(layer, f"Reduction {layer.name!r} has axes but no 5=1: ncnn's load_param "
                         f"fails ('param is too old, please regenerate!')")


def _softmax_rejected(layer: "Layer") -> Iterator[Hit]:
    if _int(layer, 0, 0) != 0 and _int(layer, 1, 0) != 1:
        yield Hit(layer, f"Softmax {layer.name!r} has axis {_int(layer, 0, 0)} but no 1=1: "
                         f"ncnn's load_param fails")


def _mha_rejected(layer: "Layer") -> Iterator[Hit]:
    e, h = _int(layer, 0, 0), _int(layer, 1, 1)
    if h <= 0 or e % h:
        yield Hit(layer, f"MultiHeadAttention {layer.name!r}: embed_dim {e} is not a "
                         f"multiple of num_heads {h}: ncnn's load_param fails")


def _groupnorm_rejected(layer: "Layer") -> Iterator[Hit]:
    grp, ch = _int(layer, 0, 1), _int(layer, 1, 0)
    if grp <= 0 or ch % grp:
        yield Hit(layer, f"GroupNorm {layer.name!r}: {ch} channels are not a multiple of "
                         f"{grp} groups: ncnn's load_param fails")


def _gemm_rejected(layer: "Layer") -> Iterator[Hit]:
    m, n, k = _int(layer, 7, 0), _int(layer, 8, 0), _int(layer, 9, 0)
    if _int(layer, 4, 0) and (m == 0 or k == 0):
        yield Hit(layer, f"Gemm {layer.name!r} has a constant A but M={m}, K={k}: ncnn's "
                         f"load_param fails")
    if _int(layer, 5, 0) and (n == 0 or k == 0):
        yield Hit(layer, f"Gemm {layer.name!r} has a constant B but N={n}, K={k}: ncnn's "
                         f"load_param fails")
    if _int(layer, 18, 0) in (4, 5, 6):
        yield Hit(layer, f"Gemm {layer.name!r} quantize_term {_int(layer, 18, 0)} is "
                         f"rejected by ncnn's load_param")


def _crop_rejected(layer: "Layer") -> Iterator[Hit]:
    has_expr = bool(layer.params.get(19)) or bool(layer.params.get(20))
    if has_expr and not layer.params.get(21):
        yield Hit(layer, f"Crop {layer.name!r} uses starts/ends expressions (19/20) without "
                         f"axes (21): ncnn leaves the crop uninitialised and crashes")


_LOAD_REJECTS = {"Reduction": _reduction_rejected, "Softmax": _softmax_rejected,
                 "MultiHeadAttention": _mha_rejected, "GroupNorm": _groupnorm_rejected,
                 "Gemm": _gemm_rejected, "Crop": _crop_rejected}


@rule("PS013", "unread-param", INFO, "a param id the layer type does not read")
def unread_param(ctx: "LintContext") -> Iterator[Hit]:
    """ncnn ignores a param id its layer does not read (e.g. pnnx writes `7=group` on a
    Convolution1D, which has no groups: a grouped 1-D convolution is
    ConvolutionDepthWise1D). Harmless; listed so a misspelt id does not go unnoticed."""
    for group in ctx.layers_by_params:
        t = group[0].type
        if t not in LAYER_PARAMS or not len(group[0].params):
            continue
        unread = [pid for pid in group[0].params if param_info(t, pid) is None]
        if unread:  # the same ids for the whole group
            for layer in group:
                yield Hit(layer, f"{t} {layer.name!r} has param(s) "
                                 f"{', '.join(map(str, unread))}, which {t} does not read "
                                 f"(ncnn ignores them)")


# =========================================================================== codebooks

def _is_sum(layer: "Layer") -> bool:
    if layer.type == "BinaryOp":
        return _int(layer, 0, 0) == 0 and not _int(layer, 1, 0) and len(layer.inputs) == 2
    return layer.type == "Eltwise" and _int(layer, 0, 1) == EltwiseOpType.SUM and not layer.params.get(1)


_PASS_THROUGH = ("Reshape", "Split")


@rule("PS014", "separate-codebook-embeds", INFO,
      "several Embed tables, one id input each, summed (one fused Embed is cheaper)",
      fix_pass="fuse-codebooks")
def separate_codebook_embeds(ctx: "LintContext") -> Iterator[Hit]:
    """An RVQ-style sum of K embeddings, each `Embed` reading its own graph input and the
    results added with a chain of `BinaryOp` adds (or an Eltwise sum): K tables, K inputs to
    feed and K-1 adds per step. `paramsurgery fuse-codebooks` concatenates the tables into
    one Embed over ids pre-offset by `level × vocab` on the host (the Qwen3-TTS port's form).
    Not a bug: an optimisation, reported as info."""
    g = ctx.graph
    if g.types().get("Embed", 0) < 2:
        return  # nothing to fuse: skip the walk over every sum (a residual chain has many)

    def back(b: str) -> "Layer | None":
        p = g.producer(b)
        passed: set[int] = set()  # a layer reading its own top (PS105) ends the walk
        while p is not None and p.type in _PASS_THROUGH and p.inputs and p.id not in passed:
            passed.add(p.id)
            p = g.producer(p.inputs[0])
        return p

    sums = [lay for t in ("BinaryOp", "Eltwise") for lay in g.by_type(t) if _is_sum(lay)]
    sum_ids = {lay.id for lay in sums}
    for root in sums:
        if any(c.id in sum_ids for b in root.outputs for c in ctx.through_splits(b)):
            continue  # not the last add of its chain
        embeds: dict[int, "Layer"] = {}
        work = [root]
        seen = {root.id}
        while work:
            cur = work.pop()
            for b in cur.inputs:
                p = back(b)
                if p is None or p.id in seen:
                    continue
                seen.add(p.id)
                if p.id in sum_ids:
                    work.append(p)
                elif p.type == "Embed" and p.inputs:
                    src = back(p.inputs[0])
                    if src is not None and src.type == "Input":
                        embeds[p.id] = p
        dims = {_int(e, 0, 0) for e in embeds.values()}
        if len(embeds) >= 2 and len(dims) == 1:
            first = min(embeds.values(), key=lambda e: ctx.index[e.id])
            yield Hit(root, f"{len(embeds)} Embed tables (first {first.name!r}), one id "
                            f"input each, are summed up to {root.type} {root.name!r}: one Embed "
                            f"over pre-offset ids does the same with one table and one input")


@rule("PS016", "frozen-trace-length", ERROR,
      "a constant pnnx folded at the first trace equals that trace's length: the graph "
      "computes with it at every length", fix_pass="lower", needs=("pnnx",))
def frozen_trace_length(ctx: "LintContext") -> Iterator[Hit]:
    """pnnx 20261020 folds arithmetic on the size of a dim it reached through a transpose
    into a constant of the first trace (`torch.ones(B) * y.shape[1]`, HF ECAPA's
    `_length_to_mask(lengths * seq_len)` and `mask.sum()`; repro case
    `size-after-transpose-folded`). A one-element `MemoryData pnnx_fold_*` equal to the
    traced extent of a dynamic input dim (pnnx's `X_ncnn.py` records it), read together with
    a tensor of a dynamic length, is that length frozen: the dynamic graph is wrong at every
    other length. `paramsurgery lower` computes it from the input instead (needs `--bin`)."""
    from paramsurgery.analysis.frozen_extent import folded_value, frozen_lengths, is_folded, trace_evidence

    folds = [lay for lay in ctx.graph.by_type("MemoryData") if is_folded(lay)]
    if not folds or ctx.pnnx is None:
        return
    ev = trace_evidence(ctx.pnnx, ctx.pnnx.path, None)
    if not ev.dims:
        return
    values: dict[str, float | None] = {}
    if not any(lay.weights for lay in folds) and ctx.run_bin:
        from paramsurgery.formats.io import load

        weighted = load(ctx.path, bin=ctx.run_bin) if ctx.path else None
        for lay in folds:
            w = weighted.find(lay.name) if weighted is not None else None
            values[lay.name] = folded_value(w) if w is not None else None
    found, _ = frozen_lengths(ctx.graph, ctx.pnnx, ev,
                              lambda lay: values.get(lay.name, folded_value(lay)))
    for layer, dim, value in found:
        yield Hit(layer, f"MemoryData {layer.name!r} = {value:g} is a constant pnnx folded at "
                         f"the first trace, equal to its length ({dim.blob} dim {dim.dim} = "
                         f"{dim.traced}, {ev.source}): the graph computes with {value:g} at "
                         f"every length (e.g. `torch.ones(B) * x.shape[-1]` after a "
                         f"transpose, ECAPA's length mask)")


@rule("PS015", "lossy-batch-reshape", ERROR,
      "a Reshape to all-ones dims read back from ncnn's batch axis (0n): the elements are lost",
      fix_pass="fix-batch-reshape")
def lossy_batch_reshape(ctx: "LintContext") -> Iterator[Hit]:
    """pnnx gives 1-D tensors no batch axis; reshaping one into a layout whose batch axis
    holds its elements (`arange(T).reshape(1, 1, -1)` with batch axis 2) makes pnnx
    20261020 write `Reshape 0=1 1=1` without the output batch param `13=`, then
    `Reshape 12=k 13=233 6="0n,..."` to read the elements back from n. ncnn keeps one
    element (n is 1): every value after it is the first one (Mimi's RoPE positions all 0,
    output NaN). `paramsurgery fix-batch-reshape` merges the pair into one Reshape."""
    from paramsurgery.patterns.batch_reshape import find_lossy_pairs

    for r1, r2 in find_lossy_pairs(ctx.graph):
        yield Hit(r1, f"Reshape {r1.name!r} keeps one element ({r1.params}); {r2.name!r} "
                      f"reads its elements back from ncnn's batch axis n ({r2.params}), "
                      f"which is 1: the rest is lost")
