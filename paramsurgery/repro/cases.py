"""The catalogue of minimal pnnx 20261020 -> ncnn conversion bugs (pnnx-bugs.md), each with
its workaround, defined once so the fixture generator, the tests and `paramsurgery repro`
share the same models.

Every model is tiny (a handful of channels) and deterministic: weights come from
`torch.manual_seed(case.seed)`, inputs from `numpy.random.default_rng((case.seed, length))`.
torch is imported only inside the factories and `torch_reference`, so listing the catalogue
and building ncnn feeds works without torch.

Vocabulary:
- a *case* is one bug; a *variant* is one model of it (`bug`, its `workaround`, sometimes a
  `static` export of the bug);
- *status* is what happens when pnnx exports the variant and ncnn runs the graph at a length
  no trace used: `right`, `wrong`, `load_fail`, `crash` (ncnn killed by a signal) or
  `export_fail` (pnnx itself failed or wrote no ncnn files).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from paramsurgery.runtime.child import NO_BATCH, Feed, Fetch

STATUSES = ("right", "wrong", "load_fail", "crash", "export_fail")

ATOL = 1e-3
RTOL = 1e-3

Arrays = list[np.ndarray]


@dataclass(frozen=True)
class Variant:
    """One model of a case.

    `factory` builds the torch module that is traced (None only for hand-written graphs).
    `prepare` is host-side preprocessing applied to the case inputs before they reach the
    model (a workaround that moves index arithmetic or mask building out of the graph);
    the torch reference of such a variant must still equal the bug model's output on the
    raw inputs, which `paramsurgery.repro.cases.equivalent_to_bug` checks.
    `handwritten_param` is the `.ncnn.param` text of a hand-written graph (no pnnx run)."""

    name: str
    description: str
    expected: str
    factory: Callable[[], Any] | None = None
    trace_lengths: tuple[int, ...] | None = None
    run_length: int | None = None
    prepare: Callable[[Arrays], Arrays] | None = None
    handwritten_param: str | None = None
    nondeterministic: str | None = None   # why ncnn's output varies run to run, if it does

    def __post_init__(self) -> None:
        if self.expected not in STATUSES:
            raise ValueError(f"unknown status {self.expected!r}")


@dataclass(frozen=True)
class ReproCase:
    id: str
    number: str                     # the case number in pnnx-bugs.md ("1", "2a", ...)
    title: str
    construct: str                  # the torch construct, one line
    make_inputs: Callable[[int, np.random.Generator], Arrays]
    trace_lengths: tuple[int, ...]  # (T1, T2) = dynamic export, (T,) = static
    run_length: int                 # the untraced length the ncnn graph is run at
    variants: tuple[Variant, ...]
    why: str                        # why it happens
    offending: tuple[str, ...]      # regexes matching the offending .ncnn.param lines
    offending_text: str             # the offending line pattern, for people
    upstream: tuple[str, ...] = ()
    seed: int = 0
    input_names: tuple[str, ...] = ()   # what each in0, in1, ... means
    notes: str = ""
    handwritten: bool = False

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"case {self.id} has no variant {name!r}")

    def lengths(self, variant: Variant) -> tuple[tuple[int, ...], int]:
        """(trace lengths, run length) of a variant (variant overrides the case)."""
        return (variant.trace_lengths or self.trace_lengths,
                variant.run_length if variant.run_length is not None else self.run_length)

    def is_dynamic(self, variant: Variant) -> bool:
        return len(self.lengths(variant)[0]) > 1


# --------------------------------------------------------------------------- helpers

def _tnn():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    return torch, nn, F


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _ids(rng: np.random.Generator, high: int, *shape: int) -> np.ndarray:
    return rng.integers(0, high, size=shape).astype(np.int32)


def _rope_tables(length: int, dim: int, half: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """HF-style RoPE tables (1,1,T,D) = cat(freqs, freqs), or the (1,1,T,D/2) halves."""
    inv = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    freqs = np.outer(np.arange(length, dtype=np.float64), inv)
    if not half:
        freqs = np.concatenate([freqs, freqs], axis=-1)
    return (np.cos(freqs).astype(np.float32)[None, None],
            np.sin(freqs).astype(np.float32)[None, None])


# --------------------------------------------------------------------------- case 1

def _inputs_hidden32(length: int, rng: np.random.Generator) -> Arrays:
    return [_normal(rng, 1, length, 32)]


def _attn_module(kind: str):
    """q/k/v projections (hidden 32, 4 query heads, head_dim 8) then SDPA.
    kind: repeat_kv (HF expand+reshape, 2 kv heads), repeat_interleave (dim=-3),
    is_causal (4 kv heads), mask (4 kv heads, additive mask input, or none), ones_mask (4 kv
    heads, HF's all-ones padding mask built in the graph)."""
    torch, nn, F = _tnn()
    kv_heads = 2 if kind in ("repeat_kv", "repeat_interleave") else 4

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(32, 32)
            self.k = nn.Linear(32, kv_heads * 8)
            self.v = nn.Linear(32, kv_heads * 8)

        def forward(self, x, mask=None):
            b, t, _ = x.shape
            q = self.q(x).view(b, t, 4, 8).transpose(1, 2)
            k = self.k(x).view(b, t, kv_heads, 8).transpose(1, 2)
            v = self.v(x).view(b, t, kv_heads, 8).transpose(1, 2)
            if kind == "repeat_kv":
                n_rep = 4 // kv_heads
                k = k[:, :, None].expand(b, kv_heads, n_rep, t, 8).reshape(b, 4, t, 8)
                v = v[:, :, None].expand(b, kv_heads, n_rep, t, 8).reshape(b, 4, t, 8)
            elif kind == "repeat_interleave":
                k = k.repeat_interleave(4 // kv_heads, dim=-3)
                v = v.repeat_interleave(4 // kv_heads, dim=-3)
            if kind == "is_causal":
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=8 ** -0.5)
            if kind == "ones_mask":  # HF BERT called without attention_mask: all ones
                m = torch.ones(b, t)[:, None, None, :].expand(b, 1, t, t)
                inv = 1.0 - m
                mask = inv.masked_fill(inv.to(torch.bool), torch.finfo(x.dtype).min)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=8 ** -0.5)

    return Attn()


# --------------------------------------------------------------------------- case 2

def _inputs_codes3(length: int, rng: np.random.Generator) -> Arrays:
    return [_ids(rng, 32, 3, length)]


def _with_leading_one(inputs: Arrays) -> Arrays:
    return [inputs[0][None]]


def _codes_module(kind: str):
    """Three Embedding(32, 8) tables summed, one per row of int codes."""
    torch, nn, F = _tnn()

    class Codes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.ModuleList(nn.Embedding(32, 8) for _ in range(3))

        def forward(self, codes):
            if kind == "unbind0":          # codes (3,T): unbind pnnx's batch axis
                a, b, c = codes.unbind(0)
                return self.emb[0](a) + self.emb[1](b) + self.emb[2](c)
            if kind == "unbind1":          # codes (1,3,T): the levels are not the batch axis
                a, b, c = codes.unbind(1)
                return self.emb[0](a) + self.emb[1](b) + self.emb[2](c)
            if kind == "keepdim0":         # codes (3,T): keep-dim slices of the batch axis
                return sum(self.emb[i](codes[i:i + 1]) for i in range(3))
            if kind == "keepdim1":         # codes (1,3,T): keep-dim slices of a real axis
                return sum(self.emb[i](codes[:, i]) for i in range(3))
            raise ValueError(kind)

    return Codes()


def _fused_qkv_module(kind: str):
    """timm Attention: one Linear(32, 96) for q,k,v, 4 heads of 8, SDPA, output Linear."""
    torch, nn, F = _tnn()

    class FusedQKV(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(32, 96)
            self.proj = nn.Linear(32, 32)

        def forward(self, x):
            b, t, c = x.shape
            if kind == "unbind":
                qkv = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
                q, k, v = qkv.unbind(0)
            else:  # chunk the last axis: a Slice along a real axis
                q, k, v = (p.view(b, t, 4, 8).transpose(1, 2) for p in self.qkv(x).chunk(3, -1))
            y = F.scaled_dot_product_attention(q, k, v)
            return self.proj(y.transpose(1, 2).reshape(b, t, c))

    return FusedQKV()


def _inputs_c4(length: int, rng: np.random.Generator) -> Arrays:
    return [_normal(rng, 1, 4, length)]


def _uneven_chunk_module(kind: str):
    torch, nn, F = _tnn()

    class Halves(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            if kind == "chunk":
                a, b = y.chunk(2, dim=2)
                return a, b
            half = (y.shape[-1] + 1) // 2   # torch's ceil-first split, written out
            return y[..., :half], y[..., half:]

    return Halves()


def _unbind_float_module():
    """Reference semantics of the hand-written Slice graphs: x (3,4,6) -> x[0], x[1], x[2]."""
    torch, nn, F = _tnn()

    class Unbind(nn.Module):
        def forward(self, x):
            a, b, c = x.unbind(0)
            return a, b, c

    return Unbind()


def _inputs_346(length: int, rng: np.random.Generator) -> Arrays:
    # the hand-written graphs have a static shape; `length` only seeds the generator
    return [_normal(rng, 3, 4, 6)]


# A `.ncnn.param` is whitespace-separated; we pad like pnnx (24 columns) for readability.
def _param_text(lines: Sequence[tuple[str, str, Sequence[str], Sequence[str], str]]) -> str:
    blobs: list[str] = []
    for _, _, bottoms, tops, _ in lines:
        for b in [*bottoms, *tops]:
            if b not in blobs:
                blobs.append(b)
    out = ["7767517", f"{len(lines)} {len(blobs)}"]
    for typ, name, bottoms, tops, params in lines:
        row = f"{typ:<24} {name:<24} {len(bottoms)} {len(tops)}"
        row += "".join(f" {b}" for b in [*bottoms, *tops])
        if params:
            row += " " + params
        out.append(row)
    return "\n".join(out) + "\n"


def _paramless_slice_graph(slice_params: str) -> str:
    """Input (3,4,6) -> Slice along c into 3 -> a Reshape per part dropping the unit axis:
    the shape pnnx 20261020 writes for a float `unbind(0)` on a non-batch axis, with the
    Slice params replaced by `slice_params`."""
    lines = [("Input", "in0", [], ["in0"], "0=6 1=4 2=3"),
             ("Slice", "unbind_0", ["in0"], ["1", "2", "3"], slice_params)]
    for i in range(3):
        lines.append(("Reshape", f"unbind_0_ncnnreshape{i}", [str(i + 1)], [f"out{i}"],
                      '6="0w,0h"'))
    return _param_text(lines)


PARAMLESS_SLICE_PARAM = _paramless_slice_graph("")
FIXED_SLICE_PARAM = _paramless_slice_graph("-23300=3,-233,-233,-233 1=0")


# --------------------------------------------------------------------------- case 3

def _neg_slice_module(kind: str):
    torch, nn, F = _tnn()

    class Trim(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=2)

        def forward(self, x):
            y = self.conv(x)
            if kind == "slice":
                return y[..., :-3] * 2
            return F.pad(y, (0, -3)) * 2   # a negative pad is a crop pnnx keeps

    return Trim()


# --------------------------------------------------------------------------- cases 8, 9

def _folded_length_module(kind: str):
    torch, nn, F = _tnn()

    class MeanOverTime(nn.Module):
        def forward(self, x):
            y = x.transpose(1, 2)                    # (1, T, 4)
            if kind == "length":
                total = torch.ones(1) * y.shape[1]   # ECAPA: lengths * seq_len, mask.sum()
                return (y / total).sum(1)
            return y.mean(1)

    return MeanOverTime()


def _one_d_positions_module(kind: str):
    torch, nn, F = _tnn()

    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.rand(1, 4, 1))
            self.conv = nn.Conv1d(4, 4, 1)

        def forward(self, x):
            if kind == "one_d":
                p = (x[0, 0] * 2).reshape(1, 1, -1)  # a 1-D (T,) tensor, as arange(T)
            else:
                p = x[:, 0:1] * 2                    # the same values, never 1-D
            return self.conv(x) + self.w @ p

    return Positions()


# --------------------------------------------------------------------------- case 10

def _bool_mask_module(kind: str):
    torch, nn, F = _tnn()

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 1)
            tril = torch.tril(torch.ones(16, 16, dtype=torch.bool)).view(1, 1, 16, 16)
            if kind == "bool":   # GPT-2's eager `bias` buffer
                self.register_buffer("bias", tril)
            else:                # the same mask as an additive float buffer
                self.register_buffer("neg", torch.zeros(1, 1, 16, 16).masked_fill(
                    ~tril, torch.finfo(torch.float32).min))

        def forward(self, x):
            h = self.conv(x)
            q = h.view(1, 2, 2, -1).transpose(2, 3)   # (1, heads, T, head_dim)
            s = q @ q.transpose(2, 3)
            t = x.shape[-1]
            if kind == "bool":   # GPT-2's eager attention
                mask_value = torch.full([], torch.finfo(s.dtype).min, dtype=s.dtype)
                s = torch.where(self.bias[:, :, :t, :t], s, mask_value)
            else:
                s = s + self.neg[:, :, :t, :t]
            return s.softmax(-1)

    return Masked()


# --------------------------------------------------------------------------- cases 12-14

def _inputs_hidden8(length: int, rng: np.random.Generator) -> Arrays:
    return [_normal(rng, 1, length, 8)]


def _position_table_module(kind: str):
    """A learned position table of 16 rows added to the hidden states, then a Linear:
    GPT-2's `wpe(arange(T))` ("arange") or Whisper's / a cropped table's `weight[:T]`
    ("slice"): the same values."""
    torch, nn, F = _tnn()

    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wpe = nn.Embedding(16, 8)
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            t = x.shape[1]
            if kind == "arange":
                p = self.wpe(torch.arange(t))
            else:
                p = self.wpe.weight[:t]
            return self.proj(x + p)

    return Positions()


def _inputs_image(length: int, rng: np.random.Generator) -> Arrays:
    return [_normal(rng, 1, 3, length, length)]


def _interpolated_table_module():
    """ViT's patch embedding with its position grid interpolated to the patch grid
    (`interpolate_pos_encoding`): a 4x4 grid of 8 channels, bicubic, added to the patches."""
    torch, nn, F = _tnn()

    class Patches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, 8, 4, stride=4)
            self.pos = nn.Parameter(torch.randn(1, 8, 4, 4))

        def forward(self, x):
            e = self.patch(x)                                   # (1, 8, H/4, W/4)
            p = F.interpolate(self.pos, size=(e.shape[2], e.shape[3]), mode="bicubic",
                              align_corners=False)
            return (e + p).flatten(2).transpose(1, 2)

    return Patches()


