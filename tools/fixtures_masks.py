#!/usr/bin/env python
"""Regenerate fixtures/masks/: attention masks as pnnx folds them in a static export of an
HF decoder (`torch.full((T, T), finfo.min).triu(1)` → `MemoryData pnnx_fold_attention_mask
0=T 1=T 2=1`), in front of SDPA layers reading q/k/v from inputs (numpy (heads, T, D)).
The graphs are written by hand below; the values are computed, so the .bin files are
byte-identical on every run.

- causal_sdpa{6,8}: the causal mask at T=6 and T=8 (a `--pair`), read by two SDPAs through
  a Split;
- padding_sdpa6: a mask that is not causal (the last key masked for every query): refused.

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


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    write("causal_sdpa6", 6, causal(6))
    write("causal_sdpa8", 8, causal(8))
    write("padding_sdpa6", 6, padding(6))


if __name__ == "__main__":
    main()
