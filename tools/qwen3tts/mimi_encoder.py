"""mimi_encoder: 24 kHz wav (1, 1, L) -> 512-d latents at 12.5 Hz (qwen3-tts.md §5 #10).
The split-RVQ encode (cdist + argmin) is host code in every port (pnnx leaves
`torch.argmax`), so both variants stop at the latents, as `MimiModel._encode_frame` does
right before `self.quantizer.encode`.

ported (reference port export_mimi.py): every `MimiConv1d` as `conv(F.pad(x, (pad_total, 0),
mode))` -- exact when L is a multiple of 1920, which makes every extra pad 0 -- and the
transformer layers inlined with an explicit `F.scaled_dot_product_attention`, mask and RoPE
tables as inputs (HF derives RoPE from `position_ids` inside the attention). The mask is
plain causal: transformers 4.57.3's `MimiTransformerModel` uses `create_causal_mask`, so
its sliding window (250) is not applied (qwen3-tts.md §6.11).
raw: the HF encode path as it is: `encoder(wav)` (extra padding from `torch.ceil` on the
traced length, buffers as tensors), `encoder_transformer(...)` (in-graph positions, RoPE,
the HF attention class picked at construction), `downsample` (replicate pad). Like the codec
decoder, the causal mask is passed in as a prepared 4-D mask (HF returns such a mask as-is):
the HF mask builder cannot be traced (`RAW_TRACE_NOTE`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import masks, patches, rope, sources
from .inputs import Inputs
from .patched_call import PatchedCall
from .spec import VariantSpec

HOP = 1920                        # samples per 12.5 Hz latent frame
LENGTHS = (25, 13, 20)            # latent frames (wav = frames*1920): 48000 / 24960 as the port
RAW_TRACE_NOTE = ("torch.jit.trace of the unmodified encode path (no mask argument) fails before "
                  "pnnx runs: RuntimeError unordered_map::at in transformers masking_utils "
                  "(vmapped packed-sequence mask built from position_ids); the raw fixture "
                  "passes the prepared 4-D causal mask instead")


def _conv_static(self: nn.Module, hidden_states: torch.Tensor, padding_cache=None) -> torch.Tensor:  # noqa: ANN001
    return self.conv(F.pad(hidden_states, (int(self.padding_total), 0), mode=self.pad_mode))


class MimiEncoderPorted(nn.Module):
    def __init__(self, encoder: nn.Module, layers: nn.ModuleList, downsample: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.layers = layers
        self.downsample = downsample

    def forward(self, wav: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(wav).transpose(1, 2)                   # (1, T25, hidden)
        for layer in self.layers:
            attn = layer.self_attn
            residual = hidden
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(1, -1, attn.num_heads, attn.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(1, -1, attn.num_key_value_heads, attn.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(1, -1, attn.num_key_value_heads, attn.head_dim).transpose(1, 2)
            q, k = patches.plain_rotary(q, k, cos, sin)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
            o = o.transpose(1, 2).reshape(1, -1, attn.num_heads * attn.head_dim)
            hidden = residual + layer.self_attn_layer_scale(attn.o_proj(o))
            residual = hidden
            hidden = residual + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(hidden)))
        return self.downsample(hidden.transpose(1, 2))              # (1, hidden, T25/2)


class MimiEncoderRaw(nn.Module):
    """`MimiModel._encode_frame` up to the quantizer (padding_cache None, no streaming)."""

    def __init__(self, encoder: nn.Module, transformer: nn.Module, downsample: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.transformer = transformer
        self.downsample = downsample

    def forward(self, wav: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        emb = self.encoder(wav)
        out = self.transformer(emb.transpose(1, 2), attention_mask=mask, return_dict=True)
        return self.downsample(out[0].transpose(1, 2))


def build(size: str) -> list[VariantSpec]:
    model = sources.get("mimi", size)
    cfg = model.config
    from transformers.models.mimi import modeling_mimi as mm

    hd, theta = cfg.head_dim, float(cfg.rope_theta)
    inp = Inputs()
    t1, t2, tr = LENGTHS
    wav = {t: inp.normal((1, 1, t * HOP), 0.1) for t in (t1, t2, tr)}

    def ported_inputs(t: int) -> tuple[torch.Tensor, ...]:
        frames25 = 2 * t
        cos, sin = rope.rope_tables(frames25, hd, theta)
        return wav[t], masks.causal(frames25)[None, None], cos, sin

    ported_wrapper = PatchedCall(
        MimiEncoderPorted(model.encoder, model.encoder_transformer.layers, model.downsample),
        [lambda: patches.swapped(mm.MimiConv1d, "forward", _conv_static)])
    common = dict(module="mimi_encoder", output_names=["latents"], config_part="mimi",
                  length_axis_note="12.5 Hz latent frames (wav samples = frames*1920; the "
                                   "transformer runs at 25 Hz, 2*frames)",
                  trace_length=t1, trace_length2=t2, ref_length=tr)
    ported = VariantSpec(
        variant="ported", wrapper=ported_wrapper,
        trace_inputs=ported_inputs(t1), trace_inputs2=ported_inputs(t2),
        ref_inputs=ported_inputs(tr), input_names=["wav", "mask", "cos", "sin"],
        constructs=["MimiConv1d: conv(F.pad(x, (padding_total, 0), pad_mode)), no extra pad "
                    "(L % 1920 == 0)",
                    "transformer layers inlined: explicit F.scaled_dot_product_attention, "
                    "plain RoPE with (1,T,hd) tables, causal mask input",
                    "downsample: replicate left pad via F.pad(mode='replicate')"],
        extra={"rope_theta": theta, "head_dim": hd,
               "mask": "causal (T25, T25) as (1,1,T25,T25); HF applies no sliding window"},
        **common)

    def raw_inputs(t: int) -> tuple[torch.Tensor, ...]:
        return wav[t], masks.causal(2 * t)[None, None]

    raw = VariantSpec(
        variant="raw", wrapper=MimiEncoderRaw(model.encoder, model.encoder_transformer,
                                              model.downsample),
        trace_inputs=raw_inputs(t1), trace_inputs2=raw_inputs(t2), ref_inputs=raw_inputs(tr),
        input_names=["wav", "mask"], extra={"trace_note": RAW_TRACE_NOTE},
        constructs=["HF MimiEncoder (extra padding from torch.ceil on the traced length)",
                    f"HF MimiTransformerModel ({type(model.encoder_transformer.layers[0].self_attn).__name__}),"
                    " in-graph positions and RoPE",
                    "HF downsample MimiConv1d (replicate pad)",
                    "causal mask given as a prepared 4-D input"],
        **common)

    def hf_check() -> float:
        with torch.no_grad():
            emb = model.encoder(wav[tr])
            h = model.encoder_transformer(emb.transpose(1, 2), return_dict=True)[0]
            ref = model.downsample(h.transpose(1, 2))
            return float((ported_wrapper(*ported.ref_inputs) - ref).abs().max())

    ported.hf_check = hf_check
    return [ported, raw]
