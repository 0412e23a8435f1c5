#!/usr/bin/env python
"""Build the model zoo (fixtures/zoo/): tiny random-init transformers models exported by
pnnx along several routes, with torch references at traced and untraced lengths and, for
the decoders, a greedy decode with HF's own kv cache.

    /work/genvenv/bin/python tools/zoo/build.py [--only FAMILY ...] [--out DIR]
                                                [--torch-exports one|all]

Needs torch 2.13.0 CPU, transformers 4.57.3 and pnnx 20261020 (the export environment of
fixtures/README.md). Deterministic: models are built from configs with fixed seeds, the
arithmetic is pinned (tools/qwen3tts/env.py), references are written by the byte-stable
npz writer; a rebuild reproduces every file byte for byte (tests/test_zoo.py, slow).

Layout, per family `F` and route `R` (`<entry>_<attn>_<shape>`, e.g. `embeds_sdpa_static`):
- `F/R.ncnn.param`, `F/R.ncnn.bin`, `F/R.pnnx.param`, `F/R_ncnn.py` (pnnx's script: the
  traced shapes and batch axes), as pnnx writes them; `static2` routes (the second length for
  `fix --pair`) keep no `.bin`; the `sdpa_static` route also keeps pnnx's torch re-export
  (`F/R_pnnx.py`, `F/R.pnnx.bin`) for `compare --pnnx`;
- `F/R.ref.npz` + `F/R.ref.io.json` (not for `static2`): inputs and torch outputs at T=11
  (no trace used it), the reference `fix`/`lint` find next to the file;
- `F/torch.npz`: inputs and torch outputs at every length (`<entry>.<input>@T`, inputs
  `x` (+ `mask`, `positions` for the kv form), `<entry>.output@T`), and for decoders the
  greedy decode (`decode.*`);
- `zoo.json`: configs, seeds, routes, pnnx commands and exit codes, the wrapper-vs-plain
  checks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

OUT = ROOT / "fixtures" / "zoo"
REF_LENGTH = 11          # the untraced length of every `R.ref.npz` (ViT: 24)
PROMPT = 6               # greedy decode: prompt tokens, then DECODE_STEPS cached steps
DECODE_STEPS = 6


def routes(family: Any) -> list[tuple[str, str, str]]:
    """(entry, attn, shape) of every export of a family, most valuable first."""
    entry = "x" if family.name in ("whisper_encoder", "vit") else "embeds"
    out = [(entry, "sdpa", "static"), (entry, "sdpa", "static2"), (entry, "sdpa", "dynamic")]
    if family.kind == "decoder":
        out += [(entry, "eager", "static"), (entry, "eager", "dynamic")]
    if "ids" in family.entries:
        out += [("ids", "sdpa", "static"), ("ids", "sdpa", "dynamic")]
    if "kv" in family.entries:
        out += [("kv", "sdpa", "dynamic")]
    return out


def input_names(entry: str) -> tuple[str, ...]:
    """The wrapper's inputs (npz keys `input_<name>`, torch.npz `<entry>.<name>@T`)."""
    return ("x", "mask", "positions") if entry == "kv" else ("x",)


def route_name(entry: str, attn: str, shape: str) -> str:
    return f"{entry}_{attn}_{shape}"


def greedy_decode(model: Any, seed: int) -> dict[str, Any]:
    """Prompt ids, then DECODE_STEPS argmax tokens decoded with HF's DynamicCache; the
    logits of every step (the prompt's last position first)."""
    import numpy as np
    import torch

    from zoo.models import VOCAB

    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, VOCAB, (1, PROMPT), generator=g)
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        past = out.past_key_values
        logits = [out.logits[0, -1]]
        tokens = []
        for _ in range(DECODE_STEPS):
            tok = int(logits[-1].argmax())
            tokens.append(tok)
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits.append(out.logits[0, -1])
        # the cache changes nothing: a full prefill of prompt + tokens gives the same logits
        full = model(input_ids=torch.cat([prompt, torch.tensor([tokens])], 1),
                     use_cache=False).logits[0, PROMPT - 1:]
    stacked = torch.stack(logits)
    return {"decode.prompt_ids": prompt.numpy().astype(np.int64),
            "decode.tokens": np.array(tokens, dtype=np.int64),
            "decode.logits": stacked.numpy().astype(np.float32),
            "decode.embed_tokens": model.get_input_embeddings().weight.detach().numpy()
            .astype(np.float32),
            "_full_vs_cached": float((full - stacked).abs().max())}


