"""Build fixtures/handpatch/: real pnnx exports whose graphs keep the leftovers that users
patch by hand today, for `remove-passthrough` and `lower`.

    python tools/fixtures_handpatch.py [--only NAME ...] [--out DIR]

Each model is a small torch module exported with the pnnx binary (fp16=0, dynamic: traced
at T=7 and T=5). Files per model: model.ncnn.param, model.ncnn.bin, model.pnnx.param,
meta.json (input shapes and dtypes, the batch axes pnnx chose, its warnings, the leftover
layer types), ref.npz (inputs `in<i>` and torch outputs `out<i>` at T=13, a length no trace
used), so the default tests check ncnn against torch without torch installed.

- `leftovers`: an adaLN-style block using ops pnnx leaves unconverted (`aten::addcmul`
  with and without `value`, `aten::addcdiv`, `aten::lerp` with a scalar weight,
  `aten::frac`, `aten::clamp_min`, `F.softsign`, `F.tanhshrink`, `F.softmin`,
  `aten::mT`, `torch.narrow`) -> `paramsurgery lower`.
- `declined`: leftovers with no exact ncnn equivalent (`aten::lerp` with a tensor weight,
  `aten::exp2`) next to a lowerable one -> `lower` refuses; `--partial` lowers the rest.
- `casts`: `ids.to(torch.int64)` before an Embedding and a float64 round trip: `Tensor.to`
  layers that keep ncnn's values -> `paramsurgery remove-passthrough`.
- `casts_int_float`: `ids.float()` ... `.long()` before an Embedding: casts that change the
  values -> refused.

Needs torch 2.13.0 (CPU) and pnnx 20261020.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "fixtures" / "handpatch"
TRACE = (7, 5)
REF_LEN = 13


def _models():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Leftovers(nn.Module):
        """x (1, T, 16), y (1, T, 16) -> (1, T, 8)."""

        def __init__(self):
            super().__init__()
            self.mod = nn.Linear(16, 32)
            self.proj = nn.Linear(16, 16)

        def forward(self, x, y):
            shift, scale = self.mod(y).chunk(2, -1)
            h = torch.addcmul(shift, x, scale + 1)              # aten::addcmul, value 1
            h = torch.addcmul(h, x, y, value=0.5)                # aten::addcmul, value 0.5
            h = torch.addcdiv(h, y, x.abs() + 1, value=-0.25)    # aten::addcdiv
            h = torch.lerp(h, self.proj(x), 0.25)                # aten::lerp, scalar weight
            h = h * 2 + torch.frac(h * 3)                        # aten::frac
            n = h.abs().amax(-1, keepdim=True)
            h = h / torch.clamp_min(n, 1e-3)                     # aten::clamp_min
            h = F.softsign(h * 4).mT.mT + F.tanhshrink(h) + F.softmin(h, -1)  # aten::mT
            return torch.narrow(h, -1, 3, 8)                     # torch.narrow

    class Declined(nn.Module):
        """x, y, w (1, T, 8) -> (1, T, 8)."""

        def forward(self, x, y, w):
            h = torch.lerp(x, y, w.sigmoid())                    # tensor weight: declined
            h = torch.exp2(h) + torch.frac(x)                    # exp2: declined; frac: ok
            return h

    class Casts(nn.Module):
        """ids (1, T) int32, x (1, T, 16) -> (1, T, 16)."""

        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(20, 16)
            self.lin = nn.Linear(16, 16)

        def forward(self, ids, x):
            e = self.emb(ids.to(torch.int64))                    # Tensor.to i32 -> i64
            h = self.lin(e + x).double()                         # Tensor.to f32 -> f64
            return (h.float() * 2).relu()                        # Tensor.to f64 -> f32

    class CastsIntFloat(Casts):
        def forward(self, ids, x):
            e = self.emb((ids.float() + 0.0).long())             # i32 -> f32, f32 -> i64
            return self.lin(e + x)

    return dict(leftovers=Leftovers, declined=Declined, casts=Casts,
                casts_int_float=CastsIntFloat)


def make_inputs(name: str, length: int) -> list[np.ndarray]:
    rng = np.random.default_rng((sum(map(ord, name)), length))
    if name.startswith("casts"):
        return [rng.integers(0, 20, (1, length)).astype(np.int32),
                rng.standard_normal((1, length, 16)).astype(np.float32)]
    if name == "declined":
        return [rng.standard_normal((1, length, 8)).astype(np.float32) for _ in range(3)]
    return [rng.standard_normal((1, length, 16)).astype(np.float32) for _ in range(2)]


def build_module(name: str):
    import torch

    torch.manual_seed(sum(map(ord, name)))
    m = _models()[name]().eval()
    with torch.no_grad():  # jitter: pnnx de-duplicates equal constants
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return m


def reference(name: str, length: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Inputs and torch outputs at `length` (needs torch)."""
    import torch

    m = build_module(name)
    xs = make_inputs(name, length)
    with torch.no_grad():
        y = m(*[torch.from_numpy(x) for x in xs])
    ys = [y] if not isinstance(y, (tuple, list)) else list(y)
    return xs, [t.float().numpy() for t in ys]


def export(name: str, out: Path) -> dict:
    import torch

    from paramsurgery.repro.pnnx_export import export_with_pnnx
    from paramsurgery.core.layer_types import is_converter_leftover
    from paramsurgery.core.npz import write_npz

    m = build_module(name)
    ins = tuple(torch.from_numpy(x) for x in make_inputs(name, TRACE[0]))
    ins2 = tuple(torch.from_numpy(x) for x in make_inputs(name, TRACE[1]))
    dest = out / name
    with tempfile.TemporaryDirectory() as tmp:
        r = export_with_pnnx(m, ins, Path(tmp), "model", example_inputs2=ins2)
        if not r.ok:
            raise SystemExit(f"pnnx failed on {name}: {r.stderr_tail()}")
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        for src in (r.ncnn_param, r.ncnn_bin, r.pnnx_param):
            shutil.copyfile(src, dest / src.name)
    xs, ys = reference(name, REF_LEN)
    arrays = {f"in{i}": x for i, x in enumerate(xs)}
    arrays.update({f"out{i}": y for i, y in enumerate(ys)})
    write_npz(dest / "ref.npz", arrays)
    types = [ln.split()[0] for ln in (dest / "model.ncnn.param").read_text().splitlines()[2:]
             if ln.strip()]
    meta = {"model": name, "trace_lengths": list(TRACE), "ref_length": REF_LEN,
            "inputs": [[list(x.shape), str(x.dtype)] for x in xs],
            "input_batch_index": r.input_batch_index,
            "output_batch_index": r.output_batch_index,
            "leftovers": sorted({t for t in types if is_converter_leftover(t)}),
            "pnnx_warnings": r.warnings, "pnnx_command": r.command[1:]}
    (dest / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in _models():
        if args.only and name not in args.only:
            continue
        meta = export(name, args.out)
        print(name, meta["leftovers"], meta["input_batch_index"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
