"""Prefill + single-step torch references for the decoder stacks (kv-cache parity tests).

The same patched HF layers as the `ported` fixtures run with a transformers `DynamicCache`:
a prefill of PREFILL tokens, then STEPS single-token steps. Per call the npz stores exactly
what was fed and what came out (keys `prefill_*`, `step1_*` .. `step3_*`):

- `*_embeds` (1, Lq, hidden) float32;
- `*_mask` (Lq, past + Lq) additive float32 (0 / -inf): causal for the prefill, zeros for a
  single step. torch was fed `mask[None, None]`; an ncnn SDPA with a kv cache takes it 2-D
  (w = past + Lq, h = Lq);
- `*_cos`, `*_sin` (1, Lq, head_dim): rows for positions past .. past+Lq-1, full width
  `cat(freqs, freqs)` (ncnn RotaryEmbed reads the first half of each row);
- `*_out` (1, Lq, hidden): the stack output after the final norm.

`full_out` is the uncached forward over all PREFILL + STEPS tokens with a causal mask; the
builder asserts the cached outputs equal it, so the cache handling is checked in torch too.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

from . import decoder_stack, masks, rope
from .inputs import Inputs

PREFILL = 6
STEPS = 3
KV_INPUT_SEED = 11
CACHE_EQUIV_TOL = 1e-5


def _run(stack: Any, hidden: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
         sin: torch.Tensor, cache: Any, past: int) -> torch.Tensor:
    positions = torch.arange(past, past + hidden.shape[1])
    for layer in stack.layers:
        hidden = layer(hidden, attention_mask=mask, position_embeddings=(cos, sin),
                       past_key_values=cache, use_cache=True, cache_position=positions)[0]
    return stack.norm(hidden)


def build(which: str, size: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from transformers import DynamicCache

    stack, cfg = decoder_stack.stack_parts(which, size)
    hd, theta = cfg.head_dim, float(cfg.rope_theta)
    total = PREFILL + STEPS
    embeds = Inputs(KV_INPUT_SEED).normal((1, total, cfg.hidden_size))
    arrays: dict[str, np.ndarray] = {}
    outs = []
    with contextlib.ExitStack() as ctx, torch.no_grad():
        for make in decoder_stack.ported_contexts(which, cfg):
            ctx.enter_context(make())
        cache = DynamicCache()
        calls = [("prefill", 0, PREFILL)] + [(f"step{i + 1}", PREFILL + i, 1) for i in range(STEPS)]
        for name, past, length in calls:
            x = embeds[:, past:past + length]
            mask = masks.cached_step(length, past)
            cos, sin = rope.rope_tables(length, hd, theta, start=past)
            out = _run(stack, x, mask[None, None], cos, sin, cache, past)
            outs.append(out)
            for key, val in (("embeds", x), ("mask", mask), ("cos", cos), ("sin", sin),
                             ("out", out)):
                arrays[f"{name}_{key}"] = val.numpy().astype(np.float32)
        cos, sin = rope.rope_tables(total, hd, theta)
        full = stack(embeds, masks.causal(total)[None, None], cos, sin)
    arrays["full_out"] = full.numpy().astype(np.float32)
    diff = float((torch.cat(outs, dim=1) - full).abs().max())
    if not diff <= CACHE_EQUIV_TOL:
        raise AssertionError(f"{which}: cached steps differ from the full forward by {diff}")
    convention = {
        "prefill_length": PREFILL,
        "steps": STEPS,
        "cache": "transformers DynamicCache through the HF layers (same patches as ported)",
        "cached_vs_full_max_abs": diff,
        "mask_shapes": {"prefill": [PREFILL, PREFILL], "step": [1, "past+1"]},
        "mask_values": "additive float32, 0 attend / -inf blocked; torch fed mask[None, None]",
        "rope": {"theta": theta, "head_dim": hd,
                 "tables": "(1, Lq, head_dim) rows for positions past..past+Lq-1, "
                           "cat(freqs, freqs)"},
        "num_layers": len(stack.layers),
        "num_kv_heads": cfg.num_key_value_heads,
        "num_attention_heads": cfg.num_attention_heads,
        "hidden_size": cfg.hidden_size,
        "embeds_seed": KV_INPUT_SEED,
    }
    return arrays, convention