def build_family(name: str, out_dir: Path, scratch: Path,
                 torch_exports: str = "one") -> dict[str, Any]:
    import numpy as np
    import torch

    from paramsurgery.formats.pnnx_reference import write_io_sidefile
    from paramsurgery.repro.pnnx_export import NO_BATCH, export_with_pnnx
    from qwen3tts.npz import save_npz
    from zoo.models import FAMILIES, lengths

    fam = FAMILIES[name]
    L = lengths(fam)
    ref_len = 24 if name == "vit" else REF_LENGTH
    fdir = out_dir / name
    shutil.rmtree(fdir, ignore_errors=True)
    fdir.mkdir(parents=True)
    cfg = fam.config()
    record: dict[str, Any] = {
        "family": name, "kind": fam.kind, "seed": fam.seed, "constructs": fam.constructs,
        "config_class": type(cfg).__name__, "config": cfg.to_diff_dict(),
        "lengths": {"trace": L["trace"], "trace2": L["trace2"], "untraced": list(L["untraced"]),
                    "reference": ref_len, "meaning": fam.length_note},
        "routes": {}, "plain_call_max_abs": {},
    }
    arrays: dict[str, np.ndarray] = {}
    all_lengths = sorted({L["trace"], L["trace2"], *L["untraced"]})
    models = {}
    for attn in ("sdpa", "eager"):
        models[attn] = fam.build(attn)
    record["parameters"] = int(sum(p.numel() for p in models["sdpa"].parameters()))
    entries = sorted({r[0] for r in routes(fam)})
    for entry in entries:
        wrapper = fam.wrap(models["sdpa"], entry)
        for n in all_lengths:
            xs = fam.example(n, entry, fam.seed)
            with torch.no_grad():
                y = wrapper(*xs)
            for key, x in zip(input_names(entry), xs):
                arrays[f"{entry}.{key}@{n}"] = x.numpy()
            arrays[f"{entry}.output@{n}"] = y.numpy().astype(np.float32)
        if entry == "kv":  # the kv form computes what the in-graph-mask wrapper does
            record["kv_form_vs_embeds_max_abs"] = max(
                float(np.abs(arrays[f"kv.output@{n}"] - arrays[f"embeds.output@{n}"]).max())
                for n in all_lengths)
            continue
        for attn in ("sdpa", "eager"):
            record["plain_call_max_abs"][f"{entry}_{attn}"] = fam.plain_check(
                models[attn], entry, ref_len, fam.seed)
    if fam.kind == "decoder":
        dec = greedy_decode(models["sdpa"], fam.seed)
        record["decode"] = {"prompt": PROMPT, "steps": DECODE_STEPS,
                            "tokens": dec["decode.tokens"].tolist(),
                            "full_prefill_vs_cached_max_abs": dec.pop("_full_vs_cached"),
                            "cache": "transformers DynamicCache (model(..., use_cache=True))"}
        arrays.update(dec)
    save_npz(fdir / "torch.npz", arrays)

    out_name = "logits" if fam.kind == "decoder" else "last_hidden_state"
    for entry, attn, shape in routes(fam):
        rname = route_name(entry, attn, shape)
        wrapper = fam.wrap(models[attn], entry)
        t1 = L["trace2"] if shape == "static2" else L["trace"]
        x1 = fam.example(t1, entry, fam.seed)
        x2 = fam.example(L["trace2"], entry, fam.seed) if shape == "dynamic" else None
        work = scratch / f"{name}-{rname}"
        res = export_with_pnnx(wrapper, x1, work, rname, example_inputs2=x2, fp16=False,
                               optlevel=2, keep_intermediates=True)
        rec: dict[str, Any] = {
            "entry": entry, "attn": attn, "shape": shape, "traced": [t1] + ([L["trace2"]]
                                                                         if x2 is not None else []),
            "pnnx_command": " ".join(["pnnx"] + res.command[1:]), "pnnx_returncode": res.returncode,
            "pnnx_warnings": res.warnings, "files": [],
        }
        if not res.ok:
            rec["pnnx_stderr_tail"] = res.stderr_tail()
            record["routes"][rname] = rec
            print(f"{name}/{rname}: pnnx exit {res.returncode}", flush=True)
            continue
        keep = [(res.ncnn_param, ".ncnn.param"), (res.pnnx_param, ".pnnx.param")]
        if shape != "static2":
            keep.append((res.ncnn_bin, ".ncnn.bin"))
        keep.append((res.ncnn_py, "_ncnn.py"))   # pnnx's script: traced shapes, batch axes
        if torch_exports == "all" or ((attn, shape) == ("sdpa", "static") and entry != "ids"):
            # pnnx's torch re-export, for `compare --pnnx` (one route per family; every
            # route with --torch-exports all, for the slow test that compares them all)
            keep += [(work / f"{rname}_pnnx.py", "_pnnx.py"),
                     (work / f"{rname}.pnnx.bin", ".pnnx.bin")]
        for src, suffix in keep:
            if src is not None and src.is_file():
                shutil.copyfile(src, fdir / f"{rname}{suffix}")
                rec["files"].append(f"{name}/{rname}{suffix}")
        names = input_names(entry)
        io = {"inputs": [{"blob": f"in{i}", "key": f"input_{key}", "name": key,
                          "batch_index": int(res.input_batch_index.get(f"in{i}", NO_BATCH))}
                         for i, key in enumerate(names)],
              "outputs": [{"blob": "out0", "key": f"output_{out_name}", "name": out_name,
                           "batch_index": int(res.output_batch_index.get("out0", NO_BATCH))}]}
        rec["io"] = io
        record["routes"][rname] = rec
        shutil.rmtree(work, ignore_errors=True)
        print(f"{name}/{rname}: ok", flush=True)
        if shape == "static2":  # only the `--pair` of its static route: no reference
            continue
        ref = fdir / f"{rname}.ref.npz"
        save_npz(ref, {**{f"input_{key}": arrays[f"{entry}.{key}@{ref_len}"] for key in names},
                       f"output_{out_name}": arrays[f"{entry}.output@{ref_len}"]})
        write_io_sidefile(str(ref), io)
        rec["files"] += [f"{name}/{rname}.ref.npz", f"{name}/{rname}.ref.io.json"]
    return record


