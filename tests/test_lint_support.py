"""Shared helpers of the lint tests (imported by test_lint_*.py), and their own checks:
which fixture is which, and the exact traced shapes / references of the Qwen3-TTS
fixtures from fixtures/manifest.json (batch axes included, so the conformance runs are
exact, not guessed)."""

import json
from functools import lru_cache

import numpy as np

from paramsurgery.lint import InputSpec, Reference, lint_file

from conftest import FIXTURES

REPROS = FIXTURES / "repros"
QWEN = FIXTURES / "qwen3_tts"


@lru_cache(maxsize=None)
def manifest() -> dict:
    return json.loads((FIXTURES / "manifest.json").read_text())


def qwen_exports(size: str | None = None, variant: str | None = None) -> list[dict]:
    out = []
    for e in manifest()["qwen3_tts"]["exports"]:
        if "files" not in e or "ncnn_param" not in e.get("files", {}):
            continue
        if size and e["size"] != size or variant and e["variant"] != variant:
            continue
        out.append(e)
    return out


def export_id(e: dict) -> str:
    return f"{e['size']}/{e['module']}.{e['variant']}"


def traced_specs(e: dict) -> list[InputSpec]:
    """The first traced input shapes, dtypes and pnnx batch axes of an export."""
    dtypes = e.get("input_dtypes") or ["float32"] * len(e["io"]["inputs"])
    return [InputSpec(x["blob"], tuple(shape), "i32" if dt.startswith("int") else "f32",
                      x["batch_index"])
            for x, shape, dt in zip(e["io"]["inputs"], e["input_shapes"]["trace"], dtypes)]


def reference(e: dict) -> Reference | None:
    """The export's torch reference with pnnx's batch axes (tiny exports only)."""
    ref = e["files"].get("reference")
    if not ref:
        return None
    with np.load(FIXTURES / ref) as z:
        ins = {x["blob"]: (z[x["key"]], x["batch_index"]) for x in e["io"]["inputs"]}
        outs = {x["blob"]: z[x["key"]].shape for x in e["io"]["outputs"]}
    return Reference.from_arrays(ins, outs, str(FIXTURES / ref))


@lru_cache(maxsize=None)
def lint_export(key: str, run: bool) -> tuple:
    """Lint a Qwen3-TTS export (cached: several tests read the same result)."""
    e = next(x for x in qwen_exports() if export_id(x) == key)
    param = FIXTURES / e["files"]["ncnn_param"]
    if run:
        fs = lint_file(param, reference=reference(e), input_shapes=traced_specs(e), run=True)
    else:
        fs = lint_file(param, run=False)
    return tuple(fs)


@lru_cache(maxsize=None)
def lint_repro(case: str, variant: str, run: bool = True) -> tuple:
    return tuple(lint_file(REPROS / case / variant / "model.ncnn.param", run=run))


def codes(findings, severity: str | None = None) -> set[str]:
    return {f.code for f in findings if severity is None or f.severity == severity}


def test_manifest_helpers_cover_every_fixture():
    keys = {export_id(e) for e in qwen_exports()}
    assert "tiny/talker_decoder.ported" in keys and "real/talker_decoder.raw" in keys
    e = next(x for x in qwen_exports("tiny") if x["module"] == "codec_decoder"
             and x["variant"] == "ported")
    specs = traced_specs(e)
    assert [s.blob for s in specs] == ["in0", "in1", "in2", "in3", "in4"]
    assert specs[1].dtype == "i32" and specs[1].batch_index == 233 and specs[1].shape == (375,)
    ref = reference(e)
    assert ref.outputs == {"out0": (1, 1, 24960)} and not any(s.guessed for s in ref.inputs)
