#!/usr/bin/env python
"""Regenerate fixtures/fold_constants/: a RoPE-style table pnnx left as MemoryData → Reshape →
Permute → Reshape in front of a BinaryOp (the graph is written by hand below; the table's
values are seeded, so the .bin is byte-identical on every run).

    python tools/fixtures_fold_constants.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import paramsurgery
from paramsurgery.formats.weights import set_weights

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "fold_constants"
PARAM = """7767517
7 8
Input                    in0                      0 1 in0
MemoryData               pnnx_fold_cos            0 1 1 0=64 1=12
Reshape                  view_0                   1 1 1 2 0=16 1=4 2=12
Permute                  permute_1                1 1 2 3 0=2
Reshape                  view_2                   1 1 3 4 0=16 1=48
BinaryOp                 mul_3                    2 1 in0 4 5 0=2
ReLU                     relu_4                   1 1 5 out0
"""


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    g = paramsurgery.loads(PARAM)
    table = np.random.default_rng(7).standard_normal(64 * 12).astype(np.float32)
    set_weights(g.layer("pnnx_fold_cos"), {"data": table})
    paramsurgery.save(g, OUT / "rope_table.param", bin=OUT / "rope_table.bin")
    print(f"wrote {OUT / 'rope_table.param'}, {OUT / 'rope_table.bin'}")


if __name__ == "__main__":
    main()