def main(argv: list[str] | None = None) -> int:
    from qwen3tts.env import pin_arithmetic

    pin_arithmetic()
    from zoo.models import FAMILIES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=sorted(FAMILIES), metavar="FAMILY")
    ap.add_argument("--out", type=Path, default=OUT, help="zoo directory (default fixtures/zoo)")
    ap.add_argument("--torch-exports", choices=["one", "all"], default="one",
                    help="keep pnnx's torch re-export (X_pnnx.py, X.pnnx.bin) for the sdpa "
                         "static route of each family (default, committed) or every route")
    args = ap.parse_args(argv)
    from qwen3tts.env import tool_versions

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / "zoo.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    index["generator"] = "/work/genvenv/bin/python tools/zoo/build.py"
    index["versions"] = {k: v for k, v in tool_versions().items() if k != "qwen-tts"}
    index.setdefault("families", {})
    scratch = Path(tempfile.mkdtemp(prefix="paramsurgery-zoo-"))
    try:
        for name in args.only or list(FAMILIES):
            index["families"][name] = build_family(name, out, scratch, args.torch_exports)
            index["families"] = dict(sorted(index["families"].items(),
                                            key=lambda kv: list(FAMILIES).index(kv[0])))
            tmp = index_path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
            tmp.replace(index_path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