def _tied_head_module(tied: bool):
    """An lm_head whose weight is the token embedding's (GPT-2, Gemma: tie_word_embeddings),
    after a LayerNorm; untied: the same values as a parameter of its own."""
    torch, nn, F = _tnn()

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(32, 8)
            self.head = nn.Linear(8, 32, bias=False)
            self.norm = nn.LayerNorm(8)
            if tied:
                self.head.weight = self.emb.weight
            else:
                self.head.weight = nn.Parameter(self.emb.weight.detach().clone())

        def forward(self, x):
            return self.head(self.norm(x))

    return Head()


# --------------------------------------------------------------------------- case 4

def _stack_sum_module(kind: str):
    torch, nn, F = _tnn()

    class StackSum(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = nn.ModuleList(nn.Conv1d(4, 4, 3, padding=1) for _ in range(3))

        def forward(self, x):
            parts = [c(x) for c in self.convs]
            if kind == "dim0":
                return torch.stack(parts, 0).sum(0)
            return torch.stack(parts, 1).sum(1)

    return StackSum()


# --------------------------------------------------------------------------- case 5

def _causal_pad_module(kind: str):
    torch, nn, F = _tnn()
    k, s = 4, 2

    class CausalConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(4, 4, k, stride=s)

        def forward(self, x):
            if kind == "encodec":
                # Encodec/Mimi: extra right pad so the last window is complete, computed
                # with Python floats from the traced length
                length = x.shape[-1]
                frames = (length - k + (k - s)) / s + 1
                extra = (math.ceil(frames) - 1) * s + k - (k - s) - length
                return self.conv(F.pad(x, (k - s, extra)))
            return self.conv(F.pad(x, (k - s, s - 1)))

    return CausalConv()


# --------------------------------------------------------------------------- case 6a

def _inputs_rope(length: int, rng: np.random.Generator) -> Arrays:
    cos, sin = _rope_tables(length, 8)
    return [_normal(rng, 1, 2, length, 8), cos, sin]


def _rope_half_tables(inputs: Arrays) -> Arrays:
    q, cos, sin = inputs
    return [q, cos[..., :4].copy(), sin[..., :4].copy()]


def _rope_module(kind: str):
    torch, nn, F = _tnn()

    class Rope(nn.Module):
        def forward(self, q, cos, sin):
            h = q.shape[-1] // 2
            x1, x2 = q[..., :h], q[..., h:]
            if kind == "hf":     # HF rotate_half with full-width tables (fused to RotaryEmbed)
                return q * cos + torch.cat((-x2, x1), -1) * sin
            # the same rotation written with half-width tables: not fused
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)

    return Rope()


