"""Build the repair-pass fixtures: fixtures/repairs/<model>/<variant>/.

Small torch modules exported with the pnnx binary (fp16=0), each in the forms the repair
passes need:

    static<T>   traced at one length T (the lengths are baked into Crop/Reshape/Gemm params)
    dynamic     traced at two lengths (what `dynamize --pair` must reproduce)
    raw         the form pnnx gets wrong (dequant: stack(parts, 0).sum(0))
    ported      its working twin (dequant: sum(parts))

Files per variant: model.ncnn.param, model.ncnn.bin, model.pnnx.param, meta.json (input
shapes, batch axes pnnx chose, trace lengths, pnnx warnings). Inputs and torch outputs
for the tests are made by `reference()` below at any length (the tests that need torch are
marked slow); `ref.npz` holds inputs + outputs at `REF_LEN`, a length no trace used, so the
default (torch-free) tests can check ncnn numerically.

    python tools/fixtures_repairs.py [--only NAME ...]
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

from paramsurgery.core.npz import write_npz  # noqa: E402

OUT = ROOT / "fixtures" / "repairs"
REF_LEN = 13


# --------------------------------------------------------------------------- models

def _models():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class NegSlice(nn.Module):
        """x[..., :x.shape[-1] - r] after a conv: a static trace bakes the end in."""

        def __init__(self, r=3):
            super().__init__()
            self.r = r
            self.conv = nn.Conv1d(4, 4, 3, padding=2)

        def forward(self, x):
            h = self.conv(x)
            return h[..., 1:h.shape[-1] - self.r] * 2

    class PadCrop(nn.Module):
        """F.pad(x, (l, -r)) after a conv: a crop of r at the end (and a pad of l)."""

        def __init__(self, r=3):
            super().__init__()
            self.r = r
            self.conv = nn.Conv1d(4, 4, 3, padding=2)

        def forward(self, x):
            return F.pad(self.conv(x), (-1, -self.r)) + 1

    class Attention(nn.Module):
        """A Reshape-heavy self-attention block on x (T, 32): 4 heads of 8, Linear as Gemm."""

        def __init__(self, heads=4, dim=32):
            super().__init__()
            self.h, self.d = heads, dim // heads
            self.q = nn.Linear(dim, dim)
            self.k = nn.Linear(dim, dim)
            self.v = nn.Linear(dim, dim)
            self.o = nn.Linear(dim, dim)

        def forward(self, x):
            T, C = x.shape
            q = self.q(x).view(T, self.h, self.d).transpose(0, 1)
            k = self.k(x).view(T, self.h, self.d).transpose(0, 1)
            v = self.v(x).view(T, self.h, self.d).transpose(0, 1)
            a = F.scaled_dot_product_attention(q, k, v)
            return self.o(a.transpose(0, 1).reshape(T, C))

    class DequantRaw(nn.Module):
        """RVQ dequant as HF writes it: one Embedding per level, stack on dim 0, sum."""

        def __init__(self, k=4, vocab=16, dim=8):
            super().__init__()
            self.emb = nn.ModuleList(nn.Embedding(vocab, dim) for _ in range(k))

        def forward(self, codes):  # codes (1, K, T) int32
            parts = [e(codes[:, i]) for i, e in enumerate(self.emb)]
            return torch.stack(parts, 0).sum(0)

    class DequantPorted(DequantRaw):
        def forward(self, codes):
            parts = [e(codes[:, i]) for i, e in enumerate(self.emb)]
            out = parts[0]
            for p in parts[1:]:
                out = out + p
            return out

    class DequantMean(DequantRaw):
        def forward(self, codes):
            parts = [e(codes[:, i]) for i, e in enumerate(self.emb)]
            return torch.stack(parts, 0).mean(0)

    return dict(NegSlice=NegSlice, PadCrop=PadCrop, Attention=Attention,
                DequantRaw=DequantRaw, DequantPorted=DequantPorted, DequantMean=DequantMean)


def make_input(name: str, length: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng((seed, length))
    if name.startswith("dequant"):
        return [rng.integers(0, 16, (1, 4, length)).astype(np.int32)]
    if name == "attention":
        return [rng.standard_normal((length, 32)).astype(np.float32)]
    return [rng.standard_normal((1, 4, length)).astype(np.float32)]


# model dir -> (class, seed, {variant: trace lengths})
SPECS = {
    "neg_slice": ("NegSlice", 1, {"static10": (10,), "static12": (12,), "dynamic": (10, 8)}),
    "pad_crop": ("PadCrop", 2, {"static10": (10,), "static12": (12,), "dynamic": (10, 8)}),
    "attention": ("Attention", 3, {"static10": (10,), "static12": (12,), "static4": (4,),
                                   "dynamic": (10, 8)}),
    "dequant_raw": ("DequantRaw", 4, {"dynamic": (7, 5)}),
    "dequant_ported": ("DequantPorted", 4, {"dynamic": (7, 5)}),
    "dequant_mean": ("DequantMean", 4, {"dynamic": (7, 5)}),
}


def build_module(model: str):
    import torch

    cls, seed, _ = SPECS[model]
    torch.manual_seed(seed)
    m = _models()[cls]().eval()
    with torch.no_grad():  # jitter: pnnx de-duplicates equal constants
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return m


def reference(model: str, length: int, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Inputs and torch outputs of `model` at `length` (needs torch)."""
    import torch

    m = build_module(model)
    xs = make_input(model, length, seed)
    with torch.no_grad():
        y = m(*[torch.from_numpy(x) for x in xs])
    ys = [y] if not isinstance(y, (tuple, list)) else list(y)
    return xs, [t.numpy() for t in ys]


def export(model: str, variant: str, lengths: tuple[int, ...]) -> dict:
    import torch

    from paramsurgery.repro.pnnx_export import export_with_pnnx

    m = build_module(model)
    ins = [torch.from_numpy(x) for x in make_input(model, lengths[0])]
    ins2 = [torch.from_numpy(x) for x in make_input(model, lengths[1])] if len(lengths) > 1 \
        else None
    dest = OUT / model / variant
    with tempfile.TemporaryDirectory() as tmp:
        r = export_with_pnnx(m, tuple(ins), Path(tmp), "model",
                             example_inputs2=tuple(ins2) if ins2 else None)
        if not r.ok:
            raise SystemExit(f"pnnx failed on {model}/{variant}: {r.stderr_tail()}")
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        for src in (r.ncnn_param, r.ncnn_bin, r.pnnx_param):
            shutil.copyfile(src, dest / src.name)
    xs, ys = reference(model, REF_LEN)
    arrays = {f"in{i}": x for i, x in enumerate(xs)}
    arrays.update({f"out{i}": y for i, y in enumerate(ys)})
    write_npz(dest / "ref.npz", arrays)
    meta = {"model": model, "variant": variant, "trace_lengths": list(lengths),
            "ref_length": REF_LEN, "input_batch_index": r.input_batch_index,
            "output_batch_index": r.output_batch_index, "pnnx_warnings": r.warnings,
            "pnnx_command": r.command[1:]}
    (dest / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args(argv)
    for model, (_, _, variants) in SPECS.items():
        if args.only and model not in args.only:
            continue
        for variant, lengths in variants.items():
            meta = export(model, variant, lengths)
            print(model, variant, meta["input_batch_index"], meta["pnnx_warnings"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
