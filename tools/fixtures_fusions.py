#!/usr/bin/env python
"""Build fixtures/fusions/: Qwen3-TTS decoder stacks whose GQA K/V are expanded to the query
heads before SDPA, the forms `paramsurgery fold-gqa` removes.

    python tools/fixtures_fusions.py [--out DIR] [--scratch DIR]

Each variant is the tiny talker / code-predictor stack of fixtures/qwen3_tts (same seeded
source model, same inputs, same T=37/5 dynamic pnnx export with fp16=0), with the attention
function swapped for one that repeats k/v from G to H heads in torch:

- `tile`:  `k[:, :, None].expand(-1, -1, rep, -1, -1).reshape(B, H, T, D)`
           -> pnnx: `ExpandDims -23303=1,1` + `Tile -23302=4,1,rep,1,1` + `Reshape`
           (the layout of ncnn's benchmark LLM params);
- `stack`: `torch.stack([k] * rep, 2).reshape(B, H, T, D)`
           -> pnnx: `Concat 0=1` of copies + two `Reshape`s.

pnnx writes the same weights as for the ported (repeat_interleave) export, so only the
`.ncnn.param` files are kept; the generator checks that the `.bin` is byte-identical to
`fixtures/qwen3_tts/tiny/<module>.ported.ncnn.bin` (tests load that one) and records its
sha256. `<module>.<form>.ref.npz` holds the reference inputs and torch outputs at T=9 (a
length neither trace used); `manifest.json` records the ncnn-vs-torch status of every
variant as exported (before any folding).

It also exports `embeds3.<form>`: three Embeddings (vocabularies 5, 7, 4; width 8), one
int32 id input each, summed in torch as `sum(parts)`, `stack(parts, 0).sum(0)`,
`stack(parts, 1).sum(1)` and `stack(parts, -1).sum(-1)` -- the sum forms
`paramsurgery fuse-codebooks` meets in pnnx output (`stack0` is pnnx-bugs case 4: broken
as exported). These keep their (tiny) `.bin`.

Needs the export environment (torch 2.13.0 CPU, qwen-tts 0.1.1, transformers 4.57.3, pnnx).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

FORMS = {"tile": "k[:, :, None].expand(-1, -1, rep, -1, -1).reshape(B, H, T, D)",
         "stack": "torch.stack([k] * rep, 2).reshape(B, H, T, D)"}
VARIANTS = [("predictor_decoder", "tile"), ("predictor_decoder", "stack"),
            ("talker_decoder", "tile")]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def attention(form: str):  # noqa: ANN201 - a transformers attention function
    import torch
    import torch.nn.functional as F

    def fn(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **_):  # noqa: ANN001, ANN202
        b, g, t, d = key.shape
        rep = query.shape[1] // g
        if form == "tile":
            key = key[:, :, None].expand(-1, -1, rep, -1, -1).reshape(b, g * rep, t, d)
            value = value[:, :, None].expand(-1, -1, rep, -1, -1).reshape(b, g * rep, t, d)
        else:
            key = torch.stack([key] * rep, 2).reshape(b, g * rep, t, d)
            value = torch.stack([value] * rep, 2).reshape(b, g * rep, t, d)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                             scale=scaling)
        return out.transpose(1, 2).contiguous(), None

    return fn


def build(which: str, form: str, out: Path, scratch: Path) -> dict:
    import torch
    from transformers import AttentionInterface

    from paramsurgery.repro.pnnx_export import export_with_pnnx
    from qwen3tts import decoder_stack, ncnn_check, patches
    from qwen3tts.npz import save_npz
    from qwen3tts.patched_call import PatchedCall

    ported = next(s for s in decoder_stack.build(which, "tiny") if s.variant == "ported")
    stack, cfg = decoder_stack.stack_parts(which, "tiny")
    name = f"paramsurgery_gqa_{form}"
    AttentionInterface.register(name, attention(form))
    contexts = [lambda: patches.attention_impl([cfg], name)]
    if which == "talker_decoder":
        contexts.append(patches.talker_plain_rope)
    wrapper = PatchedCall(stack, contexts)
    stem = f"{which}.{form}"
    with torch.no_grad():
        twin = float((wrapper(*ported.ref_inputs) - ported.wrapper(*ported.ref_inputs))
                     .abs().max())
    work = scratch / stem
    res = export_with_pnnx(wrapper, ported.trace_inputs, work, stem,
                           example_inputs2=ported.trace_inputs2)
    if not res.ok:
        raise SystemExit(f"{stem}: pnnx failed ({res.returncode}): {res.stderr_tail()}")
    ported_bin = ROOT / "fixtures" / "qwen3_tts" / "tiny" / f"{which}.ported.ncnn.bin"
    if res.ncnn_bin.read_bytes() != ported_bin.read_bytes():
        raise SystemExit(f"{stem}: the .bin differs from {ported_bin.name}; keep it instead")
    shutil.copy(res.ncnn_param, out / f"{stem}.ncnn.param")
    with torch.no_grad():
        ref_out = wrapper(*ported.ref_inputs)
    arrays = {f"input_{n}": t.numpy() for n, t in zip(ported.input_names, ported.ref_inputs)}
    arrays["output_hidden"] = ref_out.numpy()
    save_npz(out / f"{stem}.ref.npz", arrays)
    inputs = [{"blob": f"in{i}", "key": f"input_{n}",
               "batch_index": res.input_batch_index.get(f"in{i}", 233)}
              for i, n in enumerate(ported.input_names)]
    outputs = [{"blob": "out0", "key": "output_hidden",
                "batch_index": res.output_batch_index.get("out0", 233)}]
    status = ncnn_check.check(out / f"{stem}.ncnn.param", ported_bin, inputs, outputs, arrays)
    hist: dict[str, int] = {}
    for line in (out / f"{stem}.ncnn.param").read_text().splitlines()[2:]:
        if line.strip():
            hist[line.split()[0]] = hist.get(line.split()[0], 0) + 1
    return {"module": which, "form": form, "torch": FORMS[form],
            "param": f"{stem}.ncnn.param", "param_sha256": sha256(out / f"{stem}.ncnn.param"),
            "bin": f"../qwen3_tts/tiny/{which}.ported.ncnn.bin",
            "bin_sha256": sha256(ported_bin), "ref": f"{stem}.ref.npz",
            "ref_length": ported.ref_length, "trace_lengths": [ported.trace_length,
                                                               ported.trace_length2],
            "torch_vs_ported_twin_max_abs": twin,
            "input_batch_index": res.input_batch_index,
            "status": status, "layer_types": dict(sorted(hist.items())),
            "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "rope_theta": float(cfg.rope_theta)}


EMBED_FORMS = {"sum": "sum(parts)", "stack0": "torch.stack(parts, 0).sum(0)",
               "stack1": "torch.stack(parts, 1).sum(1)",
               "stackm1": "torch.stack(parts, -1).sum(-1)"}
EMBED_VOCABS, EMBED_DIM = (5, 7, 4), 8


def build_embeds(form: str, out: Path, scratch: Path) -> dict:
    """Three Embeddings (unequal vocabularies), one int32 id input each (T,), summed in
    torch as `form`: the sum forms fuse-codebooks meets in pnnx output."""
    import torch

    from paramsurgery.repro.pnnx_export import export_with_pnnx
    from qwen3tts import ncnn_check
    from qwen3tts.npz import save_npz

    class Embeds(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            gen = torch.Generator().manual_seed(20260405)
            self.e = torch.nn.ModuleList(torch.nn.Embedding(v, EMBED_DIM) for v in EMBED_VOCABS)
            for e in self.e:
                e.weight.data = torch.randn(e.weight.shape, generator=gen)

        def forward(self, a, b, c):  # noqa: ANN001, ANN201
            parts = [e(x) for e, x in zip(self.e, (a, b, c))]
            if form == "sum":
                return sum(parts)
            axis = {"stack0": 0, "stack1": 1, "stackm1": -1}[form]
            return torch.stack(parts, axis).sum(axis)

    gen = torch.Generator().manual_seed(7)

    def ids(t: int) -> tuple:
        return tuple(torch.randint(0, v, (t,), generator=gen, dtype=torch.int64)
                     .to(torch.int32) for v in EMBED_VOCABS)

    model = Embeds().eval()
    stem = f"embeds3.{form}"
    res = export_with_pnnx(model, ids(7), scratch / stem, stem, example_inputs2=ids(5))
    if not res.ok:
        raise SystemExit(f"{stem}: pnnx failed ({res.returncode}): {res.stderr_tail()}")
    shutil.copy(res.ncnn_param, out / f"{stem}.ncnn.param")
    shutil.copy(res.ncnn_bin, out / f"{stem}.ncnn.bin")
    ref_in = ids(9)
    with torch.no_grad():
        ref_out = model(*ref_in)
    arrays = {f"input_ids{i}": t.numpy() for i, t in enumerate(ref_in)}
    arrays["output_sum"] = ref_out.numpy()
    save_npz(out / f"{stem}.ref.npz", arrays)
    inputs = [{"blob": f"in{i}", "key": f"input_ids{i}",
               "batch_index": res.input_batch_index.get(f"in{i}", 233)} for i in range(3)]
    outputs = [{"blob": "out0", "key": "output_sum",
                "batch_index": res.output_batch_index.get("out0", 233)}]
    status = ncnn_check.check(out / f"{stem}.ncnn.param", out / f"{stem}.ncnn.bin", inputs,
                              outputs, arrays)
    return {"module": "embeds3", "form": form, "torch": EMBED_FORMS[form],
            "vocab_sizes": list(EMBED_VOCABS), "dim": EMBED_DIM,
            "param": f"{stem}.ncnn.param", "param_sha256": sha256(out / f"{stem}.ncnn.param"),
            "bin": f"{stem}.ncnn.bin", "bin_sha256": sha256(out / f"{stem}.ncnn.bin"),
            "ref": f"{stem}.ref.npz", "ref_length": 9, "trace_lengths": [7, 5],
            "warnings": res.warnings, "input_batch_index": res.input_batch_index,
            "output_batch_index": res.output_batch_index, "status": status}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "fixtures" / "fusions")
    ap.add_argument("--scratch", type=Path, default=None)
    args = ap.parse_args()
    from qwen3tts.env import pin_arithmetic

    # the arithmetic of fixtures/qwen3_tts, whose ported .bin these exports must equal
    pin_arithmetic()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="fusions-", dir=args.scratch))
    try:
        records = [build(which, form, args.out, scratch) for which, form in VARIANTS]
        records += [build_embeds(form, args.out, scratch) for form in EMBED_FORMS]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    from qwen3tts.env import tool_versions

    manifest = {"generator": "tools/fixtures_fusions.py", "versions": tool_versions(),
                "files": records}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    for r in records:
        print(f"{r['param']}: {r['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
