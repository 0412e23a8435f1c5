"""The zoo's families: tiny transformers 4.57.3 models built from their configs (no
download), seeded, and the traceable wrappers pnnx exports.

Every family is a `Family`: how to build the model (`build(attn)`), the wrapper traced
(`wrap(model, entry)`), the example input at a length (`example(n, entry)`), and for the
decoders the token embedding table the `inputs_embeds` entry point is fed from.

Why wrappers: with torch 2.13 + transformers 4.57.3, `torch.jit.trace` of a plain
`model(inputs_embeds=...)` fails inside masking_utils (`RuntimeError: unordered_map::at`).
The decoder wrapper builds the 4-D additive causal mask and the position ids itself (the
4-D mask is passed through by masking_utils); `plain_check` compares it with the plain call
in torch. Whisper's encoder refuses any length but `max_source_positions`: its wrapper runs
the same submodules with the position table cropped to the length (checked against the
plain call at the full length). ViT is traced with `interpolate_pos_encoding=True`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

VOCAB = 32
HIDDEN = 32
HEADS = 4
KV_HEADS = 2
LAYERS = 2
INTER = 32
MAX_POS = 32


def reinit(model: nn.Module, seed: int) -> None:
    """Seeded weights of a scale that makes every layer matter (HF's 0.02 init leaves the
    logits of a tiny model nearly tied, so a greedy decode would hinge on rounding)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if p.ndim >= 2:
                fan_in = p.shape[-1] if p.ndim == 2 else int(p[0].numel())
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:  # norm scales (Gemma's RMSNorm is 1 + w: small values keep it near 1)
                base = 0.0 if "gemma" in type(model).__name__.lower() else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))


class DecoderWrap(nn.Module):
    """`model(inputs_embeds | input_ids, 4-D additive causal mask, position ids)` -> logits."""

    def __init__(self, model: nn.Module, entry: str):
        super().__init__()
        self.model = model
        self.entry = entry

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
        pos = torch.arange(t)[None]
        kw = {"inputs_embeds": x} if self.entry == "embeds" else {"input_ids": x}
        out = self.model(**kw, attention_mask=mask, position_ids=pos, use_cache=False)
        return out.logits


class DecoderKvFormWrap(nn.Module):
    """The kv form: `model(inputs_embeds, mask, position_ids)` -> logits, the additive mask
    (1, 1, T, T) and the positions (1, T) given as inputs (what a kv-cache port feeds)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.model(inputs_embeds=x, attention_mask=mask, position_ids=pos,
                          use_cache=False).logits


class EncoderWrap(nn.Module):
    """BERT: `model(inputs_embeds | input_ids)` -> last hidden state (no padding mask)."""

    def __init__(self, model: nn.Module, entry: str):
        super().__init__()
        self.model = model
        self.entry = entry

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kw = {"inputs_embeds": x} if self.entry == "embeds" else {"input_ids": x}
        return self.model(**kw).last_hidden_state


class WhisperEncoderWrap(nn.Module):
    """Whisper's encoder at any length: conv stem, cropped position table, layers."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        enc = self.encoder
        h = nn.functional.gelu(enc.conv1(feats))
        h = nn.functional.gelu(enc.conv2(h)).permute(0, 2, 1)
        h = h + enc.embed_positions.weight[: h.shape[1]]
        for layer in enc.layers:
            h = layer(h, None, layer_head_mask=None)[0]
        return enc.layer_norm(h)


class ViTWrap(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixels, interpolate_pos_encoding=True).last_hidden_state


@dataclass
class Family:
    name: str
    kind: str                      # "decoder" | "encoder"
    seed: int
    config: Callable[[], Any]      # the transformers config (attn implementation set later)
    constructs: list[str] = field(default_factory=list)
    entries: tuple[str, ...] = ("embeds",)   # + "ids" (input_ids), "kv" (the kv form)
    length_note: str = "sequence length T (tokens)"

    def build(self, attn: str) -> nn.Module:
        import transformers

        cfg = self.config()
        cfg._attn_implementation = attn
        if self.kind == "decoder":
            model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
        elif self.name == "whisper_encoder":
            model = transformers.WhisperModel(cfg).encoder
        elif self.name == "vit":
            model = transformers.ViTModel(cfg, add_pooling_layer=False)
        else:
            model = transformers.AutoModel.from_config(cfg, attn_implementation=attn,
                                                       add_pooling_layer=False)
        model.config._attn_implementation = attn
        reinit(model, self.seed)
        return model.eval()

    def wrap(self, model: nn.Module, entry: str) -> nn.Module:
        if entry == "kv":
            return DecoderKvFormWrap(model).eval()
        if self.kind == "decoder":
            return DecoderWrap(model, entry).eval()
        if self.name == "whisper_encoder":
            return WhisperEncoderWrap(model).eval()
        if self.name == "vit":
            return ViTWrap(model).eval()
        return EncoderWrap(model, entry).eval()

    def example(self, n: int, entry: str, seed: int) -> tuple[torch.Tensor, ...]:
        """The inputs at length `n` (deterministic in (n, entry, seed)); the kv form's are
        (embeds, causal additive mask, positions)."""
        if entry == "kv":
            x = self.example(n, "embeds", seed)[0]
            mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
            return x, mask, torch.arange(n)[None]
        return (self._example(n, entry, seed),)

    def _example(self, n: int, entry: str, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1000 + n)
        if self.name == "whisper_encoder":
            return torch.randn((1, self.config().num_mel_bins, 2 * n), generator=g)
        if self.name == "vit":
            return torch.randn((1, 3, n, n), generator=g)
        if entry == "ids":
            return torch.randint(0, VOCAB, (1, n), generator=g, dtype=torch.int64)
        return torch.randn((1, n, HIDDEN), generator=g)

    def plain_check(self, model: nn.Module, entry: str, n: int, seed: int) -> float:
        """max |wrapper - plain HF call| in torch at length `n`."""
        x = self._example(n, entry, seed)
        with torch.no_grad():
            ours = self.wrap(model, entry)(x)
            if self.kind == "decoder":
                kw = {"inputs_embeds": x} if entry == "embeds" else {"input_ids": x}
                plain = model(**kw, use_cache=False).logits
            elif self.name == "whisper_encoder":
                full = torch.randn((1, self.config().num_mel_bins,
                                    2 * model.config.max_source_positions),
                                   generator=torch.Generator().manual_seed(seed))
                ours = self.wrap(model, entry)(full)
                plain = model(full).last_hidden_state
            elif self.name == "vit":
                plain = model(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state
            else:
                kw = {"inputs_embeds": x} if entry == "embeds" else {"input_ids": x}
                plain = model(**kw).last_hidden_state
        return float((ours - plain).abs().max())


def _common(**extra: Any) -> dict[str, Any]:
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
                num_hidden_layers=LAYERS, intermediate_size=INTER,
                max_position_embeddings=MAX_POS, **extra)


