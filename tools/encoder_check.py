#!/usr/bin/env python
"""Issue 24, the non-Llama forms: tiny random-init transformers models (BERT, Whisper's
encoder, ViT, GPT-2, GPT-NeoX with the rotary part covering the whole head) exported by pnnx
(static at one length, and dynamic with `inputshape2`), repaired by `paramsurgery fix` alone
with a torch reference at another length next to the static export, then run through ncnn at
lengths no trace used against torch. One line per (model, route, length).

    PYTHONPATH=. /work/genvenv/bin/python tools/encoder_check.py [--only bert,whisper] [--keep DIR]

Needs torch 2.13, transformers 4.57.3 and pnnx 20261020 (the export extra). The models are
built from their configs (no download), seeded; nothing is written outside a temporary
directory unless `--keep DIR`. Statuses: `right` (rel ≤ 1e-4), `WRONG` / `CRASH` (fix exit 0,
then wrong or failing in ncnn: the case the issue forbids), `refused` (fix exit 2, its
message), `wrong` / `crash` after fix exit 1 (errors left, reported), `beyond the stated
bound` (a length past the rows fix said the result is exact for).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

HIDDEN, HEADS, LAYERS, INTER, VOCAB = 32, 4, 2, 64, 64
TRACE, TRACE2, UNTRACED = 7, 10, (5, 11, 16)
RTOL = 1e-4


def _reinit(model: Any, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1] if p.ndim == 2
                                                                      else p[0].numel()))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))


def _families() -> dict[str, tuple[Callable[[], Any], Callable[[int, int], Any]]]:
    """name -> (build the traced wrapper, example input at length n)."""
    import torch
    import transformers
    from torch import nn

    common = dict(hidden_size=HIDDEN, num_attention_heads=HEADS, num_hidden_layers=LAYERS,
                  intermediate_size=INTER)

    class Last(nn.Module):
        def __init__(self, m: nn.Module, kw: str, field: str = "last_hidden_state") -> None:
            super().__init__()
            self.m, self.kw, self.field = m, kw, field

        def forward(self, x):  # noqa: ANN001, ANN201
            return getattr(self.m(**{self.kw: x}), self.field)

    class Causal(nn.Module):  # the 4-D additive causal mask built here (HF's masking_utils
        def __init__(self, m: nn.Module) -> None:  # does not trace with torch 2.13)
            super().__init__()
            self.m = m

        def forward(self, x):  # noqa: ANN001, ANN201
            t = x.shape[1]
            mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
            return self.m(inputs_embeds=x, attention_mask=mask, position_ids=torch.arange(t)[None],
                          use_cache=False).logits

    class Whisper(nn.Module):  # HF's encoder refuses any length but max_source_positions
        def __init__(self, enc: nn.Module) -> None:
            super().__init__()
            self.enc = enc

        def forward(self, feats):  # noqa: ANN001, ANN201
            e = self.enc
            h = nn.functional.gelu(e.conv1(feats))
            h = nn.functional.gelu(e.conv2(h)).permute(0, 2, 1)
            h = h + e.embed_positions.weight[: h.shape[1]]
            for layer in e.layers:
                h = layer(h, None, layer_head_mask=None)[0]
            return e.layer_norm(h)

    def built(model: nn.Module, seed: int, wrap: Callable[[nn.Module], nn.Module]) -> nn.Module:
        _reinit(model, seed)
        return wrap(model.eval()).eval()

    def embeds(n: int, seed: int) -> Any:
        return torch.randn((1, n, HIDDEN), generator=torch.Generator().manual_seed(seed + n))

    return {
        "bert": (lambda: built(transformers.BertModel(transformers.BertConfig(
            vocab_size=VOCAB, max_position_embeddings=32, type_vocab_size=2,
            attn_implementation="sdpa", **common), add_pooling_layer=False), 104,
            lambda m: Last(m, "inputs_embeds")), embeds),
        "whisper_encoder": (lambda: built(transformers.WhisperModel(transformers.WhisperConfig(
            vocab_size=VOCAB, num_mel_bins=8, d_model=HIDDEN, encoder_layers=LAYERS,
            encoder_attention_heads=HEADS, encoder_ffn_dim=INTER, decoder_layers=1,
            decoder_attention_heads=HEADS, decoder_ffn_dim=INTER, max_source_positions=16,
            max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            decoder_start_token_id=1)).encoder, 108, Whisper),
            lambda n, seed: torch.randn((1, 8, 2 * n),
                                        generator=torch.Generator().manual_seed(seed + n))),
        "vit": (lambda: built(transformers.ViTModel(transformers.ViTConfig(
            image_size=16, patch_size=4, num_channels=3, **common), add_pooling_layer=False),
            109, lambda m: _ViT(m)),
            lambda n, seed: torch.randn((1, 3, 4 * n, 4 * n),
                                        generator=torch.Generator().manual_seed(seed + n))),
        "gpt2": (lambda: built(transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=HIDDEN, n_head=HEADS, n_layer=LAYERS, n_inner=INTER,
            n_positions=32)), 103, Causal), embeds),
        "gpt_neox_full_rotary": (lambda: built(transformers.GPTNeoXForCausalLM(
            transformers.GPTNeoXConfig(vocab_size=VOCAB, max_position_embeddings=32,
                                       rotary_pct=1.0, **common)), 111, Causal), embeds),
    }


class _ViT:  # a callable module factory kept out of _families for readability
    def __new__(cls, m):  # noqa: ANN001, ANN204
        from torch import nn

        class W(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = m

            def forward(self, x):  # noqa: ANN001, ANN201
                return self.m(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state

        return W()


def _fix(param: Path, out: Path, extra: list[str]) -> tuple[int, str]:
    from paramsurgery.cli import main

    buf_o, buf_e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf_o), contextlib.redirect_stderr(buf_e):
        code = main(["fix", str(param), "--bin", str(param.with_suffix(".bin")), "-o", str(out),
                     *extra])
    return code, (buf_o.getvalue() + buf_e.getvalue())


def _run(param: Path, x: np.ndarray) -> np.ndarray | str:
    from paramsurgery.runtime.child import Feed, Fetch, RunOptions, run_isolated

    res = run_isolated(param, param.with_suffix(".bin"), {"in0": Feed(x, 0)}, [Fetch("out0", 0)],
                       RunOptions())
    return res.outputs["out0"] if res.ok else res.describe()


def check(name: str, scratch: Path) -> list[str]:
    import torch

    from paramsurgery.core.npz import write_npz
    from paramsurgery.repro.pnnx_export import export_with_pnnx

    build, example = _families()[name]
    model = build()
    lines = []
    d = scratch / name
    scale = 4 if name == "vit" else 1  # ViT: the image side in patches of 4
    t0, t1 = (5, 7) if name == "vit" else (TRACE, TRACE2)
    with torch.no_grad():
        x0, x1 = example(t0, 0), example(t1, 0)
        for stem, a, b in (("static", x0, None), ("dynamic", x0, x1)):
            r = export_with_pnnx(model, (a,), d, stem, example_inputs2=(b,) if b is not None
                                 else None, keep_intermediates=True)
            if not r.ok:
                lines.append(f"{name:22s} {stem:8s} pnnx failed (rc {r.returncode})")
        lengths = (3, 4, 6) if name == "vit" else UNTRACED
        ref_n = lengths[0]
        xr = example(ref_n, 0)
        io_rec = {"inputs": [{"blob": "in0", "key": "input_x", "batch_index": 0}],
                  "outputs": [{"blob": "out0", "key": "output_y", "batch_index": 0}]}
        for stem in ("static", "dynamic"):
            if not (d / f"{stem}.ncnn.param").exists():
                continue
            write_npz(d / f"{stem}.ref.npz", {"input_x": xr.numpy(),
                                              "output_y": model(xr).numpy()})
            (d / f"{stem}.ref.io.json").write_text(json.dumps(io_rec))
            out = d / f"{stem}.fixed.param"
            code, text = _fix(d / f"{stem}.ncnn.param", out, [])
            if code == 2 or not out.exists():
                why = next((ln for ln in text.splitlines() if "refused" in ln or "error" in ln),
                           text.strip().splitlines()[-1] if text.strip() else "")
                lines.append(f"{name:22s} {stem:8s} fix exit {code}: refused: {why[:220]}")
                continue
            import re

            bounds = [int(b) for b in re.findall(r"exact for lengths up to (\d+)", text)]
            bound = min(bounds) if bounds else None
            for n in (t0, *lengths):
                x = example(n, 0)
                want = model(x).numpy()
                got = _run(out, x.numpy())
                side = f"{n * scale}px" if name == "vit" else f"T={n}"
                if bound is not None and n > bound:
                    lines.append(f"{name:22s} {stem:8s} fix exit {code} {side:6s} beyond the "
                                 f"stated bound (exact up to {bound})")
                    continue
                if isinstance(got, str):
                    status = "CRASH" if code == 0 else "crash"
                    lines.append(f"{name:22s} {stem:8s} fix exit {code} {side:6s} {status}: {got}")
                    continue
                if got.size != want.size:
                    rel = math.inf
                else:
                    rel = float(np.abs(got.reshape(want.shape) - want).max()
                                / max(float(np.abs(want).max()), 1e-30))
                status = "right" if rel <= RTOL else ("WRONG" if code == 0 else "wrong")
                lines.append(f"{name:22s} {stem:8s} fix exit {code} {side:6s} {status} "
                             f"(rel {rel:.1e})")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated families (default: all)")
    ap.add_argument("--keep", type=Path, help="keep the exports in this directory")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(_families())
    with tempfile.TemporaryDirectory(prefix="encoder-check-") as tmp:
        scratch = args.keep or Path(tmp)
        wrong = 0
        for name in names:
            for line in check(name, scratch):
                print(line, flush=True)
                wrong += " WRONG " in line or " CRASH:" in line
    print(f"encoder_check: {wrong} wrong or crashing after fix exit 0")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
