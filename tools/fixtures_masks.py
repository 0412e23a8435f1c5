#!/usr/bin/env python
"""Regenerate fixtures/masks/: attention masks as pnnx folds them in a static export of an
HF decoder (`torch.full((T, T), finfo.min).triu(1)` → `MemoryData pnnx_fold_attention_mask
0=T 1=T 2=1`), in front of SDPA layers reading q/k/v from inputs (numpy (heads, T, D)).
The graphs are written by hand below; the values are computed, so the .bin files are
byte-identical on every run.

- causal_sdpa{6,8}: the causal mask at T=6 and T=8 (a `--pair`), read by two SDPAs through
  a Split;
- padding_sdpa6: a mask that is not causal (the last key masked for every query): refused.
- built_causal: the mask a dynamic export builds in the graph from the input's length
  (`torch.full([size(x,1), size(x,1)], finfo.min)` → `aten::triu(·, 1)` → two ExpandDims →
  a Split → HF's crop to each SDPA's key length), its values only in
  `built_causal.pnnx.param`; q/k/v inputs as in causal_sdpa6, x (T, 8) gives the length.
- gqa_batch_k: HF's repeat_kv as pnnx's dynamic export leaves it (k keeps pnnx's batch axis:
  [D, T, G, 1] → ExpandDims 2 → Tensor.expand → Tensor.reshape (1, H, -1, D); v: ExpandDims 1
  → Tensor.expand → Reshape), shapes in `gqa_batch_k.pnnx.param`; H = 4, G = 2, D = 8.
- arange_sdpa: `lower`'s arange over the input's length (`MemoryData 0..63` cropped to in0's
  h) added to q before an SDPA: positions add-kvcache counts from the past.
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


BUILT = """7767517
19 24
Input                    in0                      0 1 in0
Input                    in1                      0 1 in1
Input                    in2                      0 1 in2
Input                    in3                      0 1 in3
Split                    splitncnn_0              1 2 in0 q0 q1
Split                    splitncnn_2              1 2 in2 v0 v1
Split                    splitncnn_3              1 2 in1 k0 k1
pnnx.Expression          pnnx_expr_2              1 1 in3 2
torch.full               torch.full_0             1 1 2 3
pnnx.Expression          pnnx_expr_1              0 1 4
aten::triu               pnnx_0                   2 1 3 4 5
ExpandDims               unsqueeze_0              1 1 5 6 -23303=1,0
ExpandDims               unsqueeze_1              1 1 6 7 -23303=1,1
Split                    splitncnn_1              1 2 7 m0 m1
Crop                     slice1_0                 2 1 m0 k0 c0 19="0" 20="size(@1,2)" 21="2"
SDPA                     sdpa_0                   4 1 q0 k1 v0 c0 a 5=1
Split                    splitncnn_4              1 2 a a0 a1
Crop                     slice1_1                 2 1 m1 a0 c1 19="0" 20="size(@1,2)" 21="2"
SDPA                     sdpa_1                   4 1 q1 a1 v1 c1 out0 5=1 6=0.5
"""
BUILT_PNNX = """7767517
6 5
pnnx.Input               pnnx_input_3             0 1 0 #0=(1,?,8)f32
pnnx.Expression          pnnx_expr_2              1 1 0 2 expr=[size(@0,1),size(@0,1)] #0=(1,?,8)f32
torch.full torch.full_0 1 1 2 3 dtype=None fill_value=-3.40282347e38 $size=2 #3=(?,?)f32
pnnx.Expression          pnnx_expr_1              0 1 4 expr=1
aten::triu               pnnx_0                   2 1 3 4 5 #3=(?,?)f32 #5=(?,?)f32
pnnx.Output              pnnx_output_0            1 0 5
"""
GQA = """7767517
18 21
Input                    in0                      0 1 in0
Input                    in1                      0 1 in1
Input                    in2                      0 1 in2
Reshape                  reshape_k0               1 1 in1 k0 12=0 13=1 6="8,2,0h,1"
Reshape                  reshape_k1               1 1 k0 k1 12=2 13=233 6="8,0n,2,1"
Split                    splitncnn_0              1 2 k1 k2 k3
ExpandDims               unsqueeze_k              1 1 k3 k4 -23303=1,2
pnnx.Expression          pnnx_expr_k              1 1 k2 k5
Tensor.expand            Tensor.expand_k          2 1 k4 k5 k6
Tensor.reshape           Tensor.reshape_k         1 1 k6 k7
Reshape                  reshape_v0               1 1 in2 v0 6="8,2,0h"
Permute                  transpose_v              1 1 v0 v1 0=2
Split                    splitncnn_1              1 2 v1 v2 v3
ExpandDims               unsqueeze_v              1 1 v3 v4 -23303=1,1
pnnx.Expression          pnnx_expr_v              1 1 v2 v5
Tensor.expand            Tensor.expand_v          2 1 v4 v5 v6
Reshape                  reshape_v1               1 1 v6 v7 6="8,0h,4"
SDPA                     sdpa_0                   3 1 in0 k7 v7 out0 6=0.353553385
"""
GQA_PNNX = """7767517
4 4
pnnx.Input               pnnx_input_1             0 1 0 #0=(1,2,?,8)f32
torch.unsqueeze          torch.unsqueeze_k        1 1 0 1 dim=2 $input=0 #0=(1,2,?,8)f32 #1=(1,2,1,?,8)f32
Tensor.expand Tensor.expand_k 2 1 1 2 3 $input=1 $sizes=2 #1=(1,2,1,?,8)f32 #3=(1,2,2,?,8)f32
Tensor.reshape           Tensor.reshape_k         1 1 3 4 shape=(1,4,-1,8) #3=(1,2,2,?,8)f32 #4=(1,4,?,8)f32
"""
ARANGE = """7767517
13 16
Input                    in0                      0 1 in0
Split                    splitncnn_0              1 4 in0 x0 x1 x2 x3
MemoryData               torch.arange_0_table     0 1 tab 0=64
Crop                     torch.arange_0           2 1 tab x0 pos 19="0" 20="1h" 21="0"
Reshape                  reshape_p                1 1 pos pcol 0=1 1=-1
BinaryOp                 add_p                    2 1 x1 pcol xq 0=0
Reshape                  view_q                   1 1 xq q1 0=4 1=2 2=-1
Permute                  permute_q                1 1 q1 q 0=2
Reshape                  view_k                   1 1 x2 k1 0=4 1=2 2=-1
Permute                  permute_k                1 1 k1 k 0=2
Reshape                  view_v                   1 1 x3 v1 0=4 1=2 2=-1
Permute                  permute_v                1 1 v1 v 0=2
SDPA                     sdpa_0                   3 1 q k v out0
"""


def write_text_fixtures() -> None:
    (OUT / "built_causal.param").write_text(BUILT)
    (OUT / "built_causal.pnnx.param").write_text(BUILT_PNNX)
    (OUT / "gqa_batch_k.param").write_text(GQA)
    (OUT / "gqa_batch_k.pnnx.param").write_text(GQA_PNNX)
    print(f"wrote {OUT / 'built_causal'}.param, .pnnx.param, {OUT / 'gqa_batch_k'}.param, "
          f".pnnx.param")


def write_arange() -> None:
    g = paramsurgery.loads(ARANGE)
    set_weights(g.layer("torch.arange_0_table"), {"data": np.arange(64, dtype=np.float32)})
    paramsurgery.save(g, OUT / "arange_sdpa.param", bin=OUT / "arange_sdpa.bin")
    print(f"wrote {OUT / 'arange_sdpa'}.param, .bin")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    write("causal_sdpa6", 6, causal(6))
    write("causal_sdpa8", 8, causal(8))
    write("padding_sdpa6", 6, padding(6))
    write_rope()
    write_text_fixtures()
    write_arange()


if __name__ == "__main__":
    main()
