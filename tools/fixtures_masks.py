#!/usr/bin/env python
"""Regenerate fixtures/masks/: attention masks as pnnx folds them in a static export of an
HF decoder (`torch.full((T, T), finfo.min).triu(1)` → `MemoryData pnnx_fold_attention_mask
0=T 1=T 2=1`), in front of SDPA layers reading q/k/v from inputs (numpy (heads, T, D)).
The graphs are written by hand below; the values are computed, so the .bin files are
byte-identical on every run.

- causal_sdpa{6,8}: the causal mask at T=6 and T=8 (a `--pair`), read by two SDPAs through
  a Split;
- padding_sdpa6: a mask that is not causal (the last key masked for every query): refused.
- rope6: HF's RoPE cos/sin tables folded at T=6 (`MemoryData pnnx_fold_cos 0=4 1=6 2=1`, θ of
  base 10000, head_dim 4) read by a RotaryEmbed of q (2 heads), with pnnx's traced input
  (`rope6.pnnx.param`) and a numpy reference at T=9 (`rope6.ref.npz`): one trace and a
  reference past the traced rows.

    python tools/fixtures_masks.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import paramsurgery
from paramsurgery.formats.weights import set_weights

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "masks"
NEG = float(np.finfo(np.float32).min)
PARAM = """7767517
9 14
Input                    in0                      0 1 in0
Input                    in1                      0 1 in1
Input                    in2                      0 1 in2
Split                    splitncnn_0              1 2 in0 q0 q1
Split                    splitncnn_2              1 2 in2 v0 v1
MemoryData               pnnx_fold_attention_mask 0 1 m 0={t} 1={t} 2=1
Split                    splitncnn_1              1 2 m m0 m1
SDPA                     sdpa_0                   4 1 q0 in1 v0 m0 a 5=1
SDPA                     sdpa_1                   4 1 q1 a v1 m1 out0 5=1 6=0.5
"""


def causal(t: int) -> np.ndarray:
    return np.triu(np.full((t, t), NEG, dtype=np.float32), 1)


def padding(t: int) -> np.ndarray:
    m = np.zeros((t, t), dtype=np.float32)
    m[:, -1] = NEG
    return m


def write(name: str, t: int, mask: np.ndarray) -> None:
    g = paramsurgery.loads(PARAM.format(t=t))
    set_weights(g.layer("pnnx_fold_attention_mask"), {"data": mask.reshape(-1)})
    paramsurgery.save(g, OUT / f"{name}.param", bin=OUT / f"{name}.bin")
    print(f"wrote {OUT / name}.param, .bin")


ROPE = """7767517
4 4
Input                    in0                      0 1 in0
MemoryData               pnnx_fold_cos            0 1 c 0=4 1=6 2=1
MemoryData               pnnx_fold_sin            0 1 s 0=4 1=6 2=1
RotaryEmbed              rope_0                   3 1 in0 c s out0 0=0
"""
ROPE_PNNX = """7767517
3 2
pnnx.Input               pnnx_input_0             0 1 0 #0=(1,2,6,4)f32
F.rotary                 rope_0                   1 1 0 1 #0=(1,2,6,4)f32 #1=(1,2,6,4)f32
pnnx.Output              pnnx_output_0            1 0 1
"""


def rope_tables(t: int, d: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """HF's float32 computation: inv_freq, p·inv_freq, cat(freqs, freqs), cos/sin."""
    inv = (1.0 / (10000.0 ** (np.arange(0, d, 2, dtype=np.float32) / d))).astype(np.float32)
    freqs = np.arange(t, dtype=np.float32)[:, None] * inv[None, :]
    emb = np.concatenate([freqs, freqs], -1).astype(np.float32)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def rope(x: np.ndarray) -> np.ndarray:
    """RotaryEmbed 0=0 on (heads, T, D): x·cos + rotate_half(x)·sin."""
    cos, sin = rope_tables(x.shape[-2], x.shape[-1])
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
    return (x * cos + rot * sin).astype(np.float32)


def write_rope() -> None:
    g = paramsurgery.loads(ROPE)
    cos, sin = rope_tables(6)
    set_weights(g.layer("pnnx_fold_cos"), {"data": cos.reshape(-1)})
    set_weights(g.layer("pnnx_fold_sin"), {"data": sin.reshape(-1)})
    paramsurgery.save(g, OUT / "rope6.param", bin=OUT / "rope6.bin")
    (OUT / "rope6.pnnx.param").write_text(ROPE_PNNX)
    x = np.random.default_rng(9).standard_normal((1, 2, 9, 4)).astype(np.float32)
    with open(OUT / "rope6.ref.npz", "wb") as f:
        np.savez(f, input_0=x, output_0=rope(x[0])[None])
    print(f"wrote {OUT / 'rope6'}.param, .bin, .pnnx.param, .ref.npz")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    write("causal_sdpa6", 6, causal(6))
    write("causal_sdpa8", 8, causal(8))
    write("padding_sdpa6", 6, padding(6))
    write_rope()


if __name__ == "__main__":
    main()
