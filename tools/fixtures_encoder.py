#!/usr/bin/env python
"""Regenerate fixtures/encoder/: small graphs in the forms pnnx 20261020 writes for Hugging
Face transformers (checked against the tiny GPT-2 export of issue 24), with seeded
weights, so every file is byte-identical on every run.

- `tied_head.param/.bin`: a tied lm_head (`lm_head.weight is wte.weight`) as pnnx writes
  it: the table (`MemoryData`, 12 rows of 8) as an InnerProduct's input, the hidden states
  added as if a bias (lint PS017, `fix-tied-linear`).

- `learned_pos.ncnn.param/.ncnn.bin` (+ `.pnnx.param`, `.ref.npz`, `.ref.io.json`): a
  BERT-like static export traced at T=6 (input (1, 6, 8)): a uniform token-type table and
  a learned position table (MemoryData of 6 rows, added), an all-zero attention mask folded
  at 6x6, Gemm/Reshape sizes baked at 6; the reference (numpy, the same formulas) at T=4;
  `learned_pos_long.ref.npz` at T=9, longer than the table (`dynamize` refuses it).

- `broadcast_table.ncnn.param/.ncnn.bin` (+ `.pnnx.param`, `broadcast_table_ncnn.py`): the
  dynamic Whisper form of `embed_positions.weight[:T]` added to the hidden states: the table
  (16 rows of 8) cropped to the input's length, then pnnx's broadcast helper
  `Reshape add_0_ncnnreshape0 0=8 1=1` (every position gets row 0; lint PS019,
  `fix-lossy-reshape`); traced at T=6 (`torch.rand(1, 6, 8)` in pnnx's script).

    python tools/fixtures_encoder.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import paramsurgery
from paramsurgery.core.npz import write_npz
from paramsurgery.formats.weights import set_weights

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "encoder"
VOCAB, HIDDEN = 12, 8

TIED_HEAD = f"""7767517
5 6
Input                    in0                      0 1 in0
MemoryData               model.transformer.wte    0 1 1 0={HIDDEN} 1={VOCAB}
LayerNorm                ln_6                     1 1 in0 2 0={HIDDEN} 1=1.000000e-5 2=1
InnerProduct             linear_7                 1 1 1 3 0={VOCAB} 1=0 2={VOCAB * HIDDEN}
BinaryOp                 bias_8                   2 1 3 2 out0 0=0
"""


def tied_head() -> None:
    g = paramsurgery.loads(TIED_HEAD)
    rng = np.random.default_rng(24)
    table = rng.standard_normal(VOCAB * HIDDEN).astype(np.float32)
    set_weights(g.layer("model.transformer.wte"), {"data": table})
    set_weights(g.layer("ln_6"), {"gamma": (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
                                  "beta": (0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)})
    set_weights(g.layer("linear_7"), {"weight": table.copy()})  # pnnx writes the copy
    paramsurgery.save(g, OUT / "tied_head.param", bin=OUT / "tied_head.bin")
    print(f"wrote {OUT / 'tied_head.param'}, {OUT / 'tied_head.bin'}")


T0 = 6  # the traced length of learned_pos
LEARNED_POS = f"""7767517
14 16
Input                    in0                      0 1 in0
MemoryData               pnnx_fold_61             0 1 1 0={HIDDEN} 1={T0}
MemoryData               pnnx_fold_63             0 1 2 0={HIDDEN} 1={T0}
BinaryOp                 add_0                    2 1 in0 1 3 0=0
BinaryOp                 add_1                    2 1 3 2 4 0=0
MemoryData               pnnx_fold_attention_mask.1 0 1 5 0={T0} 1={T0} 2=1
Gemm                     gemm_0                   1 1 4 6 10=4 2=0 3=1 4=0 5=1 6=1 7={T0} 8={HIDDEN} 9={HIDDEN}
Reshape                  reshape_1                1 1 6 7 0=4 1=2 2={T0}
Permute                  transpose_2              1 1 7 8 0=2
Split                    splitncnn_0              1 3 8 9 10 11
SDPA                     sdpa_3                   4 1 9 10 11 5 12 5=1
Permute                  transpose_4              1 1 12 13 0=2
Reshape                  reshape_5                1 1 13 14 0={HIDDEN} 1={T0}
ReLU                     relu_6                   1 1 14 out0
"""
LEARNED_POS_PNNX = f"""7767517
2 1
pnnx.Input               pnnx_input_0             0 1 0 #0=(1,{T0},{HIDDEN})f32
pnnx.Output              pnnx_output_0            1 0 0 #0=(1,{T0},{HIDDEN})f32
"""


def learned_pos_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(6)
    return {"type_row": rng.standard_normal(HIDDEN).astype(np.float32),
            "pos": rng.standard_normal((T0, HIDDEN)).astype(np.float32),
            "B": (rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32),
            "C": (0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)}


def learned_pos_forward(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    """What the graph means at any length T ≤ 6, for x of (T, 8) (float64)."""
    t = x.shape[0]
    h = x.astype(np.float64) + w["type_row"] + w["pos"][:t]
    y = h @ w["B"].T.astype(np.float64) + w["C"]
    q = y.reshape(t, 2, 4).transpose(1, 0, 2)  # (heads, T, head_dim)
    s = q @ q.transpose(0, 2, 1) / np.sqrt(4.0)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.maximum((p @ q).transpose(1, 0, 2).reshape(t, HIDDEN), 0)


def learned_pos() -> None:
    import json

    g = paramsurgery.loads(LEARNED_POS)
    w = learned_pos_weights()
    set_weights(g.layer("pnnx_fold_61"), {"data": np.tile(w["type_row"], T0)})
    set_weights(g.layer("pnnx_fold_63"), {"data": w["pos"].reshape(-1)})
    set_weights(g.layer("pnnx_fold_attention_mask.1"), {"data": np.zeros(T0 * T0, np.float32)})
    set_weights(g.layer("gemm_0"), {"B": w["B"], "C": w["C"].reshape(1, -1)})
    stem = OUT / "learned_pos"
    paramsurgery.save(g, f"{stem}.ncnn.param", bin=f"{stem}.ncnn.bin")
    (OUT / "learned_pos.pnnx.param").write_text(LEARNED_POS_PNNX)
    io = {"inputs": [{"blob": "in0", "key": "input_x", "batch_index": 0}],
          "outputs": [{"blob": "out0", "key": "output_y", "batch_index": 0}]}
    for name, t in (("learned_pos", 4), ("learned_pos_long", 9)):
        x = np.random.default_rng(100 + t).standard_normal((t, HIDDEN)).astype(np.float32)
        y = learned_pos_forward(x, w) if t <= T0 else np.zeros((t, HIDDEN))
        write_npz(OUT / f"{name}.ref.npz", {"input_x": x[None],
                                            "output_y": y.astype(np.float32)[None]})
        (OUT / f"{name}.ref.io.json").write_text(json.dumps(io, indent=1, sort_keys=True) + "\n")
    print(f"wrote {stem}.ncnn.param, .ncnn.bin, .pnnx.param, .ref.npz (T=4), "
          f"learned_pos_long.ref.npz (T=9)")


BROADCAST_TABLE = f"""7767517
7 8
Input                    in0                      0 1 in0
MemoryData               encoder.embed_positions  0 1 1 0={HIDDEN} 1=16
Split                    splitncnn_0              1 2 in0 2 3
Crop                     slice1_0                 2 1 1 3 4 19="0" 20="1h" 21="0"
Reshape                  add_0_ncnnreshape0       1 1 4 5 0={HIDDEN} 1=1
BinaryOp                 add_0                    2 1 2 5 6 0=0
ReLU                     relu_1                   1 1 6 out0
"""
BROADCAST_TABLE_PNNX = f"""7767517
5 4
pnnx.Input               pnnx_input_0             0 1 0 #0=(1,?,{HIDDEN})f32
pnnx.Attribute           encoder.embed_positions  0 1 1 @data=(16,{HIDDEN})f32 #1=(16,{HIDDEN})f32
Tensor.slice             Tensor.slice_0           1 1 1 2 dim=0 start=0 step=1 end=? #1=(16,{HIDDEN})f32 #2=(?,{HIDDEN})f32
pnnx.Expression          pnnx_expr_0              2 1 0 2 3 expr=relu(add(@0,@1)) #0=(1,?,{HIDDEN})f32 #2=(?,{HIDDEN})f32 #3=(1,?,{HIDDEN})f32
pnnx.Output              pnnx_output_0            1 0 3 #3=(1,?,{HIDDEN})f32
"""
BROADCAST_TABLE_SCRIPT = f"""import numpy as np
import ncnn
import torch

