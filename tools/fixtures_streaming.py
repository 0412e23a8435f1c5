"""Build the streaming fixtures: fixtures/streaming/<case>.ncnn.{param,bin} + <case>.ref.npz.

Minimal torch modules, one per layer kind the streaming pass (`add-conv-cache`) must take in
the form pnnx writes it, plus forms it must refuse; each exported with the pnnx binary at two
lengths (dynamic, fp16=0). `ref.npz` holds `input` (1, C, REF_LEN) and the torch `output`
at a length no trace used, so the torch-free tests can check that the ncnn graph is the torch
computation, and then that streaming it equals running it offline. `cases.json` lists per
case what the module is, what pnnx wrote for it (the ncnn layer types) and what the pass must
do (`streams`, or `refuses` with a substring of the reason).

    python tools/fixtures_streaming.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "fixtures" / "streaming"
LENGTHS = (6, 9)  # traced (dynamic export)
REF_LEN = 7


def _modules():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Snake(nn.Module):
        """Qwen3-TTS SnakeBeta, folded as the reference port does (exp precomputed)."""

        def __init__(self, c):
            super().__init__()
            self.alpha = nn.Parameter(torch.rand(c) * 0.5 + 0.5)
            self.inv_beta = nn.Parameter(torch.rand(c) * 0.5 + 0.5)

        def forward(self, x):
            a = self.alpha[None, :, None]
            return x + self.inv_beta[None, :, None] * torch.sin(x * a) ** 2

    class CausalConv(nn.Module):
        """Qwen3TTSTokenizerV2CausalConvNet with the fixed left pad (stride 1)."""

        def __init__(self, cin, cout, k, d=1, groups=1):
            super().__init__()
            self.conv = nn.Conv1d(cin, cout, k, dilation=d, groups=groups)
            self.pad = (k - 1) * d

        def forward(self, x):
            return self.conv(F.pad(x, (self.pad, 0)))

    class CausalTransConv(nn.Module):
        """Qwen3TTSTokenizerV2CausalTransConvNet, trim written as the reference port does:
        F.pad(h, (0, -r)) (a relative Crop); `slice` writes h[..., :h.shape[-1]-r]."""

        def __init__(self, cin, cout, k, s, groups=1, form="pad", left=0):
            super().__init__()
            self.conv = nn.ConvTranspose1d(cin, cout, k, stride=s, groups=groups)
            self.r = k - s
            self.left = left
            self.form = form

        def forward(self, x):
            h = self.conv(x)
            if self.form == "slice":
                return h[..., self.left:h.shape[-1] - self.r]
            return F.pad(h, (-self.left, -self.r))

    class Seq(nn.Sequential):
        pass

    class Residual(nn.Module):
        """Qwen3TTSTokenizerV2DecoderResidualUnit: snake, causal conv k7 dilated, snake, 1x1."""

        def __init__(self, c, d):
            super().__init__()
            self.act1 = Snake(c)
            self.conv1 = CausalConv(c, c, 7, d)
            self.act2 = Snake(c)
            self.conv2 = nn.Conv1d(c, c, 1)

        def forward(self, x):
            return x + self.conv2(self.act2(self.conv1(self.act1(x))))

    class Block(nn.Module):
        """Qwen3TTSTokenizerV2DecoderBlock: snake, causal transposed conv (k=2s), units."""

        def __init__(self, cin, cout, s):
            super().__init__()
            self.act = Snake(cin)
            self.up = CausalTransConv(cin, cout, 2 * s, s)
            self.units = nn.Sequential(Residual(cout, 1), Residual(cout, 3))

        def forward(self, x):
            return self.units(self.up(self.act(x)))

    class ConvNeXt(nn.Module):
        """Qwen3TTSTokenizerV2ConvNeXtBlock: causal depthwise k7, LayerNorm over channels,
        Linear-GELU-Linear, gamma, residual."""

        def __init__(self, c):
            super().__init__()
            self.dwconv = CausalConv(c, c, 7, groups=c)
            self.norm = nn.LayerNorm(c, eps=1e-6)
            self.pw1 = nn.Linear(c, 4 * c)
            self.pw2 = nn.Linear(4 * c, c)
            self.gamma = nn.Parameter(torch.rand(c) * 0.2 + 0.1)

        def forward(self, x):
            h = self.dwconv(x).permute(0, 2, 1)
            h = self.pw2(F.gelu(self.pw1(self.norm(h))))
            return x + (self.gamma * h).permute(0, 2, 1)

    class Worked(nn.Module):
        """Issue 10's worked example: K=4, s=2, weights [1,2,3,4], bias 0.5, trims 2 | 2."""

        def __init__(self):
            super().__init__()
            self.conv = nn.ConvTranspose1d(1, 1, 4, stride=2)
            with torch.no_grad():
                self.conv.weight.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 4))
                self.conv.bias.fill_(0.5)

        def forward(self, x):
            return F.pad(self.conv(x), (-2, -2))

    class TransPadding(nn.Module):
        """ConvTranspose1d(padding=p): pnnx keeps the trims in the layer (4=p, 15 = 4);
        p = K-s trims both ends by K-s (the worked example's form); HiFi-GAN's p = (K-s)/2
        leaves K-s-p samples for the end of the stream."""

        def __init__(self, padding=4):
            super().__init__()
            self.conv = nn.ConvTranspose1d(3, 2, 6, stride=2, padding=padding)

        def forward(self, x):
            return self.conv(x)

    class Symmetric(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(3, 3, 3, padding=1)

        def forward(self, x):
            return self.conv(x)

    class Strided(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = CausalConv(3, 3, 4)
            self.conv.conv.stride = (2,)

        def forward(self, x):
            return self.conv(x)

    class Untrimmed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.ConvTranspose1d(3, 2, 4, stride=2)

        def forward(self, x):
            return self.conv(x)

    class Lookahead(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(3, 3, 3)

        def forward(self, x):
            return self.conv(F.pad(x, (1, 1)))

    cases = {
        "causal_conv": (lambda: CausalConv(3, 4, 3, 2), 3,
                        "F.pad(x, ((K-1)*d, 0)) + Conv1d(3, 4, k=3, dilation=2)"),
        "depthwise": (lambda: CausalConv(4, 4, 7, groups=4), 4,
                      "causal depthwise Conv1d(4, 4, k=7, groups=4)"),
        "transconv_trim": (lambda: CausalTransConv(4, 3, 8, 4), 4,
                           "ConvTranspose1d(4, 3, k=8, s=4) + F.pad(h, (0, -(k-s)))"),
        "transconv_slice": (lambda: CausalTransConv(4, 3, 6, 2, form="slice"), 4,
                            "ConvTranspose1d(4, 3, k=6, s=2) + h[..., :h.shape[-1]-(k-s)]"),
        "transconv_depthwise": (lambda: CausalTransConv(4, 4, 4, 2, groups=4), 4,
                                "ConvTranspose1d(4, 4, k=4, s=2, groups=4) + right trim"),
        "transconv_padding": (TransPadding, 3,
                              "ConvTranspose1d(3, 2, k=6, s=2, padding=4): trims 4 | 4"),
        "worked_example": (Worked, 1, "issue 10's worked example (trims 2 | 2)"),
        "residual_unit": (lambda: Residual(4, 3), 4,
                          "Qwen3-TTS residual unit: SnakeBeta, causal conv k7 d3, SnakeBeta, 1x1, +x"),
        "convnext": (lambda: ConvNeXt(4), 4,
                     "Qwen3-TTS ConvNeXt block: causal depthwise k7, LayerNorm, MLP, gamma, +x"),
        "decoder_block": (lambda: Seq(CausalConv(6, 6, 7), Block(6, 3, 4), Snake(3),
                                      CausalConv(3, 1, 7)), 6,
                          "Qwen3-TTS decoder tail: causal conv k7, block (snake, transposed "
                          "conv k8 s4, residual units d1/d3), snake, causal conv to 1 channel"),
        "refuse_symmetric_pad": (Symmetric, 3, "Conv1d(padding=1): looks one sample ahead"),
        "refuse_stride": (Strided, 3, "causal Conv1d with stride 2 (downsampling)"),
        "refuse_untrimmed": (Untrimmed, 3, "ConvTranspose1d without the causal right trim"),
        "refuse_lookahead": (Lookahead, 3, "F.pad(x, (1, 1)) + Conv1d(k=3): pads the right"),
        "refuse_hifigan_padding": (lambda: TransPadding(2), 3,
                                   "ConvTranspose1d(3, 2, k=6, s=2, padding=2) (HiFi-GAN): the "
                                   "last K-s-p samples would need a flush through later layers"),
    }
    return cases


EXPECT = {
    "refuse_symmetric_pad": "pads the right by 1",
    "refuse_stride": "stride 2",
    "refuse_untrimmed": "right trim 0 < K-s = 2",
    "refuse_lookahead": "pads the right by 1",
    "refuse_hifigan_padding": "right trim 2 < K-s = 4",
}


def _jitter(module, seed: int) -> None:
    """Random weights; pnnx drops all-ones affine weights and merges equal constants."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "Worked" in type(module).__name__:
                continue
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def export(name: str, make, channels: int, what: str, tmp: Path) -> dict:
    import torch

    from paramsurgery.repro.pnnx_export import export_with_pnnx

    torch.manual_seed(sum(map(ord, name)))  # per case: --only reproduces the same weights
    module = make().eval()
    _jitter(module, sum(map(ord, name)))
    x1 = torch.randn(1, channels, LENGTHS[0])
    x2 = torch.randn(1, channels, LENGTHS[1])
    r = export_with_pnnx(module, (x1,), tmp, name, example_inputs2=(x2,))
    if r.returncode != 0 or r.ncnn_param is None:
        raise RuntimeError(f"{name}: pnnx failed ({r.returncode}): {r.stderr[-2000:]}")
    shutil.copyfile(r.ncnn_param, OUT / f"{name}.ncnn.param")
    shutil.copyfile(r.ncnn_bin, OUT / f"{name}.ncnn.bin")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, channels, REF_LEN, generator=g)
    if name == "worked_example":
        x = torch.tensor([[[1.0, 10.0, 100.0, 3.0, -2.0, 0.5, 7.0]]])
    with torch.no_grad():
        y = module(x)
    from paramsurgery.core.npz import write_npz

    write_npz(OUT / f"{name}.ref.npz", {"input": x[0].numpy(), "output": y[0].numpy()})
    types = []
    for line in (OUT / f"{name}.ncnn.param").read_text().splitlines()[2:]:
        t = line.split()[0]
        if t not in types and t not in ("Input", "Split"):
            types.append(t)
    return {"module": what, "channels": channels, "ncnn_layers": types,
            "input_batch_index": r.input_batch_index, "pnnx_warnings": r.warnings,
            "expect": "refuses" if name in EXPECT else "streams",
            "reason": EXPECT.get(name)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    index_path = OUT / "cases.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    cases = _modules()
    with tempfile.TemporaryDirectory(prefix="fixtures-streaming-") as tmp:
        for name, (make, channels, what) in cases.items():
            if args.only and name not in args.only:
                continue
            index[name] = export(name, make, channels, what, Path(tmp) / name)
            print(f"{name}: {', '.join(index[name]['ncnn_layers'])}")
    index_path.write_text(json.dumps(dict(sorted(index.items())), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
