#!/usr/bin/env python
"""Regenerate fixtures/precision/: a small CNN with one planted layer that reduced precision
breaks (ncnn's docs/developer-guide/layer-feat-mask.md: "since the weight value of conv1 is
very large, fp16 accumulation may cause numerical overflow").

    python tools/fixtures_precision.py

`planted.param` / `.bin`: Input 3x16x16 → conv0 (3x3, 16 channels in ± pairs: channel 2k+1
is exactly -(channel 2k), scaled ×16) → `conv_huge` (1x1, every weight HUGE + r with r ~
N(0, 1): the pairs cancel the HUGE part exactly, the output is r·x) → ReLU → conv2 (3x3) →
global average pooling → `fc_huge` (InnerProduct 8→16, weights ±2^20) → fc (InnerProduct
16→10).

- bf16 stores weights with 8 significant bits (steps of 16 at 2048), which wipes out r:
  `conv_huge` breaks, keeping it in fp32 (`31=4`) repairs the output; ±2^20 is exact in
  bf16, so `fc_huge` is harmless there.
- fp16's largest value is 65504: `fc_huge`'s weights overflow (on x86 ncnn stores
  InnerProduct weights in fp16 with F16C, converting with round-toward-zero: they saturate
  at 65504, the output shrinks 16-fold; the convolutions stay fp32 there), keeping it in
  fp32 (`31=3`) repairs the output. Where fp16 storage covers the convolutions too (ARM),
  `conv_huge` overflows as well (2048 × |x| > 65504 for |x| > 32).

`planted.inputs.npz`: one seeded input (`in0`). Every value is seeded: the files are
byte-identical on every run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import paramsurgery
from paramsurgery.core.npz import write_npz
from paramsurgery.formats.weights import set_weights

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "precision"
HUGE = 2048.0
PARAM = """7767517
9 9
Input                    in0                      0 1 in0 0=16 1=16 2=3
Convolution              conv0                    1 1 in0 c0 0=16 1=3 4=1 5=1 6=432
Convolution              conv_huge                1 1 c0 c1 0=8 1=1 5=1 6=128
ReLU                     relu                     1 1 c1 r1
Convolution              conv2                    1 1 r1 c2 0=8 1=3 4=1 5=1 6=576
ReLU                     relu2                    1 1 c2 r2
Pooling                  gap                      1 1 r2 p 0=1 4=1
InnerProduct             fc_huge                  1 1 p h 0=16 1=1 2=128
InnerProduct             fc                       1 1 h out0 0=10 1=1 2=160
"""


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(27)
    g = paramsurgery.loads(PARAM)
    half = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 16 / np.sqrt(27)
    w0 = np.stack([half, -half], axis=1).reshape(16, 3, 3, 3)
    b_half = rng.standard_normal(8).astype(np.float32)
    b0 = np.stack([b_half, -b_half], axis=1).reshape(16)
    set_weights(g.layer("conv0"), {"weight": w0.reshape(-1), "bias": b0})
    w1 = (HUGE + rng.standard_normal((8, 16))).astype(np.float32)
    set_weights(g.layer("conv_huge"), {"weight": w1.reshape(-1),
                                       "bias": rng.standard_normal(8).astype(np.float32)})
    w2 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) / np.sqrt(72)
    set_weights(g.layer("conv2"), {"weight": w2.reshape(-1),
                                   "bias": rng.standard_normal(8).astype(np.float32) * 0.1})
    signs = np.where(rng.standard_normal((16, 8)) > 0, 1.0, -1.0).astype(np.float32)
    set_weights(g.layer("fc_huge"), {"weight": (float(2 ** 20) * signs).reshape(-1),
                                     "bias": np.zeros(16, np.float32)})
    w3 = rng.standard_normal((10, 16)).astype(np.float32) / 4
    set_weights(g.layer("fc"), {"weight": w3.reshape(-1),
                                "bias": rng.standard_normal(10).astype(np.float32) * 0.1})
    paramsurgery.save(g, OUT / "planted.param", bin=OUT / "planted.bin")
    x = rng.standard_normal((3, 16, 16)).astype(np.float32)
    write_npz(OUT / "planted.inputs.npz", {"in0": x})
    print(f"wrote {OUT}/planted.param, planted.bin, planted.inputs.npz")


if __name__ == "__main__":
    main()
