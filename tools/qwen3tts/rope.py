"""RoPE tables fed to the exported nets as inputs (cos/sin are never computed in-graph:
the HF rotary modules derive them from `position_ids` with arange/matmul, which pins them
to the traced length, qwen3-tts.md §6.1, §6.12).

Convention (same as the HF rotary modules, `rope_type="default"`, attention_scaling 1):
`inv_freq[i] = 1 / theta**(2i/head_dim)`, `freqs = pos ⊗ inv_freq` in float32, tables
`cat(freqs, freqs)` of full head_dim width, shape (1, L, head_dim). ncnn `RotaryEmbed`
reads only the first half of each row, so full-width rows work on the CPU.
"""

from __future__ import annotations

import torch


def inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_tables(length: int, head_dim: int, theta: float, start: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (1, length, head_dim) for positions start .. start+length-1."""
    pos = torch.arange(start, start + length, dtype=torch.float32)
    freqs = (inv_freq(head_dim, theta)[:, None] @ pos[None, :]).transpose(0, 1)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None], emb.sin()[None]


def mrope_tables(length: int, head_dim: int, theta: float, start: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The talker's M-RoPE tables as its HF rotary module returns them for text-only input:
    three identical position streams, shape (3, 1, length, head_dim). (TTS never uses
    distinct streams: `get_rope_index` expands one cumsum 3x, qwen3-tts.md §6.1.)"""
    cos, sin = rope_tables(length, head_dim, theta, start)
    return cos[None].expand(3, 1, length, head_dim).contiguous(), \
        sin[None].expand(3, 1, length, head_dim).contiguous()
