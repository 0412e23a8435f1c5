"""Which torch construct usually leaves each non-ncnn layer type in a pnnx graph
(pnnx-bugs.md §1-§3, measured with torch 2.13 / pnnx 20261020), and what to do about it.

`explain_leftover(ctx, layer)` picks the first entry whose type pattern matches and whose
context test (what feeds or reads the layer) holds. Entries are data: add one per newly
measured construct.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from paramsurgery.ir.layer import Layer
    from paramsurgery.lint.context import LintContext


@dataclass(frozen=True)
class Construct:
    types: tuple[str, ...]  # exact types; an entry ending in "*" is a prefix
    construct: str  # the torch code that usually produces it
    workaround: str
    fix_pass: str | None = None
    when: Callable[["LintContext", "Layer"], bool] | None = None
    case: str | None = None  # pnnx-bugs.md case

    def matches(self, ctx: "LintContext", layer: "Layer") -> bool:
        t = layer.type
        if not any(t == p or (p.endswith("*") and t.startswith(p[:-1])) for p in self.types):
            return False
        return self.when is None or self.when(ctx, layer)


def _reads_type(*types: str) -> Callable[["LintContext", "Layer"], bool]:
    def f(ctx: "LintContext", layer: "Layer") -> bool:
        return any(c.type in types for b in layer.outputs for c in ctx.through_splits(b))
    return f


def _fed_by(*types: str) -> Callable[["LintContext", "Layer"], bool]:
    def f(ctx: "LintContext", layer: "Layer") -> bool:
        for b in layer.inputs:
            p = ctx.source_of(b)
            if p is not None and p.type in types:
                return True
        return False
    return f


def _expand_feeds_attention(ctx: "LintContext", expand: "Layer") -> bool:
    """`Tensor.expand` → Reshape (→ Permute/Split…) → SDPA/MultiHeadAttention: the
    repeat_kv shape (k/v repeated to the query head count before attention)."""
    work = [(b, 0) for b in expand.outputs]
    seen = set()
    while work:
        b, hops = work.pop()
        if b in seen or hops > 4:
            continue
        seen.add(b)
        for c in ctx.consumer_layers(b):
            if c.type in ("SDPA", "MultiHeadAttention", "F.scaled_dot_product_attention"):
                return True
            if c.type in ("Reshape", "Permute", "Split", "Tensor.reshape", "Tensor.view"):
                work.extend((o, hops + 1) for o in c.outputs)
    return False


def _feeds_pad(ctx: "LintContext", layer: "Layer") -> bool:
    """Shape arithmetic (through casts and further expressions) that ends in an F.pad's pad
    bottom: Encodec/Mimi extra padding (`ceil(...)` -> `.long()` -> `[K-S, extra]`)."""
    from paramsurgery.patterns.match import readers_below

    arithmetic = ("pnnx.Expression", "Tensor.to", "Tensor.long", "Tensor.int")
    return any(c.type == "F.pad" for c in readers_below(ctx.through_splits, layer.outputs,
                                                        arithmetic))


def _repeat_kv_expr(ctx: "LintContext", layer: "Layer") -> bool:
    return any(c.type == "Tensor.expand" and _expand_feeds_attention(ctx, c)
               for b in layer.outputs for c in ctx.through_splits(b))


def _repeat_kv_expand(ctx: "LintContext", layer: "Layer") -> bool:
    return _fed_by("pnnx.Expression")(ctx, layer) and _expand_feeds_attention(ctx, layer)


_MASK_TYPES = ("torch.arange", "torch.full", "aten::triu", "torch.triu", "torch.tril",
               "Tensor.triu", "Tensor.tril", "torch.ones", "torch.zeros")
_BOOL_TYPES = ("Tensor.masked_fill", "torch.lt", "torch.gt", "torch.le", "torch.ge",
               "torch.eq", "torch.ne", "torch.where", "torch.logical_and", "torch.logical_or",
               "torch.logical_not")

REPEAT_KV = ("HF `repeat_kv` (`k[:, :, None].expand(B, kv, n_rep, T, D).reshape(B, H, T, D)`) "
             "under a dynamic sequence length: the expand sizes come from `x.shape`")
REPEAT_KV_FIX = ("`k.repeat_interleave(n_rep, dim=-3)` or `F.scaled_dot_product_attention(..., "
                 "enable_gqa=True)` (one GQA SDPA)")
SHAPE_PAD = ("padding computed from `x.shape[-1]` (Encodec/Mimi causal-conv extra padding with "
             "`math.ceil`); the pad is also frozen at the trace length")
SHAPE_PAD_FIX = ("pad a constant `S-1` on the right, `F.pad(x, (K-S, S-1))`: output length "
                 "ceil(T/S), every window reads the same samples")

def _repeat_kv_reshape(ctx: "LintContext", layer: "Layer") -> bool:
    """`Tensor.reshape` of a repeat_kv `Tensor.expand` (the k side keeps pnnx's batch axis
    in a dynamic export, so pnnx leaves the reshape too)."""
    return any(p is not None and p.type == "Tensor.expand" and _repeat_kv_expand(ctx, p)
               for p in (ctx.source_of(b) for b in layer.inputs[:1]))


_TRIU_TYPES = ("aten::triu", "torch.triu", "Tensor.triu")


def _causal_triu(ctx: "LintContext", layer: "Layer") -> bool:
    """`torch.full(size, v)` → `triu(·, 1)`: HF's causal mask built from the run-time length
    (the torch.full, the triu, or the pnnx.Expression giving the size or the diagonal)."""
    if layer.type in _TRIU_TYPES:
        return _fed_by("torch.full")(ctx, layer)
    if layer.type == "torch.full":
        return _reads_type(*_TRIU_TYPES)(ctx, layer)
    return any(c.type in _TRIU_TYPES or (c.type == "torch.full" and _causal_triu(ctx, c))
               for b in layer.outputs for c in ctx.through_splits(b))


CAUSAL_BUILT = ("HF's causal mask built from the dynamic length (`torch.full((T, T), "
                "finfo.min).triu(1)`, pnnx's dynamic export)")
CAUSAL_BUILT_FIX = ("pass the additive mask as an input (the kv form); `paramsurgery "
                    "causal-mask` rebuilds it from each SDPA's query/key lengths (values from "
                    "X.pnnx.param)")

CONSTRUCTS: tuple[Construct, ...] = (
    Construct(("pnnx.Expression",), REPEAT_KV, REPEAT_KV_FIX, "fold-gqa", _repeat_kv_expr, "1"),
    Construct(("Tensor.expand",), REPEAT_KV, REPEAT_KV_FIX, "fold-gqa", _repeat_kv_expand, "1"),
    Construct(("Tensor.reshape",), REPEAT_KV, REPEAT_KV_FIX, "fold-gqa", _repeat_kv_reshape,
              "1"),
    Construct(("torch.full", "pnnx.Expression") + _TRIU_TYPES, CAUSAL_BUILT, CAUSAL_BUILT_FIX,
              "causal-mask", _causal_triu, "6c"),
    Construct(("pnnx.Expression", "Tensor.to"), SHAPE_PAD, SHAPE_PAD_FIX, "lower", _feeds_pad,
              "5"),
    Construct(("F.pad",), SHAPE_PAD, SHAPE_PAD_FIX, "lower", _fed_by("pnnx.Expression"), "5"),
    Construct(("pnnx.Expression",),
              "positions or a mask (causal or length mask) built in the graph from the "
              "dynamic length (`torch.arange(T)`, `torch.full((T, T), -inf).triu(1)`)",
              "compute positions / the additive mask on the host and pass them as inputs "
              "(`arange(x.shape[d])` is lowered)",
              "lower", _reads_type("torch.arange"), "6c"),
    Construct(("pnnx.Expression",),
              "positions or a mask (causal or length mask) built in the graph from the "
              "dynamic length (`torch.arange(T)`, `torch.full((T, T), -inf).triu(1)`)",
              "compute positions / the additive mask on the host and pass them as inputs",
              None, _reads_type(*_MASK_TYPES), "6c"),
    Construct(("pnnx.Expression",),
              "arithmetic on a traced shape (`x.shape[i]`, `x.size(i)` used as a value: "
              "lengths, repeat counts, view sizes) or on integer tensors",
              "make the size static, or express it with ncnn's shape expressions "
              "(`x[..., :x.shape[-1] - r]` becomes a Crop with expressions)"),
    Construct(("torch.unbind",),
              "`unbind` / `for t in x` / `enumerate(x)` along pnnx's inferred batch axis "
              "(int codes `(K, T)`, `codes.transpose(0, 1)` in an RVQ decode, or timm-style "
              "fused qkv `.permute(2, 0, 3, 1, 4).unbind(0)`)",
              "unbind a non-batch axis (give the codes a leading 1: `(1, K, T).unbind(1)`), "
              "index `codes[:, i]`, or `qkv.chunk(3, -1)`", "fix-slice", None, "2a/2c"),
    Construct(("Tensor.select",),
              "`x[i]` / `select` along pnnx's inferred batch axis",
              "index a non-batch axis (keep a leading 1), or feed one input per part",
              None, None, "2a"),
    Construct(("F.scaled_dot_product_attention",),
              "`F.scaled_dot_product_attention(..., is_causal=True)` (or `dropout_p > 0`): "
              "pnnx converts SDPA only with an explicit mask",
              "pass an additive float mask input (0 / -inf) and `is_causal=False`",
              None, None, "6c"),
    Construct(("Tensor.slice", "Tensor.slice_copy"),
              "strided slicing or slice assignment (`x[..., 1:60:3] = ...`, e.g. HF "
              "interleaved M-RoPE `apply_interleaved_mrope`)",
              "plain RoPE with per-position cos/sin tables computed on the host (the "
              "Qwen3-TTS port passes `(1, T, head_dim)` tables); static slices are lowered "
              "to Crop + Concat", "lower", None, "6a"),
    Construct(("torch.repeat_interleave",),
              "`repeat_interleave(n_rep, dim=1)` with a positive dim (pnnx fuses only "
              "`dim=-3` into a GQA SDPA)",
              "`repeat_interleave(n_rep, dim=-3)`, or SDPA `enable_gqa=True`", "fold-gqa",
              None, "1"),
    Construct(("torch.narrow",),
              "`x.narrow(dim, 0, n)`",
              "`x[..., :n]`, or `F.pad(x, (0, -r))` for a crop from the end (becomes Crop)",
              None, None, "3"),
    Construct(("torch.arange",),
              "positions built in the graph from a length (`torch.arange(x.shape[d])`)",
              "build them on the host and pass them as an input (`paramsurgery lower` "
              "lowers an arange over a static or shape-derived extent)", "lower", None, "6c"),
    Construct(_MASK_TYPES,
              "positions or a mask (causal or length mask) built in the graph from a dynamic "
              "length (`torch.arange(T)`, `torch.full(...).triu(1)`)",
              "build it on the host and pass it as an input", None, None, "6c"),
    Construct(("Tensor.to", "Tensor.type", "Tensor.float", "Tensor.long", "Tensor.int",
               "Tensor.bool", "Tensor.type_as"),
              "a dtype conversion inside the graph (`.to(dtype)`, `.long()`, `.float()`)",
              "keep the graph float32 end to end; convert ids and masks on the host (casts "
              "of values computed in the graph are lowered as identities)", "lower"),
    Construct(("torch.where",),
              "a boolean mask applied with `torch.where` (GPT-2's eager attention: "
              "`where(causal_mask, scores, finfo.min)`)",
              "pass an additive float mask as an input (`paramsurgery lower` rewrites a "
              "`where` of a 0/1 mask and finfo.min exactly)", "lower"),
    Construct(_BOOL_TYPES,
              "a boolean mask built in the graph (length masks, `masked_fill`, comparisons)",
              "pass an additive float mask as an input"),
    Construct(("Tensor.repeat",),
              "`Tensor.repeat` with a count taken from a dynamic shape (e.g. ECAPA "
              "`repeat(1, 1, seq_len)`)",
              "broadcast instead (`h * 0 + stat`), or a static repeat (becomes Tile)"),
    Construct(("Tensor.expand", "Tensor.expand_as"),
              "`expand` / `expand_as` with sizes from a dynamic shape",
              "a static `expand(-1, -1, n, -1)` / `repeat(...)` (becomes Tile), or broadcasting"),
    Construct(("torch.argmax", "torch.argmin", "torch.cdist"),
              "a nearest-codebook search (`torch.cdist` + `argmin`, RVQ encode)",
              "do the search on the host"),
    Construct(("F.pad",),
              "`F.pad` with `mode='replicate'` / `'reflect'`, or pads ncnn's Padding cannot "
              "express",
              "concatenate copies of the edge column, or use constant padding (`paramsurgery "
              "lower` turns static constant/replicate/reflect pads into Padding)", "lower"),
    Construct(("prim::*",),
              "Python-side structure that survived tracing (tuples, lists, control flow)",
              "return plain tensors from the traced module"),
    Construct(("aten::*",), "an aten op pnnx has no pass for",
              "rewrite the op with tensor ops pnnx converts, or do it on the host"),
    Construct(("nn.*",), "a `torch.nn` module pnnx has no ncnn conversion for",
              "replace the module, or run that part on the host"),
    Construct(("F.*",), "a `torch.nn.functional` call pnnx could not convert (pnnx prints "
              "'ignore F.… param …' on stderr)",
              "rewrite it with ops pnnx converts, or do it on the host"),
    Construct(("pnnx.*", "torch.*", "Tensor.*"),
              "a torch op pnnx could not convert (pnnx prints 'ignore <type> … param …' on "
              "stderr and still writes the graph)",
              "rewrite it with ops pnnx converts, or do it on the host"),
)


def explain_leftover(ctx: "LintContext", layer: "Layer") -> Construct | None:
    for c in CONSTRUCTS:
        if c.matches(ctx, layer):
            return c
    return None