# --------------------------------------------------------------------------- case 6b

def _inputs_ids(length: int, rng: np.random.Generator) -> Arrays:
    return [_ids(rng, 27, length)]


def _offset_on_host(inputs: Arrays) -> Arrays:
    return [(inputs[0] + 5).astype(np.int32)]


def _embed_module(kind: str):
    torch, nn, F = _tnn()

    class Emb(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(32, 8)

        def forward(self, ids):
            return self.emb(ids + 5) if kind == "add" else self.emb(ids)

    return Emb()


# --------------------------------------------------------------------------- case 6c

def _causal_mask_on_host(inputs: Arrays) -> Arrays:
    t = inputs[0].shape[1]
    mask = np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1)
    return [inputs[0], mask]


# --------------------------------------------------------------------------- case 6d

def _dead_conv_module(kind: str):
    torch, nn, F = _tnn()

    class Dead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv1d(4, 4, 3)
            if kind == "dead":
                self.c2 = nn.Conv1d(4, 4, 3)

        def forward(self, x):
            a = self.c1(x)
            if kind == "dead":
                b = self.c2(x)   # noqa: F841 - computed and never used: the trigger
            return a * 2

    return Dead()


# --------------------------------------------------------------------------- case 7

def _inputs_levels(length: int, rng: np.random.Generator) -> Arrays:
    # 3 levels of codes in [0, 32), pre-offset into one fused (3*32, 8) table (level k uses
    # rows 32k..32k+31) and flattened level-major: (3*T,) int32
    codes = _ids(rng, 32, 3, length) + (32 * np.arange(3, dtype=np.int32))[:, None]
    return [codes.reshape(-1).astype(np.int32)]


def _time_major(inputs: Arrays) -> Arrays:
    # level-major (3*T,) -> time-major (T*3,), done on the host
    return [np.ascontiguousarray(inputs[0].reshape(3, -1).T).reshape(-1)]


