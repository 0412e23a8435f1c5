"""The raw (unpatched HF) Qwen3-TTS tiny exports repaired by `paramsurgery fix` alone, then
run by ncnn at the `ref.npz` length against torch: `python tools/qwen3tts/rawfix.py` prints
the before/after table (no torch needed).

Every module goes through the issue's command, `paramsurgery fix X.ncnn.param --bin
X.ncnn.bin -o Y.param` (run in this process): fix lints, runs the repairs the findings call
for (fold-gqa, lower, fix-batch-reshape, fix-slice, ...) and, for the codec decoder, which
pnnx can export only statically (`raw_static`, one trace at T=25), dynamize from that trace,
pnnx's IR and the reference next to it (T=13). The speaker encoder's length mask, which pnnx
froze at the traced length, is read back from pnnx's test script kept next to the raw
export (`speaker_encoder.raw_ncnn.py`).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import numpy as np  # noqa: E402

from qwen3tts.ncnn_check import check  # noqa: E402

TINY = ROOT / "fixtures" / "qwen3_tts" / "tiny"
MANIFEST = json.loads((ROOT / "fixtures" / "manifest.json").read_text())
MODULES = ("talker_text_embed", "talker_codec_embed", "talker_decoder", "talker_codec_head",
           "predictor_decoder", "predictor_embeds", "predictor_heads", "codec_decoder",
           "speaker_encoder", "mimi_encoder")


def record(module: str, variant: str, size: str = "tiny") -> dict[str, Any]:
    for r in MANIFEST["qwen3_tts"]["exports"]:
        if (r["module"], r["variant"], r["size"]) == (module, variant, size):
            return r
    raise KeyError(f"{size} {module}.{variant}")


def raw_variant(module: str) -> str:
    """The raw export `fix` starts from: the codec decoder's is its static trace (pnnx
    aborts re-tracing it at inputshape2)."""
    return "raw_static" if module == "codec_decoder" else "raw"


def run_fix(param: Path, bin_path: Path | None, out: Path, *extra: str,
            always_write: bool = False) -> tuple[int, str]:
    """`paramsurgery fix PARAM [--bin BIN] -o OUT [extra]`, in this process: (exit code,
    what it printed). `always_write`: OUT also when nothing changed or errors are left
    (`--always-write`; the tables inspect whatever fix made)."""
    from paramsurgery.cli import main

    args = ["fix", str(param), "-o", str(out), *extra] + (["--always-write"] if always_write
                                                          else [])
    if bin_path is not None:
        args += ["--bin", str(bin_path)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        code = main(args)
    return code, buf.getvalue()


def repairs_run(fix_output: str) -> str:
    """The passes that changed the graph, from fix's report."""
    ran = re.findall(r"^([a-z][a-z-]+): \d+ change\(s\)", fix_output, re.M)
    return " + ".join(ran) or "none"


def left_types(param: Path) -> str:
    """The layer types ncnn does not have that a graph still holds, counted."""
    import paramsurgery
    from paramsurgery.core.layer_types import is_ncnn_layer

    counts: dict[str, int] = {}
    for layer in paramsurgery.load(param):
        if not is_ncnn_layer(layer.type):
            counts[layer.type] = counts.get(layer.type, 0) + 1
    return ", ".join(f"{t} x{n}" for t, n in sorted(counts.items())) or "none"


def table() -> list[tuple[str, str, str, str]]:
    rows = []
    for module in MODULES:
        variant = raw_variant(module)
        before = record(module, "raw")["status"]["kind"]
        if variant != "raw":
            before = f"{before}; {variant}: {record(module, variant)['status']['kind']}"
        param = TINY / f"{module}.{variant}.ncnn.param"
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "y.param"
            code, text = run_fix(param, param.with_suffix(".bin"), out, always_write=True)
            rec = record(module, variant)
            if not out.exists():
                after = f"fix wrote nothing (exit {code})"
            else:
                arrays = dict(np.load(TINY / f"{module}.{variant}.ref.npz"))
                st = check(out, out.with_suffix(".bin"), rec["io"]["inputs"],
                           rec["io"]["outputs"], arrays)
                err = st.get("max_rel_err")
                after = st["kind"] + (f" (rel {err:.1e} at T={rec['lengths']['reference']})"
                                      if err is not None else "")
                if st["kind"] != "runs_right":
                    after += f"; fix exit {code}, left: {left_types(out)}"
        rows.append((module, before, repairs_run(text), after))
    return rows


def main() -> int:
    rows = table()
    print("| module | pnnx gave | `fix` ran | after, ncnn vs torch |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    right = sum(r[3].startswith("runs_right") for r in rows)
    print(f"rawfix: {right}/{len(rows)} raw modules run right after `paramsurgery fix` alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
