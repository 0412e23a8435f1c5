"""The raw (unpatched HF) Qwen3-TTS tiny exports repaired by graph surgery alone, then run by
ncnn at the `ref.npz` length against torch: `python tools/qwen3tts/rawfix.py` prints the
before/after table (no torch needed).

The repairs are the registered passes, chained in the order `paramsurgery fix` runs them
(fold-gqa where there is SDPA, lower, fix-batch-reshape); the codec decoder, which pnnx can
export only statically, goes through fix-slice and `dynamize --pair` with its second static
trace. The speaker encoder's length mask, which pnnx froze at the traced length, is read
back from pnnx's test script kept next to the raw export (`speaker_encoder.raw_ncnn.py`).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import numpy as np  # noqa: E402

import paramsurgery  # noqa: E402
from paramsurgery.passes.base import PassManager  # noqa: E402
from paramsurgery.passes.dynamize import Dynamize  # noqa: E402
from paramsurgery.passes.fix_batch_reshape import FixBatchReshape  # noqa: E402
from paramsurgery.passes.fix_slice import FixSlice  # noqa: E402
from paramsurgery.passes.fold_gqa import FoldGQA  # noqa: E402
from paramsurgery.passes.lower import Lower  # noqa: E402
from qwen3tts.ncnn_check import check  # noqa: E402

TINY = ROOT / "fixtures" / "qwen3_tts" / "tiny"
MANIFEST = json.loads((ROOT / "fixtures" / "manifest.json").read_text())


def record(module: str, variant: str, size: str = "tiny") -> dict[str, Any]:
    for r in MANIFEST["qwen3_tts"]["exports"]:
        if (r["module"], r["variant"], r["size"]) == (module, variant, size):
            return r
    raise KeyError(f"{size} {module}.{variant}")


def repairs(g: paramsurgery.Graph, traced: Path | None) -> list:
    gqa = [FoldGQA()] if g.by_type("SDPA") else []  # fold-gqa refuses graphs without SDPA
    return gqa + [Lower(traced=traced), FixBatchReshape()]


def repair(param: Path, bin_path: Path | None):  # noqa: ANN201 - (graph, results, failures)
    traced = param.with_name(param.name.replace(".ncnn.param", ".pnnx.param"))
    g = paramsurgery.load(param, bin=bin_path)
    return PassManager(repairs(g, traced), early_stop=False).run(g)


def static_codec(variant: str, size_dir: Path = TINY) -> paramsurgery.Graph:
    """A static raw codec export after fix-slice (the RVQ decode's batch-axis split)."""
    param = size_dir / f"codec_decoder.{variant}.ncnn.param"
    bin_path = param.with_suffix(".bin")
    g = paramsurgery.load(param, bin=bin_path if bin_path.exists() else None)
    return FixSlice(traced=param.with_name(f"codec_decoder.{variant}.pnnx.param"))(g).graph


def repair_codec():  # noqa: ANN201 - PassResult
    return Dynamize(25, pair=static_codec("raw_static_pair"), pair_len=50,
                    traced=TINY / "codec_decoder.raw_static.pnnx.param",
                    pair_traced=TINY / "codec_decoder.raw_static_pair.pnnx.param"
                    )(static_codec("raw_static"))


def table() -> list[tuple[str, str, str, str]]:
    rows = []
    for module in ("talker_text_embed", "talker_codec_embed", "talker_decoder",
                   "talker_codec_head", "predictor_decoder", "predictor_embeds",
                   "predictor_heads", "codec_decoder", "speaker_encoder", "mimi_encoder"):
        raw = record(module, "raw")
        before = raw["status"]["kind"]
        variant = "raw"
        with tempfile.TemporaryDirectory() as tmp:
            out, out_bin = Path(tmp) / "y.param", Path(tmp) / "y.bin"
            if module == "codec_decoder":
                variant = "raw_static"
                before = f"{before}; raw_static: {record(module, variant)['status']['kind']}"
                res = repair_codec()
                res.graph.save(out, out_bin)
                passes, failures = "fix-slice + dynamize --pair", []
            else:
                param = TINY / f"{module}.raw.ncnn.param"
                g, results, failures = repair(param, param.with_suffix(".bin"))
                passes = " + ".join(r.pass_name for r in results if r.modified) or "none"
                g.save(out, out_bin)
            rec = record(module, variant)
            if failures:
                after = "refused: " + failures[0][1].splitlines()[0][:160]
            else:
                arrays = dict(np.load(TINY / f"{module}.{variant}.ref.npz"))
                st = check(out, out_bin, rec["io"]["inputs"], rec["io"]["outputs"], arrays)
                err = st.get("max_rel_err")
                after = st["kind"] + (f" (rel {err:.1e} at T={rec['lengths']['reference']})"
                                      if err is not None else "")
        rows.append((module, before, passes, after))
    return rows


def main() -> int:
    print("| module | pnnx gave | repairs | after, ncnn vs torch |")
    print("|---|---|---|---|")
    rows = table()
    for row in rows:
        print("| " + " | ".join(row) + " |")
    right = sum(1 for row in rows if row[3].startswith("runs_right"))
    print(f"\nraw modules repaired by graph surgery and right in ncnn: {right}/{len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
