#!/usr/bin/env python
"""Regenerate fixtures/encoder/: small graphs in the forms pnnx 20261020 writes for Hugging
Face transformers (checked against the tiny GPT-2 export of issue 24), with seeded
weights, so every file is byte-identical on every run.

- `tied_head.param/.bin`: a tied lm_head (`lm_head.weight is wte.weight`) as pnnx writes
  it: the table (`MemoryData`, 12 rows of 8) as an InnerProduct's input, the hidden states
  added as if a bias (lint PS017, `fix-tied-linear`).

    python tools/fixtures_encoder.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import paramsurgery
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


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tied_head()


if __name__ == "__main__":
    main()
