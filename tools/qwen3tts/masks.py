"""Additive float attention masks (0 = attend, -inf = blocked) fed as graph inputs.

In-graph masks built from a dynamic length (`torch.full(...).triu`, `is_causal=True`) do
not convert (pnnx-bugs.md case 6c), so every exported attention takes its mask as an input.
"""

from __future__ import annotations

import torch

NEG = float("-inf")


def causal(length: int) -> torch.Tensor:
    """(length, length): query i sees keys 0..i."""
    return torch.full((length, length), NEG).triu(1)


def sliding_causal(length: int, window: int) -> torch.Tensor:
    """(length, length): query i sees keys i-window+1 .. i (transformers' sliding-window
    overlay `kv_idx > q_idx - window` combined with causality)."""
    q = torch.arange(length)[:, None]
    k = torch.arange(length)[None, :]
    allowed = (k <= q) & (k > q - window)
    return torch.where(allowed, torch.zeros(()), torch.full((), NEG))


def cached_step(query_len: int, past_len: int) -> torch.Tensor:
    """(query_len, past_len + query_len) for a step after `past_len` cached positions:
    causal within the new positions, everything cached visible."""
    m = torch.zeros(query_len, past_len + query_len)
    m[:, past_len:] = causal(query_len)
    return m
