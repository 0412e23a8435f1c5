"""The reference port's export patches (qwen3-tts.md §6), applied without editing qwen_tts.

Function/method swaps are context managers that restore the original on exit, so the same
model object serves the `raw` variant (HF code untouched) and the `ported` variant (traced
inside the context). Weight folds (SnakeBeta) replace submodules of a *copy*.

Each patch is exact for the case the port uses it in (checked numerically against the
unpatched HF forward by the builders):
- plain RoPE for the talker: the three M-RoPE position streams are identical in TTS, so
  M-RoPE == plain RoPE; the interleaved M-RoPE code (`x[..., 1:60:3] = ...`) would leave
  `Tensor.slice` step 3 + `Tensor.slice_copy` (load fails).
- GQA via `repeat_interleave(rep, dim=-3)`: the pattern pnnx fuses into one GQA `SDPA`
  (HF `repeat_kv`'s 5-D expand + reshape leaves `Tensor.expand` + `pnnx.Expression`, and
  `repeat_interleave(dim=1)` stays `torch.repeat_interleave`; both fail to load).
- no extra causal-conv padding: every codec-decoder conv has stride 1, so the `math.ceil`
  extra pad is always 0; computed from the traced size it makes pnnx abort at inputshape2.
- speaker pooling for one full-length utterance: plain mean/std (the length mask is all
  ones) broadcast with `x*0 + stat` instead of `arange`/`lt`/`repeat(seq_len)`/`masked_fill`;
  Res2Net `torch.chunk` as static channel slices.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

GQA_ATTENTION = "paramsurgery_gqa_sdpa"


@contextlib.contextmanager
def swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Temporarily replace attribute `name` of `owner` (module, class or object)."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


# --------------------------------------------------------------------------- attention

def gqa_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: torch.Tensor | None, dropout: float = 0.0,
             scaling: float | None = None, **_: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: k/v heads repeated with dim=-3 (what pnnx fuses
    into ncnn SDPA's native GQA), mask passed through, output (B, T, H, D) like HF."""
    rep = query.shape[1] // key.shape[1]
    if rep > 1:
        key = key.repeat_interleave(rep, dim=-3)
        value = value.repeat_interleave(rep, dim=-3)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                         scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register_gqa_attention() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register(GQA_ATTENTION, gqa_sdpa)
    return GQA_ATTENTION


@contextlib.contextmanager
def attention_impl(configs: list[Any], name: str) -> Iterator[None]:
    """Set `_attn_implementation` on every given config for the duration (HF attention
    modules read it at forward time)."""
    old = [c._attn_implementation for c in configs]
    for c in configs:
        c._attn_implementation = name
    try:
        yield
    finally:
        for c, o in zip(configs, old):
            c._attn_implementation = o


# --------------------------------------------------------------------------- RoPE

def plain_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 *_: Any, **__: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """HF `apply_rotary_pos_emb` with cos/sin (B, T, D): `x*cos + rotate_half(x)*sin`
    (pnnx fuses this into `RotaryEmbed`)."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)

    def rot(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


@contextlib.contextmanager
def talker_plain_rope() -> Iterator[None]:
    from qwen_tts.core.models import modeling_qwen3_tts as m

    with swapped(m, "apply_multimodal_rotary_pos_emb", plain_rotary):
        yield


# --------------------------------------------------------------------------- causal conv

def _no_extra_padding(self: nn.Module, hidden_state: torch.Tensor) -> int:
    if self.stride != 1:
        raise ValueError("the zero-extra-padding patch is only exact for stride 1")
    return 0


@contextlib.contextmanager
def codec_conv_fixed_padding() -> Iterator[None]:
    from qwen_tts.core.tokenizer_12hz import modeling_qwen3_tts_tokenizer_v2 as m

    with swapped(m.Qwen3TTSTokenizerV2CausalConvNet, "_get_extra_padding_for_conv1d",
                 _no_extra_padding):
        yield


# --------------------------------------------------------------------------- SnakeBeta

class FoldedSnakeBeta(nn.Module):
    """SnakeBeta with exp(alpha), exp(beta) precomputed (the port's fold):
    x + 1/(beta + 1e-9) * sin(alpha * x)^2, alpha/beta shaped (1, C, 1)."""

    def __init__(self, snake: nn.Module) -> None:
        super().__init__()
        self.alpha = nn.Parameter(snake.alpha.detach().exp().reshape(1, -1, 1).clone())
        self.beta = nn.Parameter(snake.beta.detach().exp().reshape(1, -1, 1).clone())
        self.eps = float(snake.no_div_by_zero)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (1.0 / (self.beta + self.eps)) * torch.pow(torch.sin(x * self.alpha), 2)


def fold_snakebeta(model: nn.Module) -> nn.Module:
    """A deep copy of `model` with every SnakeBeta replaced by FoldedSnakeBeta."""
    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ == "SnakeBeta":
                setattr(parent, name, FoldedSnakeBeta(child))
    return model


def folded_codebook(codebook: nn.Module) -> torch.Tensor:
    """EuclideanCodebook's `embedding_sum / cluster_usage.clamp(eps)` computed once (the
    port's fold), so decode is a plain `F.embedding` on a constant table."""
    usage = codebook.cluster_usage.detach().clamp(min=codebook.epsilon)
    return (codebook.embedding_sum.detach() / usage[:, None]).contiguous()


# --------------------------------------------------------------------------- speaker

def _asp_full_length(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    x = hidden_states
    mean = x.mean(dim=2, keepdim=True)
    std = torch.sqrt((x - mean).pow(2).mean(dim=2, keepdim=True).clamp(self.eps))
    attention = torch.cat([x, x * 0 + mean, x * 0 + std], dim=1)
    attention = self.conv(self.tanh(self.tdnn(attention)))
    attention = F.softmax(attention, dim=2)
    mean = (attention * x).sum(2)
    std = torch.sqrt((attention * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(self.eps))
    return torch.cat((mean, std), dim=1).unsqueeze(2)


def _res2net_static_slices(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    # a static int from the module (a width derived from the traced shape would be an
    # expression in the graph)
    width = self.blocks[0].conv.in_channels
    outputs = []
    output_part = hidden_states
    for i in range(self.scale):
        part = hidden_states[:, i * width:(i + 1) * width]
        if i == 0:
            output_part = part
        elif i == 1:
            output_part = self.blocks[i - 1](part)
        else:
            output_part = self.blocks[i - 1](part + output_part)
        outputs.append(output_part)
    return torch.cat(outputs, dim=1)


@contextlib.contextmanager
def speaker_pooling_patch() -> Iterator[None]:
    from qwen_tts.core.models import modeling_qwen3_tts as m

    with swapped(m.AttentiveStatisticsPooling, "forward", _asp_full_length), \
            swapped(m.Res2NetBlock, "forward", _res2net_static_slices):
        yield