def _level_sum_module(kind: str):
    """RVQ-style dequantisation: one fused Embedding for 3 levels, the levels summed per
    frame, then a Conv1d (as in a codec decoder). The Conv pins a batch axis, which pnnx
    propagates back through the level sum."""
    torch, nn, F = _tnn()

    class LevelSum(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(3 * 32, 8)
            self.conv = nn.Conv1d(8, 4, 1)
            self.register_buffer("ones", torch.ones(1, 3))

        def forward(self, ids):
            e = self.emb(ids)
            if kind == "matmul":     # level-major ids: sum = ones(1,3) @ (3, T*8)
                frames = torch.matmul(self.ones, e.reshape(3, -1)).reshape(1, -1, 8)
            else:                    # time-major ids: sum a real (non-batch) axis
                frames = e.reshape(-1, 3, 8).sum(1)[None]
            return self.conv(frames.transpose(1, 2))

    return LevelSum()


# --------------------------------------------------------------------------- catalogue

_UNSUPPORTED = r"^(pnnx\.|Tensor\.|torch\.|F\.|aten::|nn\.)\S*\s"

CASES: tuple[ReproCase, ...] = (
    ReproCase(
        id="repeat-kv-expand", number="1",
        title="HF repeat_kv (expand + reshape) before SDPA leaves pnnx.Expression + Tensor.expand",
        construct="k[:, :, None].expand(B, KV, n_rep, T, D).reshape(B, H, T, D) with dynamic T",
        make_inputs=_inputs_hidden32, trace_lengths=(7, 5), run_length=9, seed=101,
        input_names=("x (1,T,32) hidden states",),
        variants=(
            Variant("bug", "HF repeat_kv: unsqueeze, expand to a size list holding T, reshape",
                    "load_fail", lambda: _attn_module("repeat_kv")),
            Variant("workaround", "k.repeat_interleave(n_rep, dim=-3): fused into GQA SDPA",
                    "right", lambda: _attn_module("repeat_interleave")),
        ),
        why=("The expand target size contains the dynamic sequence length, so it reaches "
             "pnnx as a second input computed by a pnnx.Expression. pnnx's Tensor.expand -> "
             "Tile conversion only handles constant sizes, so both the expression and the "
             "expand stay as pnnx ops that ncnn does not have."),
        offending=(r"^pnnx\.Expression\s", r"^Tensor\.expand\s"),
        offending_text="pnnx.Expression pnnx_expr_N 1 1 a s  +  Tensor.expand Tensor.expand_N 2 1 x s y",
        upstream=("pnnx/pnnx#228", "Tencent/ncnn#6387", "Tencent/ncnn PR #6397",
                  "Tencent/ncnn PR #6399", "Tencent/ncnn PR #4850", "Tencent/ncnn#6741"),
    ),
    ReproCase(
        id="unbind-batch-axis", number="2a",
        title="unbind of pnnx's inferred batch axis stays a raw torch.unbind",
        construct="codes.unbind(0) on int codes (K,T) feeding Embeddings",
        make_inputs=_inputs_codes3, trace_lengths=(7, 5), run_length=9, seed=102,
        input_names=("codes (3,T) int32",),
        variants=(
            Variant("bug", "codes (3,T) int32, codes.unbind(0), one Embedding per row",
                    "load_fail", lambda: _codes_module("unbind0")),
            Variant("workaround", "codes fed as (1,3,T), codes.unbind(1)", "right",
                    lambda: _codes_module("unbind1"), prepare=_with_leading_one),
        ),
        why=("Embedding outputs make pnnx take the first axis of the int codes as the ncnn "
             "batch axis; ncnn layers cannot split along the batch axis, so pnnx warns "
             "'unbind along batch axis 0 is not supported' and leaves the torch op."),
        offending=(r"^torch\.unbind\s",),
        offending_text="torch.unbind torch.unbind_0 1 3 in0 1 2 3",
        upstream=("Tencent/ncnn#6387", "Tencent/ncnn PR #6784", "Tencent/ncnn PR #6032"),
    ),
    ReproCase(
        id="slice-batch-axis", number="2b",
        title="keep-dim slicing of the inferred batch axis becomes Slice 1=-233",
        construct="emb_i(codes[i:i+1]) for i in range(K) on int codes (K,T)",
        make_inputs=_inputs_codes3, trace_lengths=(7, 5), run_length=9, seed=103,
        input_names=("codes (3,T) int32",),
        variants=(
            Variant("bug", "codes (3,T) int32, codes[i:i+1] per Embedding", "load_fail",
                    lambda: _codes_module("keepdim0")),
            Variant("workaround", "codes fed as (1,3,T), codes[:, i] per Embedding", "right",
                    lambda: _codes_module("keepdim1"), prepare=_with_leading_one),
        ),
        why=("The sliced axis is pnnx's batch axis. Since pnnx PR #6784 the Slice is kept "
             "with placeholder params (axis -233 = the batch axis) 'for future across-batch "
             "support', which ncnn's Slice rejects at load time."),
        offending=(r"^Slice\s.*\s1=-233\b",),
        offending_text="Slice tensor_split_0 1 3 in0 1 2 3 1=-233 -23302=2,1,2",
        upstream=("Tencent/ncnn PR #6784", "Tencent/ncnn#6094"),
    ),
    ReproCase(
        id="fused-qkv-unbind", number="2c",
        title="timm fused qkv: permute(2,0,3,1,4).unbind(0) moves qkv into the batch axis",
        construct="qkv.view(b, l, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)",
        make_inputs=_inputs_hidden32, trace_lengths=(7, 5), run_length=9, seed=104,
        input_names=("x (1,T,32) hidden states",),
        variants=(
            Variant("bug", "timm Attention: view, permute(2,0,3,1,4), unbind(0), SDPA",
                    "load_fail", lambda: _fused_qkv_module("unbind")),
            Variant("workaround", "qkv.chunk(3, -1), then view/transpose each part", "right",
                    lambda: _fused_qkv_module("chunk")),
        ),
        why=("After the permute the q/k/v axis is the leading axis, which pnnx takes as "
             "the batch axis (a Reshape moves it into ncnn's n); unbinding it is then an "
             "unbind along the batch axis, which has no ncnn conversion."),
        offending=(r"^torch\.unbind\s", r"^Reshape\s.*\b12=(?!233\b)\d+|^Reshape\s.*\b13=(?!233\b)\d+"),
        offending_text='Reshape reshape_N 1 1 a b 12=233 13=2 6="8,4,3,0h,1" + torch.unbind torch.unbind_N 1 3 b q k v',
        upstream=("Tencent/ncnn PR #6784",),
    ),
    ReproCase(
        id="uneven-chunk", number="2d",
        title="uneven chunk/tensor_split: ncnn splits floor-first, torch ceil-first",
        construct="y.chunk(2, dim=2) where the length is odd",
        make_inputs=_inputs_c4, trace_lengths=(10, 8), run_length=9, seed=105,
        input_names=("x (1,4,T)",),
        variants=(
            Variant("bug", "Conv1d then chunk(2, dim=2); run at an odd length", "wrong",
                    lambda: _uneven_chunk_module("chunk")),
            Variant("workaround", "explicit y[..., :(T+1)//2], y[..., (T+1)//2:]", "right",
                    lambda: _uneven_chunk_module("slices")),
        ),
        why=("pnnx writes a Slice with automatic (-233) sizes; ncnn gives the remainder to "
             "the last part (9 -> 4+5), torch's chunk gives it to the first parts "
             "(9 -> 5+4). pnnx only warns about 'non-perfect divided size' and the outputs "
             "are silently wrong at every length that does not divide."),
        offending=(r"^Slice\s.*-23300=\d+(,-233)+",),
        offending_text="Slice chunk_0 1 2 in0 1 2 -23300=2,-233,-233 1=2",
        upstream=(),
    ),
    ReproCase(
        id="paramless-slice", number="2e",
        title="parameterless Slice (older pnnx output) segfaults ncnn",
        construct="x.unbind(0) as written by pnnx before PR #6784: Slice with no params",
        make_inputs=_inputs_346, trace_lengths=(6,), run_length=6, seed=106,
        input_names=("x (3,4,6) float32",),
        variants=(
            Variant("bug", "hand-written: Slice unbind_0 1 3 in0 1 2 3 (no params)", "crash",
                    _unbind_float_module, handwritten_param=PARAMLESS_SLICE_PARAM),
            Variant("workaround", "hand-written twin with -23300=3,-233,-233,-233 1=0", "right",
                    _unbind_float_module, handwritten_param=FIXED_SLICE_PARAM),
        ),
        why=("Older pnnx set the op type to Slice and skipped writing its params when the "
             "split axis was the batch axis. ncnn's Slice does not check that it has as many "
             "slices as outputs and reads past an empty array in forward."),
        offending=(r"^Slice\s(?!.*-2330[02]=)",),
        offending_text="Slice unbind_0 1 3 in0 1 2 3   (no -23300/-23302 and no 1=)",
        upstream=("Tencent/ncnn#6387", "Tencent/ncnn#6094", "Tencent/ncnn#838",
                  "Tencent/ncnn PR #6784"),
        notes=("pnnx 20261020 no longer writes a parameterless Slice (it writes "
               "placeholders, see slice-batch-axis), so both graphs are hand-written "
               "(paramsurgery.repro.cases.PARAMLESS_SLICE_PARAM / FIXED_SLICE_PARAM); the "
               "torch reference is x.unbind(0)."),
        handwritten=True,
    ),
    ReproCase(
        id="dropped-negative-slice", number="3",
        title="x[..., :-r] on a dynamic axis is silently deleted",
        construct="conv(x)[..., :-3] * 2 with dynamic T",
        make_inputs=_inputs_c4, trace_lengths=(10, 8), run_length=13, seed=107,
        input_names=("x (1,4,T)",),
        variants=(
            Variant("bug", "Conv1d(padding=2) then [..., :-3]", "wrong",
                    lambda: _neg_slice_module("slice")),
            Variant("workaround", "F.pad(y, (0, -3)): a negative pad, kept as Crop", "right",
                    lambda: _neg_slice_module("pad")),
        ),
        why=("pnnx's eliminate_noop_slice pass removes a slice whose input and output "
             "shapes compare equal; with a dynamic last axis both are (1,4,?), so the crop "
             "is judged a no-op and the graph returns the untrimmed tensor."),
        offending=(),
        offending_text="(nothing: the Crop is missing; Convolution1D is followed directly by BinaryOp)",
        upstream=(),
    ),
    ReproCase(
        id="stack-sum-batch-axis", number="4",
        title="stack(parts, 0).sum(0) -> Concat 0=-233 + Reduction -23303=0",
        construct="torch.stack([conv_i(x) for i in range(3)], 0).sum(0)",
        make_inputs=_inputs_c4, trace_lengths=(10, 8), run_length=13, seed=108,
        input_names=("x (1,4,T)",),
        variants=(
            Variant("bug", "three Conv1d outputs stacked on dim 0 and summed", "crash",
                    lambda: _stack_sum_module("dim0")),
            Variant("workaround", "stack(parts, 1).sum(1)", "right",
                    lambda: _stack_sum_module("dim1")),
        ),
        why=("Conv outputs carry pnnx's batch axis 0, so stacking and summing along it is "
             "along the batch axis: the Concat gets axis -233 (ncnn returns an empty Mat) "
             "and the sum drops its only axis (an empty axes list); the Reduction then "
             "divides by zero on the empty input."),
        offending=(r"^Concat\s.*\b0=-233\b", r"^Reduction\s.*-23303=0\b"),
        offending_text="Concat stack_0 3 1 a b c s 0=-233  +  Reduction sum_N 1 1 s out0 0=0 1=0 -23303=0 4=0 5=1",
        upstream=("Tencent/ncnn PR #6784 (review notes the same silent drop for cumsum)",),
    ),
    ReproCase(
        id="causal-pad-from-shape", number="5",
        title="causal-conv extra padding computed from x.shape[-1] is frozen by the trace",
        construct="F.pad(x, (K-S, extra)) with extra = f(math.ceil((T-K+K-S)/S+1)) (Encodec/Mimi)",
        make_inputs=_inputs_c4, trace_lengths=(10, 8), run_length=13, seed=109,
        input_names=("x (1,4,T)",),
        variants=(
            Variant("bug", "Encodec extra padding from the traced length, dynamic export",
                    "load_fail", lambda: _causal_pad_module("encodec")),
            Variant("static", "the same model, static export at T=10, run at T=13", "wrong",
                    lambda: _causal_pad_module("encodec"), trace_lengths=(10,), run_length=13),
            Variant("workaround", "always pad S-1 on the right: F.pad(x, (K-S, S-1))", "right",
                    lambda: _causal_pad_module("fixed")),
        ),
        why=("torch.jit.trace records the Python float/int arithmetic on x.shape[-1] as "
             "constants of the traced length: the dynamic graph keeps an expression pad "
             "that ncnn's Padding cannot take (and that is frozen to T=10 anyway), the "
             "static graph has the right pad of the traced length baked in."),
        offending=(r"^pnnx\.Expression\s", r"^F\.pad\s", r"^Padding\s.*\b3=0\b"),
        offending_text="pnnx.Expression pnnx_expr_0 1 1 a p + F.pad F.pad_1 2 1 x p y (dynamic); Padding pad_0 ... 2=2 3=0 (static)",
        upstream=("Tencent/ncnn#5025 (different trigger)",),
    ),
    ReproCase(
        id="rope-4d-no-batch", number="6a",
        title="RotaryEmbed on a 4-D input without a batch axis computes only one head",
        construct="q * cos + rotate_half(q) * sin with q (1,H,T,D), cos/sin (1,1,T,D), no SDPA after",
        make_inputs=_inputs_rope, trace_lengths=(7, 5), run_length=9, seed=110,
        input_names=("q (1,2,T,8)", "cos (1,1,T,8) = cat(freqs, freqs)", "sin (1,1,T,8)"),
        variants=(
            Variant("bug", "HF rotate_half RoPE with full-width tables: fused to RotaryEmbed",
                    "wrong", lambda: _rope_module("hf"),
                    nondeterministic=("heads after the first are uninitialised memory, so "
                                      "the error changes from run to run")),
            Variant("workaround", "the same rotation with half-width tables: not fused",
                    "right", lambda: _rope_module("half"), prepare=_rope_half_tables),
        ),
        why=("pnnx fuses the rotate_half pattern into RotaryEmbed. With no op that pins a "
             "batch axis, every input gets batch_index 233 and the q blob is 4-D "
             "(c=1, d=H, h=T, w=D); RotaryEmbed handles only the first head and leaves "
             "the rest of its output uninitialised."),
        offending=(r"^RotaryEmbed\s",),
        offending_text="RotaryEmbed rope_0 3 1 q cos sin out0 0=0  (all inputs batch_index=233)",
        upstream=("Tencent/ncnn PR #6407", "Tencent/ncnn#6833 (a different RotaryEmbed issue, fixed here)"),
    ),
    ReproCase(
        id="int-arith-before-embed", number="6b",
        title="integer arithmetic on ids before Embed is done in float on int32 bits",
        construct="emb(ids + 5) with int32 ids",
        make_inputs=_inputs_ids, trace_lengths=(7, 5), run_length=9, seed=111,
        input_names=("ids (T,) int32 in [0, 27)",),
        variants=(
            Variant("bug", "Embedding(32, 8) of ids + 5", "wrong", lambda: _embed_module("add")),
            Variant("workaround", "add the offset on the host, Embedding(32, 8) of ids",
                    "right", lambda: _embed_module("plain"), prepare=_offset_on_host),
        ),
        why=("ncnn has no integer BinaryOp/Clip: the add runs in float on the int32 bit "
             "patterns of the ids, and Embed then reads the resulting float bits as "
             "indices, which picks wrong (clamped) rows."),
        offending=(r"^(BinaryOp|Clip|UnaryOp)\s.*\bin0\b",),
        offending_text="BinaryOp add_0 1 1 in0 1 0=0 1=1 2=5.0  ->  Embed embed_0 1 1 1 out0 ...",
        upstream=(),
    ),
    ReproCase(
        id="sdpa-is-causal", number="6c",
        title="scaled_dot_product_attention(is_causal=True) is not converted",
        construct="F.scaled_dot_product_attention(q, k, v, is_causal=True)",
        make_inputs=_inputs_hidden32, trace_lengths=(7, 5), run_length=9, seed=112,
        input_names=("x (1,T,32) hidden states",),
        variants=(
            Variant("bug", "SDPA with is_causal=True", "load_fail",
                    lambda: _attn_module("is_causal")),
            Variant("workaround", "additive causal mask (0 / -inf) built on the host, fed as input",
                    "right", lambda: _attn_module("mask"), prepare=_causal_mask_on_host),
        ),
        why=("pnnx's SDPA conversion refuses is_causal=True (and dropout != 0), so the op "
             "stays as F.scaled_dot_product_attention, which ncnn does not have; the causal "
             "mask has to be an explicit input."),
        offending=(r"^F\.scaled_dot_product_attention\s",),
        offending_text="F.scaled_dot_product_attention F.scaled_dot_product_attention_N 3 1 q k v out",
        upstream=("Tencent/ncnn#6402 (related SDPA mask backend fix)",),
    ),
    ReproCase(
        id="dead-conv-output", number="6d",
        title="an unused Conv1d output makes pnnx segfault in pass_level1",
        construct="b = conv2(x) computed and never used",
        make_inputs=_inputs_c4, trace_lengths=(10, 8), run_length=13, seed=113,
        input_names=("x (1,4,T)",),
        variants=(
            Variant("bug", "a second Conv1d whose output is dead", "export_fail",
                    lambda: _dead_conv_module("dead")),
            Variant("workaround", "the dead branch removed before tracing", "right",
                    lambda: _dead_conv_module("live")),
        ),
        why=("The traced graph keeps the call of the unused Conv module; pnnx crashes "
             "(SIGSEGV) in pass_level1 while converting it, before writing any file."),
        offending=(),
        offending_text="(no files: pnnx exits with -11 after '############# pass_level1')",
        upstream=(),
    ),
    ReproCase(
        id="axis-into-batch", number="7",
        title="a real axis moved into ncnn's batch n (Reshape 12/13) breaks a level-sum MatMul",
        construct="conv(ones(1,K) @ emb(ids).reshape(K, -1)) with level-major ids (K*T,)",
        make_inputs=_inputs_levels, trace_lengths=(7, 5), run_length=9, seed=114,
        input_names=("ids (3*T,) int32, level-major, pre-offset into a fused (96, 8) table",),
        variants=(
            Variant("bug", "fused Embedding, level sum as ones(1,3) @ e.reshape(3,-1), Conv1d",
                    "wrong", lambda: _level_sum_module("matmul")),
            Variant("workaround", "time-major ids (T*3,) from the host, reshape(-1,3,8).sum(1)",
                    "right", lambda: _level_sum_module("time_major"), prepare=_time_major),
        ),
        why=("The Conv1d downstream pins a batch axis, and pnnx propagates it back through "
             "the MatMul onto the level axis of e.reshape(3, -1); since PR #6784 a Reshape "
             "with 12/13 params moves the levels into ncnn's n, so the MatMul runs once per "
             "level instead of contracting the levels."),
        offending=(r"^Reshape\s.*\b1[23]=(?!233\b)\d+",),
        offending_text="Reshape reshape_N 1 1 a b 12=233 13=0 6=...   (12/13 != 233)",
        upstream=("Tencent/ncnn PR #6784", "Tencent/ncnn PR #6032"),
    ),
    ReproCase(
        id="size-after-transpose-folded", number="8",
        title="a size read after a transpose is folded into a constant of the first trace",
        construct="(y / (torch.ones(1) * y.shape[1])).sum(1) with y = x.transpose(1, 2)",
        make_inputs=_inputs_c4, trace_lengths=(10, 8), run_length=13, seed=115,
        input_names=("x (1,4,T)",),
        variants=(
            Variant("bug", "mean over time as a sum divided by ones(1) * the length",
                    "wrong", lambda: _folded_length_module("length")),
            Variant("workaround", "y.mean(1)", "right", lambda: _folded_length_module("mean")),
        ),
        why=("pnnx folds `torch.ones(1) * y.shape[1]` into a constant (pnnx.Attribute "
             "pnnx_fold_*) when y is a transpose's output, although that dim is dynamic (`?`) "
             "in its own IR; without the transpose it keeps `size(@0,2)`. The dynamic graph "
             "divides by the first trace's length (10) at every length."),
        offending=(r"^MemoryData\s+pnnx_fold_",),
        offending_text="MemoryData pnnx_fold_n.1 0 1 n 0=1   (holds 10, the first trace's length)",
        upstream=(),
        notes=("Met in Qwen3-TTS's ECAPA speaker encoder: AttentiveStatisticsPooling's "
               "`_length_to_mask(lengths * seq_length)` and `mask.sum()` are folded at T=300, "
               "so the mask and the mean are frozen there. `paramsurgery lower` reads such a "
               "constant back as the input's extent when pnnx's X_ncnn.py (or --traced-len) "
               "shows it is the traced length."),
    ),
    ReproCase(
        id="one-d-through-batch-axis", number="9",
        title="a 1-D tensor computed in the graph gets Reshape 12=0 6=\"0n\": read from ncnn's n",
        construct="w @ (x[0, 0] * 2).reshape(1, 1, -1) next to conv(x) (a (T,) tensor as arange(T))",
        make_inputs=_inputs_c4, trace_lengths=(7, 5), run_length=9, seed=116,
        input_names=("x (1,4,T)",),
        variants=(
            Variant("bug", "a (T,) slice reshaped to (1,1,T) for a MatMul", "wrong",
                    lambda: _one_d_positions_module("one_d")),
            Variant("workaround", "x[:, 0:1] * 2: the same values with their leading dims",
                    "right", lambda: _one_d_positions_module("keep_dims")),
        ),
        why=("pnnx gives the 1-D tensor batch axis 0 and writes a Reshape that moves its "
             "elements out of ncnn's batch n (12=0 13=233 6=\"0n\"); ncnn holds a 1-D blob's "
             "elements in w, so the Reshape fails at run time (extract returns -1). Mimi's "
             "RoPE positions meet the same belief as a pair (Reshape 0=1 1=1, then 12=2 "
             "6=\"0n,1,1\") that keeps one of the T positions (paramsurgery fix-batch-reshape, "
             "lint PS015)."),
        offending=(r"^Reshape\s.*\b12=0\b.*\b13=233\b.*6=\"?0n",),
        offending_text='Reshape slice_0_ncnnreshape 1 1 a b 12=0 13=233 6="0n"',
        upstream=("Tencent/ncnn PR #6784",),
    ),
    ReproCase(
        id="bool-mask-buffer", number="10",
        title="a bool constant (GPT-2's causal `bias` buffer) becomes MemoryData 21=3, a load "
              "type ncnn does not have",
        construct="torch.where(self.bias[:, :, :T, :T], s, finfo.min) with a bool tril buffer "
                  "(GPT-2's eager attention)",
        make_inputs=_inputs_c4, trace_lengths=(7, 5), run_length=9, seed=117,
        input_names=("x (1,4,T)",),
        variants=(
            Variant("bug", "softmax(where(bool tril[..., :T, :T], s, finfo.min))", "load_fail",
                    lambda: _bool_mask_module("bool")),
            Variant("workaround", "softmax(s + additive float mask[..., :T, :T]) (0 / finfo.min)",
                    "right", lambda: _bool_mask_module("additive")),
        ),
        why=("pnnx writes a bool tensor constant as MemoryData with load type 21=3, one byte "
             "per value; ncnn's ModelBin has load types 0 (tagged) and 1 (raw float32) only "
             "(\"ModelBin load type 3 not implemented\"), so load_model fails; the "
             "torch.where reading it is not converted either (ncnn has no select layer). "
             "paramsurgery fix repairs both: fix-bool-table writes the table as float32 0/1 "
             "(lint PS020), lower rewrites where(m, s, finfo.min) as min(s, (2m-1)*FLT_MAX)."),
        offending=(r"^MemoryData\s.*\b21=3\b", r"^torch\.where\s"),
        offending_text="MemoryData bias 0 1 3 0=16 1=16 2=1 21=3  ->  torch.where torch.where_9 3 1 11 9 10 12",
        upstream=(),
    ),
    ReproCase(
        id="ones-padding-mask", number="11",
        title="HF's default all-ones padding mask built in the graph leaves torch.ones, "
              "Tensor.expand, Tensor.to and Tensor.masked_fill",
        construct="m = torch.ones(b, T)[:, None, None, :].expand(b, 1, T, T); "
                  "(1 - m).masked_fill((1 - m).bool(), finfo.min) as SDPA's mask (BERT "
                  "called without attention_mask)",
        make_inputs=_inputs_hidden32, trace_lengths=(7, 5), run_length=9, seed=118,
        input_names=("x (1,T,32) hidden states",),
        variants=(
            Variant("bug", "SDPA with the all-ones padding mask built from T in the graph",
                    "load_fail", lambda: _attn_module("ones_mask")),
            Variant("workaround", "no mask (the all-ones mask masks nothing: attn_mask=None)",
                    "right", lambda: _attn_module("mask")),
        ),
        why=("torch.ones with a size from the dynamic T, the expand of it and the bool cast "
             "have no ncnn conversion, and masked_fill has none either (ncnn has no select "
             "layer); the mask is all zero at every length. paramsurgery fix proves it 0 at "
             "every length and drops it from the SDPA (lower: adding 0.0 is exact); the HF fix "
             "is to pass no mask, or an additive float mask as an input."),
        offending=(r"^torch\.ones\s", r"^Tensor\.expand\s", r"^Tensor\.masked_fill\s"),
        offending_text="torch.ones torch.ones_0 1 1 a b  ->  Tensor.expand ...  ->  "
                       "Tensor.masked_fill ...",
        upstream=(),
    ),
    ReproCase(
        id="folded-position-table", number="12",
        title="a static export folds a learned position table to the traced rows "
              "(MemoryData 1=T): no rows for another length",
        construct="proj(x + wpe(torch.arange(T))) (GPT-2's learned positions; BERT's "
                  "position_ids[:, :T]; Whisper's embed_positions.weight[:T])",
        make_inputs=_inputs_hidden8, trace_lengths=(7,), run_length=9, seed=119,
        input_names=("x (1,T,8) hidden states",),
        variants=(
            Variant("bug", "wpe(arange(T)) added to x, static export at T=7, run at T=9",
                    "wrong", lambda: _position_table_module("arange")),
            Variant("slice", "wpe.weight[:T] (the same rows), static export at T=7, run at T=9",
                    "wrong", lambda: _position_table_module("slice")),
            Variant("dynamic", "wpe(arange(T)) exported with inputshape2= (T=7 and 5), run at "
                    "T=9", "load_fail", lambda: _position_table_module("arange"),
                    trace_lengths=(7, 5)),
            Variant("workaround", "wpe.weight[:T] exported with inputshape2= (T=7 and 5): the "
                    "whole table and a Crop to the length", "right",
                    lambda: _position_table_module("slice"), trace_lengths=(7, 5)),
        ),
        why=("A static trace evaluates `wpe(arange(T))` (or `weight[:T]`) at the traced T and "
             "pnnx folds the result into a constant: MemoryData pnnx_fold_* 0=8 1=7, the first "
             "7 rows only; the 16-row table is gone from the file, so no rewrite of the graph "
             "can give row 7 or later. With inputshape2= pnnx keeps the table: `weight[:T]` "
             "becomes MemoryData wpe 1=16 + Crop to the input's length (right at every length "
             "up to 16); `wpe(arange(T))` becomes torch.arange + Embed, and torch.arange has "
             "no ncnn layer (paramsurgery lower writes it as a table). What would fix it "
             "upstream: fold `table[arange(T)]` into `MemoryData table + Crop to T` in a "
             "static export too (as the dynamic export does for `weight[:T]`), or keep the "
             "Embed. paramsurgery fix (dynamize) crops the folded rows at run time, exact up "
             "to the traced length, and refuses a longer reference naming the table."),
        offending=(r"^MemoryData\s+pnnx_fold_\S+\s.*\b1=7\b", r"^torch\.arange\s"),
        offending_text="MemoryData pnnx_fold_21 0 1 1 0=8 1=7   (the traced rows; static)  "
                       "/  torch.arange torch.arange_1 1 1 a b   (inputshape2)",
        upstream=(),
        notes=("The zoo's GPT-2 (`pnnx_fold_position_embeds.1`), BERT (`pnnx_fold_63`) and "
               "Whisper encoder (`pnnx_fold_57`) static exports: fix refuses a reference at "
               "T=11 naming the table; a --pair traced at T=10 gives rows 0..9, exact for "
               "lengths up to 10."),
    ),
    ReproCase(
        id="folded-interpolated-table", number="13",
        title="a static export folds a position grid interpolated to the traced image size: "
              "other sizes need other values",
        construct="patch(x) + F.interpolate(pos, size=patch(x).shape[2:], mode='bicubic') "
                  "(ViT's interpolate_pos_encoding)",
        make_inputs=_inputs_image, trace_lengths=(12,), run_length=20, seed=120,
        input_names=("x (1,3,N,N) image, N = the length",),
        variants=(
            Variant("bug", "static export at 12x12 (a 3x3 patch grid), run at 20x20", "wrong",
                    _interpolated_table_module),
            Variant("workaround", "the same model exported with inputshape2= (12x12 and 8x8): "
                    "the 4x4 grid and an Interp sized by the patch grid", "right",
                    _interpolated_table_module, trace_lengths=(12, 8)),
        ),
        why=("A static trace computes the interpolated grid at the traced size and pnnx folds "
             "it (MemoryData pnnx_fold_* 0=3 1=3 2=8): at another image size every position "
             "has another interpolated value, not a row of this one, so neither a crop nor a "
             "second static export (its grid is not this one's first rows) extends it. With "
             "inputshape2= pnnx keeps the learned grid and writes Interp with the size of the "
             "patch grid as a second input: right at every size. What would fix it upstream: "
             "keep `F.interpolate` of a parameter with a size read from an input as Interp in "
             "a static export too."),
        offending=(r"^MemoryData\s+pnnx_fold_\S+\s.*\b0=3\b.*\b1=3\b",),
        offending_text="MemoryData pnnx_fold_p.1 0 1 2 0=3 1=3 2=8   (the grid at the traced size)",
        upstream=(),
        notes=("The zoo's ViT static export (`pnnx_fold_83`, 1=26: 25 patches and the CLS "
               "row): fix refuses it naming the table; its inputshape2= export fixes right."),
    ),
    ReproCase(
        id="tied-linear", number="14",
        title="a tied lm_head (its weight the embedding's) becomes a 2-input Linear: ncnn "
              "InnerProduct over the table + BinaryOp, and a TypeError in pnnx's torch export",
        construct="head(norm(x)) with head.weight = emb.weight (tie_word_embeddings: GPT-2, "
                  "Gemma)",
        make_inputs=_inputs_hidden8, trace_lengths=(7, 5), run_length=9, seed=121,
        input_names=("x (1,T,8) hidden states",),
        variants=(
            Variant("bug", "Linear(8, 32) whose weight is the Embedding(32, 8)'s", "wrong",
                    lambda: _tied_head_module(True)),
            Variant("workaround", "the head's weight a copy of the embedding's (untied before "
                    "tracing)", "right", lambda: _tied_head_module(False)),
        ),
        why=("TorchScript reads the shared parameter once, as the embedding's attribute, and "
             "pnnx writes the head as `nn.Linear model.head 2 1 table x y` (the weight as a "
             "first input). Its ncnn conversion makes the table the data: MemoryData emb + "
             "InnerProduct over the table (a (32, 32) product) + BinaryOp bias_N adding the "
             "hidden states as if they were a bias; its torch export (model_pnnx.py) calls "
             "`self.head(v_table, v_x)` and raises `TypeError: Linear.forward() takes 2 "
             "positional arguments but 3 were given`. What would fix it upstream: read a "
             "Linear's weight from an attribute input as its weight (a Gemm / InnerProduct "
             "of x by that table). paramsurgery fix repairs the ncnn graph (fix-tied-linear, "
             "lint PS401); compare --pnnx covers the blobs before the head."),
        offending=(r"^BinaryOp\s+bias_\d+\s",),
        offending_text="MemoryData emb 0 1 t 0=8 1=32 -> InnerProduct linear_1 1 1 t a 0=32 "
                       "2=256 -> BinaryOp bias_2 2 1 a h out0 0=0",
        upstream=(),
    ),
)


def case_ids() -> list[str]:
    return [c.id for c in CASES]


def get_case(case_id: str) -> ReproCase:
    for c in CASES:
        if c.id == case_id:
            return c
    raise KeyError(f"unknown repro case {case_id!r}; known: {', '.join(case_ids())}")


# --------------------------------------------------------------------------- data

def raw_inputs(case: ReproCase, length: int) -> Arrays:
    """The case's inputs at `length`, before any host-side preprocessing."""
    return case.make_inputs(length, np.random.default_rng((case.seed, length)))


def case_inputs(case: ReproCase, variant: Variant, length: int) -> Arrays:
    """The inputs fed to `variant` at `length` (host preprocessing applied)."""
    inputs = raw_inputs(case, length)
    return variant.prepare(inputs) if variant.prepare is not None else inputs


def trace_inputs(case: ReproCase, variant: Variant) -> list[Arrays]:
    """The example inputs pnnx traces with: one set per trace length (two = dynamic)."""
    return [case_inputs(case, variant, length) for length in case.lengths(variant)[0]]


def build_module(case: ReproCase, variant: Variant):
    """The variant's torch module with the case's deterministic weights, in eval mode."""
    import torch

    if variant.factory is None:
        raise ValueError(f"{case.id}/{variant.name} has no torch model")
    torch.manual_seed(case.seed)
    return variant.factory().eval()


def to_torch(inputs: Arrays) -> tuple:
    import torch

    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in inputs)