def _llama() -> Any:
    import transformers
    return transformers.LlamaConfig(**_common(num_key_value_heads=KV_HEADS))


def _qwen2() -> Any:
    import transformers
    return transformers.Qwen2Config(**_common(num_key_value_heads=KV_HEADS,
                                              use_sliding_window=False))


def _qwen3() -> Any:
    import transformers
    return transformers.Qwen3Config(**_common(num_key_value_heads=KV_HEADS, head_dim=8,
                                              use_sliding_window=False))


def _mistral() -> Any:
    import transformers
    return transformers.MistralConfig(**_common(num_key_value_heads=KV_HEADS,
                                                sliding_window=None))


def _gemma() -> Any:
    import transformers
    return transformers.GemmaConfig(**_common(num_key_value_heads=1, head_dim=8,
                                              tie_word_embeddings=True))


def _phi3() -> Any:
    import transformers
    return transformers.Phi3Config(**_common(num_key_value_heads=KV_HEADS,
                                             partial_rotary_factor=0.5,
                                             pad_token_id=0, sliding_window=None))


def _gpt_neox() -> Any:
    import transformers
    return transformers.GPTNeoXConfig(**_common(rotary_pct=0.25, use_parallel_residual=True))


def _gpt2() -> Any:
    import transformers
    return transformers.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_head=HEADS,
                                   n_layer=LAYERS, n_inner=INTER, n_positions=MAX_POS)


def _bert() -> Any:
    import transformers
    return transformers.BertConfig(**_common(type_vocab_size=2))


def _whisper() -> Any:
    import transformers
    return transformers.WhisperConfig(vocab_size=VOCAB, num_mel_bins=8, d_model=HIDDEN,
                                      encoder_layers=LAYERS, encoder_attention_heads=HEADS,
                                      encoder_ffn_dim=INTER, decoder_layers=1,
                                      decoder_attention_heads=HEADS, decoder_ffn_dim=INTER,
                                      max_source_positions=16, max_target_positions=16,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      decoder_start_token_id=1)


def _vit() -> Any:
    import transformers
    return transformers.ViTConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                  num_attention_heads=HEADS, intermediate_size=INTER,
                                  image_size=16, patch_size=4, num_channels=3)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", "decoder", 101, _llama, ["rope", "gqa repeat_kv", "rmsnorm", "swiglu"],
           entries=("embeds", "ids", "kv")),
    Family("qwen2", "decoder", 102, _qwen2, ["rope", "gqa repeat_kv", "qkv bias"],
           entries=("embeds", "kv")),
    Family("gpt2", "decoder", 103, _gpt2,
           ["learned positions", "fused QKV (Conv1D)", "layernorm", "gelu"],
           entries=("embeds", "kv")),
    Family("bert", "encoder", 104, _bert, ["learned positions", "token type table", "layernorm"]),
    Family("qwen3", "decoder", 105, _qwen3, ["rope", "gqa repeat_kv", "q/k norm"],
           entries=("embeds", "kv")),
    Family("mistral", "decoder", 106, _mistral, ["rope", "gqa repeat_kv"]),
    Family("gemma", "decoder", 107, _gemma, ["rope", "MQA", "tied lm_head", "embed scaling"],
           entries=("embeds", "kv")),
    Family("whisper_encoder", "encoder", 108, _whisper,
           ["conv stem", "learned positions (cropped)", "layernorm"],
           length_note="encoder length T (mel frames = 2T)"),
    Family("vit", "encoder", 109, _vit, ["patch conv", "interpolated positions", "cls token"],
           length_note="image side in pixels (patches of 4: (n/4)^2 + 1 tokens)"),
    Family("phi3", "decoder", 110, _phi3, ["fused QKV", "fused gate_up", "partial rotary"]),
    Family("gpt_neox", "decoder", 111, _gpt_neox,
           ["fused QKV (interleaved heads)", "partial rotary", "parallel residual"]),
)}

# lengths: traced (static), second trace (static2, inputshape2), untraced references
LENGTHS = {"trace": 7, "trace2": 10, "untraced": (5, 11, 16)}
VIT_LENGTHS = {"trace": 20, "trace2": 28, "untraced": (12, 16, 24)}


def lengths(family: Family) -> dict[str, Any]:
    return VIT_LENGTHS if family.name == "vit" else LENGTHS
