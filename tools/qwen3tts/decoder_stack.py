"""talker_decoder and predictor_decoder: the HF decoder layers + final norm, looped by a
wrapper that takes the embeddings, an additive mask and the RoPE tables as inputs
(reference port export_decoder.py; qwen3-tts.md §5 #3, #5).

ported: inside the port's patches -- GQA via `repeat_interleave(dim=-3)` (both stacks) and
plain RoPE with (1, T, head_dim) cos/sin (talker; its HF attention does interleaved M-RoPE).
raw: the same HF layers with the HF defaults: `sdpa` attention, which with a mask calls
`repeat_kv` (5-D expand + reshape), and for the talker the M-RoPE tables the HF rotary
module produces, (3, 1, T, head_dim).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import masks, patches, rope, sources
from .inputs import Inputs
from .patched_call import PatchedCall
from .spec import VariantSpec

LENGTHS = (37, 5, 9)   # reference port traces T=37 and T=5; 9 is the untraced check length


class DecoderStack(nn.Module):
    """`h = layer(h, attention_mask=mask, position_embeddings=(cos, sin))[0]` per layer,
    then the final RMSNorm; only the layers and the norm are registered (no parent)."""

    def __init__(self, layers: nn.ModuleList, norm: nn.Module) -> None:
        super().__init__()
        self.layers = layers
        self.norm = norm

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=(cos, sin))[0]
        return self.norm(hidden)


def stack_parts(which: str, size: str) -> tuple[DecoderStack, Any]:
    """The layer loop over the seeded source model's layers, and that model's config."""
    talker = sources.get("talker", size)
    if which == "talker_decoder":
        model = talker.model
    else:
        model = talker.code_predictor.model
    return DecoderStack(model.layers, model.norm), model.config


def ported_contexts(which: str, config: Any) -> list:
    """Patch contexts of the ported variant (entered by PatchedCall on every call)."""
    name = patches.register_gqa_attention()
    ctx = [lambda: patches.attention_impl([config], name)]
    if which == "talker_decoder":
        ctx.append(patches.talker_plain_rope)
    return ctx


def raw_contexts(config: Any) -> list:
    # the HF default, pinned so a ported trace in the same process cannot leak into it
    return [lambda: patches.attention_impl([config], "sdpa")]


def convention(config: Any) -> dict[str, Any]:
    return {
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "rope_theta": config.rope_theta,
        "rope_tables": "cos/sin = cat(freqs, freqs), full head_dim width, "
                       "freqs[t, i] = t / theta**(2i/head_dim), shape (1, T, head_dim)",
        "mask": "additive float32, 0 = attend, -inf = blocked; fed as (1, 1, T, T)",
    }


def build(which: str, size: str) -> list[VariantSpec]:
    stack, cfg = stack_parts(which, size)
    hidden, hd, theta = cfg.hidden_size, cfg.head_dim, float(cfg.rope_theta)
    inp = Inputs()
    t1, t2, tr = LENGTHS
    x = {t: inp.normal((1, t, hidden)) for t in (t1, t2, tr)}

    def plain(t: int) -> tuple[torch.Tensor, ...]:
        cos, sin = rope.rope_tables(t, hd, theta)
        return x[t], masks.causal(t)[None, None], cos, sin

    def hf_tables(t: int) -> tuple[torch.Tensor, ...]:
        if which == "talker_decoder":
            cos, sin = rope.mrope_tables(t, hd, theta)
        else:
            cos, sin = rope.rope_tables(t, hd, theta)
        return x[t], masks.causal(t)[None, None], cos, sin

    names = ["embeds", "mask", "cos", "sin"]
    common = dict(module=which, input_names=names, output_names=["hidden"],
                  config_part="talker" if which == "talker_decoder" else "predictor",
                  length_axis_note="tokens (prefill length)", trace_length=t1,
                  trace_length2=t2, ref_length=tr, extra={"convention": convention(cfg)})
    ported_constructs = ["layer loop over HF layers + norm",
                         "GQA: k/v repeat_interleave(rep, dim=-3) then F.scaled_dot_product_attention"]
    if which == "talker_decoder":
        ported_constructs.append("plain RoPE (x*cos + rotate_half(x)*sin) with (1,T,hd) tables "
                                 "instead of interleaved M-RoPE")
    raw_constructs = ["layer loop over HF layers + norm",
                      "HF sdpa attention with a mask: repeat_kv (expand + reshape)"]
    if which == "talker_decoder":
        raw_constructs.append("HF interleaved M-RoPE on (3,1,T,hd) tables (mrope_section "
                              f"{cfg.rope_scaling['mrope_section']})")
    ported = VariantSpec(
        variant="ported", wrapper=PatchedCall(stack, ported_contexts(which, cfg)),
        trace_inputs=plain(t1), trace_inputs2=plain(t2), ref_inputs=plain(tr),
        constructs=ported_constructs, **common)
    raw = VariantSpec(
        variant="raw", wrapper=PatchedCall(stack, raw_contexts(cfg)),
        trace_inputs=hf_tables(t1), trace_inputs2=hf_tables(t2), ref_inputs=hf_tables(tr),
        constructs=raw_constructs, **common)

    def hf_check() -> float:
        with torch.no_grad():
            return float((ported.wrapper(*ported.ref_inputs) - raw.wrapper(*raw.ref_inputs))
                         .abs().max())

    ported.hf_check = hf_check
    return [ported, raw]
