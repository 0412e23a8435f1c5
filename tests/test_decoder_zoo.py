"""HF causal decoders of the zoo (fixtures/zoo: tiny random-init transformers models exported
by pnnx) made right at every length and kv-cached by paramsurgery alone (issue 24):

- static export traced at 7 with its torch reference at 11 next to it: `fix` must exit 0
  with an output that matches torch at every recorded length (5, 7, 10, 11, 16), never exit 0
  wrong (the folded causal mask and RoPE tables used to stay at the traced size: rel error
  0.5–1.3 at T=11);
- the kv form (mask and positions as inputs): `fix` → `add-kvcache` → a greedy decode
  through ncnn with native caches gives torch's own cached decode (HF's DynamicCache):
  the same tokens, the logits within 1e-4 relative.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import paramsurgery
from paramsurgery.cli import main
from paramsurgery.runtime.child import RunOptions, run_isolated
from paramsurgery.verify.decode import greedy_decode

ZOO = Path(__file__).resolve().parents[1] / "fixtures" / "zoo"
pytestmark = pytest.mark.skipif(not (ZOO / "zoo.json").exists(),
                                reason="fixtures/zoo (tools/zoo) not in this checkout yet")
STATIC = [("llama", "embeds_sdpa_static"), ("llama", "embeds_eager_static"),
          ("llama", "ids_sdpa_static"), ("qwen2", "embeds_sdpa_static"),
          ("qwen3", "embeds_sdpa_static"), ("mistral", "embeds_sdpa_static")]
KV = ["llama", "qwen2", "qwen3", "gemma", "gpt2"]
POSITIONS = {"gpt2": "position_ids"}  # an Embed reads GPT-2's positions: int32 ids


def _copy(family: str, route: str, tmp_path: Path) -> Path:
    """The route's files in tmp_path (fix reads X.ref.npz and X.pnnx.param next to X)."""
    entry = json.loads((ZOO / "zoo.json").read_text())["families"][family]["routes"][route]
    for rel in entry["files"]:
        shutil.copy(ZOO / rel, tmp_path / Path(rel).name)
    return tmp_path / f"{route}.ncnn.param"


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("family, route", STATIC)
def test_static_export_fixed_right_at_every_length(tmp_path, family, route):
    param = _copy(family, route, tmp_path)
    out = tmp_path / "fixed.param"
    assert main(["fix", str(param), "--bin", str(param.with_suffix(".bin")), "-o",
                 str(out)]) == 0
    g = paramsurgery.load(out)
    assert not [m.name for m in g.by_type("MemoryData") if "mask" in m.name]  # rebuilt
    torch = np.load(ZOO / family / "torch.npz")
    entry = route.split("_")[0]
    for n in (5, 7, 10, 11, 16):
        x = torch[f"{entry}.x@{n}"][0]  # ids are fed as int32 (what Embed reads)
        res = run_isolated(str(out), str(out.with_suffix(".bin")),
                           {"in0": x.astype(np.int32) if entry == "ids" else x}, ["out0"],
                           RunOptions())
        assert res.ok, res.describe()
        assert _rel(res.outputs["out0"], torch[f"{entry}.output@{n}"][0]) < 1e-4, n


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_static_export_with_pair_right_at_every_length(tmp_path, family):
    """`--pair` (the T=10 export, param only, no reference): the mask is proven causal on
    this export and rebuilt, the RoPE tables computed (the pair has no weights to extend
    them): no refusal asking for --pair, no error on the pass's own layers."""
    param = _copy(family, "embeds_sdpa_static", tmp_path)
    (tmp_path / "embeds_sdpa_static.ref.npz").unlink()
    pair = _copy(family, "embeds_sdpa_static2", tmp_path)
    out = tmp_path / "fixed.param"
    assert main(["fix", str(param), "--bin", str(param.with_suffix(".bin")), "-o", str(out),
                 "--pair", str(pair)]) == 0
    torch = np.load(ZOO / family / "torch.npz")
    for n in (5, 11, 16):
        res = run_isolated(str(out), str(out.with_suffix(".bin")),
                           {"in0": torch[f"embeds.x@{n}"][0]}, ["out0"], RunOptions())
        assert res.ok, res.describe()
        assert _rel(res.outputs["out0"], torch[f"embeds.output@{n}"][0]) < 1e-4, n


@pytest.mark.parametrize("family", KV)
def test_kv_form_cached_greedy_decode_equals_torch(tmp_path, family):
    param = _copy(family, "kv_sdpa_dynamic", tmp_path)
    fixed, cached = tmp_path / "fixed.param", tmp_path / "cached.param"
    assert main(["fix", str(param), "--bin", str(param.with_suffix(".bin")), "-o",
                 str(fixed)]) == 0
    assert main(["add-kvcache", str(fixed), "--bin", str(fixed.with_suffix(".bin")), "-o",
                 str(cached)]) == 0
    torch = np.load(ZOO / family / "torch.npz")
    want = torch["decode.tokens"].tolist()
    got = greedy_decode(cached, cached.with_suffix(".bin"), embed=torch["decode.embed_tokens"],
                        prompt=torch["decode.prompt_ids"][0].tolist(), steps=len(want),
                        extra={"in1": ("mask", 3), "in2": (POSITIONS.get(family, "positions"), 1)})
    assert got.error is None, got.error
    assert got.tokens == want
    logits = torch["decode.logits"][:len(got.logits)]
    assert _rel(got.logits, logits) < 1e-4
