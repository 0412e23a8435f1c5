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

`planted.inputs.npz`: one seeded input (`in0`).

`small_cnn.param` / `.bin` / `.table` (the int8 pass's golden case): Convolution 3x3 →
ConvolutionDepthWise → Convolution 1x1 → global pooling → InnerProduct, seeded weights, and
a calibration table in ncnn2table's format (weight scales as ncnn2table computes them,
fixed input scales). `small_cnn.calib/c{0,1,2}.npz`: seeded calibration inputs.

`seq_rnn.param` / `.bin` (the recurrent and attention int8 case): Input (16 features × 10
steps) → LSTM (24) → GRU (20, bidirectional) → RNN (16) → MultiHeadAttention (self, 2
heads), seeded weights, and its table (ncnn2table's `_param_0..3` weight scales: these
layers need no calibration run); `seq_rnn.calib/c{0,1}.npz`: seeded inputs.

Every value is seeded: the files are byte-identical on every run.
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
    small_cnn(np.random.default_rng(8))
    seq_rnn(np.random.default_rng(31))


SEQ = """7767517
5 5
Input                    in0                      0 1 in0 0=16 1=10
LSTM                     lstm                     1 1 in0 l 0=24 1=1536 2=0
GRU                      gru                      1 1 l g 0=20 1=2880 2=2
RNN                      rnn                      1 1 g r 0=16 1=640 2=0
MultiHeadAttention       mha                      1 1 r out0 0=16 1=2 2=256
"""


def seq_rnn(rng: np.random.Generator) -> None:
    from paramsurgery.formats.weights.schema import layer_reads

    g = paramsurgery.loads(SEQ)
    for layer in g:
        reads = [r for r in layer_reads(layer) or [] if r.required]
        if not reads:
            continue
        # weights ~ N(0, 1/fan_in) (fan_in: a read's innermost dim), biases ~ N(0, 0.01)
        set_weights(layer, {r.role: (rng.standard_normal(r.count).astype(np.float32)
                                     / np.float32(np.sqrt(r.shape[-1] if "bias" not in r.role
                                                          else 1e4)))
                            for r in reads})
    paramsurgery.save(g, OUT / "seq_rnn.param", bin=OUT / "seq_rnn.bin")
    from paramsurgery.passes.quantize_int8 import Int8Table, table_weight_sets

    table = Int8Table()
    for layer in g:
        sets = table_weight_sets(layer)
        if sets:
            table.weights[layer.name], table.more_weights[layer.name] = sets[0], sets[1:]
    (OUT / "seq_rnn.table").write_text(table.format())
    calib = OUT / "seq_rnn.calib"
    calib.mkdir(exist_ok=True)
    for i in range(2):
        write_npz(calib / f"c{i}.npz", {"in0": rng.standard_normal((10, 16)).astype(np.float32)})
    print(f"wrote {OUT}/seq_rnn.param, .bin, .table, seq_rnn.calib/")


SMALL = """7767517
6 6
Input                    in0                      0 1 in0 0=12 1=12 2=3
Convolution              conv0                    1 1 in0 c0 0=8 1=3 4=1 5=1 6=216 9=1
ConvolutionDepthWise     dw1                      1 1 c0 d1 0=8 1=3 4=1 5=1 6=72 7=8 9=1
Convolution              pw2                      1 1 d1 c2 0=16 1=1 5=1 6=128 9=1
Pooling                  gap                      1 1 c2 p 0=1 4=1
InnerProduct             fc                       1 1 p out0 0=5 1=1 2=80
"""


def small_cnn(rng: np.random.Generator) -> None:
    from paramsurgery.passes.quantize_int8 import Int8Table, weight_scales

    g = paramsurgery.loads(SMALL)
    for layer in g:
        if layer.type in ("Input", "Pooling"):
            continue
        p = layer.params
        n_out = int(p.get(0, 0))
        size = int(p.get(2 if layer.type == "InnerProduct" else 6, 0))
        fan_in = size // n_out if layer.type != "ConvolutionDepthWise" else 9
        w = rng.standard_normal(size).astype(np.float32) / np.float32(np.sqrt(fan_in))
        set_weights(layer, {"weight": w, "bias": rng.standard_normal(n_out).astype(np.float32)
                            * np.float32(0.1)})
    paramsurgery.save(g, OUT / "small_cnn.param", bin=OUT / "small_cnn.bin")
    table = Int8Table()
    for layer, scale in zip([x for x in g if x.type != "Input" and x.type != "Pooling"],
                            (40.0, 25.0, 30.0, 60.0)):
        table.weights[layer.name] = weight_scales(layer)
        table.inputs[layer.name] = scale
    (OUT / "small_cnn.table").write_text(table.format())
    calib = OUT / "small_cnn.calib"
    calib.mkdir(exist_ok=True)
    for i in range(3):
        write_npz(calib / f"c{i}.npz", {"in0": rng.standard_normal((3, 12, 12)).astype(np.float32)})
    print(f"wrote {OUT}/small_cnn.param, .bin, .table, small_cnn.calib/")


if __name__ == "__main__":
    main()