def test_inference():
    torch.manual_seed(0)
    in0 = torch.rand(1, 6, {HIDDEN}, dtype=torch.float)
    out = []

    with ncnn.Net() as net:
        net.load_param("broadcast_table.ncnn.param")
        net.load_model("broadcast_table.ncnn.bin")

        with net.create_extractor() as ex:
            ex.input("in0", ncnn.Mat(in0.numpy(), batch_index=0).clone())

            _, out0 = ex.extract("out0")
            out.append(torch.from_numpy(out0.numpy(batch_index=0)))

    return out[0]
"""


def broadcast_table() -> None:
    g = paramsurgery.loads(BROADCAST_TABLE)
    table = np.random.default_rng(16).standard_normal(16 * HIDDEN).astype(np.float32)
    set_weights(g.layer("encoder.embed_positions"), {"data": table})
    stem = OUT / "broadcast_table"
    paramsurgery.save(g, f"{stem}.ncnn.param", bin=f"{stem}.ncnn.bin")
    (OUT / "broadcast_table.pnnx.param").write_text(BROADCAST_TABLE_PNNX)
    (OUT / "broadcast_table_ncnn.py").write_text(BROADCAST_TABLE_SCRIPT)
    print(f"wrote {stem}.ncnn.param, .ncnn.bin, .pnnx.param, broadcast_table_ncnn.py")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tied_head()
    learned_pos()
    broadcast_table()


if __name__ == "__main__":
    main()