def _flatten(out: Any) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def torch_reference(case: ReproCase, variant: Variant, inputs: Arrays,
                    module: Any = None) -> Arrays:
    """Torch outputs of the variant on `inputs` (already preprocessed), as float32 arrays."""
    import torch

    module = module if module is not None else build_module(case, variant)
    with torch.no_grad():
        out = module(*to_torch(inputs))
    return [np.ascontiguousarray(t.detach().cpu().numpy()) for t in _flatten(out)]


def equivalent_to_bug(case: ReproCase, variant: Variant, length: int) -> float:
    """Max abs difference between `variant`'s torch output (on its preprocessed inputs)
    and the bug model's output on the raw inputs: a workaround must compute the same."""
    raw = raw_inputs(case, length)
    ref = torch_reference(case, case.variant("bug"), raw)
    got = torch_reference(case, variant, case_inputs(case, variant, length))
    if len(ref) != len(got):
        return math.inf
    worst = 0.0
    for a, b in zip(ref, got):
        if a.shape != b.shape:
            return math.inf
        if a.size:
            worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b))))
    return worst


def ncnn_feeds(inputs: Sequence[np.ndarray], batch_index: Mapping[str, int]) -> dict[str, Feed]:
    """`in0`, `in1`, ... Feeds with the batch axis pnnx chose; integer inputs become int32
    (ncnn Embed reads int32 bit patterns)."""
    feeds: dict[str, Feed] = {}
    for i, arr in enumerate(inputs):
        name = f"in{i}"
        a = np.asarray(arr)
        if np.issubdtype(a.dtype, np.integer):
            a = a.astype(np.int32)
        elif a.dtype != np.float32:
            a = a.astype(np.float32)
        feeds[name] = Feed(np.ascontiguousarray(a), int(batch_index.get(name, NO_BATCH)))
    return feeds


def ncnn_fetches(n_outputs: int, batch_index: Mapping[str, int]) -> list[Fetch]:
    return [Fetch(f"out{i}", int(batch_index.get(f"out{i}", NO_BATCH))) for i in range(n_outputs)]


def offending_lines(case: ReproCase, param_text: str) -> list[str]:
    """The `.ncnn.param` lines matching the case's offending patterns (whitespace squeezed)."""
    pats = [re.compile(p) for p in case.offending]
    found = []
    for line in param_text.splitlines()[2:]:
        squeezed = " ".join(line.split())
        if any(p.search(squeezed) for p in pats):
            found.append(squeezed)
    return found


def unsupported_layers(param_text: str) -> list[str]:
    """Layers whose type is a pnnx/torch op rather than an ncnn layer."""
    pat = re.compile(_UNSUPPORTED)
    return [" ".join(ln.split()) for ln in param_text.splitlines()[2:] if pat.search(ln)]


# --------------------------------------------------------------------------- verdict

@dataclass
class Comparison:
    status: str                   # right | wrong
    max_abs: float | None         # None when shapes differ
    message: str
    shapes: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (ncnn, torch)


def compare_outputs(got: Sequence[np.ndarray], ref: Sequence[np.ndarray],
                    atol: float = ATOL, rtol: float = RTOL) -> Comparison:
    """RIGHT iff every output allclose(atol, rtol) to torch. ncnn drops unit axes
    (no batch axis, 1-sized leading dims), so shapes match when they agree after removing
    size-1 dims; any other difference (a missing crop, an empty Mat) is WRONG."""
    shapes = [(list(np.shape(g)), list(np.shape(r))) for g, r in zip(got, ref)]
    if len(got) != len(ref):
        return Comparison("wrong", None, f"{len(got)} outputs, torch has {len(ref)}", shapes)
    worst = 0.0
    msgs = []
    ok = True
    shape_mismatch = False
    for i, (g, r) in enumerate(zip(got, ref)):
        g = np.asarray(g)
        r = np.asarray(r)
        if [d for d in g.shape if d != 1] != [d for d in r.shape if d != 1] or g.size != r.size:
            ok = False
            shape_mismatch = True
            msgs.append(f"out{i}: ncnn shape {list(g.shape)} vs torch {list(r.shape)}")
            continue
        g = g.reshape(r.shape).astype(np.float64)
        r64 = r.astype(np.float64)
        if g.size:
            finite = np.isfinite(g) & np.isfinite(r64)
            diff = np.where(finite, np.abs(g - r64), np.where(g == r64, 0.0, np.inf))
            err = float(np.max(diff))
            worst = max(worst, err)
        if not np.allclose(g, r64, atol=atol, rtol=rtol, equal_nan=False):
            ok = False
            msgs.append(f"out{i}: max abs error {err:.3g}")
    return Comparison("right" if ok else "wrong", None if shape_mismatch else worst,
                      "; ".join(msgs), shapes)
